"""Hugging Face TGI's native routes (POST `/`, `/generate`, `/generate_stream`, GET `/info`).

Shapes follow TGI's router (what `huggingface_hub.InferenceClient` parses): errors are
`{"error", "error_type"}`; a stream is SSE, one token per event, `index` from 1, the last event
adding `generated_text` (and `details`), no `[DONE]`. Pure: no I/O.
"""

from __future__ import annotations

from typing import Annotated, Any, assert_never

import msgspec
from msgspec import UNSET, Meta, UnsetType

from protocols.constraints import constrained, tgi_grammar
from protocols.errors import ErrorKind, GenerationError, named, refuse, validation_error
from protocols.events import (
    Finished,
    GeneratedSequence,
    TokenInfo,
    TopToken,
    best_sequences,
    stop_cause,
    top_tokens,
)
from protocols.generation import (
    Count,
    MaxNewTokens,
    NonEmpty,
    Penalty,
    RepetitionPenalty,
    SamplingOptions,
    SequencesAsked,
    Truncate,
    sequences_asked,
)
from protocols.json_body import decode_json_object
from protocols.sse import sse_event
from protocols.transformers_fields import strip_ignored

# TGI's launcher defaults, enforced and reported by /info (MAX_BEST_OF is a setting, held on
# the engine path: gateway/engine_path/sequences.py).
MAX_BEST_OF = 2
MAX_STOP_SEQUENCES = 4
MAX_TOP_N_TOKENS = 5


class TgiParameters(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    best_of: Count | None = None
    temperature: Annotated[float, Meta(gt=0.0, le=2.0)] | None = None
    repetition_penalty: RepetitionPenalty | None = None
    frequency_penalty: Penalty | None = None
    top_k: Annotated[int, Meta(gt=0, le=2**31 - 1)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, lt=1.0)] | None = None
    typical_p: Annotated[float, Meta(gt=0.0, lt=1.0)] | None = None
    do_sample: bool | None = None
    max_new_tokens: MaxNewTokens | None = None
    return_full_text: bool | None = None
    stop: Annotated[list[NonEmpty], Meta(max_length=MAX_STOP_SEQUENCES)] | None = None
    truncate: Truncate | None = None
    watermark: bool | None = None
    details: bool | None = None
    decoder_input_details: bool | None = None
    seed: Annotated[int, Meta(ge=0, le=2**63 - 1)] | None = None
    top_n_tokens: Annotated[int, Meta(ge=0, le=MAX_TOP_N_TOKENS)] | None = None
    grammar: Any = None  # protocols/constraints.py reads it
    adapter_id: str | None = None
    # Not TGI's: the gateway's extension (vLLM's benchmark client sends it to TGI).
    ignore_eos_token: bool | None = None


class _Payload(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    inputs: NonEmpty
    parameters: TgiParameters | None = None
    stream: bool | None = None


class TgiCall(msgspec.Struct, frozen=True, kw_only=True):
    """`options.n` is best_of: that many sequences, all answered, best first by mean
    log-probability (`asked` names it for its bound); `top_n` alternatives per token."""

    inputs: str
    options: SamplingOptions
    asked: tuple[SequencesAsked, ...] = ()
    top_n: int = 0
    truncate: int | None = None
    stream: bool
    details: bool
    return_full_text: bool
    seed: int | None  # reported in details when sampling
    constraint_field: str | None = None  # `$.parameters.grammar`, when given
    adapter: str | None = None  # `parameters.adapter_id`: a LoRA adapter's name


def decode_tgi(
    raw: bytes | str, *, stream: bool | None, full_text_default: bool, max_new_tokens: int
) -> TgiCall:
    """`stream` None reads the payload's own flag (POST `/`); raises GenerationError."""
    doc = decode_json_object(raw)
    strip_ignored(doc, "parameters", TgiParameters.__struct_fields__, "TGI parameters")
    try:
        payload = msgspec.convert(doc, _Payload)
    except msgspec.ValidationError as e:
        raise validation_error(e) from e
    p = payload.parameters or TgiParameters()
    streaming = bool(payload.stream) if stream is None else stream
    best_of = p.best_of or 1
    # TGI samples when asked to, or when any sampling filter differs from its neutral value.
    sampling = (
        bool(p.do_sample)
        or p.temperature not in (None, 1.0)
        or bool(p.top_k or p.top_p or p.typical_p)
    )
    prefill = bool(p.decoder_input_details)
    if p.watermark:
        raise refuse("watermark", "watermarking is not supported by this server")
    if best_of > 1:
        if streaming:
            raise refuse("best_of", "`best_of` != 1 is not supported when streaming tokens")
        if not sampling:
            raise refuse("best_of", "you must use sampling when `best_of` is > 1")
        if p.seed is not None:
            raise refuse("seed", "`seed` must not be set when `best_of` > 1")
    if prefill and streaming:
        raise refuse(
            "decoder_input_details",
            "`decoder_input_details` == true is not supported when streaming tokens",
        )
    details = bool(p.details) or prefill
    top_n = p.top_n_tokens or 0
    want_tokens = streaming or details or best_of > 1 or top_n > 0
    options = SamplingOptions(
        max_new_tokens=p.max_new_tokens or max_new_tokens,
        do_sample=sampling,
        temperature=p.temperature or 1.0,
        top_p=p.top_p or 1.0,
        top_k=p.top_k or 0,
        typical_p=p.typical_p or 1.0,
        repetition_penalty=p.repetition_penalty or 1.0,
        frequency_penalty=p.frequency_penalty or 0.0,
        seed=p.seed,
        stop=tuple(p.stop or ()),
        ignore_eos=bool(p.ignore_eos_token),
        logprobs=top_n if want_tokens else None,
        prompt_logprobs=0 if prefill else None,
        n=best_of,
    )
    grammar = None if p.grammar is None else tgi_grammar(p.grammar, "$.parameters.grammar")
    full_text = full_text_default if p.return_full_text is None else p.return_full_text
    return TgiCall(
        inputs=payload.inputs,
        options=constrained(options, grammar),
        asked=sequences_asked("$.parameters", best_of=best_of),
        top_n=top_n,
        truncate=p.truncate,
        stream=streaming,
        details=details,
        return_full_text=full_text,
        seed=p.seed if sampling else None,
        constraint_field=grammar.field if grammar is not None else None,
        adapter=p.adapter_id,
    )


# --- Answers ------------------------------------------------------------------------------------


class Token(msgspec.Struct):
    id: int
    text: str
    logprob: float | None
    special: bool


class PrefillToken(msgspec.Struct):
    id: int
    text: str
    logprob: float | None  # null for the first prompt token


class BestOfSequence(msgspec.Struct):
    generated_text: str
    finish_reason: str
    generated_tokens: int
    seed: int | None
    prefill: list[PrefillToken]
    tokens: list[Token]
    top_tokens: list[list[Token]] | UnsetType = UNSET


class Details(msgspec.Struct):
    finish_reason: str
    generated_tokens: int
    seed: int | None
    prefill: list[PrefillToken]
    tokens: list[Token]
    top_tokens: list[list[Token]] | UnsetType = UNSET
    best_of_sequences: list[BestOfSequence] | UnsetType = UNSET


class GenerateResponse(msgspec.Struct):
    generated_text: str
    details: Details | UnsetType = UNSET


class StreamDetails(msgspec.Struct):
    finish_reason: str
    generated_tokens: int
    seed: int | None
    input_length: int


class StreamResponse(msgspec.Struct):
    index: int
    token: Token
    top_tokens: list[Token] | UnsetType = UNSET
    generated_text: str | None = None
    details: StreamDetails | None = None


class ErrorResponse(msgspec.Struct):
    error: str
    error_type: str


class Info(msgspec.Struct, kw_only=True):
    model_id: str
    model_sha: str | None = None
    model_dtype: str | None = None  # as TGI writes it: torch.bfloat16, torch.float32
    model_pipeline_tag: str | None = "text-generation"
    max_concurrent_requests: int
    max_best_of: int = MAX_BEST_OF  # the MAX_BEST_OF setting
    max_stop_sequences: int = MAX_STOP_SEQUENCES
    max_input_tokens: int
    max_input_length: int  # the name before TGI 2.1, still read by older clients
    max_total_tokens: int
    validation_workers: int = 1
    max_client_batch_size: int = 1
    router: str = "llm-gateway"
    version: str
    sha: str | None = None
    docker_label: str | None = None


_ENCODER = msgspec.json.Encoder()


def _status(kind: ErrorKind) -> tuple[int, str, str]:
    """(status, error_type, message prefix) as TGI's router answers each kind."""
    match kind:
        case (
            ErrorKind.INVALID_REQUEST | ErrorKind.UNPROCESSABLE | ErrorKind.CONTEXT_LENGTH_EXCEEDED
        ):
            return 422, "validation", "Input validation error: "
        case ErrorKind.DUPLICATE_REQUEST_ID:
            return 422, "validation", "Input validation error: "
        case ErrorKind.RATE_LIMITED:
            return 429, "overloaded", "Model is overloaded: "
        case ErrorKind.UNAUTHORIZED:
            return 401, "authentication", ""
        case ErrorKind.ENGINE_ERROR:
            return 424, "generation", "Request failed during generation: "
        case ErrorKind.ENGINE_UNAVAILABLE:
            return 503, "unhealthy", ""
        case _:
            assert_never(kind)


def error_of(error: GenerationError) -> tuple[int, ErrorResponse]:
    """TGI's status and body for a failure: 422 validation, 424 generation, 429 overloaded."""
    status, error_type, prefix = _status(error.kind)
    return status, ErrorResponse(prefix + named(error), error_type)


def encode_info(info: Info) -> bytes:
    return _ENCODER.encode(info)


class TgiEncoder:
    """Writes one call's answer, or its stream events (counting `index` from 1)."""

    def __init__(self, call: TgiCall) -> None:
        self.call = call
        self._index = 0

    @staticmethod
    def token(info: TokenInfo | TopToken) -> Token:
        return Token(info.token_id, info.text, info.logprob, info.special)

    def _tops(self, info: TokenInfo) -> list[Token]:
        return [self.token(t) for t in top_tokens(info, self.call.top_n)]

    def _text(self, text: str) -> str:
        return self.call.inputs + text if self.call.return_full_text else text

    def _reason(self, sequence: GeneratedSequence) -> str:
        return stop_cause(
            sequence.finish_reason, sequence.stop_reason, self.call.options.stop_token_ids
        )

    def response(self, finished: Finished) -> GenerateResponse:
        best, *others = best_sequences(finished, self.call.options.n, by_mean=True)
        if not self.call.details:
            return GenerateResponse(self._text(best.text))
        prefill = [PrefillToken(t.token_id, t.text, t.logprob) for t in finished.prefill or ()]
        seed = self.call.seed

        def tokens(of: GeneratedSequence) -> list[Token]:
            return [self.token(t) for t in of.tokens or ()]

        def tops(of: GeneratedSequence) -> list[list[Token]] | UnsetType:
            return [self._tops(t) for t in of.tokens or ()] if self.call.top_n else UNSET

        details = Details(
            self._reason(best), best.generated_tokens, seed, prefill, tokens(best), tops(best)
        )
        if others:
            details.best_of_sequences = [
                BestOfSequence(
                    self._text(s.text),
                    self._reason(s),
                    s.generated_tokens,
                    seed,
                    prefill,
                    tokens(s),
                    tops(s),
                )
                for s in others
            ]
        return GenerateResponse(self._text(best.text), details)

    def document(self, finished: Finished, *, listed: bool) -> bytes:
        """The answer; POST `/` wraps it in a one-element list, as TGI does."""
        answer = self.response(finished)
        return _ENCODER.encode([answer] if listed else answer)

    def events(self, tokens: list[TokenInfo], final: Finished | None) -> bytes:
        """One event per token; the prompt's last adds generated_text (and details)."""
        out: list[bytes] = []
        last = len(tokens) - 1
        for i, info in enumerate(tokens):
            self._index += 1
            event = StreamResponse(self._index, self.token(info))
            if self.call.top_n:
                event.top_tokens = self._tops(info)
            if final is not None and i == last:
                new = final.sequences[0]
                event.generated_text = self._text(new.text)
                if self.call.details:
                    event.details = StreamDetails(
                        self._reason(new), new.generated_tokens, self.call.seed, final.prompt_tokens
                    )
            out.append(sse_event(_ENCODER.encode(event)))
        return b"".join(out)


def error_event(error: GenerationError) -> bytes:
    """A failure inside a stream: one `data:` event carrying TGI's error body."""
    return sse_event(_ENCODER.encode(error_of(error)[1]))


def error_body(error: GenerationError) -> tuple[int, bytes]:
    status, body = error_of(error)
    return status, _ENCODER.encode(body)
