"""The generation task's score: whether the answer names the expected word."""

from __future__ import annotations

from typing import Any


def names_the_answer(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    named = str(doc["answer"]).lower() in results[0].lower()
    return {"named": float(named)}
