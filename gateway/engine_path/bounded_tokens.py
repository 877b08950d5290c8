"""A text's tokens, tokenized only as far as a length check needs: the embedding routes take
inputs up to the body's size (4 MiB), and tokenizing all of one costs seconds of a core
(all-MiniLM-L6-v2's tokenizer: 2.6 s for 4 MiB of words) that the engines share, where the
model keeps a few hundred tokens of it.

A text longer than one chunk is tokenized a chunk at a time from the side truncation keeps,
until the tokens are `MARGIN` past the limit: the text then has more than the model takes
(refused, or cut at that side). Chunks end at whitespace where one is near, so the tokens on
each side of a boundary are those the whole text's tokenization gives (the words are split at
whitespace first); only a chunk with no whitespace in its last half is cut inside a word, and
that boundary lies at least `MARGIN` tokens past any cut. A chunk holds enough characters for
the limit's tokens at the vocabulary's longest, so an ordinary text takes one chunk; text of
whitespace or unknown words (tokens of no vocabulary length) takes more, each cheap.
"""

from __future__ import annotations

import re
import weakref
from typing import Any, Literal

MARGIN = 16  # tokens past the limit: a boundary this far from a cut cannot change what is kept

_WHITESPACE = re.compile(r"\s")


def bounded_encode(
    tokenizer: Any, text: str, limit: int, side: Literal["left", "right"]
) -> list[int]:
    """`text`'s tokens (no special tokens) when it has at most `limit` of them; else at least
    `limit + MARGIN` of them, those at `side` ("right": the first, "left": the last)."""
    chunk = max((limit + MARGIN) * longest_token(tokenizer), 1)
    if len(text) <= chunk:
        return _encode(tokenizer, text)
    found: list[list[int]] = []
    count, start, stop = 0, 0, len(text)
    while start < stop and count < limit + MARGIN:
        if side == "right":
            end = _boundary_before(text, start, min(start + chunk, stop))
            piece, start = text[start:end], end
            found.append(_encode(tokenizer, piece))
        else:
            begin = _boundary_after(text, max(stop - chunk, start), stop)
            piece, stop = text[begin:stop], begin
            found.insert(0, _encode(tokenizer, piece))
        count += len(found[-1] if side == "right" else found[0])
    return [token for ids in found for token in ids]


def _boundary_before(text: str, start: int, end: int) -> int:
    """Where a chunk from `start` ends: at the last whitespace in its second half (the next
    chunk starts with it), else at `end`."""
    if end >= len(text):
        return end
    half = start + (end - start) // 2
    last = None
    for match in _WHITESPACE.finditer(text, half, end):
        last = match.start()
    return last if last is not None and last > start else end


def _boundary_after(text: str, begin: int, stop: int) -> int:
    """Where a chunk ending at `stop` begins, going left: at the first whitespace in its first
    half (this chunk starts with it), else at `begin`."""
    if begin <= 0:
        return 0
    match = _WHITESPACE.search(text, begin, begin + (stop - begin) // 2)
    return match.start() if match is not None else begin


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


# By the tokenizer object, weakly: a model unloaded takes its tokenizer's entry with it (an
# lru_cache here held the last eight tokenizers, about 50 MiB each, past their models' unloads).
_LONGEST: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def longest_token(tokenizer: Any) -> int:
    """The most characters one token of `tokenizer` stands for."""
    try:
        return _LONGEST[tokenizer]
    except KeyError:
        pass
    except TypeError:  # not weakly referenceable: computed each time (a few ms)
        return _longest_in(tokenizer)
    longest = _LONGEST[tokenizer] = _longest_in(tokenizer)
    return longest


def _longest_in(tokenizer: Any) -> int:
    return max((len(token) for token in tokenizer.get_vocab()), default=1)
