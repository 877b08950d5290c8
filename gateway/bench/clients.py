"""One async client function per protocol, and the table of protocols the bench measures.

Adding a protocol is one function `(worker, request) -> Record` and one `Protocol` entry in
`GATEWAY_PROTOCOLS`. A function sends one request, calls `record.arrive()` for each message
that carries text and returns `record.finish(tokens)`; or, when the protocol says how many
tokens each read carries, calls `record.counted(k, text)` per read and returns
`record.finish_counted()`. It raises on any error. Replies are decoded with msgspec into small
Structs naming only the fields the bench reads.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.bench.metrics import BenchError, Record, start
from gateway.bench.results import TargetKind, TokenSource
from gateway.bench.worker import (
    JSON_HEADERS,
    Lines,
    Worker,
    receive,
    sse_reads,
)
from gateway.bench.workload import Request
from protocols.generation import SamplingOptions

_ENCODE = msgspec.json.encode


# --- vLLM in-process (the ceiling) ----------------------------------------------------------


async def inprocess(worker: Worker, request: Request) -> Record:
    return await _inprocess(worker, request, logprobs=None)


async def inprocess_logprobs(worker: Worker, request: Request) -> Record:
    """The same, with the sampled token's log-probability computed for every token."""
    return await _inprocess(worker, request, logprobs=0)


async def _inprocess(worker: Worker, request: Request, logprobs: int | None) -> Record:
    engine = worker.engine
    options = SamplingOptions(
        max_new_tokens=request.max_new_tokens,
        do_sample=False,
        ignore_eos=True,
        logprobs=logprobs,
    )
    record = start()
    async for step in engine.stream(engine.encode(request.prompt), options):
        if logprobs is not None and step.token_ids and step.tokens is None:
            raise BenchError("logprobs were asked for and the engine returned none")
        record.counted(len(step.token_ids), bool(step.text))
    return record.finish_counted()


# --- vLLM's OpenAI server: streaming /v1/completions ----------------------------------------


class _Usage(msgspec.Struct):
    completion_tokens: int


class _Choice(msgspec.Struct):
    text: str = ""
    logprobs: Any = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: Any = None


_CHUNK = msgspec.json.Decoder(_Chunk)


async def vllm_completions(worker: Worker, request: Request) -> Record:
    return await _completions(worker, request, logprobs=None)


async def vllm_completions_logprobs(worker: Worker, request: Request) -> Record:
    """The same, with the sampled token's log-probability for every token."""
    return await _completions(worker, request, logprobs=0)


async def _completions(worker: Worker, request: Request, logprobs: int | None) -> Record:
    body: dict[str, Any] = {
        "model": worker.context.model,
        "prompt": request.prompt,
        "max_tokens": request.max_new_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if logprobs is not None:
        body["logprobs"] = logprobs
    record, tokens = start(), None
    async with worker.post("/v1/completions", body) as r:
        async for payloads in sse_reads(r):
            text = False
            for payload in payloads:
                if payload == b"[DONE]":
                    continue
                chunk = _CHUNK.decode(payload)
                if chunk.error is not None:
                    raise BenchError(f"vLLM error: {chunk.error}")
                text = text or any(c.text for c in chunk.choices)
                if logprobs is not None and any(
                    c.text and c.logprobs is None for c in chunk.choices
                ):
                    raise BenchError("logprobs were asked for and vLLM returned none")
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
            if text:
                record.arrive()
    if tokens is None:
        raise BenchError("the stream ended without usage")
    return record.finish(tokens)


# --- The gateway ------------------------------------------------------------------------------


def _generation_config(request: Request) -> dict[str, Any]:
    return {"max_new_tokens": request.max_new_tokens, "do_sample": False, "ignore_eos": True}


class _WsEvent(msgspec.Struct):
    type: str
    text: str = ""
    new_tokens_count: int = 0
    error: str | None = None


_WS_FRAME = msgspec.json.Decoder(list[_WsEvent])


async def ws_batch(worker: Worker, request: Request) -> Record:
    """WS `/ws`: one prompt per payload; PROGRESS carries text, COMPLETE the token count."""
    ws = await worker.websocket("/ws")
    payload = {
        "prompts": [{"request_id": request.request_id, "prompt": request.prompt}],
        "generation_config": _generation_config(request),
    }
    record, received = start(), 0
    await ws.send_bytes(_ENCODE(payload))
    while True:
        for event in _WS_FRAME.decode(await receive(ws)):
            if event.type == "PROGRESS" and event.text:
                record.arrive()
                received += len(event.text)
            elif event.type == "COMPLETE":
                if len(event.text) > received:  # the last step's text came with COMPLETE
                    record.arrive()
                record.text = event.text
                return record.finish(event.new_tokens_count)
            elif event.type == "ERROR":
                raise BenchError(f"ERROR event: {event.error}")


async def generate_one(worker: Worker, request: Request) -> Record:
    """POST `/api/generate-one`: streamed text/plain, one chunk per engine step."""
    body = {
        "request_id": request.request_id,
        "prompt": request.prompt,
        "generation_config": _generation_config(request),
    }
    record = start()
    async with worker.post("/api/generate-one", body) as r:
        async for data in r.content.iter_any():
            if data:
                record.arrive()
    # The plain-text answer says nothing about tokens; ignore_eos makes it max_new_tokens.
    return record.finish(request.max_new_tokens)


class _ControlUsage(msgspec.Struct):
    completion_tokens: int


class _ControlMessage(msgspec.Struct):
    type: str
    token: str = ""
    usage: _ControlUsage | None = None
    error: str = ""
    message: str = ""


_CONTROL = msgspec.json.Decoder(_ControlMessage)


def _control_parameters(request: Request) -> dict[str, Any]:
    return {"max_tokens": request.max_new_tokens, "temperature": 0, "ignore_eos": True}


async def control_ws(worker: Worker, request: Request) -> Record:
    """WS `/generate`: one `config` per generation, `token` messages, then `completion`."""
    ws = await worker.websocket("/generate")
    config = {
        "type": "config",
        "prompt": request.prompt,
        "parameters": _control_parameters(request),
    }
    record = start()
    await ws.send_bytes(_ENCODE(config))
    while True:
        message = _CONTROL.decode(await receive(ws))
        if message.type == "token":
            if message.token:
                record.arrive()
        elif message.type == "completion" and message.usage is not None:
            return record.finish(message.usage.completion_tokens)
        elif message.type == "error":
            raise BenchError(f"{message.error}: {message.message}")


async def v1_generate(worker: Worker, request: Request) -> Record:
    """POST `/v1/generate` with `stream: true`: the control messages as server-sent events."""
    body = {"prompt": request.prompt, "stream": True, **_control_parameters(request)}
    record = start()
    async with worker.post("/v1/generate", body) as r:
        async for payloads in sse_reads(r):
            text = False
            for payload in payloads:
                message = _CONTROL.decode(payload)
                if message.type == "token":
                    text = text or bool(message.token)
                elif message.type == "completion" and message.usage is not None:
                    if text:
                        record.arrive()
                    return record.finish(message.usage.completion_tokens)
                elif message.type == "error":
                    raise BenchError(f"{message.error}: {message.message}")
            if text:
                record.arrive()
    raise BenchError("the stream ended without a completion")


class _StartEvent(msgspec.Struct):
    type: str
    data: str = ""


_START_FRAME = msgspec.json.Decoder(list[_StartEvent])


async def ws_events(worker: Worker, request: Request) -> Record:
    """WS `/ws/events`: START in; START echo, PROGRESS, COMPLETE out."""
    ws = await worker.websocket("/ws/events")
    start_event = {
        "type": "START",
        "id": request.request_id,
        "data": request.prompt,
        "parameters": _generation_config(request),
    }
    record, received = start(), 0
    await ws.send_bytes(_ENCODE([start_event]))
    while True:
        for event in _START_FRAME.decode(await receive(ws)):
            if event.type == "PROGRESS" and event.data:
                record.arrive()
                received += len(event.data)
            elif event.type == "COMPLETE":
                if len(event.data) > received:
                    record.arrive()
                # COMPLETE carries no token count; ignore_eos makes it max_new_tokens.
                return record.finish(request.max_new_tokens)
            elif event.type == "ERROR":
                raise BenchError(f"ERROR event: {event.data}")


class _LmiToken(msgspec.Struct):
    id: int
    text: str = ""


class _LmiDetails(msgspec.Struct):
    finish_reason: str | None = None


class _LmiLine(msgspec.Struct):
    token: _LmiToken | None = None
    details: _LmiDetails | None = None
    error: str | None = None


_LMI_LINE = msgspec.json.Decoder(_LmiLine)


async def invocations(worker: Worker, request: Request) -> Record:
    """POST `/invocations`, jsonlines: one line per token, so each read's count is exact."""
    body = {
        "inputs": request.prompt,
        "parameters": {
            "max_new_tokens": request.max_new_tokens,
            "do_sample": False,
            "ignore_eos_token": True,
        },
        "stream": True,
    }
    headers = {**JSON_HEADERS, "Accept": "application/jsonlines"}
    record, lines = start(), Lines()
    async with worker.post("/invocations", body, headers) as r:
        async for data in r.content.iter_any():
            text, tokens = False, 0
            for line in lines.feed(data):
                if not line.strip():
                    continue
                parsed = _LMI_LINE.decode(line)
                failed = parsed.details is not None and parsed.details.finish_reason == "error"
                if failed or parsed.error is not None or (parsed.token and parsed.token.id < 0):
                    raise BenchError(f"LMI error line: {line[:300]!r}")
                if parsed.token is not None:
                    tokens += 1
                    text = text or bool(parsed.token.text)
            record.counted(tokens, text)
    return record.finish_counted()


class _TgiEvent(msgspec.Struct):
    token: _LmiToken | None = None
    error: str | None = None


_TGI_EVENT = msgspec.json.Decoder(_TgiEvent)


async def tgi_stream(worker: Worker, request: Request) -> Record:
    """POST `/generate_stream` (TGI): one SSE event per token. TGI has no ignore_eos; the
    gateway's `ignore_eos_token` extension (the one vLLM's own benchmark client sends) fixes
    the length, and the tokens are counted from the stream."""
    parameters = {"max_new_tokens": request.max_new_tokens, "ignore_eos_token": True}
    body = {"inputs": request.prompt, "parameters": parameters}
    record = start()
    async with worker.post("/generate_stream", body) as r:
        async for payloads in sse_reads(r):
            text, tokens = False, 0
            for payload in payloads:
                event = _TGI_EVENT.decode(payload)
                if event.error is not None:
                    raise BenchError(f"TGI error event: {event.error}")
                if event.token is not None:
                    tokens += 1
                    text = text or bool(event.token.text)
            record.counted(tokens, text)
    return record.finish_counted()


# --- The table ------------------------------------------------------------------------------

Call = Callable[[Worker, Request], Awaitable[Record]]


@dataclass(frozen=True)
class Protocol:
    name: str  # CLI and JSON name
    label: str  # table label
    call: Call
    kind: TargetKind
    tokens: TokenSource
    websocket: str | None = None  # a worker opens this path before the measurement
    notes: str = ""
    # Every token on the wire carries its log-probability, which the engine must compute.
    logprobs: bool = False


INPROCESS = Protocol(
    "ceiling",
    "vLLM in-process",
    inprocess,
    "ceiling",
    "counted",
    notes="AsyncLLM through gateway.engine.Engine, RequestOutputKind.DELTA; exact token counts",
)
INPROCESS_LOGPROBS = Protocol(
    "ceiling-logprobs",
    "vLLM in-process, logprobs=0",
    inprocess_logprobs,
    "ceiling-logprobs",
    "counted",
    notes="as the ceiling, with logprobs=0: the reference for protocols that send every "
    "token's log-probability",
)
VLLM_SERVER = Protocol(
    "vllm-server",
    "vLLM OpenAI server",
    vllm_completions,
    "vllm-server",
    "reported",
    notes="streaming /v1/completions, ignore_eos; tokens from usage (stream_options)",
)
VLLM_SERVER_LOGPROBS = Protocol(
    "vllm-server-logprobs",
    "vLLM OpenAI server, logprobs=0",
    vllm_completions_logprobs,
    "vllm-server-logprobs",
    "reported",
    notes="as vLLM's server, with logprobs: 0 (each token's log-probability)",
)
GATEWAY_PROTOCOLS: tuple[Protocol, ...] = (
    Protocol(
        "ws",
        "WS /ws",
        ws_batch,
        "gateway",
        "reported",
        websocket="/ws",
        notes="one prompt per payload, generation_config.ignore_eos; COMPLETE.new_tokens_count",
    ),
    Protocol(
        "generate-one",
        "POST /api/generate-one",
        generate_one,
        "gateway",
        "requested",
        notes="streamed text/plain; no token count on the wire: max_new_tokens (ignore_eos)",
    ),
    Protocol(
        "control-ws",
        "WS /generate",
        control_ws,
        "gateway",
        "reported",
        websocket="/generate",
        notes="control protocol, parameters.ignore_eos; usage.completion_tokens",
    ),
    Protocol(
        "v1-generate",
        "POST /v1/generate (SSE)",
        v1_generate,
        "gateway",
        "reported",
        notes="stream: true, ignore_eos; usage.completion_tokens",
    ),
    Protocol(
        "ws-events",
        "WS /ws/events",
        ws_events,
        "gateway",
        "requested",
        websocket="/ws/events",
        notes="parameters.ignore_eos; no token count on the wire: max_new_tokens",
    ),
    Protocol(
        "invocations",
        "POST /invocations (jsonlines)",
        invocations,
        "gateway",
        "counted",
        notes="parameters.ignore_eos_token; one line per token, exact counts",
        logprobs=True,
    ),
    Protocol(
        "tgi",
        "POST /generate_stream (TGI)",
        tgi_stream,
        "gateway",
        "counted",
        notes="parameters.ignore_eos_token (a gateway extension); tokens counted from the stream",
        logprobs=True,
    ),
)
