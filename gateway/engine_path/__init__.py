"""The one engine path: every prompt's generation, batches and continuation keys, the control
session, admission by priority, deadlines, and the metrics they keep.

May import: edge/, engine/, stores/, config/, protocols/.
"""
