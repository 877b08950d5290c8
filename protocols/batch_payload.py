"""Decoding of the payload shared by WS `/ws` and POST `/api/generate-batch`.

One bad prompt fails that prompt only; a bad `generation_config` fails every prompt of the
payload (each by its request_id); a payload that is not a JSON object at all fails as a whole.
"""

from __future__ import annotations

from typing import Any

import msgspec

from protocols.errors import ErrorKind, GenerationError, invalid, validation_error
from protocols.generation import PromptItem, SamplingOptions
from protocols.generation_config import GenerationConfig, resolve_options
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
    raw: bytes | str, defaults: SamplingOptions, *, streaming_allowed: bool = True
) -> BatchRequest:
    """Decode a batch payload; raises GenerationError only when no prompt can be named."""
    doc = decode_json_object(raw)
    items, positions, rejected = decode_prompts(doc)
    settings_doc = {k: v for k, v in doc.items() if k != "prompts"}
    try:
        settings = msgspec.convert(settings_doc, PayloadSettings)
        stream = settings.stream_response and streaming_allowed
        options = resolve_options(settings.generation_config, defaults, streaming=stream)
    except (msgspec.ValidationError, GenerationError) as e:
        error = validation_error(e) if isinstance(e, msgspec.ValidationError) else e
        pairs = zip(items, positions, strict=True)
        rejected += [Rejected(item.request_id, error, i) for item, i in pairs]
        rejected.sort(key=lambda r: r.position)
        return BatchRequest([], [], rejected, defaults, True, False)
    return BatchRequest(items, positions, rejected, options, settings.only_new_tokens, stream)
