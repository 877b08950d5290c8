"""The engine's dtype follows the settings and the CPU, and the server says which it chose
and why. (The test engine asks for float32, tests/serving.py; what "auto" picks on each kind
of CPU is tests/test_cpu_defaults.py.)"""

from __future__ import annotations

import httpx

from gateway.engine.cpu_defaults import cpu_flags, reported_flags, resolve_dtype
from serving import RunningServer


def test_info_and_metrics_report_the_dtype_chosen_for_this_cpu(server: RunningServer) -> None:
    dtype, reason = resolve_dtype(server.gateway.settings.engine.dtype, "cpu", cpu_flags())
    info = httpx.get(server.http + "/info").json()
    assert info["model_dtype"] == f"torch.{dtype}"
    metrics = httpx.get(server.http + "/metrics").text
    flags = " ".join(reported_flags(cpu_flags()))
    line = next(m for m in metrics.splitlines() if m.startswith("gateway_engine_info{"))
    assert f'dtype="{dtype}"' in line and f'dtype_reason="{reason}"' in line
    assert f'cpu_flags="{flags}"' in line
