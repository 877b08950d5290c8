"""gRPC's client settings for a gateway that reaches engine replicas (ENGINE_REPLICAS).

Set when Ray Serve's handle took each streamed engine step over grpcio; since the replicas
are plain Ray actors (gateway/engine/replicas.py), steps travel in Ray's own core worker, and
what this setting still does for them is not measured (docs/BENCHMARKS.md). grpcio 1.85's
EventEngine client reads every message on a thread pool of its own and hands it on: 2.5 to 3.3
thread wake-ups a message in the gateway, against 1.25 with gRPC's older poller, which reads
on the thread that waits for completions. On a machine whose cores the model's threads fill,
each wake-up can stall them (docs/BENCHMARKS-HISTORY.md, "Engine replicas"). gRPC reads the setting
once, when it starts: it must be in the environment before anything imports gRPC (Ray does).
An operator's own GRPC_EXPERIMENTS is kept. A gRPC that no longer has the experiment logs
"Unknown experiment" once and goes on with its default client.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping


def use_poller_client(environ: MutableMapping[str, str] = os.environ) -> None:
    environ.setdefault("GRPC_EXPERIMENTS", "-event_engine_client")
