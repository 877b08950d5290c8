"""Replica affinity, simulated with Ray Serve's own router code (docs/BENCHMARKS.md).

`python -m gateway_bench.affinity_sim` (needs the `ray` extra): for 4, 8 and 16 replicas,
conversations of request_ids (keys as the gateway makes them, gateway/engine/affinity.py) replayed
turn by turn, interleaved.
A turn is served from the prefix cache when it reaches the replica that served the key's
previous turn (the cache is taken as large enough: what routing alone decides). Affinity is
`ConsistentHashRouter`'s ring (its hash, 100 virtual nodes); without it, Ray's default
`PowerOfTwoChoices` (two replicas drawn at random, the less loaded taken). Then one replica
leaves: how many keys move.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter

from ray.serve._private.common import DeploymentID, ReplicaID
from ray.serve.experimental.consistent_hash_router import ConsistentHashRouter

from gateway.engine.affinity import affinity_key

CONVERSATIONS = 2000
TURNS = 8


def ring(replicas: list[ReplicaID]) -> ConsistentHashRouter:
    """The router's ring alone (its own build and lookup), without a running Serve."""
    router = ConsistentHashRouter.__new__(ConsistentHashRouter)
    router._deployment_id = replicas[0].deployment_id
    router._num_virtual_nodes = 100
    router._num_fallback_replicas = 0
    router._rebuild_ring(frozenset(replicas))
    return router


def owner(router: ConsistentHashRouter, key: str) -> ReplicaID:
    return router._lookup_ranked_replicas(key)[0]


def simulate(count: int, rng: random.Random) -> dict[str, float]:
    deployment = DeploymentID(name="EngineReplica", app_name="llm-gateway-engine")
    replicas = [
        ReplicaID(uuid.UUID(int=rng.getrandbits(128)).hex, deployment) for _ in range(count)
    ]
    keys = [
        affinity_key(("", str(uuid.UUID(int=rng.getrandbits(128))))) for _ in range(CONVERSATIONS)
    ]
    turns = [k for k in keys for _ in range(TURNS)]
    rng.shuffle(turns)
    router = ring(replicas)
    hashed: dict[str, ReplicaID] = {}
    drawn: dict[str, ReplicaID] = {}
    load: Counter[ReplicaID] = Counter()
    hits = {"affinity": 0, "power_of_two": 0}
    continuations = 0
    for key in turns:
        chosen = owner(router, key)
        a, b = rng.sample(replicas, 2)
        random_choice = a if load[a] <= load[b] else b
        load[random_choice] += 1
        if key in hashed:
            continuations += 1
            hits["affinity"] += hashed[key] == chosen
            hits["power_of_two"] += drawn[key] == random_choice
        hashed[key], drawn[key] = chosen, random_choice
    per_replica = Counter(owner(router, k) for k in keys)
    leaving = replicas[0]
    smaller = ring(replicas[1:])
    moved = [k for k in keys if owner(smaller, k) != owner(router, k)]
    return {
        "replicas": count,
        "hit_affinity": hits["affinity"] / continuations,
        "hit_power_of_two": hits["power_of_two"] / continuations,
        "keys_max_over_mean": max(per_replica.values()) / (CONVERSATIONS / count),
        "moved_share": len(moved) / len(keys),
        "moved_not_from_leaving": sum(owner(router, k) != leaving for k in moved),
        "leaving_share": per_replica[leaving] / len(keys),
    }


def main() -> None:
    rng = random.Random(17)
    print(
        "| replicas | continuations from cache, affinity | without (PowerOfTwoChoices) |"
        " keys on the busiest replica / mean | keys moved when one leaves | of them not"
        " the leaver's |"
    )
    print("|---|---|---|---|---|---|")
    for count in (4, 8, 16):
        r = simulate(count, rng)
        print(
            f"| {count} | {r['hit_affinity']:.1%} | {r['hit_power_of_two']:.1%} |"
            f" {r['keys_max_over_mean']:.2f} | {r['moved_share']:.1%}"
            f" (its share: {r['leaving_share']:.1%}) | {r['moved_not_from_leaving']} |"
        )


if __name__ == "__main__":
    main()
