"""What a control-protocol client may have missed of its latest generation, for `reattach`.

The server cannot know which messages a dropped connection delivered, so a session that may be
reattached (REATTACH_SECONDS > 0) keeps every token message of its latest generation, from
its `init`, and the generation's terminal message (its `completion` or `error`) once it came.
A reattaching client says how many token messages it has (`received`) and gets the rest.

Bounded: one kept message per token message (at most one per generated token, plus the one
that closes the generation: the context length bounds them), each without its
`generated_text`, the whole text so far, which would make the kept bytes grow with the square
of the length: it is rebuilt from the generation's latest text on replay.
"""

from __future__ import annotations

import msgspec

from protocols.control import Completion, Error, Init, ServerMessage, Token


class Replay:
    """The token messages of the latest generation and its terminal message, kept compact."""

    def __init__(self) -> None:
        self._tokens: list[tuple[Token, int]] = []  # each without generated_text, and its length
        self._text = ""  # the latest generated_text: every kept one is a prefix of it
        self._terminal: Completion | Error | None = None

    @property
    def token_messages(self) -> int:
        return len(self._tokens)

    def keep(self, message: ServerMessage, ended: bool) -> None:
        """Keeps what a reattaching client may need of `message`; `ended`: the session's
        generation is over, so a `completion` or an `error` is its terminal message (an error
        answering a control while it runs is not)."""
        match message:
            case Init():
                self._tokens.clear()
                self._text = ""
                self._terminal = None
            case Token():
                self._text = message.generated_text
                compact = msgspec.structs.replace(message, generated_text="")
                self._tokens.append((compact, len(message.generated_text)))
            case Completion() | Error() if ended:
                self._terminal = message

    def since(self, received: int) -> list[ServerMessage]:
        """The token messages after the first `received`, then the terminal message if the
        generation ended, each as it was sent."""
        missed: list[ServerMessage] = [
            msgspec.structs.replace(token, generated_text=self._text[:end])
            for token, end in self._tokens[received:]
        ]
        if self._terminal is not None:
            missed.append(self._terminal)
        return missed
