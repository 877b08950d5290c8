"""What the engine replicas take from Ray outside its documented API (gateway/engine/ray_seam.py),
checked against the installed Ray without a cluster: a Ray that changes it fails here, naming
it, before a replica runs at Ray's worker priority."""

from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed")


def test_ray_still_reads_the_worker_niceness_setting_the_replicas_set() -> None:
    from gateway.engine.ray_seam import WORKER_NICENESS, rays_worker_niceness_variable

    found = rays_worker_niceness_variable()
    assert found == WORKER_NICENESS, (
        f"Ray's worker niceness setting is {found!r} now, not {WORKER_NICENESS!r}: the engine "
        "replicas would run at Ray's worker priority (gateway/engine/ray_seam.py)"
    )
