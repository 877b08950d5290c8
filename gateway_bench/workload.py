"""The seeded workload: prompts of exact token lengths, the same for every target.

A prompt is a run of whole words, each one token of the served model's tokenizer with its
leading space (" the", " river", ...), so a prompt of N words is N tokens and stays N tokens
when one word is swapped. The seed fixes every word but the first, which is drawn per run
and per target: a target never finds another target's prompt in vLLM's prefix cache (the
gateway's protocols share one engine), nor a server an earlier run's, and no two requests of
a run share a prefix block.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

_SPACE_MARKERS = ("Ġ", "▁")  # byte-level BPE and SentencePiece word starts
_SAMPLE_CHECKS = 4


class Request(msgspec.Struct, frozen=True):
    request_id: str
    prompt: str
    max_new_tokens: int
    prompt_tokens: int
    body: dict[str, Any] = msgspec.field(default_factory=dict)  # added to an OpenAI body


def word_list(vocabulary: Sequence[str]) -> list[str]:
    """Lowercase ASCII words of 3-8 letters that the tokenizer holds as one token each."""
    words = {
        token[1:]
        for token in vocabulary
        if token[:1] in _SPACE_MARKERS
        and 3 <= len(token) - 1 <= 8
        and token[1:].isascii()
        and token[1:].isalpha()
        and token[1:].islower()
    }
    return sorted(words)


def text_of(words: Sequence[str]) -> str:
    return "".join(" " + word for word in words)


class Workload:
    """Seeded prompts: `prompt(stream, index)` is the same words in every run with this seed."""

    def __init__(
        self,
        words: Sequence[str],
        *,
        seed: int,
        prompt_tokens: tuple[int, int],
        output_tokens: int,
        exact: bool = True,
    ) -> None:
        if len(words) < 100:
            raise ValueError("the tokenizer offers too few one-token words to build prompts")
        self.words = list(words)
        self.seed = seed
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.exact = exact  # prompt lengths verified with the tokenizer
        self.run = uuid.uuid4().hex[:8]  # request_ids must not meet a previous run's history

    @classmethod
    def from_tokenizer(
        cls, tokenizer: Any, *, seed: int, prompt_tokens: tuple[int, int], output_tokens: int
    ) -> Workload:
        words = word_list(list(tokenizer.get_vocab()))
        workload = cls(words, seed=seed, prompt_tokens=prompt_tokens, output_tokens=output_tokens)
        workload.exact = workload.check(lambda text: len(tokenizer.encode(text)))
        return workload

    def check(self, count: Callable[[str], int]) -> bool:
        """Whether a few sample prompts are as many tokens as they are words."""
        for i in range(_SAMPLE_CHECKS):
            words = self.words_for("check", i, 64 + 37 * i)
            if count(text_of(words)) != len(words):
                return False
        return True

    def words_for(self, stream: str, index: int, length: int) -> list[str]:
        rng = random.Random(f"{self.seed}:{stream}:{index}")
        return rng.choices(self.words, k=length)

    def salted(self, words: Sequence[str], salt: str) -> list[str]:
        """`words` with its first word replaced by one picked from `salt`."""
        first = random.Random(f"{self.seed}:salt:{salt}").choice(self.words)
        if words and first == words[0]:
            first = self.words[(self.words.index(first) + 1) % len(self.words)]
        return [first, *words[1:]]

    def length_of(self, stream: str, index: int) -> int:
        low, high = self.prompt_tokens
        return random.Random(f"{self.seed}:length:{stream}:{index}").randint(low, high)

    def requests(
        self, target: str, stream: str, count: int, output_tokens: int | None = None
    ) -> list[Request]:
        """`count` requests of `stream` (a sweep step, the warm-up...) for one target."""
        new_tokens = output_tokens or self.output_tokens
        out: list[Request] = []
        for i in range(count):
            words = self.words_for(stream, i, self.length_of(stream, i))
            words = self.salted(words, f"{self.run}:{target}")
            request_id = f"bench-{self.run}-{target}-{stream}-{i}"
            out.append(Request(request_id, text_of(words), new_tokens, len(words)))
        return out

    def request_id(self, *parts: object) -> str:
        return "-".join(["bench", self.run, *(str(p) for p in parts)])
