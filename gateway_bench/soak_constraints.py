"""The soak's amplification by constraints (issue 43): another key's TTFT while one key sends, back
to back at its concurrent limit, the hostile probe's output constraints: a regex of 50,000
alternated words, a JSON schema of 10,000 string properties and one of a 100,000-value enum
(each `structured_outputs` on `/v1/completions`). Each must be refused at once, naming the
field and the limit (MAX_REGEX_CHARS, MAX_SCHEMA_BYTES...), and leave the engine to the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from gateway_bench.soak_calls import Client


def _probes() -> list[tuple[str, Any]]:
    words = "|".join(f"w7x{i}" for i in range(50_000))
    properties = {f"p{i}": {"type": "string"} for i in range(10_000)}
    return [
        ("regex", words),
        ("json", {"type": "object", "properties": properties}),
        ("json", {"type": "string", "enum": [f"value{i}" for i in range(100_000)]}),
    ]


class ConstraintLoad(msgspec.Struct, kw_only=True):
    contended_ttft_p50_ms: float | None  # the main key's, while the probes were sent
    chats: int
    chat_failures: int
    probes: int  # the limited key's requests carrying a probe's constraint
    refused_naming_field: int  # of those, a 4xx naming the field and a MAX_ setting
    server_errors: int


async def _prober(
    client: Client,
    prompt: str,
    encoded: list[tuple[str, bytes]],
    stop: asyncio.Event,
    tally: dict[str, int],
) -> None:
    turn = 0
    while not stop.is_set():
        name, body = encoded[turn % len(encoded)]
        turn += 1
        async with client.session.post(
            client.base_url + "/v1/completions", data=body, headers=client.headers
        ) as r:
            text = (await r.read()).decode(errors="replace")
        tally["probes"] += 1
        tally["server_errors"] += r.status >= 500
        named = f"structured_outputs.{name}" in text and "MAX_" in text
        tally["refused"] += r.status in (400, 422) and named


async def measure_constraint_load(
    main: Client,
    limited: Client,
    *,
    askers: int,
    chats: Callable[[], Awaitable[list[float | None]]],
    p50: Callable[[list[float | None]], float | None],
    prompt: str,
) -> ConstraintLoad:
    """`chats()` measures the main key's chats; the probes run until they are done."""
    encoded = [
        (
            name,
            msgspec.json.encode(
                {"prompt": prompt, "max_tokens": 2, "structured_outputs": {name: value}}
            ),
        )
        for name, value in _probes()
    ]
    stop, tally = asyncio.Event(), {"probes": 0, "refused": 0, "server_errors": 0}
    probing = [
        asyncio.create_task(_prober(limited, prompt, encoded, stop, tally)) for _ in range(askers)
    ]
    try:
        contended = await chats()
    finally:
        stop.set()
        await asyncio.gather(*probing)
    return ConstraintLoad(
        contended_ttft_p50_ms=p50(contended),
        chats=len(contended),
        chat_failures=sum(v is None for v in contended),
        probes=tally["probes"],
        refused_naming_field=tally["refused"],
        server_errors=tally["server_errors"],
    )
