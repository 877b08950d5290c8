"""The one thing of Ray's the replicas use that Ray does not document as its API.

Ray starts its workers at nice 15 (its `worker_niceness` setting), and an engine replica's
processes (the actor and vLLM's engine core, its child) inherit it: the model would give its
cores up to the gateway and Ray's own processes (nice 0) whenever they run. An unprivileged
process may raise its niceness but never lower it again, so the replica cannot undo it
itself: the setting goes in its actor's environment, as Ray's own job manager sets it for a
job's driver (`ray._private.ray_constants.RAY_WORKER_NICENESS`). The engine then runs at the
priority `ray start` ran at, as in-process at the gateway's. tests/test_ray_contract.py fails
naming it if Ray drops it; tests/test_replicas.py checks the replicas' priority on a cluster.
"""

from __future__ import annotations

WORKER_NICENESS = "RAY_worker_niceness"
REPLICA_ENV = {WORKER_NICENESS: "0"}


def rays_worker_niceness_variable() -> object:
    """The variable Ray's own job manager sets for the same purpose (None: Ray has none)."""
    from ray._private import ray_constants

    return getattr(ray_constants, "RAY_WORKER_NICENESS", None)
