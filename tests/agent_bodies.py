"""The requests Claude Code and Codex CLI sent, recorded through a logging proxy in front of
the gateway (tests/data/agents/<agent>/: each body byte for byte as the agent sent it, and
`requests.jsonl`, each request's method, path and headers, keys left out)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data" / "agents"
CLAUDE_CODE = DATA / "claude-code"
CODEX = DATA / "codex"
# Headers replayed with a body: what says how to read it, not who sent it.
REPLAYED = ("content-type", "anthropic-version", "anthropic-beta", "accept")


@dataclass(frozen=True)
class Recorded:
    name: str
    path: str  # with its query, as sent
    headers: dict[str, str]
    raw: bytes

    @cached_property
    def body(self) -> dict[str, Any]:
        decoded: dict[str, Any] = json.loads(self.raw)
        return decoded


def recorded(agent: Path) -> list[Recorded]:
    """Every POST with a body the agent sent, in order."""
    requests = []
    for line in (agent / "requests.jsonl").read_text().splitlines():
        request = json.loads(line)
        if request["method"] != "POST" or not request["body"]:
            continue
        headers = {k: v for k, v in request["headers"].items() if k in REPLAYED}
        raw = (agent / f"{request['name']}.json").read_bytes()
        requests.append(Recorded(request["name"], request["path"], headers, raw))
    return requests
