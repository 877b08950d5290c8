"""The edge: who may come in. Connections (timeouts, caps), API keys, callers, per-caller
limits, origins, body size, and the refusals answered in each path's protocol's error shape.

May import: config/, protocols/. Nothing of the engine (lint-imports checks).
"""
