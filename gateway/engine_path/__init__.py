"""The one engine path: every prompt's generation, batches and continuation keys, the control
session, admission by priority, deadlines, the metrics they keep, and the served model as
routes see it (`ServedModel`: the engine object never leaves this layer).

May import: edge/, engine/, stores/, config/, protocols/.
"""
