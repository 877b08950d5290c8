"""What the engine's outputs add to a sequence: `EngineStep`s, their tokens with
log-probabilities and alternatives."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from vllm import CompletionOutput, RequestOutput
from vllm.logprobs import Logprob
from vllm.v1.engine.async_llm import AsyncLLM

from gateway.engine.engine_errors import FAILED, engine_failure
from protocols.events import TokenInfo, TopToken


class EngineStep(msgspec.Struct):
    """What one engine output adds to one sequence of a request.

    `tokens` is set when logprobs were asked for; `prompt_tokens` on the first step when
    prompt logprobs were (the first token's log-probability is NaN: it has none).
    """

    text: str
    token_ids: Sequence[int]
    finished: bool
    is_eos: bool
    finish_reason: str | None
    cached_tokens: int
    tokens: list[TokenInfo] | None = None
    prompt_tokens: list[TokenInfo] | None = None
    stop_reason: int | str | None = None
    generated: int | None = None  # tokens generated, where token_ids are fewer (a stop string)
    beyond: str = ""  # the last token's text past the stop string that ended the sequence


class OutputReader:
    """Reads the engine's outputs with the model's tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._special = frozenset(int(i) for i in tokenizer.all_special_ids)

    def token(self, token_id: int, position: Mapping[int, Logprob] | None) -> TokenInfo:
        """A token with its log-probability (NaN where the engine gave none) and alternatives."""
        position = position or {}
        chosen = position.get(token_id)
        special = token_id in self._special
        text = self._text(token_id, chosen)
        logprob = chosen.logprob if chosen is not None else float("nan")
        if len(position) <= (chosen is not None):  # logprobs=0, the LMI/TGI stream's case
            return TokenInfo(token_id, text, logprob, special=special)
        others = sorted(
            (
                TopToken(tid, self._text(tid, lp), lp.logprob, tid in self._special)
                for tid, lp in position.items()
                if tid != token_id
            ),
            key=lambda t: -t.logprob,
        )
        return TokenInfo(token_id, text, logprob, tuple(others), special)

    def step(
        self,
        output: RequestOutput,
        completion: CompletionOutput,
        first: bool,
        constrained: bool = False,
    ) -> EngineStep:
        reason = completion.finish_reason
        if reason in FAILED:
            raise engine_failure(reason, constrained)
        step = EngineStep(
            completion.text,
            completion.token_ids,
            output.finished,
            _is_eos(reason, completion.stop_reason),
            reason,
            output.num_cached_tokens or 0,
            stop_reason=completion.stop_reason,
        )
        if completion.logprobs is not None:
            step.tokens = [
                self.token(tid, position)
                for tid, position in zip(completion.token_ids, completion.logprobs, strict=False)
            ]
        if first and output.prompt_logprobs is not None:
            positions = list(output.prompt_logprobs)
            prompt_ids = output.prompt_token_ids or []
            step.prompt_tokens = [
                self.token(tid, positions[i] if i < len(positions) else None)
                for i, tid in enumerate(prompt_ids)
            ]
        return step

    def piece(self, token_id: int, skip_special_tokens: bool) -> str:
        """A token's own text, as the tokenizer spells it alone."""
        return str(self.tokenizer.decode([token_id], skip_special_tokens))

    def _text(self, token_id: int, logprob: Logprob | None) -> str:
        if logprob is not None and logprob.decoded_token is not None:
            return logprob.decoded_token
        return str(self.tokenizer.decode([token_id]))


def eos_token_ids(llm: AsyncLLM, tokenizer: Any) -> frozenset[int]:
    """The tokenizer's end of sequence and the generation config's, as transformers uses."""
    configured = llm.model_config.try_get_generation_config().get("eos_token_id")
    ids = configured if isinstance(configured, list) else [configured]
    return frozenset(int(i) for i in [*ids, tokenizer.eos_token_id] if i is not None)


def _is_eos(finish_reason: str | None, stop_reason: int | str | None) -> bool:
    # "stop" with a string stop_reason was a stop string; otherwise an EOS / stop token.
    return finish_reason == "stop" and not isinstance(stop_reason, str)
