"""Stores: what outlives a request. Continuation histories (in this process, or Redis with
REDIS_URL) and feedback (SQLite).

May import: config/, protocols/.
"""
