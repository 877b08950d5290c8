"""LMI `/invocations` (lmi-invocations.md): the engine's events written as the spec's JSON
documents, jsonlines or server-sent events (protocols/lmi.py's shapes), no I/O.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from protocols.events import Finished, TokenInfo, TopToken, best_sequences, stop_cause, top_tokens
from protocols.lmi import (
    MEDIA_TYPES,
    Answer,
    BestOfSequence,
    CompatToken,
    Details,
    Line,
    LmiToken,
    Output,
    Outputs,
    Token,
)
from protocols.lmi_requests import LmiRequest
from protocols.sse import sse_event

_ENCODER = msgspec.json.Encoder()


class LmiEncoder:
    """Writes one request's answers in its output form (built once per request)."""

    def __init__(self, request: LmiRequest) -> None:
        self.request = request
        self.media_type = MEDIA_TYPES[request.output]
        self._compat = request.tgi_compat
        self._top_n = request.top_n
        self._stop_ids = request.options.stop_token_ids

    def frame(self, data: bytes) -> bytes:
        return sse_event(data) if self.request.output == "sse" else data + b"\n"

    def token(self, info: TokenInfo | TopToken, top_n: int = 0) -> Token:
        top: list[Any] | UnsetType = UNSET
        if top_n and isinstance(info, TokenInfo):
            top = [self.token(t) for t in top_tokens(info, top_n)]
        if self._compat:
            return CompatToken(info.token_id, info.text, info.logprob, info.special, top)
        return LmiToken(info.token_id, info.text, info.logprob, info.special, top)

    def _tokens(self, infos: list[TokenInfo] | None) -> list[Any]:
        return [self.token(t, self._top_n) for t in infos or ()]

    def _prefill(self, finished: Finished) -> list[Any] | UnsetType:
        return UNSET if finished.prefill is None else [self.token(t) for t in finished.prefill]

    def answer(self, prompt: str, finished: Finished) -> Answer:
        request = self.request
        head = prompt if request.return_full_text else ""
        if request.options.num_beams > 1:  # ranked by the search's own score
            best, *others = finished.sequences[: request.returned]
        else:
            best, *others = best_sequences(finished, request.returned)
        if not request.details:
            return Answer(head + best.text)
        prefill = self._prefill(finished)
        details = Details(
            stop_cause(best.finish_reason, best.stop_reason, self._stop_ids),
            best.generated_tokens,
            prompt,
            self._tokens(best.tokens),
            prefill,
        )
        if others:
            details.best_of_sequences = [
                BestOfSequence(
                    stop_cause(s.finish_reason, s.stop_reason, self._stop_ids),
                    s.generated_tokens,
                    self._tokens(s.tokens),
                    head + s.text,
                    prefill,
                )
                for s in others
            ]
        return Answer(head + best.text, details)

    def document(self, answers: list[Answer]) -> bytes:
        """A rolling batch answer (a one-element list in TGI mode) or a dynamic batch's list."""
        if self.request.dynamic or self._compat:
            return _ENCODER.encode(answers)
        return _ENCODER.encode(answers[0])

    def lines(self, prompt: str, tokens: list[TokenInfo], final: Finished | None) -> bytes:
        """One line per token; the prompt's last line adds generated_text (and details)."""
        lines = [Line(self.token(t, self._top_n)) for t in tokens]
        if final is not None:
            if not lines:
                lines.append(Line())
            last = lines[-1]
            new = final.sequences[0]
            last.generated_text = (prompt if self.request.return_full_text else "") + new.text
            if self.request.details:
                reason = stop_cause(new.finish_reason, new.stop_reason, self._stop_ids)
                prefill = self._prefill(final)
                last.details = Details(reason, new.generated_tokens, prompt, prefill=prefill)
        return b"".join(self.frame(_ENCODER.encode(line)) for line in lines)

    def outputs(self, texts: list[str]) -> bytes:
        """A dynamic batch stream line: the new text of every prompt, in payload order."""
        return self.frame(_ENCODER.encode(Outputs(texts)))

    def failed_answer(self, message: str) -> bytes:
        return failed_answer(message, tgi_compat=self._compat)

    def failed_line(self, message: str) -> bytes:
        return failed_line(message, self.request.output, tgi_compat=self._compat)


def failed_answer(message: str, *, tgi_compat: bool) -> bytes:
    """The spec's answer to a rolling request whose generation failed (or could not start)."""
    answer = Answer("", Details("error", None, None, None, error_msg=message))
    return _ENCODER.encode([answer] if tgi_compat else answer)


def failed_line(message: str, output: Output, *, tgi_compat: bool) -> bytes:
    """The spec's last line of a stream whose generation failed (or could not start)."""
    details = Details("error", None, None)
    if tgi_compat:
        token: Token = CompatToken(-1, "", -1.0, True)
        line = Line(token, "", details, error=message, error_type="generation")
    else:
        line = Line(LmiToken(-1, "", -1.0, True, error_msg=message), "", details)
    data = _ENCODER.encode(line)
    return sse_event(data) if output == "sse" else data + b"\n"
