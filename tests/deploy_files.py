"""Reading deploy/: the Dockerfile's instructions, for the tests that check what the image runs."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "deploy/docker/Dockerfile"


def instructions(dockerfile: Path, name: str) -> list[str]:
    """The arguments of every `name` instruction (continuation lines joined)."""
    text = dockerfile.read_text().replace("\\\n", " ")
    return [
        line.split(None, 1)[1].strip()
        for line in text.splitlines()
        if line.split(None, 1)[:1] == [name]
    ]


def entrypoint() -> list[str]:
    """The image's ENTRYPOINT, the command every container of it starts with."""
    (found,) = instructions(DOCKERFILE, "ENTRYPOINT")
    command: list[str] = json.loads(found)
    return command
