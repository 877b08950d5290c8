"""An embedding input is tokenized only as far as its length check needs
(gateway/engine_path/bounded_tokens.py): the tokens kept are those the whole text's
tokenization gives, and a text of megabytes costs the tokenizer a chunk, not the whole text.
On all-MiniLM-L6-v2's own tokenizer; no engine."""

from __future__ import annotations

import random
from typing import Any, Literal

import pytest
from transformers import AutoTokenizer

from gateway.engine.pooling_engine import default_embedding_model
from gateway.engine_path.bounded_tokens import MARGIN, bounded_encode

Side = Literal["left", "right"]
WORDS = ["hello", "world", "disestablishment", "\u4e00\u4e8c", "a" * 150, "x.y", "café", "\n"]


class CountingTokenizer:
    """The tokenizer, counting the characters it was given."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.characters = 0

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        self.characters += len(text)
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def get_vocab(self) -> dict[str, int]:
        return dict(self._tokenizer.get_vocab())


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(default_embedding_model()))


def _whole(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("side", ["right", "left"])
def test_the_tokens_kept_are_the_whole_texts(tokenizer: Any, side: Side) -> None:
    draw = random.Random(7)
    for _ in range(60):
        count = draw.randint(1, 3000)
        text = "".join(draw.choice(WORDS) + draw.choice([" ", "", "\t"]) for _ in range(count))
        limit = draw.choice([0, 1, 10, 254, 510])
        whole, got = _whole(tokenizer, text), bounded_encode(tokenizer, text, limit, side)
        if len(whole) <= limit:
            assert got == whole
            continue
        assert len(got) >= min(limit + MARGIN, len(whole))
        if side == "right":
            assert got[:limit] == whole[:limit]
        else:
            assert got[len(got) - limit :] == whole[len(whole) - limit :]


@pytest.mark.parametrize("side", ["right", "left"])
def test_megabytes_of_words_cost_one_chunk(tokenizer: Any, side: Side) -> None:
    counting = CountingTokenizer(tokenizer)
    text = "hello world " * 350_000  # 4.2 MB, 700,000 tokens: seconds of a core whole
    got = bounded_encode(counting, text, 254, side)
    assert 254 + MARGIN <= len(got) < 2_000
    assert counting.characters < 20_000
