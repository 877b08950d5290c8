"""Decoding of the payload shared by WS `/ws` and POST `/api/generate-batch`.

One bad prompt fails that prompt only; a bad `generation_config` fails every prompt of the
payload (each by its request_id); a payload that is not a JSON object at all fails as a whole.
"""

from __future__ import annotations

from typing import Any

import msgspec

from protocols.errors import ErrorKind, GenerationError, invalid, validation_error
from protocols.generation import MAX_STOP_SEQUENCES, PromptItem, SamplingOptions
from protocols.generation_config import (
    GenerationConfig,
    resolve_options,
    strip_generation_config,
    take_adapter,
)
from protocols.json_body import decode_json_object


class Rejected(msgspec.Struct, frozen=True):
    """A prompt that failed validation: `request_id` is None when none could be read."""

    request_id: str | None
    error: GenerationError
    position: int = 0  # its place in the payload's `prompts`


class BatchRequest(msgspec.Struct, frozen=True):
    """The valid prompts (`positions[i]` is where `items[i]` stood) and the rejected ones."""

    items: list[PromptItem]
    positions: list[int]
    rejected: list[Rejected]
    options: SamplingOptions
    only_new_tokens: bool
    stream: bool
    adapter: str | None = None  # `generation_config.adapter_id`: a LoRA adapter's name


class PayloadSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    only_new_tokens: bool = True
    stream_response: bool = True
    generation_config: GenerationConfig | None = None


class _PromptEntry(msgspec.Struct, forbid_unknown_fields=True):
    request_id: str
    prompt: str


def decode_prompts(doc: dict[str, Any]) -> tuple[list[PromptItem], list[int], list[Rejected]]:
    entries = doc.get("prompts")
    if not isinstance(entries, list) or not entries:
        found = "missing" if entries is None else f"got `{type(entries).__name__}`"
        if isinstance(entries, list):
            found = "got an empty array"
        raise invalid(
            f"Expected a non-empty `array` of prompts, {found} - at `$.prompts`", "$.prompts"
        )
    items: list[PromptItem] = []
    positions: list[int] = []
    rejected: list[Rejected] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        try:
            parsed = msgspec.convert(entry, _PromptEntry)
        except msgspec.ValidationError as e:
            request_id = entry.get("request_id") if isinstance(entry, dict) else None
            rid = request_id if isinstance(request_id, str) else None
            rejected.append(Rejected(rid, validation_error(e, f"$.prompts[{i}]"), i))
        else:
            if parsed.request_id in seen:
                message = f"request_id {parsed.request_id!r} appears twice in the payload"
                field = f"$.prompts[{i}].request_id"
                error = GenerationError(ErrorKind.DUPLICATE_REQUEST_ID, message, field)
                rejected.append(Rejected(parsed.request_id, error, i))
                continue
            seen.add(parsed.request_id)
            items.append(PromptItem(parsed.request_id, parsed.prompt))
            positions.append(i)
    return items, positions, rejected


def decode_batch(
    raw: bytes | str,
    defaults: SamplingOptions,
    *,
    streaming_allowed: bool = True,
    max_stop: int = MAX_STOP_SEQUENCES,
) -> BatchRequest:
    """Decode a batch payload; raises GenerationError only when no prompt can be named."""
    doc = decode_json_object(raw)
    items, positions, rejected = decode_prompts(doc)
    settings_doc = {k: v for k, v in doc.items() if k != "prompts"}
    strip_generation_config(settings_doc, "generation_config", "generation_config")
    try:
        adapter = take_adapter(settings_doc, "generation_config", "$.generation_config")
        settings = msgspec.convert(settings_doc, PayloadSettings)
        stream = settings.stream_response and streaming_allowed
        options = resolve_options(
            settings.generation_config, defaults, streaming=stream, max_stop=max_stop
        )
    except (msgspec.ValidationError, GenerationError) as e:
        error = validation_error(e) if isinstance(e, msgspec.ValidationError) else e
        pairs = zip(items, positions, strict=True)
        rejected += [Rejected(item.request_id, error, i) for item, i in pairs]
        rejected.sort(key=lambda r: r.position)
        return BatchRequest([], [], rejected, defaults, True, False)
    return BatchRequest(
        items, positions, rejected, options, settings.only_new_tokens, stream, adapter
    )


def refuse_repeated_ids(batch: BatchRequest) -> BatchRequest:
    """The payload refused as a whole when it names a request_id twice (`/ws`): one Rejected
    per request_id, before anything runs, so no request_id gets two answers. A request_id
    refused for a reason of its own keeps it; the others get the repeated ids' error."""
    repeats = [r for r in batch.rejected if r.error.kind is ErrorKind.DUPLICATE_REQUEST_ID]
    if not repeats:
        return batch
    names = ", ".join(dict.fromkeys(repr(r.request_id) for r in repeats))
    repeated = GenerationError(
        ErrorKind.DUPLICATE_REQUEST_ID,
        f"request_id {names} appears more than once in the payload: none of its prompts ran",
        repeats[0].error.field,
    )
    twice = {r.request_id for r in repeats}
    pairs = zip(batch.items, batch.positions, strict=True)
    entries = sorted(
        [(position, item.request_id, None) for item, position in pairs]
        + [(r.position, r.request_id, r.error) for r in batch.rejected],
        key=lambda entry: entry[0],
    )
    refused: dict[str | None, Rejected] = {}
    for position, request_id, error in entries:
        if request_id not in refused:
            own = error if error is not None and request_id not in twice else repeated
            refused[request_id] = Rejected(request_id, own, position)
    return BatchRequest([], [], list(refused.values()), batch.options, batch.only_new_tokens, False)
