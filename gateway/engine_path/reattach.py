"""REATTACH_SECONDS: control-protocol generations whose connection dropped, waiting for their
client to come back (docs/CONTROL.md, "Reattaching").

A connection that drops while its generation runs or is paused leaves it here, detached, for
REATTACH_SECONDS; a `reattach` naming its request_id, from the key that started it, takes it
over. When the grace period ends with no client, the generation is stopped (its engine
request aborted, its slot freed); one that ended meanwhile is forgotten with its kept
messages. At most MAX_RUNNING_REQUESTS generations wait at once: past that, and while the
gateway drains (no new connection could reattach), a drop stops its generation as it would
with REATTACH_SECONDS=0.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from gateway.engine_path.control_session import ControlSession
from gateway.engine_path.replay import Replay
from protocols.control import ServerMessage
from protocols.errors import invalid

log = logging.getLogger(__name__)


@dataclass
class _Waiting:
    session: ControlSession
    owner: str  # the key's SHA-256 that started it, or "" without keys
    expiry: asyncio.Task[None]


class Detached:
    def __init__(self, seconds: float, max_waiting: int) -> None:
        self.seconds = seconds
        self.max_waiting = max_waiting
        self.draining = False
        self._waiting: dict[str, _Waiting] = {}

    @property
    def enabled(self) -> bool:
        return self.seconds > 0

    def __len__(self) -> int:
        return len(self._waiting)

    def replay(self) -> Replay | None:
        """What a new session keeps for a reattaching client: nothing when reattaching is off."""
        return Replay() if self.enabled else None

    async def leave(self, session: ControlSession, owner: str) -> None:
        """Its connection ended: the session waits for its client, or stops."""
        request_id = session.request_id
        if (
            request_id is None
            or not self.enabled
            or self.draining
            or len(self._waiting) >= self.max_waiting
        ):
            await session.close()
            return
        session.detach()
        expiry = asyncio.create_task(self._expire(request_id))
        self._waiting[request_id] = _Waiting(session, owner, expiry)

    def take(
        self, request_id: str, owner: str, received: int, send: Callable[[ServerMessage], None]
    ) -> ControlSession:
        """The detached session of `request_id`, attached to `send` (the missed messages
        first); refused naming `request_id` when none waits under it for this key."""
        waiting = self._waiting.get(request_id)
        if waiting is None or waiting.owner != owner:
            raise invalid(
                f"No generation waits to be reattached as {request_id!r}: unknown, another "
                "key's, attached to a connection, or past REATTACH_SECONDS",
                "$.request_id",
            )
        waiting.session.attach(send, received)  # refused naming `received`: it keeps waiting
        del self._waiting[request_id]
        waiting.expiry.cancel()
        return waiting.session

    async def stop_all(self) -> None:
        """The drain began, or the app ends: no connection can come back, so every waiting
        generation stops, and so does one whose connection drops from now on."""
        self.draining = True
        waiting, self._waiting = list(self._waiting.values()), {}
        for w in waiting:
            w.expiry.cancel()
        await asyncio.gather(*(w.session.close() for w in waiting), return_exceptions=True)

    async def _expire(self, request_id: str) -> None:
        await asyncio.sleep(self.seconds)
        waiting = self._waiting.pop(request_id, None)
        if waiting is not None:
            log.info("%s: no client came back within REATTACH_SECONDS; stopped", request_id)
            await waiting.session.close()
