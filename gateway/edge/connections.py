"""Connection bounds uvicorn lacks, on its own HTTP protocol (httptools), before any request
reaches the app: a request head must arrive whole within HEADER_TIMEOUT_SECONDS of its first
byte, and within 64 KiB; a connection with no request under way closes after
KEEP_ALIVE_SECONDS (uvicorn's keep-alive timer, armed here from the moment a connection
opens too); a connection past MAX_CONNECTIONS open at once, or past
MAX_CONNECTIONS_PER_ADDRESS from its address, is answered 503 and closed as it opens.

No timer here runs while a request is under way (an answer may stream for minutes), nor on
an upgraded connection, which leaves this protocol for uvicorn's WebSocket one (whose pings
end a dead peer): a WebSocket idle between messages stays open. The caps count uvicorn's own
set of open connections, WebSockets included. uvicorn's `limit_concurrency` is not the cap: it
is checked only once a request's head is complete (connections that never send one would all
be held), never for a WebSocket handshake, and counts the connection asking (N serves N - 1).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any, ClassVar, NamedTuple

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

MAX_HEAD_BYTES = 64 * 1024  # request line and headers (nginx's 4 x 8k buffers, h11's 16 KiB)
OWN_FILES = 1024  # the process's files and sockets besides its clients' (the engine's, logs...)
log = logging.getLogger(__name__)


class ConnectionBounds(NamedTuple):
    header_timeout_seconds: float
    max_connections: int  # 0: none
    max_connections_per_address: int  # 0: none


class BoundedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds of this module: `bounded_http` makes one
    per server, its `bounds` set."""

    bounds: ClassVar[ConnectionBounds]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_message = False  # from a message's first byte to its body's end
        self._head_deadline: asyncio.TimerHandle | None = None
        self._head_bytes = 0  # as read: a head still arriving, however it is split
        self._parsed_bytes = 0  # as parsed: a head that arrived in one read counts too
        self._refused = False  # answered 431 mid-parse: the parser's callbacks do nothing more

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        refusal = self._over_a_cap()
        if refusal is not None:
            log.warning("refused a connection from %s: %s", self._address(), refusal)
            self._answer(503, "Too many connections", retry_after=True)
            return
        # Idle until its first request, as between two: uvicorn arms this only after a response.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if not self._in_message:  # any byte between requests begins a head (CR LF included)
            self._start_head_deadline()
        super().data_received(data)
        if self._head_deadline is None:  # the head is complete: the rest is uvicorn's
            return
        self._head_bytes += len(data)
        if self._head_bytes > MAX_HEAD_BYTES:
            self._refuse_head()

    # httptools' callbacks: a message's first byte, its URL and each header as parsed, its head
    # complete, its body, its end. One read may hold a whole head (and more): httptools parses
    # it all before `data_received` above could count it, so the parsed parts count here, and
    # a head past the bound never reaches uvicorn's `on_headers_complete`, which starts the app.
    def on_message_begin(self) -> None:
        if self._refused:
            return
        super().on_message_begin()
        self._in_message = True
        self._parsed_bytes = 0
        self._start_head_deadline()  # a pipelined request's head, begun mid-read

    def on_url(self, url: bytes) -> None:
        if not self._refused:
            self._parsed(len(url))
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._refused:
            self._parsed(len(name) + len(value) + 4)  # `: ` and CR LF
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._stop_head_deadline()
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        super().on_message_complete()
        self._in_message = False

    def _parsed(self, size: int) -> None:
        self._parsed_bytes += size
        if self._parsed_bytes > MAX_HEAD_BYTES:
            self._refuse_head()

    def _refuse_head(self) -> None:
        self._refused = True
        self._stop_head_deadline()
        if not self.transport.is_closing():
            self._answer(431, "Request header fields too large")

    def _start_head_deadline(self) -> None:
        if self._head_deadline is None:
            self._head_bytes = 0
            self._head_deadline = self.loop.call_later(
                self.bounds.header_timeout_seconds, self._head_too_slow
            )

    def _stop_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        if not self.transport.is_closing():
            log.debug(
                "closed a connection from %s: its request head came too slowly", self._address()
            )
            self._answer(408, "Request header timeout")

    def _over_a_cap(self) -> str | None:
        """Why this connection, already counted among the open ones, is one too many."""
        total, per_address = self.bounds.max_connections, self.bounds.max_connections_per_address
        if total and len(self.connections) > total:
            return f"{len(self.connections)} connections open, MAX_CONNECTIONS is {total}"
        address = self._address()
        # No address can be past the cap while fewer are open in all: no count needed.
        if not per_address or address is None or len(self.connections) <= per_address:
            return None
        mine = sum(_address_of(c) == address for c in self.connections)
        if mine > per_address:
            return f"{mine} connections open, MAX_CONNECTIONS_PER_ADDRESS is {per_address}"
        return None

    def _address(self) -> str | None:
        return None if self.client is None else self.client[0]

    def _answer(self, status: int, message: str, retry_after: bool = False) -> None:
        """A plain-text answer, then the connection closed: no request of it reaches the app."""
        body = message.encode("ascii")
        head = [STATUS_LINE[status]]
        head += [
            name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers
        ]
        head.append(b"content-type: text/plain; charset=utf-8\r\n")
        head.append(b"content-length: %d\r\n" % len(body))
        if retry_after:
            head.append(b"retry-after: 1\r\n")
        head.append(b"connection: close\r\n\r\n")
        self.transport.write(b"".join(head) + body)
        self.transport.close()


def _address_of(connection: object) -> str | None:
    client = getattr(connection, "client", None)  # every uvicorn protocol's peer, once made
    return None if client is None else str(client[0])


def bounded_http(bounds: ConnectionBounds) -> type[BoundedHttpProtocol]:
    """uvicorn's `http` protocol class for one server, with its bounds."""
    return type("GatewayHttpProtocol", (BoundedHttpProtocol,), {"bounds": bounds})


def raise_open_file_limit(max_connections: int) -> None:
    """The process's soft open-file limit raised to hold MAX_CONNECTIONS (toward the hard limit,
    as vLLM's own server raises it): past the limit, accepting fails for every client, where the
    cap would have refused only the extra ones. Too low a hard limit is logged."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = (max_connections or 65536) + OWN_FILES
    if soft >= wanted:
        return
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < wanted:
        log.warning(
            "open files are limited to %d (ulimit -n): past about %d connections, new ones fail "
            "before MAX_CONNECTIONS (%d) refuses them",
            target,
            target - OWN_FILES,
            max_connections,
        )
