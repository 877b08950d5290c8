"""Streamed text held back with its tokens while it could still begin a stop string.

vLLM ends a request at a stop string in its own text, but when it streams it holds back the
last (longest stop string - 1) characters of text and none of the token ids, so a Delta's
text and ids drift apart. The engine adapter asks for every token's text at once (the stop
string kept in the output); here a Delta's text, token ids and log-probabilities are held as
one while its text could be the start of a stop string, and go out together: every Delta
carries exactly the text of its tokens. A Holdback can outlive an engine request (a paused
generation keeps what it holds), so a stop string that spans two requests is found here: the
engine sees only its own request's text.
"""

from __future__ import annotations

from collections.abc import Sequence

from protocols.generation import Delta


class Holdback:
    def __init__(self) -> None:
        self.held: list[Delta] = []
        self.stopped_at: str | None = None  # a stop string found across engine requests
        self._stops: tuple[str, ...] = ()
        self._keep_stop = False
        self._earlier = 0  # characters of held text from an earlier engine request

    @property
    def held_ids(self) -> list[int]:
        return [token_id for piece in self.held for token_id in piece.token_ids]

    def begin(self, stops: Sequence[str], keep_stop: bool) -> None:
        """An engine request starts (or continues the sequence) with these stop strings."""
        self._stops, self._keep_stop = tuple(stops), keep_stop
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

    def finish(self, piece: Delta, stop_string: str | None) -> Delta:
        """The engine's last piece: everything held goes out, less the stop string."""
        self.held.append(piece)
        text = _text(self.held)
        if (stopped := self._spanning(text)) is not None:
            return stopped
        if stop_string is not None and not self._keep_stop:
            text = text.removesuffix(stop_string)
        return self._release(len(self.held), text, piece.finish_reason)

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
        with_tokens = [p.tokens for p in pieces if p.tokens is not None]
        return Delta(
            pieces[0].index,
            _text(pieces) if text is None else text,
            [token_id for p in pieces for token_id in p.token_ids],
            [t for tokens in with_tokens for t in tokens] if with_tokens else None,
            finish_reason,
        )


def _text(pieces: Sequence[Delta]) -> str:
    return "".join(p.text for p in pieces)
