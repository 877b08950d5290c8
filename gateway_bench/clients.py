"""One async client function per target, and the table of clients the bench measures.

Adding a protocol is one function `(worker, request) -> Record` and one `Client` entry in
`GATEWAY_CLIENTS`. A function sends one request, calls `record.arrive()` for each message
that carries text and returns `record.finish(tokens)`; or, when the protocol says how many
tokens each read carries, calls `record.counted(k, text)` per read and returns
`record.finish_counted()`. It raises on any error.

The gateway's answers are decoded with the project's own wire types (`protocols/`), so the
bench reads exactly what the gateway writes; the OpenAI routes, whose answers the bench sends
to vLLM's server and to the gateway alike, have small Structs here naming the fields it reads.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway_bench.metrics import BenchError, Record, start
from gateway_bench.results import TargetKind, TokenSource
from gateway_bench.worker import JSON_HEADERS, Lines, Worker, receive, sse_reads
from gateway_bench.workload import Request
from protocols import batch_events, control, lmi, tgi, ws_events
from protocols.names import Protocol

_ENCODE = msgspec.json.encode


# --- vLLM in-process (the ceiling) ----------------------------------------------------------


async def inprocess(worker: Worker, request: Request) -> Record:
    from gateway_bench.ceiling import generate  # imports vLLM: only when this target runs

    return await generate(worker.llm, request, logprobs=None)


async def inprocess_logprobs(worker: Worker, request: Request) -> Record:
    """The same, with the sampled token's log-probability computed for every token."""
    from gateway_bench.ceiling import generate

    return await generate(worker.llm, request, logprobs=0)


# --- OpenAI's routes, streamed: vLLM's server and the gateway -------------------------------
# The same request goes to both: these Structs name the fields the bench reads.


class _Usage(msgspec.Struct):
    completion_tokens: int


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    """A completions choice (`text`) or a chat chunk's (`delta.content`)."""

    text: str = ""
    delta: _Delta = msgspec.field(default_factory=_Delta)
    logprobs: Any = None

    @property
    def has_text(self) -> bool:
        return bool(self.text or self.delta.content)


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: Any = None


_CHUNK = msgspec.json.Decoder(_Chunk)


def _model(worker: Worker) -> dict[str, Any]:
    """vLLM's server is told its model's name; the gateway serves its one model unnamed."""
    return {"model": worker.context.model} if worker.context.model else {}


def _streamed(worker: Worker, request: Request) -> dict[str, Any]:
    """What both routes' requests share: greedy, every token generated, usage at the end."""
    return {
        **_model(worker),
        "max_tokens": request.max_new_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def vllm_completions(worker: Worker, request: Request) -> Record:
    return await _completions(worker, request, logprobs=None)


async def vllm_completions_logprobs(worker: Worker, request: Request) -> Record:
    """The same, with the sampled token's log-probability for every token."""
    return await _completions(worker, request, logprobs=0)


async def _completions(worker: Worker, request: Request, logprobs: int | None) -> Record:
    body = {**_streamed(worker, request), "prompt": request.prompt}
    if logprobs is not None:
        body["logprobs"] = logprobs
    return await _openai_stream(worker, "/v1/completions", body, logprobs is not None)


async def chat_completions(worker: Worker, request: Request) -> Record:
    """Streaming /v1/chat/completions, the prompt as one user message: the very same request
    to vLLM's server and to the gateway."""
    body = {**_streamed(worker, request), "messages": [{"role": "user", "content": request.prompt}]}
    return await _openai_stream(worker, "/v1/chat/completions", body, False)


async def _openai_stream(worker: Worker, path: str, body: dict[str, Any], logprobs: bool) -> Record:
    record, tokens = start(), None
    async with worker.post(path, body) as r:
        async for payloads in sse_reads(r):
            text = False
            for payload in payloads:
                if payload == b"[DONE]":
                    continue
                chunk = _CHUNK.decode(payload)
                if chunk.error is not None:
                    raise BenchError(f"error event: {chunk.error}")
                text = text or any(c.has_text for c in chunk.choices)
                if logprobs and any(c.has_text and c.logprobs is None for c in chunk.choices):
                    raise BenchError("logprobs were asked for and none came")
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
        for event in batch_events.decode_frame(await receive(ws)):
            if isinstance(event, batch_events.Progress):
                if event.text:
                    record.arrive()
                    received += len(event.text)
            elif isinstance(event, batch_events.Complete):
                if len(event.text) > received:  # the last step's text came with COMPLETE
                    record.arrive()
                record.text = event.text
                return record.finish(event.new_tokens_count)
            elif isinstance(event, batch_events.ErrorEvent):
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
        message = control.decode_server(await receive(ws))
        if isinstance(message, control.Token):
            if message.token:
                record.arrive()
        elif isinstance(message, control.Completion):
            return record.finish(message.usage.completion_tokens)
        elif isinstance(message, control.Error):
            raise BenchError(f"{message.error}: {message.message}")


async def v1_generate(worker: Worker, request: Request) -> Record:
    """POST `/v1/generate` with `stream: true`: the control messages as server-sent events."""
    body = {"prompt": request.prompt, "stream": True, **_control_parameters(request)}
    record = start()
    async with worker.post("/v1/generate", body) as r:
        async for payloads in sse_reads(r):
            text = False
            for payload in payloads:
                message = control.decode_server(payload)
                if isinstance(message, control.Token):
                    text = text or bool(message.token)
                elif isinstance(message, control.Completion):
                    if text:
                        record.arrive()
                    return record.finish(message.usage.completion_tokens)
                elif isinstance(message, control.Error):
                    raise BenchError(f"{message.error}: {message.message}")
            if text:
                record.arrive()
    raise BenchError("the stream ended without a completion")


async def ws_events_stream(worker: Worker, request: Request) -> Record:
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
        for event in ws_events.decode_frame(await receive(ws)):
            if isinstance(event, ws_events.Progress):
                if event.data:
                    record.arrive()
                    received += len(event.data)
            elif isinstance(event, ws_events.Complete):
                if len(event.data) > received:
                    record.arrive()
                # COMPLETE carries no token count; ignore_eos makes it max_new_tokens.
                return record.finish(request.max_new_tokens)
            elif isinstance(event, ws_events.Error):
                raise BenchError(f"ERROR event: {event.data}")


_LMI_LINE = msgspec.json.Decoder(lmi.Line)


def _lmi_failed(line: lmi.Line) -> bool:
    """The spec's last line of a failed stream: finish_reason "error", a token with id -1."""
    if isinstance(line.details, lmi.Details) and line.details.finish_reason == "error":
        return True
    if isinstance(line.error, str):  # OPTION_TGI_COMPAT's way of saying it
        return True
    token = line.token
    return isinstance(token, dict) and (token.get("id", 0) < 0 or "error_msg" in token)


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
            for raw in lines.feed(data):
                if not raw.strip():
                    continue
                line = _LMI_LINE.decode(raw)
                if _lmi_failed(line):
                    raise BenchError(f"LMI error line: {raw[:300]!r}")
                token = line.token  # `Any` in protocols.lmi: an LMI or a TGI-compatible token
                if isinstance(token, dict):
                    tokens += 1
                    text = text or bool(token.get("text"))
            record.counted(tokens, text)
    return record.finish_counted()


_TGI_EVENT = msgspec.json.Decoder(tgi.StreamResponse)
_TGI_ERROR = msgspec.json.Decoder(tgi.ErrorResponse)


def _tgi_event(payload: bytes) -> tgi.StreamResponse:
    try:
        return _TGI_EVENT.decode(payload)
    except msgspec.ValidationError:
        # A failure inside the stream is one event carrying TGI's error body instead.
        error = _TGI_ERROR.decode(payload)
        raise BenchError(f"TGI error event ({error.error_type}): {error.error}") from None


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
                event = _tgi_event(payload)
                tokens += 1
                text = text or bool(event.token.text)
            record.counted(tokens, text)
    return record.finish_counted()


# --- The table ------------------------------------------------------------------------------

Call = Callable[[Worker, Request], Awaitable[Record]]


@dataclass(frozen=True)
class Client:
    """One measured target: how to send it a request, and how to report it."""

    name: str  # CLI and JSON name: a gateway protocol's `protocols.names.Protocol` value
    label: str  # table label
    call: Call
    kind: TargetKind
    tokens: TokenSource
    websocket: str | None = None  # a worker opens this path before the measurement
    notes: str = ""
    # Every token on the wire carries its log-probability, which the engine must compute.
    logprobs: bool = False
    compared_with: TargetKind = "vllm-server"  # the vLLM server target on the same route


INPROCESS = Client(
    "ceiling",
    "vLLM in-process",
    inprocess,
    "ceiling",
    "counted",
    notes="vLLM's AsyncLLM called directly, RequestOutputKind.DELTA, the gateway's CPU "
    "settings (dtype, environment); exact token counts",
)
INPROCESS_LOGPROBS = Client(
    "ceiling-logprobs",
    "vLLM in-process, logprobs=0",
    inprocess_logprobs,
    "ceiling-logprobs",
    "counted",
    notes="as the ceiling, with logprobs=0: the reference for protocols that send every "
    "token's log-probability",
)
VLLM_SERVER = Client(
    "vllm-server",
    "vLLM OpenAI server",
    vllm_completions,
    "vllm-server",
    "reported",
    notes="streaming /v1/completions, ignore_eos; tokens from usage (stream_options); the "
    "gateway's CPU settings (--dtype, environment)",
)
VLLM_SERVER_LOGPROBS = Client(
    "vllm-server-logprobs",
    "vLLM OpenAI server, logprobs=0",
    vllm_completions_logprobs,
    "vllm-server-logprobs",
    "reported",
    notes="as vLLM's server, with logprobs: 0 (each token's log-probability)",
)
VLLM_SERVER_DEFAULTS = Client(
    "vllm-server-defaults",
    "vLLM OpenAI server, its defaults",
    vllm_completions,
    "vllm-server-defaults",
    "reported",
    notes="as vLLM's server, started with vLLM's own defaults: no --dtype, no added environment",
)
VLLM_SERVER_CHAT = Client(
    "vllm-server-chat",
    "vLLM OpenAI server, chat",
    chat_completions,
    "vllm-server-chat",
    "reported",
    notes="streaming /v1/chat/completions (the prompt as one user message), ignore_eos, "
    "include_usage; the reference for the gateway's chat route",
)
GATEWAY_CLIENTS: tuple[Client, ...] = (
    Client(
        Protocol.WS,
        "WS /ws",
        ws_batch,
        "gateway",
        "reported",
        websocket="/ws",
        notes="one prompt per payload, generation_config.ignore_eos; COMPLETE.new_tokens_count",
    ),
    Client(
        Protocol.API_GENERATE_ONE,
        "POST /api/generate-one",
        generate_one,
        "gateway",
        "requested",
        notes="streamed text/plain; no token count on the wire: max_new_tokens (ignore_eos)",
    ),
    Client(
        Protocol.CONTROL,
        "WS /generate",
        control_ws,
        "gateway",
        "reported",
        websocket="/generate",
        notes="control protocol, parameters.ignore_eos; usage.completion_tokens",
    ),
    Client(
        Protocol.V1_GENERATE,
        "POST /v1/generate (SSE)",
        v1_generate,
        "gateway",
        "reported",
        notes="stream: true, ignore_eos; usage.completion_tokens",
    ),
    Client(
        Protocol.WS_EVENTS,
        "WS /ws/events",
        ws_events_stream,
        "gateway",
        "requested",
        websocket="/ws/events",
        notes="parameters.ignore_eos; no token count on the wire: max_new_tokens",
    ),
    Client(
        Protocol.LMI,
        "POST /invocations (jsonlines)",
        invocations,
        "gateway",
        "counted",
        notes="parameters.ignore_eos_token; one line per token, exact counts",
        logprobs=True,
    ),
    Client(
        Protocol.TGI,
        "POST /generate_stream (TGI)",
        tgi_stream,
        "gateway",
        "counted",
        notes="parameters.ignore_eos_token (a gateway extension); tokens counted from the stream",
        logprobs=True,
    ),
    Client(
        Protocol.OPENAI_CHAT,
        "POST /v1/chat/completions",
        chat_completions,
        "gateway",
        "reported",
        notes="the very request sent to vLLM's server (its chat row): stream, include_usage, "
        "ignore_eos; usage.completion_tokens",
        compared_with="vllm-server-chat",
    ),
    Client(
        Protocol.OPENAI_COMPLETIONS,
        "POST /v1/completions",
        vllm_completions,
        "gateway",
        "reported",
        notes="the very request sent to vLLM's server: stream, include_usage, ignore_eos; "
        "usage.completion_tokens",
    ),
)
