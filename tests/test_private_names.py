"""The check `make lint` runs for other packages' private names (tests/private_names.py)."""

from __future__ import annotations

import ast
from pathlib import Path

from private_names import check, findings, own_names

OWN = """
class Mine:
    def __init__(self) -> None:
        self._count = 0

def _helper(_quiet: bool = False) -> None: ...
"""

FOREIGN = """
from ray.serve._private.common import RequestMetadata
from ray.serve.context import _get_global_client
from vllm import SamplingParams

def watch(llm, x, serve, scheduler, request, now, handle, mine):
    llm._run_output_handler()
    serve.context._get_serve_request_context()
    x._preempt_request(request, now)
    handle.options(_by_reference=False)
    mine._count += 1  # the project's own private name, from another module
    _helper(_quiet=True)
"""


def found(source: str, own_source: str = OWN) -> list[str]:
    own = own_names([ast.parse(own_source)])
    return [what for _, what in sorted(findings(ast.parse(source), own))]


def test_other_packages_private_names_are_found_the_projects_own_are_not() -> None:
    got = found(FOREIGN)
    assert got == [
        "import through a private module: ray.serve._private.common",
        "private name imported from ray.serve.context: _get_global_client",
        "private attribute of another package: llm._run_output_handler",
        "private attribute of another package: serve.context._get_serve_request_context",
        "private attribute of another package: x._preempt_request",
        "private parameter of another package: _by_reference=",
    ], got


def test_dunders_and_namedtuple_methods_are_not_private() -> None:
    assert found("def f(p, m):\n    p.__class__\n    return m._replace(a=1)._asdict()\n") == []


def test_only_the_seams_may_use_them(tmp_path: Path) -> None:
    for path in ("gateway/engine/vllm_seam.py", "gateway/engine/ray_seam.py", "gateway/x.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("def f(llm):\n    llm._run_output_handler()\n")
    assert check(tmp_path, ["gateway"]) == [
        "gateway/x.py:2: private attribute of another package: llm._run_output_handler"
    ]
