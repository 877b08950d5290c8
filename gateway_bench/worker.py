"""What every protocol client shares: the target's context, a worker (one simulated client
with its WebSockets), and small helpers for reading streamed HTTP bodies and WebSockets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import msgspec

from gateway_bench.metrics import BenchError, Record, kind_of_status

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

JSON_HEADERS = {"Content-Type": "application/json"}

# Seconds an idle pooled connection is kept for the next request. aiohttp's default, 15 s,
# outlives the servers' keep-alive (uvicorn's 5 s: vLLM's server, the gateway's
# KEEP_ALIVE_SECONDS): a request sent on a connection the server is closing fails with
# "Server disconnected" (it ended a mixed run once, a burst sent after a 5 s pause).
KEEPALIVE_S = 2.0


def session(*, fresh_connections: bool = False, **settings: Any) -> aiohttp.ClientSession:
    """A run's client session: any number of connections at once, an idle one not reused once
    the server may have closed it (`fresh_connections`: none reused), no overall timeout (each
    request has its own)."""
    reuse = {"force_close": True} if fresh_connections else {"keepalive_timeout": KEEPALIVE_S}
    connector = aiohttp.TCPConnector(limit=0, **reuse)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None), **settings
    )


@dataclass
class Context:
    """What every worker of a target shares."""

    session: aiohttp.ClientSession
    base_url: str = ""  # http://host:port of the server under test
    model: str = ""  # the name vLLM's server serves the model under
    llm: AsyncLLM | None = None  # the in-process target: vLLM's engine, used directly
    pids: tuple[int, ...] = ()  # the server under test, whose CPU time is not "other"
    key: str = ""  # an API key, sent as `Authorization: Bearer` (HTTP and WebSocket handshake)
    profiles: Path | None = None  # --profile: each measured step's py-spy profile goes here

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        auth = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        return {**JSON_HEADERS, **auth, **(extra or {})}


class Worker:
    """One simulated client: it sends its requests one after another, on one WebSocket when
    the protocol has one (opened before the measurement starts, or by its first request)."""

    def __init__(self, context: Context) -> None:
        self.context = context
        self._sockets: dict[str, aiohttp.ClientWebSocketResponse] = {}

    @property
    def llm(self) -> AsyncLLM:
        if self.context.llm is None:
            raise BenchError("no in-process engine")
        return self.context.llm

    def url(self, path: str) -> str:
        return self.context.base_url + path

    async def websocket(self, path: str) -> aiohttp.ClientWebSocketResponse:
        ws = self._sockets.get(path)
        if ws is None or ws.closed:
            auth = {"Authorization": f"Bearer {self.context.key}"} if self.context.key else {}
            session = self.context.session
            ws = await session.ws_connect(self.url(path), max_msg_size=0, headers=auth)
            self._sockets[path] = ws
        return ws

    @asynccontextmanager
    async def post(
        self, path: str, body: object, record: Record, headers: dict[str, str] | None = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST `body` as JSON; the response, its status noted in `record`. Leaving (an
        exception, a cancellation) closes the connection: the server sees the client go."""
        data = msgspec.json.encode(body)
        session = self.context.session
        async with session.post(
            self.url(path), data=data, headers=self.context.headers(headers)
        ) as r:
            record.status = r.status
            try:
                yield r
            except BaseException:
                r.close()  # never back to the pool half read
                raise

    async def close(self) -> None:
        """Also after an error: the next request opens a fresh connection."""
        sockets, self._sockets = list(self._sockets.values()), {}
        for ws in sockets:
            await ws.close()


async def refused(response: aiohttp.ClientResponse, record: Record) -> bool:
    """A non-200 answer is the terminal of each of the request's prompts: True when it was one."""
    if response.status == 200:
        return False
    text = (await response.read()).decode(errors="replace")
    for _ in range(record.prompts):
        record.terminal(kind_of_status(response.status, text), f"HTTP {response.status}: {text}")
    return True


async def receive(ws: aiohttp.ClientWebSocketResponse) -> str | bytes:
    message = await ws.receive()
    if message.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
        data: str | bytes = message.data
        return data
    raise BenchError(f"WebSocket closed ({message.type.name}, {message.extra or message.data})")


class Lines:
    """Splits a chunked HTTP body into lines; each `feed` is one network read."""

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        lines = (self._rest + chunk).split(b"\n")
        self._rest = lines.pop()
        return lines


def sse_data(line: bytes) -> bytes | None:
    if not line.startswith(b"data:"):
        return None
    return line[5:].strip()


async def sse_reads(response: aiohttp.ClientResponse) -> AsyncIterator[list[bytes]]:
    """The non-empty SSE `data:` payloads of each network read, one list per read (what
    arrived together is timed together)."""
    lines = Lines()
    async for chunk in response.content.iter_any():
        yield [payload for line in lines.feed(chunk) if (payload := sse_data(line))]
