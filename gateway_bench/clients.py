"""One async client per protocol, used by every scenario.

A client `(worker, request, record)` sends one request and fills `record` as the answer
comes (metrics.Record): `arrive()` for each message that carries text, or `counted(k, text)`
per read when the protocol says how many tokens each read carries; then one terminal per
prompt: `finish(tokens)` (or `finish_counted()`), or `terminal(kind, message)` for an error
(`rate_limited`, `refused` naming the field, or `error`). A non-200 answer is each prompt's
terminal; an answer that ends without one is `cut`. It never raises for what the server
answers, only for the connection (a closed WebSocket, a timeout): the soak counts every
outcome, and `send` turns any failure into a `BenchError` for the scenarios that measure
answers.

The gateway's answers are decoded with the project's own wire types (`protocols/`), so the
bench reads exactly what the gateway writes; the OpenAI routes, whose answers the bench sends
to vLLM's server and to the gateway alike, have small Structs here naming the fields it reads.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import msgspec

from gateway_bench.metrics import (
    ERROR,
    RATE_LIMITED,
    REFUSED,
    BenchError,
    Record,
    kind_of_message,
    kind_of_status,
    start,
)
from gateway_bench.worker import Lines, Worker, receive, refused, sse_reads
from gateway_bench.workload import Request
from protocols import batch_events, control, lmi, ollama_answers, tgi, ws_events

Call = Callable[[Worker, Request, Record], Awaitable[None]]
_ENCODE = msgspec.json.encode


async def send(call: Call, worker: Worker, request: Request) -> Record:
    """`request` answered whole, every prompt finished with text; else a BenchError."""
    record = start()
    await call(worker, request, record)
    if (failure := record.failure()) is not None:
        raise BenchError(failure)
    return record


# --- vLLM in-process (the ceiling) ----------------------------------------------------------


def inprocess(logprobs: int | None = None) -> Call:
    """vLLM's AsyncLLM called directly; `logprobs` 0: the sampled token's log-probability
    computed for every token."""

    async def call(worker: Worker, request: Request, record: Record) -> None:
        from gateway_bench.ceiling import generate  # imports vLLM: only when this target runs

        await generate(worker.llm, request, logprobs, record)

    return call


# --- OpenAI's routes: vLLM's server and the gateway -------------------------------------------
# The same request goes to both: these Structs name the fields the bench reads.


class _Usage(msgspec.Struct):
    completion_tokens: int


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    """A completions choice (`text`) or a chat chunk's (`delta.content`, `message.content`)."""

    text: str = ""
    delta: _Delta = msgspec.field(default_factory=_Delta)
    message: _Delta = msgspec.field(default_factory=_Delta)
    logprobs: Any = None
    finish_reason: str | None = None

    @property
    def has_text(self) -> bool:
        return bool(self.text or self.delta.content or self.message.content)


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: Any = None


_CHUNK = msgspec.json.Decoder(_Chunk)


def _openai(worker: Worker, request: Request, stream: bool = True) -> dict[str, Any]:
    """What every OpenAI request shares: greedy, every token generated, usage at the end, and
    what the request adds (`Request.body`). vLLM's server is told its model's name; the gateway
    serves its one model unnamed."""
    body: dict[str, Any] = {"model": worker.context.model} if worker.context.model else {}
    body |= {"max_tokens": request.max_new_tokens, "temperature": 0, "ignore_eos": True}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body | request.body


def _error_text(error: Any) -> str:
    return str(error.get("message", error)) if isinstance(error, dict) else str(error)


async def _openai_stream(
    worker: Worker, path: str, body: dict[str, Any], record: Record, logprobs: bool = False
) -> None:
    tokens, finished = None, False
    async with worker.post(path, body, record) as r:
        if await refused(r, record):
            return
        async for payloads in sse_reads(r):
            text = False
            for payload in payloads:
                if payload == b"[DONE]":
                    continue
                chunk = _CHUNK.decode(payload)
                if chunk.error is not None:
                    message = _error_text(chunk.error)
                    record.terminal(kind_of_message(message), message)
                text = text or any(c.has_text for c in chunk.choices)
                if logprobs and any(c.has_text and c.logprobs is None for c in chunk.choices):
                    record.terminal(ERROR, "logprobs were asked for and none came")
                finished = finished or any(c.finish_reason for c in chunk.choices)
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
            if text:
                record.arrive()
    if record.terminals:
        return
    if not finished:
        record.cut = True
    elif tokens is None:
        record.terminal(ERROR, "the stream ended without usage")
    else:
        record.finish(tokens)


async def completions(worker: Worker, request: Request, record: Record) -> None:
    """Streaming /v1/completions."""
    body = {**_openai(worker, request), "prompt": request.prompt}
    await _openai_stream(worker, "/v1/completions", body, record)


async def completions_logprobs(worker: Worker, request: Request, record: Record) -> None:
    """The same, with the sampled token's log-probability for every token."""
    body = {**_openai(worker, request), "prompt": request.prompt, "logprobs": 0}
    await _openai_stream(worker, "/v1/completions", body, record, logprobs=True)


def _messages(request: Request) -> list[dict[str, str]]:
    return [{"role": "user", "content": request.prompt}]


async def chat_completions(worker: Worker, request: Request, record: Record) -> None:
    """Streaming /v1/chat/completions, the prompt as one user message: the very same request
    to vLLM's server and to the gateway."""
    body = {**_openai(worker, request), "messages": _messages(request)}
    await _openai_stream(worker, "/v1/chat/completions", body, record)


async def chat_whole(worker: Worker, request: Request, record: Record) -> None:
    """/v1/chat/completions, not streamed: each choice's finish_reason is its end."""
    body = {**_openai(worker, request, stream=False), "messages": _messages(request)}
    async with worker.post("/v1/chat/completions", body, record) as r:
        if await refused(r, record):
            return
        answer = _CHUNK.decode(await r.read())
    record.arrive()
    for choice in answer.choices:
        if choice.finish_reason:
            record.finish(answer.usage.completion_tokens if answer.usage else 0)
        else:
            record.terminal(ERROR, "a choice without its end")


# --- The gateway's WebSockets -----------------------------------------------------------------


def _generation_config(request: Request) -> dict[str, Any]:
    return {"max_new_tokens": request.max_new_tokens, "do_sample": False, "ignore_eos": True}


async def ws_batch(worker: Worker, request: Request, record: Record) -> None:
    """WS `/ws`: one prompt per payload; PROGRESS carries text, COMPLETE the token count."""
    ws = await worker.websocket("/ws")
    payload = {
        "prompts": [{"request_id": request.request_id, "prompt": request.prompt}],
        "generation_config": _generation_config(request),
    }
    received = 0
    await ws.send_bytes(_ENCODE(payload))
    while not record.terminals:
        for event in batch_events.decode_frame(await receive(ws)):
            if isinstance(event, batch_events.Progress):
                if event.text:
                    record.arrive()
                    received += len(event.text)
            elif isinstance(event, batch_events.Complete):
                if len(event.text) > received:  # the last step's text came with COMPLETE
                    record.arrive()
                record.text = event.text
                record.finish(event.new_tokens_count)
            elif isinstance(event, batch_events.ErrorEvent):
                record.terminal(kind_of_message(event.error), event.error)


async def ws_events_stream(worker: Worker, request: Request, record: Record) -> None:
    """WS `/ws/events`: START in; START echo, PROGRESS, COMPLETE out."""
    ws = await worker.websocket("/ws/events")
    start_event = {
        "type": "START",
        "id": request.request_id,
        "data": request.prompt,
        "parameters": _generation_config(request),
    }
    received = 0
    await ws.send_bytes(_ENCODE([start_event]))
    while not record.terminals:
        for event in ws_events.decode_frame(await receive(ws)):
            if isinstance(event, ws_events.Progress):
                if event.data:
                    record.arrive()
                    received += len(event.data)
            elif isinstance(event, ws_events.Complete):
                if len(event.data) > received:
                    record.arrive()
                # COMPLETE carries no token count; ignore_eos makes it max_new_tokens.
                record.finish(request.max_new_tokens)
            elif isinstance(event, ws_events.Error):
                record.terminal(kind_of_message(event.data), event.data)


def _control_parameters(request: Request) -> dict[str, Any]:
    return {"max_tokens": request.max_new_tokens, "temperature": 0, "ignore_eos": True}


def _control(message: control.ServerMessage, record: Record) -> bool:
    """One control message read: whether it carried text."""
    if isinstance(message, control.Completion):
        record.finish(message.usage.completion_tokens)
    elif isinstance(message, control.Error):
        kind = RATE_LIMITED if message.error == "rate_limited" else None
        record.terminal(kind or kind_of_message(message.message), message.message)
    return isinstance(message, control.Token) and bool(message.token)


async def control_ws(worker: Worker, request: Request, record: Record) -> None:
    """WS `/generate`: one `config` per generation, `token` messages, then `completion`."""
    ws = await worker.websocket("/generate")
    config = {"type": "config", "prompt": request.prompt}
    await ws.send_bytes(_ENCODE({**config, "parameters": _control_parameters(request)}))
    while not record.terminals:
        if _control(control.decode_server(await receive(ws)), record):
            record.arrive()


# --- The gateway's HTTP routes ----------------------------------------------------------------


async def v1_generate(worker: Worker, request: Request, record: Record) -> None:
    """POST `/v1/generate` with `stream: true`: the control messages as server-sent events."""
    body = {"prompt": request.prompt, "stream": True, **_control_parameters(request)}
    async with worker.post("/v1/generate", body, record) as r:
        if await refused(r, record):
            return
        async for payloads in sse_reads(r):
            text = False
            for payload in payloads:
                text = _control(control.decode_server(payload), record) or text
            if text:
                record.arrive()
            if record.terminals:
                return
    record.cut = True


async def generate_one(worker: Worker, request: Request, record: Record) -> None:
    """POST `/api/generate-one`: streamed text/plain, one chunk per engine step; a clean end of
    the body is the prompt's end."""
    body = {
        "request_id": request.request_id,
        "prompt": request.prompt,
        "generation_config": _generation_config(request),
    }
    async with worker.post("/api/generate-one", body, record) as r:
        if await refused(r, record):
            return
        try:
            async for data in r.content.iter_any():
                if data:
                    record.arrive()
        except aiohttp.ClientPayloadError:  # the route's way to end a failed stream: a cut
            record.cut = True
            return
    # The plain-text answer says nothing about tokens; ignore_eos makes it max_new_tokens.
    record.finish(request.max_new_tokens)


async def generate_batch(worker: Worker, request: Request, record: Record) -> None:
    """POST `/api/generate-batch`: two prompts in one payload, answered as one JSON array."""
    record.prompts = 2
    ids = [f"{request.request_id}-{i}" for i in range(2)]
    prompts = [{"request_id": i, "prompt": request.prompt} for i in ids]
    body = {"prompts": prompts, "generation_config": _generation_config(request)}
    async with worker.post("/api/generate-batch", body, record) as r:
        if await refused(r, record):
            return
        answers = msgspec.json.decode(await r.read(), type=list[dict[str, Any]])
    record.arrive()
    for answer in answers:
        error = answer.get("error")
        if isinstance(error, str):
            record.terminal(kind_of_message(error), error)
        else:
            record.finish(request.max_new_tokens)


_LMI_LINE = msgspec.json.Decoder(lmi.Line)


def _lmi_failed(line: lmi.Line) -> bool:
    """The spec's last line of a failed stream: finish_reason "error", a token with id -1."""
    if isinstance(line.details, lmi.Details) and line.details.finish_reason == "error":
        return True
    if isinstance(line.error, str):  # OPTION_TGI_COMPAT's way of saying it
        return True
    token = line.token
    return isinstance(token, dict) and (token.get("id", 0) < 0 or "error_msg" in token)


def _lmi_body(request: Request, stream: bool) -> dict[str, Any]:
    parameters = {"max_new_tokens": request.max_new_tokens, "ignore_eos_token": True}
    if stream:
        return {
            "inputs": request.prompt,
            "parameters": {**parameters, "do_sample": False},
            "stream": True,
        }
    return {"inputs": request.prompt, "parameters": parameters}


async def invocations(worker: Worker, request: Request, record: Record) -> None:
    """POST `/invocations`, jsonlines: one line per token, so each read's count is exact; the
    last line carries `generated_text` (or the error)."""
    headers = {"Accept": "application/jsonlines"}
    ended = False
    async with worker.post("/invocations", _lmi_body(request, True), record, headers) as r:
        if await refused(r, record):
            return
        lines = Lines()
        async for data in r.content.iter_any():
            text, tokens = False, 0
            for raw in lines.feed(data):
                if not raw.strip():
                    continue
                line = _LMI_LINE.decode(raw)
                if _lmi_failed(line):
                    record.terminal(ERROR, f"LMI error line: {raw[:300].decode(errors='replace')}")
                    return
                token = line.token  # `Any` in protocols.lmi: an LMI or a TGI-compatible token
                if isinstance(token, dict):
                    tokens += 1
                    text = text or bool(token.get("text"))
                ended = ended or isinstance(line.generated_text, str)
            record.counted(tokens, text)
    if ended:
        record.finish_counted()
    else:
        record.cut = True


class _ModelError(msgspec.Struct):
    OriginalStatusCode: int
    OriginalMessage: str


async def sagemaker(worker: Worker, request: Request, record: Record) -> None:
    """InvokeEndpoint: a whole LMI answer, or a 424 ModelError carrying the LMI status."""
    path = "/endpoints/soak/invocations"
    async with worker.post(path, _lmi_body(request, False), record) as r:
        raw = await r.read()
    if r.status == 424:
        error = msgspec.json.decode(raw, type=_ModelError)
        message = f"ModelError {error.OriginalStatusCode}: {error.OriginalMessage}"
        record.terminal(kind_of_status(error.OriginalStatusCode, message), message)
    elif r.status != 200:
        text = raw.decode(errors="replace")
        record.terminal(kind_of_status(r.status, text), f"HTTP {r.status}: {text[:300]}")
    else:
        record.arrive()
        record.finish(request.max_new_tokens)


_TGI_EVENT = msgspec.json.Decoder(tgi.StreamResponse)
_TGI_ERROR = msgspec.json.Decoder(tgi.ErrorResponse)


def _tgi_body(request: Request) -> dict[str, Any]:
    """TGI has no ignore_eos: the gateway's `ignore_eos_token` extension (the one vLLM's own
    benchmark client sends) fixes the length."""
    parameters = {"max_new_tokens": request.max_new_tokens, "ignore_eos_token": True}
    return {"inputs": request.prompt, "parameters": parameters}


async def tgi_stream(worker: Worker, request: Request, record: Record) -> None:
    """POST `/generate_stream` (TGI): one SSE event per token, 200 whatever happens; the last
    event has `generated_text`, or is the error."""
    ended = False
    async with worker.post("/generate_stream", _tgi_body(request), record) as r:
        if await refused(r, record):
            return
        async for payloads in sse_reads(r):
            text, tokens = False, 0
            for payload in payloads:
                try:
                    event = _TGI_EVENT.decode(payload)
                except msgspec.ValidationError:  # a failure: one event with TGI's error body
                    error = _TGI_ERROR.decode(payload)
                    validation = error.error_type == "validation"
                    record.terminal(
                        REFUSED if validation else kind_of_message(error.error), error.error
                    )
                    return
                tokens += 1
                text = text or bool(event.token.text)
                ended = ended or event.generated_text is not None
            record.counted(tokens, text)
    if ended:
        record.finish_counted()
    else:
        record.cut = True


async def tgi_generate(worker: Worker, request: Request, record: Record) -> None:
    """POST `/generate` (TGI): the whole answer."""
    async with worker.post("/generate", _tgi_body(request), record) as r:
        if await refused(r, record):
            return
        await r.read()
    record.arrive()
    record.finish(request.max_new_tokens)


_OLLAMA_CHUNK = msgspec.json.Decoder(ollama_answers.OllamaChunk)


async def ollama_chat(worker: Worker, request: Request, record: Record) -> None:
    """POST `/api/chat` (Ollama's), streamed: NDJSON lines, the last `done` with `eval_count`;
    `options.ignore_eos` (a gateway extension) fixes the length at `num_predict`."""
    options = {"num_predict": request.max_new_tokens, "ignore_eos": True, "temperature": 0}
    model = worker.context.model or "dummy"  # Ollama requires one; "dummy": the served model
    body = {"model": model, "messages": _messages(request), "stream": True, "options": options}
    async with worker.post("/api/chat", body, record) as r:
        if await refused(r, record):
            return
        lines = Lines()
        async for data in r.content.iter_any():
            text = False
            for raw in lines.feed(data):
                if not raw.strip():
                    continue
                try:
                    chunk = _OLLAMA_CHUNK.decode(raw)
                except msgspec.ValidationError:  # a failure: Ollama's {"error"} line
                    record.terminal(ERROR, raw[:300].decode(errors="replace"))
                    return
                message = chunk.message
                text = text or (
                    not isinstance(message, msgspec.UnsetType) and bool(message.content)
                )
                if chunk.done:
                    if text:
                        record.arrive()
                    count = chunk.eval_count
                    record.finish(count if isinstance(count, int) else request.max_new_tokens)
                    return
            if text:
                record.arrive()
    record.cut = True
