"""Replica affinity, simulated with the gateway's own router (docs/BENCHMARKS.md).

`python -m gateway_bench.affinity_sim` (needs the `ray` extra): for 4, 8 and 16 replicas,
conversations of request_ids (keys as the gateway makes them, gateway/engine/affinity.py) replayed
turn by turn, interleaved.
A turn is served from the prefix cache when it reaches the replica that served the key's
previous turn (the cache is taken as large enough: what routing alone decides). Affinity is
`Fleet.pick` (gateway/engine/replicas.py: rendezvous hashing); without it, two replicas drawn
at random, the less loaded taken (REPLICA_ROUTING=load). Then one replica leaves: how many
keys move.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter

from gateway.engine.affinity import affinity_key
from gateway.engine.replicas import Fleet

CONVERSATIONS = 2000
TURNS = 8


def ring(replicas: list[int]) -> Fleet:
    """The router alone, over replicas that all answer (no actors behind them)."""
    fleet = Fleet([None] * (max(replicas) + 1), "affinity")
    fleet.up = dict.fromkeys(replicas, 0)
    return fleet


def simulate(count: int, rng: random.Random) -> dict[str, float]:
    replicas = list(range(count))
    keys = [
        affinity_key(("", str(uuid.UUID(int=rng.getrandbits(128))))) for _ in range(CONVERSATIONS)
    ]
    turns = [k for k in keys for _ in range(TURNS)]
    rng.shuffle(turns)
    router = ring(replicas)
    hashed: dict[str, int] = {}
    drawn: dict[str, int] = {}
    load: Counter[int] = Counter()
    hits = {"affinity": 0, "power_of_two": 0}
    continuations = 0
    for key in turns:
        chosen = router.pick(key)
        a, b = rng.sample(replicas, 2)
        random_choice = a if load[a] <= load[b] else b
        load[random_choice] += 1
        if key in hashed:
            continuations += 1
            hits["affinity"] += hashed[key] == chosen
            hits["power_of_two"] += drawn[key] == random_choice
        hashed[key], drawn[key] = chosen, random_choice
    per_replica = Counter(router.pick(k) for k in keys)
    leaving = replicas[0]
    smaller = ring(replicas[1:])
    moved = [k for k in keys if smaller.pick(k) != router.pick(k)]
    return {
        "replicas": count,
        "hit_affinity": hits["affinity"] / continuations,
        "hit_power_of_two": hits["power_of_two"] / continuations,
        "keys_max_over_mean": max(per_replica.values()) / (CONVERSATIONS / count),
        "moved_share": len(moved) / len(keys),
        "moved_not_from_leaving": sum(router.pick(k) != leaving for k in moved),
        "leaving_share": per_replica[leaving] / len(keys),
    }


def main() -> None:
    rng = random.Random(17)
    print(
        "| replicas | continuations from cache, affinity | without (two drawn, the less loaded) |"
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
