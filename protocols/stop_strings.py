"""Stop strings, in one place: finding one in the text, cutting there with exactly the tokens of
the kept text, what came beyond it, `include_stop_str_in_output`, and holding back streamed text
that may begin one. The engine (gateway/engine/vllm_engine.py) meets each request's stop
strings through `StopStrings`; the engine path (gateway/engine_path/generation.py) and the
control session hold streamed text in a `Holdback`.

vLLM ends a request at a stop string in its own text, but when it streams it holds back the
last (longest stop string - 1) characters of text and none of the token ids, so a Delta's
text and ids drift apart. A streamed request asks the engine for every token's text at once
(`StopStrings.kept_by_engine`: the stop string kept in the output); here a Delta's text, token
ids and log-probabilities are held as one while its text could be the start of a stop string,
and go out together: every Delta carries exactly the text of its tokens. A Holdback can outlive
an engine request (a paused generation keeps what it holds), so a stop string that spans two
requests is found here: the engine sees only its own request's text.

Where a stop string is cut off, the Delta keeps only the tokens whose text it still shows: a
token the cut splits (" mission" before the stop string "mission to") is replaced by the
tokens of its kept text (" "), tokenized afresh and with no log-probability, so ids, text and
the history a continuation resumes from all describe what the client was sent. vLLM cuts the
text of a whole (not streamed) answer at the stop string but keeps every token id (the stop
string's, and one that runs past it): `StopStrings.cut` gives it the tokens of its text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from protocols.events import Delta, TokenInfo

# A text's tokens as the model's tokenizer makes them, with no log-probability (NaN).
Retokenize = Callable[[str], list[TokenInfo]]
# A token's own text, as the tokenizer spells it alone.
Spell = Callable[[int], str]


def stop_string_of(stop_reason: int | str | None) -> str | None:
    """The stop string that ended a sequence, from the engine's stop reason (a stop token's id,
    or the stop string); None when none did."""
    return stop_reason if isinstance(stop_reason, str) else None


class StopStrings:
    """One engine request's stop strings, as the engine meets them: `spell` gives a token's
    own text, `retokenize` the tokens of a text cut short."""

    def __init__(
        self,
        stops: Sequence[str],
        include_in_output: bool,
        spell: Spell,
        retokenize: Retokenize,
    ) -> None:
        self._stops = tuple(stops)
        self._include = include_in_output
        self._spell = spell
        self._retokenize = retokenize

    @property
    def kept_by_engine(self) -> bool:
        """Whether a streamed request asks the engine to keep its stop strings in the text
        (`include_stop_str_in_output`) though the client did not: vLLM would hold back text
        without its tokens, a `Holdback` holds both and cuts the stop string itself."""
        return bool(self._stops) and not self._include

    def streamed_text(self, text: str, is_eos: bool, token_ids: Sequence[int]) -> str:
        """A streamed step's text: a stop token's text only when the client asked for it
        (keeping the stop strings makes the engine keep an end token's text too)."""
        if self.kept_by_engine and is_eos and token_ids:
            return text.removesuffix(self._spell(token_ids[-1]))
        return text

    def beyond(
        self,
        text: str,
        stop_reason: int | str | None,
        token_ids: Sequence[int],
        tokens: list[TokenInfo] | None,
    ) -> str:
        """The text of a last step's tokens past the stop string that ended it (the engine cuts
        it from `text`)."""
        if stop_string_of(stop_reason) is None:
            return ""
        whole = "".join(t.text for t in self._spelled(token_ids, tokens))
        return whole[len(text) :] if whole.startswith(text) else ""

    def cut(
        self,
        text: str,
        stop_reason: int | str | None,
        token_ids: Sequence[int],
        tokens: list[TokenInfo] | None,
    ) -> Delta | None:
        """A whole sequence that ended at a stop string, with only the tokens of its `text`
        (the engine's, cut at the stop string); None when no stop string ended it."""
        if stop_string_of(stop_reason) is None:
            return None
        pieces = self._spelled(token_ids, tokens)
        if "".join(t.text for t in pieces).startswith(text):
            parts = [Delta(0, t.text, [t.token_id], [t]) for t in pieces]
            return described(parts, text, self._retokenize)
        # tokens whose text alone is not their text in the sequence (a split character)
        fresh = self._retokenize(text)
        return Delta(0, text, [t.token_id for t in fresh], fresh)

    def _spelled(self, token_ids: Sequence[int], tokens: list[TokenInfo] | None) -> list[TokenInfo]:
        """Each token with its own text (the engine's, where it gave tokens)."""
        return tokens or [TokenInfo(i, self._spell(i), float("nan")) for i in token_ids]


class Holdback:
    def __init__(self) -> None:
        self.held: list[Delta] = []
        self.stopped_at: str | None = None  # a stop string found across engine requests
        self._stops: tuple[str, ...] = ()
        self._keep_stop = False
        self._earlier = 0  # characters of held text from an earlier engine request
        self._retokenize: Retokenize = _untokenized

    @property
    def held_ids(self) -> list[int]:
        return [token_id for piece in self.held for token_id in piece.token_ids]

    def begin(self, stops: Sequence[str], keep_stop: bool, retokenize: Retokenize) -> None:
        """An engine request starts (or continues the sequence) with these stop strings;
        `retokenize` tokenizes what is left of a token a stop string cuts."""
        self._stops, self._keep_stop = tuple(stops), keep_stop
        self._retokenize = retokenize
        self.stopped_at = None
        self._earlier = len(_text(self.held))

    def push(self, piece: Delta) -> Delta | None:
        """Hold the engine's next piece; what may go out now, if anything.

        When the held text completes a stop string that began in an earlier request,
        `stopped_at` is set and the Delta returned is the generation's last.
        """
        if piece.text and not self.held and not self._stops:
            return piece  # the common case, once per token: nothing to hold
        self.held.append(piece)
        text = _text(self.held)
        if (stopped := self._spanning(text)) is not None:
            return stopped
        safe = self._safe_length(text)
        length = count = 0
        for k, held in enumerate(self.held):
            length += len(held.text)
            if length > safe:
                break
            if held.text:
                count = k + 1
        if not count:
            return None
        released = self._release(count, None, None)
        self._earlier = max(self._earlier - len(released.text), 0)
        return released

    def finish(self, piece: Delta, stop_string: str | None, beyond: str = "") -> Delta:
        """The engine's last piece: everything held goes out, less the stop string.

        `beyond` is the text of the piece's last token past the stop string's end, which the
        engine cut from the piece's text: that token is split too.
        """
        self.held.append(piece)
        text = _text(self.held)
        if (stopped := self._spanning(text)) is not None:
            return stopped
        if stop_string is not None and not self._keep_stop:
            text = text.removesuffix(stop_string)
        if beyond:
            self.held[-1] = Delta(piece.index, piece.text + beyond, piece.token_ids, piece.tokens)
        cut = text if text != _text(self.held) else None  # an end token keeps its id
        return self._release(len(self.held), cut, piece.finish_reason)

    def _spanning(self, text: str) -> Delta | None:
        """All that is held, up to a stop string that began in an earlier request, if any."""
        spanning = [
            (found + len(stop), found, stop)
            for stop in self._stops
            if 0 <= (found := text.find(stop)) < self._earlier
        ]
        if not spanning:
            return None
        end, start, self.stopped_at = min(spanning)
        return self._release(len(self.held), text[: end if self._keep_stop else start], "stop")

    def _safe_length(self, text: str) -> int:
        """How much of `text` cannot be the start of a stop string."""
        longest = max((len(s) for s in self._stops), default=0)
        for start in range(max(len(text) - longest + 1, 0), len(text)):
            tail = text[start:]
            if any(stop.startswith(tail) for stop in self._stops):
                return start
        return len(text)

    def _release(self, count: int, text: str | None, finish_reason: str | None) -> Delta:
        pieces, self.held = self.held[:count], self.held[count:]
        out = _joined(pieces) if text is None else described(pieces, text, self._retokenize)
        out.finish_reason = finish_reason
        return out


def described(pieces: Sequence[Delta], text: str, retokenize: Retokenize) -> Delta:
    """`text`, a prefix of the pieces' text, with exactly the tokens that make it up.

    Whole pieces, then whole tokens of the piece the end of `text` falls in (where its
    tokens' texts are known), keep their ids and log-probabilities; the text left after them
    is tokenized afresh.
    """
    kept: list[Delta] = []
    covered = 0
    for piece in pieces:
        if covered == len(text):
            break
        if covered + len(piece.text) > len(text):
            kept.extend(_whole_tokens(piece, len(text) - covered))
            break
        kept.append(piece)
        covered += len(piece.text)
    out = _joined(kept) if kept else Delta(pieces[0].index if pieces else 0, "", [], None)
    rest = text[len(out.text) :]
    if rest:
        fresh = retokenize(rest)
        out.token_ids.extend(t.token_id for t in fresh)
        if any(p.tokens is not None for p in pieces):
            out.tokens = [*(out.tokens or ()), *fresh]
    out.text = text
    return out


def _whole_tokens(piece: Delta, length: int) -> list[Delta]:
    """The tokens of `piece` whose text lies within its first `length` characters, as pieces:
    none unless each token's text is known and they make up the piece's text."""
    tokens = piece.tokens
    if tokens is None or len(tokens) != len(piece.token_ids):
        return []
    if "".join(t.text for t in tokens) != piece.text:
        return []
    kept: list[Delta] = []
    covered = 0
    for token in tokens:
        covered += len(token.text)
        if covered > length or (covered == length and not token.text):
            break
        kept.append(Delta(piece.index, token.text, [token.token_id], [token]))
    return kept


def _joined(pieces: Sequence[Delta]) -> Delta:
    with_tokens = [p.tokens for p in pieces if p.tokens is not None]
    return Delta(
        pieces[0].index,
        _text(pieces),
        [token_id for p in pieces for token_id in p.token_ids],
        [t for tokens in with_tokens for t in tokens] if with_tokens else None,
    )


def _text(pieces: Sequence[Delta]) -> str:
    return "".join(p.text for p in pieces)


def _untokenized(text: str) -> list[TokenInfo]:
    raise AssertionError("Holdback.begin sets the tokenizer before any text is cut")
