"""What HTTP and WebSocket routes share, below the routes: an answer prepared then written
(`prepared.py`, over `streaming.py`), the preparations more than one route serves (a chat
completion, an `/invocations` answer, a Responses API turn), the WebSockets' outbox, the
admin key check, and the OpenAPI operations each route module declares.

No route module imports another: what two need lives here. May import: state.py, drain.py,
engine_path/, edge/, stores/, config/, protocols/; never engine/ (routes reach the engine
through engine_path/served_model.py).
"""
