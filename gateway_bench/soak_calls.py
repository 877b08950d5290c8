"""The soak's clients: one request of each protocol, and what its answer says about its prompts.

Each call sends one `Spec` and fills its `Outcome` as the answer comes: the first text, and
one terminal per prompt (`finished`, `rate_limited`, `refused` for an input error naming the
field, or `error`). The outcome is filled in place, so a client that leaves (its task is
cancelled) keeps what it saw. An answer that ends without a terminal is `cut`. Keys go the
way each protocol's clients send them: `Authorization: Bearer` on HTTP and on the WebSocket
handshake.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import aiohttp
import msgspec

from gateway_bench.worker import Lines, receive, sse_data
from protocols import batch_events, control, lmi, tgi, ws_events
from protocols.names import Protocol

FINISHED = "finished"
RATE_LIMITED = "rate_limited"
REFUSED = "refused"  # the input was refused, the error naming the field
ERROR = "error"  # anything else: what the soak must never see
INVALID_BUDGET = -1  # the soak's invalid input: a negative token budget
_ENCODE = msgspec.json.encode


class Spec(msgspec.Struct, frozen=True):
    """One request of the soak, drawn from the seed (soak_plan.py)."""

    index: int
    protocol: str
    prompt: str
    max_new_tokens: int
    invalid: bool = False
    leave_at: float | None = None  # a share of the protocol's usual duration, then cancelled


class Outcome(msgspec.Struct, kw_only=True):
    index: int
    protocol: str
    key: str  # "main" or "limited"
    phase: str  # "baseline" or "contended": whether the limited key was sending
    invalid: bool
    prompts: int = 1
    sent: float = 0.0  # just before the request (or its connection) went out
    first: float | None = None  # the first text (or the whole answer, when not streamed)
    end: float | None = None  # when the last terminal came
    status: int | None = None  # HTTP status (None on WebSockets)
    terminals: list[str] = msgspec.field(default_factory=list)
    named_field: bool = False  # a refusal named the token budget's field
    left_at: float | None = None  # the client left (closed its connection) then
    cut: bool = False  # the answer ended without a terminal
    message: str = ""  # the first error's text

    def text(self) -> None:
        if self.first is None:
            self.first = perf_counter()

    def terminal(self, kind: str, message: str = "") -> None:
        self.terminals.append(kind)
        self.end = perf_counter()
        if kind != FINISHED and not self.message:
            self.message = message[:300]
        if kind == REFUSED:
            self.named_field = self.named_field or _names_budget(message)

    @property
    def left(self) -> bool:
        return self.left_at is not None


def _names_budget(message: str) -> bool:
    return "max_new_tokens" in message or "max_tokens" in message


def kind_of_message(message: str) -> str:
    """An in-band error's kind, from its text (the batch protocols' errors carry no kind)."""
    lowered = message.lower()
    if "limit" in lowered and "retry" in lowered:
        return RATE_LIMITED
    return REFUSED if _names_budget(message) else ERROR


def kind_of_status(status: int, message: str) -> str:
    if status == 429:
        return RATE_LIMITED
    if 400 <= status < 500:
        return REFUSED if _names_budget(message) else ERROR
    return ERROR


@dataclass
class Client:
    """One simulated client: its key and its session. Each WebSocket request opens a connection
    of its own (a connection left idle meanwhile would not answer the server's pings)."""

    session: aiohttp.ClientSession
    base_url: str
    key: str
    name: str  # "main" or "limited"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}

    @asynccontextmanager
    async def websocket(self, path: str) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
        """A connection, closed however the request ends: leaving closes it."""
        headers = {"Authorization": f"Bearer {self.key}"}
        async with self.session.ws_connect(self.base_url + path, headers=headers) as ws:
            yield ws

    @asynccontextmanager
    async def post(self, path: str, body: object, out: Outcome) -> AsyncIterator[Response]:
        """POST `body`; the response, its status noted. Leaving closes the connection."""
        async with self.session.post(
            self.base_url + path, data=_ENCODE(body), headers=self.headers
        ) as r:
            out.status = r.status
            try:
                yield r
            except BaseException:
                r.close()  # never back to the pool half read: the server sees the client go
                raise


Response = aiohttp.ClientResponse
Call = Callable[[Client, Spec, Outcome], Coroutine[Any, Any, None]]


def _budget(spec: Spec) -> int:
    return INVALID_BUDGET if spec.invalid else spec.max_new_tokens


def _generation_config(spec: Spec) -> dict[str, Any]:
    return {"max_new_tokens": _budget(spec), "do_sample": False, "ignore_eos": True}


async def _refusal(r: Response, out: Outcome) -> bool:
    """A non-200 answer is the terminal of each of the request's prompts: True when it was one."""
    if r.status == 200:
        return False
    text = (await r.read()).decode(errors="replace")
    for _ in range(out.prompts):
        out.terminal(kind_of_status(r.status, text), f"HTTP {r.status}: {text}")
    return True


# --- WebSockets --------------------------------------------------------------------------------


async def ws_batch(client: Client, spec: Spec, out: Outcome) -> None:
    payload = {
        "prompts": [{"request_id": f"soak-{spec.index}", "prompt": spec.prompt}],
        "generation_config": _generation_config(spec),
    }
    async with client.websocket("/ws") as ws:
        await ws.send_bytes(_ENCODE(payload))
        while not out.terminals:
            for event in batch_events.decode_frame(await receive(ws)):
                if isinstance(event, batch_events.Progress) and event.text:
                    out.text()
                elif isinstance(event, batch_events.Complete):
                    out.text()
                    out.terminal(FINISHED)
                elif isinstance(event, batch_events.ErrorEvent):
                    out.terminal(kind_of_message(event.error), event.error)


async def ws_events_stream(client: Client, spec: Spec, out: Outcome) -> None:
    start = {
        "type": "START",
        "id": f"soak-{spec.index}",
        "data": spec.prompt,
        "parameters": _generation_config(spec),
    }
    async with client.websocket("/ws/events") as ws:
        await ws.send_bytes(_ENCODE([start]))
        while not out.terminals:
            for event in ws_events.decode_frame(await receive(ws)):
                if isinstance(event, ws_events.Progress) and event.data:
                    out.text()
                elif isinstance(event, ws_events.Complete):
                    out.text()
                    out.terminal(FINISHED)
                elif isinstance(event, ws_events.Error):
                    out.terminal(kind_of_message(event.data), event.data)


async def control_ws(client: Client, spec: Spec, out: Outcome) -> None:
    config = {
        "type": "config",
        "prompt": spec.prompt,
        "parameters": {"max_tokens": _budget(spec), "temperature": 0, "ignore_eos": True},
    }
    async with client.websocket("/generate") as ws:
        await ws.send_bytes(_ENCODE(config))
        while not out.terminals:
            message = control.decode_server(await receive(ws))
            if isinstance(message, control.Token) and message.token:
                out.text()
            elif isinstance(message, control.Completion):
                out.text()
                out.terminal(FINISHED)
            elif isinstance(message, control.Error):
                kind = RATE_LIMITED if message.error == "rate_limited" else None
                out.terminal(kind or kind_of_message(message.message), message.message)


# --- The gateway's REST routes ------------------------------------------------------------------


async def generate_one(client: Client, spec: Spec, out: Outcome) -> None:
    """Streamed text/plain: a clean end of the body is the prompt's end."""
    body = {
        "request_id": f"soak-{spec.index}",
        "prompt": spec.prompt,
        "generation_config": _generation_config(spec),
    }
    async with client.post("/api/generate-one", body, out) as r:
        if await _refusal(r, out):
            return
        try:
            async for data in r.content.iter_any():
                if data:
                    out.text()
        except aiohttp.ClientPayloadError:  # the route's way to end a failed stream: a cut
            out.cut = True
            return
        out.terminal(FINISHED)


async def generate_batch(client: Client, spec: Spec, out: Outcome) -> None:
    """Two prompts in one payload, answered as one JSON array: one terminal each."""
    out.prompts = 2
    prompts = [{"request_id": f"soak-{spec.index}-{i}", "prompt": spec.prompt} for i in range(2)]
    body = {"prompts": prompts, "generation_config": _generation_config(spec)}
    async with client.post("/api/generate-batch", body, out) as r:
        if await _refusal(r, out):
            return
        answers = msgspec.json.decode(await r.read(), type=list[dict[str, Any]])
    out.text()
    for answer in answers:
        error = answer.get("error")
        if isinstance(error, str):
            out.terminal(kind_of_message(error), error)
        else:
            out.terminal(FINISHED)


_LMI_LINE = msgspec.json.Decoder(lmi.Line)


async def invocations(client: Client, spec: Spec, out: Outcome) -> None:
    """LMI, streamed as JSON lines: the last line carries `generated_text` (or the error)."""
    body = {
        "inputs": spec.prompt,
        "parameters": {
            "max_new_tokens": _budget(spec),
            "do_sample": False,
            "ignore_eos_token": True,
        },
        "stream": True,
    }
    async with client.post("/invocations", body, out) as r:
        if await _refusal(r, out):
            return
        lines = Lines()
        async for data in r.content.iter_any():
            for raw in lines.feed(data):
                if not raw.strip():
                    continue
                line = _LMI_LINE.decode(raw)
                details = line.details
                failed = isinstance(details, lmi.Details) and details.finish_reason == "error"
                if failed or isinstance(line.error, str):
                    out.terminal(ERROR, raw.decode(errors="replace"))
                elif isinstance(line.generated_text, str):
                    out.text()
                    out.terminal(FINISHED)
                elif isinstance(line.token, dict) and line.token.get("text"):
                    out.text()
    out.cut = not out.terminals


class _ModelError(msgspec.Struct):
    OriginalStatusCode: int
    OriginalMessage: str


async def sagemaker(client: Client, spec: Spec, out: Outcome) -> None:
    """InvokeEndpoint: a whole LMI answer, or a 424 ModelError carrying the LMI status."""
    body = {
        "inputs": spec.prompt,
        "parameters": {"max_new_tokens": _budget(spec), "ignore_eos_token": True},
    }
    async with client.post("/endpoints/soak/invocations", body, out) as r:
        raw = await r.read()
    if r.status == 424:
        error = msgspec.json.decode(raw, type=_ModelError)
        message = f"ModelError {error.OriginalStatusCode}: {error.OriginalMessage}"
        out.terminal(kind_of_status(error.OriginalStatusCode, message), message)
    elif r.status != 200:
        out.terminal(kind_of_status(r.status, raw.decode(errors="replace")), f"HTTP {r.status}")
    else:
        out.text()
        out.terminal(FINISHED)


_TGI_EVENT = msgspec.json.Decoder(tgi.StreamResponse)
_TGI_ERROR = msgspec.json.Decoder(tgi.ErrorResponse)


def _tgi_event(payload: bytes, out: Outcome) -> None:
    try:
        event = _TGI_EVENT.decode(payload)
    except msgspec.ValidationError:
        error = _TGI_ERROR.decode(payload)
        kind = REFUSED if error.error_type == "validation" else kind_of_message(error.error)
        out.terminal(kind, error.error)
        return
    if event.token.text:
        out.text()
    if event.generated_text is not None:
        out.terminal(FINISHED)


async def tgi_stream(client: Client, spec: Spec, out: Outcome) -> None:
    """TGI's /generate_stream: 200 whatever happens; the last event has `generated_text`, or is
    the error."""
    parameters = {"max_new_tokens": _budget(spec), "ignore_eos_token": True}
    async with client.post(
        "/generate_stream", {"inputs": spec.prompt, "parameters": parameters}, out
    ) as r:
        if await _refusal(r, out):
            return
        lines = Lines()
        async for data in r.content.iter_any():
            for line in lines.feed(data):
                payload = sse_data(line)
                if payload:
                    _tgi_event(payload, out)
    out.cut = not out.terminals


async def tgi_generate(client: Client, spec: Spec, out: Outcome) -> None:
    parameters = {"max_new_tokens": _budget(spec), "ignore_eos_token": True}
    async with client.post(
        "/generate", {"inputs": spec.prompt, "parameters": parameters}, out
    ) as r:
        if await _refusal(r, out):
            return
        await r.read()
    out.text()
    out.terminal(FINISHED)


class _Choice(msgspec.Struct):
    finish_reason: str | None = None
    delta: dict[str, Any] = {}


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    error: dict[str, Any] | None = None


_CHUNK = msgspec.json.Decoder(_Chunk)


def _chat(spec: Spec, stream: bool) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": spec.prompt}],
        "max_tokens": _budget(spec),
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }


async def chat_stream(client: Client, spec: Spec, out: Outcome) -> None:
    """OpenAI's chat stream: a choice's finish_reason ends it; an `error` chunk is its failure."""
    async with client.post("/v1/chat/completions", _chat(spec, True), out) as r:
        if await _refusal(r, out):
            return
        lines = Lines()
        async for data in r.content.iter_any():
            for line in lines.feed(data):
                payload = sse_data(line)
                if not payload or payload == b"[DONE]":
                    continue
                chunk = _CHUNK.decode(payload)
                if chunk.error is not None:
                    message = str(chunk.error.get("message", chunk.error))
                    out.terminal(kind_of_message(message), message)
                for choice in chunk.choices:
                    if choice.delta.get("content"):
                        out.text()
                    if choice.finish_reason is not None:
                        out.terminal(FINISHED)
    out.cut = not out.terminals


async def chat_whole(client: Client, spec: Spec, out: Outcome) -> None:
    async with client.post("/v1/chat/completions", _chat(spec, False), out) as r:
        if await _refusal(r, out):
            return
        answer = msgspec.json.decode(await r.read(), type=_Chunk)
    out.text()
    for choice in answer.choices:
        out.terminal(FINISHED if choice.finish_reason else ERROR, "a choice without its end")


@dataclass(frozen=True)
class SoakProtocol:
    name: str  # a protocols.names.Protocol value, or one with a suffix for a second form
    call: Call
    streamed: bool  # TTFT is the first text's time, not the whole answer's


PROTOCOLS: tuple[SoakProtocol, ...] = (
    SoakProtocol(Protocol.WS, ws_batch, True),
    SoakProtocol(Protocol.WS_EVENTS, ws_events_stream, True),
    SoakProtocol(Protocol.CONTROL, control_ws, True),
    SoakProtocol(Protocol.API_GENERATE_ONE, generate_one, True),
    SoakProtocol(Protocol.API_GENERATE_BATCH, generate_batch, False),
    SoakProtocol(Protocol.LMI, invocations, True),
    SoakProtocol(Protocol.SAGEMAKER, sagemaker, False),
    SoakProtocol(Protocol.TGI, tgi_stream, True),
    SoakProtocol(f"{Protocol.TGI}-generate", tgi_generate, False),
    SoakProtocol(Protocol.OPENAI_CHAT, chat_stream, True),
    SoakProtocol(f"{Protocol.OPENAI_CHAT}-whole", chat_whole, False),
)
BY_NAME = {p.name: p for p in PROTOCOLS}
