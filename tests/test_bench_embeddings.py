"""`llm-gateway bench embeddings`, a tiny run: the session's gateway with its embedding model
and sentence-transformers in process, one client, two requests a cell. What this asserts is the
report's shape (its table, columns and goal lines), never a speed figure: docs/BENCHMARKS.md,
"Embeddings", has those."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gateway.config.settings import served_model_name
from gateway_bench.targets import Endpoint
from serving import RunningServer, gateway_settings

pytest.importorskip("aiohttp", reason="the bench extra is not installed")


@pytest.mark.own_engine  # a bench scenario's run (sentence-transformers loads a model): test-all
def test_a_tiny_embeddings_run_reports_its_table_and_goals(
    tmp_path: Path, embedding_server: RunningServer
) -> None:
    from gateway_bench.embeddings import (
        COLUMNS,
        GATEWAY,
        IN_PROCESS,
        parse,
        report,
        run_embeddings,
    )

    flags = ["--targets", GATEWAY, IN_PROCESS, "--concurrency", "1", "--inputs", "1", "32"]
    options = parse([*flags, "--requests", "2", "--chats", "1", "--out", str(tmp_path)])
    chat_model = served_model_name(gateway_settings().engine)

    @asynccontextmanager
    async def running() -> AsyncIterator[Endpoint]:
        yield Endpoint(embedding_server.http, model=chat_model)

    result, out = asyncio.run(run_embeddings(options, "bench embeddings", running))
    measured = {(c.target, c.concurrency, c.inputs) for c in result.cells}
    assert measured == {(t, 1, n) for t in (GATEWAY, IN_PROCESS) for n in (1, 32)}
    assert all(c.failed == 0 and c.requests == 2 and c.texts_per_s > 0 for c in result.cells)
    assert len(result.chat_idle_ms) == len(result.chat_loaded_ms) == 1
    text = report(result).markdown()
    assert "| " + " | ".join(COLUMNS) + " |" in text
    assert "| gateway | 1 | 32 | 2 |" in text and "| sentence-transformers | 1 | 32 | 2 |" in text
    for goal in ("gateway >= 1.0x vllm-server (same settings), c=32 x 32 inputs",
                 "gateway >= infinity-emb's texts/s, c=32 x 32 inputs",
                 "chat TTFT under embedding load <= 2x idle"):  # fmt: skip
        assert f"| {goal} |" in text
    assert "not measured" in text  # neither vLLM's server nor infinity-emb ran
    assert json.loads((out / "report.json").read_text())["cells"]


def test_unknown_targets_are_refused() -> None:
    from gateway_bench.embeddings import parse

    assert parse(["--targets", "gateway"]).targets == ["gateway"]
    with pytest.raises(SystemExit):
        parse(["--targets", "tei"])
