"""Connection hygiene on the real server (gateway/edge/connections.py, docs/SECURITY.md): a
request head sent a byte at a time is cut at HEADER_TIMEOUT_SECONDS, a connection with no
request under way is closed after KEEP_ALIVE_SECONDS, connections past MAX_CONNECTIONS or
MAX_CONNECTIONS_PER_ADDRESS are refused as they open, and nothing of this touches a WebSocket
or a stream in use. Raw sockets and http.client: what a slow or idle client does on the wire.

Other loopback addresses (127.0.0.2, ...) are other clients: Linux routes all of 127/8 to the
loopback interface, so a socket bound to one reaches the server from that address.

A timeout under test is set short and fired by a client that never completes what it began (a
head never ended, a connection never used); what must outlive it is sent whole while the
server's loop is paused (`_paused`), so it is in the kernel before the server arms any timer,
however slow the machine. Every refusal is read as its status line: on Linux a client reads
what the server sent before closing even when its close resets the connection.
"""

from __future__ import annotations

import http.client
import itertools
import json
import resource
import select
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager, suppress

import pytest
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import ClientConnection
from websockets.sync.connection import Connection
from websockets.uri import parse_uri

from clients import CHAT, UNENDING, connect, frames_until_done, payload, wait_for
from gateway.edge.connections import MAX_HEAD_BYTES, OWN_FILES
from serving import RunningServer

DRIP_EVERY = 0.1  # the slow client's pace: seconds between two bytes
REQUEST = b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n"
UPGRADE = (  # a WebSocket client's opening request for /ws
    b"GET /ws HTTP/1.1\r\nHost: gateway\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)
HELD = {"KEEP_ALIVE_SECONDS": "600", "HEADER_TIMEOUT_SECONDS": "600"}  # caps alone decide
# A refused WebSocket: its 503 read, or the connection closed (or reset) before it was; or,
# when the close lands mid-handshake, an AssertionError from a race inside websockets' sync
# client (its send_context, `assert self.close_deadline is None`).
REFUSED = (InvalidHandshake, ConnectionClosed, OSError, AssertionError)


def _open(server: RunningServer, address: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), source_address=(address, 0))


@contextmanager
def _paused(server: RunningServer) -> Iterator[None]:
    """The server's event loop held for the block: a connection opened in it waits in the
    kernel's backlog with what it sent, and the server accepts it (arming its timers) only
    after the block, when its first read finds the whole request there: the loop runs a
    read that is ready before a timer that came due meanwhile, and that read stops it."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        holding.set()
        release.wait()

    server.loop.loop.call_soon_threadsafe(hold)
    holding.wait()
    try:
        yield
    finally:
        release.set()


def _sent_whole(server: RunningServer, data: bytes) -> socket.socket:
    """A connection whose `data` the server finds whole as it accepts it (`_paused`)."""
    with _paused(server):
        sock = _open(server)
        sock.sendall(data)
    return sock


@contextmanager
def _sse_sent_whole(
    server: RunningServer, path: str, body: object
) -> Iterator[http.client.HTTPResponse]:
    """A streamed POST whose request the server finds whole as it accepts the connection."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port)
    try:
        with _paused(server):
            connection.sock = _open(server)
            headers = {"Content-Type": "application/json"}
            connection.request("POST", path, body=json.dumps(body), headers=headers)
        answer = connection.getresponse()
        assert answer.status == 200, answer.read()
        yield answer
    finally:
        connection.close()


def _websocket_sent_whole(server: RunningServer, path: str) -> ClientConnection:
    """A websockets client whose opening request the server finds whole as it accepts it."""
    protocol = ClientProtocol(parse_uri(server.ws + path))
    protocol.send_request(protocol.connect())
    sock = _sent_whole(server, b"".join(protocol.data_to_send()))
    ws = ClientConnection(sock, protocol, ping_interval=None)
    ws.response_rcvd.wait()  # set by the handshake's answer, or by the connection's end
    if protocol.handshake_exc is not None:
        raise protocol.handshake_exc
    return ws


def _until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (EOF, or a reset)."""
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk


def _closed_while_dripping(sock: socket.socket, drip: Iterator[int]) -> bytes:
    """Sends `drip` a byte at a time until the server closes the connection; what the server
    sent."""
    for byte in drip:
        readable, _, _ = select.select([sock], [], [], DRIP_EVERY)  # the attacker's pace
        if readable:
            break
        try:
            sock.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            break
    return _until_closed(sock)


def _served_once(server: RunningServer, address: str) -> http.client.HTTPConnection | None:
    """A keep-alive connection from `address` once served, or None if it was refused."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, source_address=(address, 0))
    try:
        connection.request("GET", "/health")
        answer = connection.getresponse()
        answer.read()
        if answer.status == 200:
            return connection
    except (ConnectionError, http.client.HTTPException):
        pass
    connection.close()
    return None


@contextmanager
def _held(
    server: RunningServer, address: str = "127.0.0.1"
) -> Iterator[http.client.HTTPConnection]:
    """A keep-alive connection from `address`, served once (so the server counts it), held
    open until the block ends. Earlier clients' connections may count for a moment after
    they closed: it waits until it is served."""
    held: list[http.client.HTTPConnection] = []

    def attempt() -> bool:
        connection = _served_once(server, address)
        held.extend([connection] if connection else [])
        return connection is not None

    wait_for(attempt)
    try:
        yield held[0]
    finally:
        held[0].close()


@contextmanager
def _websocket(server: RunningServer) -> Iterator[Connection]:
    """A `/ws` connection, opened as `_held` opens its own."""
    opened: list[Connection] = []

    def attempt() -> bool:
        try:
            opened.append(connect(server.ws + "/ws"))
        except REFUSED:
            return False
        return True

    wait_for(attempt)
    with opened[0] as ws:
        yield ws


def _refused(server: RunningServer, address: str = "127.0.0.1", request: bytes = REQUEST) -> bool:
    """A new connection from `address` is refused: answered 503 and closed. (Closed as it
    opens, it may already be reset as the request goes: what it was sent is read all the
    same.)"""
    with closing(_open(server, address)) as sock:
        with suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        answer = _until_closed(sock)
    return answer.startswith(b"HTTP/1.1 503 ")


def _served(server: RunningServer, address: str = "127.0.0.1") -> bool:
    connection = _served_once(server, address)
    if connection is None:
        return False
    connection.close()
    return True


@pytest.mark.parametrize(
    ("start", "then"),
    [
        (b"GET /health HTTP/1.1\r\nHost: gateway\r\nX-Slow: ", b"a"),  # slowloris
        (b"", b"\r\n"),  # blank lines, which may precede a request line: none ever begins
    ],
    ids=["header", "blank-lines"],
)
def test_a_request_head_sent_a_byte_at_a_time_is_cut(
    make_server: Callable[..., RunningServer], start: bytes, then: bytes
) -> None:
    server = make_server(HEADER_TIMEOUT_SECONDS="1", KEEP_ALIVE_SECONDS="600")
    with closing(_open(server)) as sock:
        answer = _closed_while_dripping(sock, itertools.chain(start, itertools.cycle(then)))
    assert answer.startswith(b"HTTP/1.1 408 "), answer


def test_a_request_head_past_64_kib_is_refused(server: RunningServer) -> None:
    """One byte past the bound, and no more: the server has read all of it as it answers,
    so its close cannot reset the connection under its answer."""
    start = b"GET /health HTTP/1.1\r\nHost: gateway\r\nX-Big: "
    with closing(_open(server)) as sock:
        sock.sendall(start + b"a" * (MAX_HEAD_BYTES + 1 - len(start)))
        answer = _until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]


def test_idle_connections_are_closed(make_server: Callable[..., RunningServer]) -> None:
    server = make_server(KEEP_ALIVE_SECONDS="1", HEADER_TIMEOUT_SECONDS="600")
    fresh = [_open(server) for _ in range(5)]  # never send anything
    served = _sent_whole(server, REQUEST)
    for sock in fresh:
        with closing(sock):
            assert _until_closed(sock) == b""
    with closing(served):  # answered, then idle: closed after its answer
        answer = _until_closed(served)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.count(b"HTTP/1.1") == 1, answer


def test_a_websocket_or_a_stream_in_use_outlives_the_timeouts(
    make_server: Callable[..., RunningServer],
) -> None:
    """Opened before an idle connection that the server then closes: still in use after."""
    server = make_server(KEEP_ALIVE_SECONDS="1", HEADER_TIMEOUT_SECONDS="1")
    body = {"inputs": CHAT.format("Tell me a long story."), "parameters": {}}
    body["parameters"] = {"max_new_tokens": UNENDING, "ignore_eos_token": True}
    with (
        _sse_sent_whole(server, "/generate_stream", body) as sse,
        _websocket_sent_whole(server, "/ws") as ws,
    ):
        lines = (line.strip() for line in iter(sse.readline, b""))
        events = (line.decode() for line in lines if line)
        assert "token" in json.loads(next(events).removeprefix("data:"))
        with closing(_open(server)) as idle:
            assert _until_closed(idle) == b""  # KEEP_ALIVE_SECONDS have passed
        assert "token" in json.loads(next(events).removeprefix("data:"))  # still streaming
        ws.send(payload(("a", CHAT.format("Hi")), generation_config={"max_new_tokens": 2}))
        ended = [e for f in frames_until_done(ws, {"a"}) for e in f if e["type"] == "COMPLETE"]
        assert len(ended) == 1, ended


def test_connections_past_max_connections_are_refused_until_one_leaves(
    make_server: Callable[..., RunningServer],
) -> None:
    """Every address counts toward MAX_CONNECTIONS, a WebSocket as much as HTTP."""
    server = make_server(MAX_CONNECTIONS="2", MAX_CONNECTIONS_PER_ADDRESS="0", **HELD)
    with _websocket(server) as ws, _held(server, "127.0.0.2"):
        assert _refused(server, "127.0.0.3")
        assert _refused(server, "127.0.0.4")
        assert _refused(server, "127.0.0.5", UPGRADE)  # a WebSocket too
        ws.close()
        wait_for(lambda: _served(server, "127.0.0.3"))


def test_connections_past_max_connections_per_address_are_refused_from_that_address(
    make_server: Callable[..., RunningServer],
) -> None:
    server = make_server(MAX_CONNECTIONS_PER_ADDRESS="2", **HELD)
    with _held(server), _held(server) as second:
        assert _refused(server)
        assert _served(server, "127.0.0.2")  # another address is served meanwhile
        second.close()
        wait_for(lambda: _served(server))


def test_serve_raises_the_open_file_limit_to_hold_max_connections() -> None:
    """As vLLM's server does: else accepting fails for everyone before the cap refuses one."""
    code = (
        "import resource\n"
        "from gateway.edge.connections import raise_open_file_limit\n"
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "raise_open_file_limit(4096)\n"
        "print(*resource.getrlimit(resource.RLIMIT_NOFILE))\n"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    soft, hard = (int(n) for n in ran.stdout.split())
    wanted = 4096 + OWN_FILES
    assert soft == (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)), soft
