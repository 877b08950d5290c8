"""POST `/api/generate-one` and `/api/generate-batch` (rest-generate.md)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from msgspec import UNSET, UnsetType

from protocols.batch_payload import BatchRequest, PayloadSettings, Rejected, decode_batch
from protocols.errors import GenerationError, validation_error
from protocols.generation import Failed, Finished, PromptItem, SamplingOptions
from protocols.generation_config import resolve_options
from protocols.json_body import decode_json_object


class _OnePayload(PayloadSettings, forbid_unknown_fields=True, kw_only=True):
    request_id: str
    prompt: str


class OneRequest(msgspec.Struct, frozen=True):
    item: PromptItem
    options: SamplingOptions
    only_new_tokens: bool
    stream: bool


class BatchAnswer(msgspec.Struct, omit_defaults=True):
    """One prompt's answer; a prompt that failed carries `error` (and `field`) instead."""

    request_id: str | None
    prompt: str | UnsetType = UNSET
    response: str | UnsetType = UNSET
    error: str | UnsetType = UNSET
    field: str | UnsetType = UNSET


class ErrorBody(msgspec.Struct, omit_defaults=True):
    error: str
    type: str
    field: str | UnsetType = UNSET


_ENCODER = msgspec.json.Encoder()


def decode_one(raw: bytes, defaults: SamplingOptions) -> OneRequest:
    doc = decode_json_object(raw)
    try:
        payload = msgspec.convert(doc, _OnePayload)
    except msgspec.ValidationError as e:
        raise validation_error(e) from e
    options = resolve_options(
        payload.generation_config, defaults, streaming=payload.stream_response
    )
    item = PromptItem(payload.request_id, payload.prompt)
    return OneRequest(item, options, payload.only_new_tokens, payload.stream_response)


def decode_generate_batch(raw: bytes, defaults: SamplingOptions) -> BatchRequest:
    return decode_batch(raw, defaults, streaming_allowed=False)


def encode_error(error: GenerationError) -> bytes:
    field: str | UnsetType = UNSET if error.field is None else error.field
    return _ENCODER.encode(ErrorBody(error.message, error.kind.value, field))


def failure_of_one(failed: Failed) -> GenerationError:
    """A generate-one prompt's failure, its field rooted at the payload."""
    field = None if failed.field is None else f"$.{failed.field}"
    return GenerationError(failed.kind, failed.message, field)


def answer_of(
    item: PromptItem, outcome: Finished | Failed, *, position: int, only_new_tokens: bool
) -> BatchAnswer:
    if isinstance(outcome, Failed):
        field: str | UnsetType = UNSET
        if outcome.field is not None:
            field = f"$.prompts[{position}].{outcome.field}"
        return BatchAnswer(item.request_id, error=outcome.message, field=field)
    new = outcome.sequences[0].text
    if only_new_tokens:
        return BatchAnswer(item.request_id, response=new)
    full = outcome.history.text
    return BatchAnswer(item.request_id, prompt=full[: len(full) - len(new)], response=new)


def rejected_answer(rejected: Rejected) -> BatchAnswer:
    error = rejected.error
    field: str | UnsetType = UNSET if error.field is None else error.field
    return BatchAnswer(rejected.request_id, error=error.message, field=field)


def batch_answers(batch: BatchRequest, outcomes: dict[int, Finished | Failed]) -> list[BatchAnswer]:
    """Every prompt's answer, in the order of the payload's `prompts`."""
    placed: dict[int, BatchAnswer] = {r.position: rejected_answer(r) for r in batch.rejected}
    for index, (item, position) in enumerate(zip(batch.items, batch.positions, strict=True)):
        placed[position] = answer_of(
            item, outcomes[index], position=position, only_new_tokens=batch.only_new_tokens
        )
    return [placed[position] for position in sorted(placed)]


def encode_answers(answers: Sequence[BatchAnswer]) -> bytes:
    return _ENCODER.encode(answers)
