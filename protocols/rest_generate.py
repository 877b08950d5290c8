"""POST `/api/generate-one` and `/api/generate-batch` (rest-generate.md)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from msgspec import UNSET, UnsetType

from protocols.batch_payload import BatchRequest, PayloadSettings, Rejected, decode_batch
from protocols.errors import GenerationError, validation_error
from protocols.events import Failed, Finished
from protocols.generation import MAX_STOP_SEQUENCES, PromptItem, SamplingOptions
from protocols.generation_config import resolve_options, strip_generation_config, take_adapter
from protocols.json_body import decode_json_object


class _OnePayload(PayloadSettings, forbid_unknown_fields=True, kw_only=True):
    request_id: str
    prompt: str


class OneRequest(msgspec.Struct, frozen=True):
    item: PromptItem
    options: SamplingOptions
    only_new_tokens: bool
    stream: bool
    adapter: str | None = None  # `generation_config.adapter_id`


class BatchAnswer(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One prompt's answer; a prompt that failed has an empty `response` and `error` (and
    `field`)."""

    request_id: str | None
    prompt: str | UnsetType = UNSET
    response: str
    error: str | UnsetType = UNSET
    field: str | UnsetType = UNSET


class ErrorBody(msgspec.Struct, omit_defaults=True):
    error: str
    type: str
    field: str | UnsetType = UNSET


_ENCODER = msgspec.json.Encoder()


def decode_one(
    raw: bytes, defaults: SamplingOptions, max_stop: int = MAX_STOP_SEQUENCES
) -> OneRequest:
    doc = decode_json_object(raw)
    strip_generation_config(doc, "generation_config", "generation_config")
    adapter = take_adapter(doc, "generation_config", "$.generation_config")
    try:
        payload = msgspec.convert(doc, _OnePayload)
    except msgspec.ValidationError as e:
        raise validation_error(e) from e
    options = resolve_options(
        payload.generation_config, defaults, streaming=payload.stream_response, max_stop=max_stop
    )
    item = PromptItem(payload.request_id, payload.prompt)
    return OneRequest(item, options, payload.only_new_tokens, payload.stream_response, adapter)


def decode_generate_batch(
    raw: bytes, defaults: SamplingOptions, max_stop: int = MAX_STOP_SEQUENCES
) -> BatchRequest:
    return decode_batch(raw, defaults, streaming_allowed=False, max_stop=max_stop)


def encode_error(error: GenerationError) -> bytes:
    field: str | UnsetType = UNSET if error.field is None else error.field
    return _ENCODER.encode(ErrorBody(error.message, error.kind.value, field))


def failure_of_one(failed: Failed) -> GenerationError:
    """A generate-one prompt's failure, its field rooted at the payload."""
    return GenerationError(failed.kind, failed.message, _rooted(failed.field, "$"))


def answer_of(
    item: PromptItem, outcome: Finished | Failed, *, position: int, only_new_tokens: bool
) -> BatchAnswer:
    if isinstance(outcome, Failed):
        return _error_answer(item.request_id, _placed(outcome, position))
    new = outcome.sequences[0].text
    if only_new_tokens:
        return BatchAnswer(request_id=item.request_id, response=new)
    full = outcome.history.text
    prompt = full[: len(full) - len(new)]
    return BatchAnswer(request_id=item.request_id, prompt=prompt, response=new)


def _placed(failed: Failed, position: int) -> GenerationError:
    """A batch prompt's failure, its field rooted at the payload."""
    return GenerationError(
        failed.kind, failed.message, _rooted(failed.field, f"$.prompts[{position}]")
    )


def _rooted(field: str | None, entry: str) -> str | None:
    """A field of the prompt's entry under `entry`; one of the payload (`$.generation_config...`)
    as it is."""
    if field is None or field.startswith("$"):
        return field
    return f"{entry}.{field}"


def _error_answer(request_id: str | None, error: GenerationError) -> BatchAnswer:
    field: str | UnsetType = UNSET if error.field is None else error.field
    return BatchAnswer(request_id=request_id, response="", error=error.message, field=field)


def rejected_answer(rejected: Rejected) -> BatchAnswer:
    return _error_answer(rejected.request_id, rejected.error)


def batch_answers(batch: BatchRequest, outcomes: dict[int, Finished | Failed]) -> list[BatchAnswer]:
    """Every prompt's answer, in the order of the payload's `prompts`."""
    placed: dict[int, BatchAnswer] = {r.position: rejected_answer(r) for r in batch.rejected}
    for index, (item, position) in enumerate(zip(batch.items, batch.positions, strict=True)):
        placed[position] = answer_of(
            item, outcomes[index], position=position, only_new_tokens=batch.only_new_tokens
        )
    return [placed[position] for position in sorted(placed)]


def first_failure(batch: BatchRequest, outcomes: dict[int, Finished | Failed]) -> GenerationError:
    """The error of the first prompt in the payload, when every prompt failed validation."""
    failures = [(r.position, r.error) for r in batch.rejected]
    for index, position in enumerate(batch.positions):
        outcome = outcomes[index]
        if isinstance(outcome, Failed):
            failures.append((position, _placed(outcome, position)))
    return min(failures, key=lambda failure: failure[0])[1]


def encode_answers(answers: Sequence[BatchAnswer]) -> bytes:
    return _ENCODER.encode(answers)
