"""A request head's size bound (64 KiB, docs/SECURITY.md "Connections") on the real server,
over a raw socket: the bound holds however the head's bytes arrive, in one write or in many,
in one large header or in many small ones (gateway/edge/connections.py)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import closing

import pytest

from gateway.edge.connections import MAX_HEAD_BYTES
from serving import RunningServer

LINE = b"GET /health HTTP/1.1\r\nHost: gateway\r\n"


def _one_header(size: int) -> bytes:
    """A whole request head of about `size` bytes, most of them one header's value."""
    return LINE + b"X-Big: " + b"a" * (size - len(LINE) - 11) + b"\r\n\r\n"


def _many_headers(size: int) -> bytes:
    """A whole request head of about `size` bytes in headers of 100 bytes each."""
    header = b"X-Many: " + b"b" * 90 + b"\r\n"
    return LINE + header * ((size - len(LINE)) // len(header)) + b"\r\n"


def _answer(server: RunningServer, writes: Iterator[bytes]) -> bytes:
    """What the server answers to these writes: everything it sends until it closes the
    connection or, on a kept-alive one, its first answer's status line and headers."""
    with closing(socket.create_connection(("127.0.0.1", server.port))) as sock:
        try:
            for chunk in writes:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused midway: what it answered is still to be read
        received = b""
        while b"\r\n\r\n" not in received:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
        return received


def _split(head: bytes, every: int) -> Iterator[bytes]:
    return (head[i : i + every] for i in range(0, len(head), every))


@pytest.mark.parametrize("make_head", [_one_header, _many_headers], ids=["one-header", "many"])
@pytest.mark.parametrize("every", [None, 4096], ids=["one-write", "split"])
def test_a_head_past_64_kib_gets_431_however_it_arrives(
    server: RunningServer, make_head: Callable[[int], bytes], every: int | None
) -> None:
    head = make_head(100 * 1024)
    writes = iter([head]) if every is None else _split(head, every)
    answer = _answer(server, writes)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]


@pytest.mark.parametrize("make_head", [_one_header, _many_headers], ids=["one-header", "many"])
def test_a_head_within_64_kib_in_one_write_is_served(
    server: RunningServer, make_head: Callable[[int], bytes]
) -> None:
    head = make_head(MAX_HEAD_BYTES - 1024)
    answer = _answer(server, iter([head]))
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
