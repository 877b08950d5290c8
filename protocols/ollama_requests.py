"""Ollama's `/api/chat` and `/api/generate` requests, as the `ollama` clients, langchain-ollama
and llama-index send them, decoded to the neutral vocabulary (no I/O).

A chat becomes the same `OpenAICall` a chat completion does (its messages the chat template's,
its `tools` OpenAI's function tools with `auto`), so the chat template, the tool parsers and
the grammars are the chat route's. `/api/generate` is one prompt: rendered as a user turn after
its `system` (or sent as it is with `raw`), or, with `context` (the token ids an earlier answer
handed back), those ids followed by the new prompt's, continued on the prefix cache (the route
tokenizes the new part: `OllamaGenerate.context`). `format` (`"json"` or a JSON schema) is held
by the gateway's structured outputs under the constraint budget. `options` are Ollama's, with
its defaults where a request gives none (temperature 0.8, top_k 40, top_p 0.9, repeat_penalty
1.1); `num_ctx` past the model's context is refused, those a vLLM engine has no use for
(`num_gpu`, `num_thread`, `mirostat`...) are accepted and have no effect. Images, a `think`ing
request (no thinking model here), `suffix`, a Go `template` and `logprobs` are refused naming
the field. A request with no prompt (no messages) loads the model, and with `keep_alive` 0
unloads it (`load_only`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from protocols.constraints import ANY_OBJECT, Constraint, constrained, schema_text
from protocols.errors import invalid
from protocols.generation import (
    MAX_STOP_SEQUENCES,
    GenerationRequest,
    LogprobCount,
    MinP,
    Penalty,
    RepetitionPenalty,
    SamplingOptions,
    Seed,
    Temperature,
    TokenId,
    TopP,
    TypicalP,
)
from protocols.keep_alive import keep_alive_seconds as keep_alive
from protocols.openai_requests import OpenAICall, decode_body
from protocols.tool_calls import FunctionSpec, Tool, ToolUse, decode_tool_use

# Ollama's documented defaults, where a request gives none.
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 40
DEFAULT_TOP_P = 0.9
DEFAULT_REPEAT_PENALTY = 1.1
_LATEST = ":latest"

# Seconds (a negative number: forever), or a duration; a century at most, as a number.
KeepAlive = Annotated[float, Meta(ge=-(2**31), le=100 * 365 * 86400)] | str
TopK = Annotated[int, Meta(ge=0, le=2**31 - 1)]  # 0: off
NumPredict = Annotated[int, Meta(ge=-2, le=2**31 - 1)]  # -1, -2 (and 0): up to the context
NumCtx = Annotated[int, Meta(ge=1, le=2**31 - 1)]


class OllamaOptions(msgspec.Struct, kw_only=True):
    """Ollama's `options` that bear on generation; its others are accepted and ignored."""

    num_predict: NumPredict | None = None
    num_ctx: NumCtx | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    typical_p: TypicalP | None = None
    repeat_penalty: RepetitionPenalty | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: Seed | None = None
    stop: Annotated[list[str], Meta(max_length=MAX_STOP_SEQUENCES)] | None = None
    ignore_eos: bool = False  # a gateway extension (vLLM's): `num_predict` tokens, for the bench


class OllamaFunction(msgspec.Struct, kw_only=True):
    name: str
    arguments: dict[str, Any] = {}


class OllamaToolCall(msgspec.Struct, kw_only=True):
    function: OllamaFunction


class OllamaMessage(msgspec.Struct, kw_only=True):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    images: list[Any] | None = None
    tool_calls: list[OllamaToolCall] | None = None  # an assistant's
    tool_name: str | None = None  # a tool's: the function it answers
    thinking: str | None = None  # an assistant's earlier thinking: not shown to the model


class OllamaTool(msgspec.Struct, kw_only=True):
    function: FunctionSpec
    type: Literal["function"] = "function"


class _Common(msgspec.Struct, kw_only=True):
    model: Annotated[str, Meta(min_length=1)]
    stream: bool = True
    format: str | dict[str, Any] | None = None
    options: OllamaOptions | None = None
    keep_alive: KeepAlive | None = None
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: LogprobCount | None = None


class OllamaChatRequest(_Common, kw_only=True):
    messages: list[OllamaMessage] | None = None
    tools: Annotated[list[OllamaTool], Meta(max_length=128)] | None = None


class OllamaGenerateRequest(_Common, kw_only=True):
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[TokenId] | None = None
    raw: bool = False
    images: list[Any] | None = None


class OllamaCall(msgspec.Struct, frozen=True, kw_only=True):
    """A decoded chat or generate request: the one-prompt `call`, the model it names (":latest"
    dropped), `keep_alive` in seconds (None: the model's own; negative: forever), `load_only`:
    no prompt (the model is loaded, or unloaded with keep_alive 0)."""

    call: OpenAICall
    model: str
    keep_alive: float | None
    load_only: bool


class OllamaGenerate(msgspec.Struct, frozen=True, kw_only=True):
    """`/api/generate`'s call; `context`: the ids an earlier answer handed back, which the new
    `text` (the prompt rendered or raw) follows: the route tokenizes it into the request's
    history. None: the request renders (or sends) its prompt itself."""

    ollama: OllamaCall
    context: list[int] | None
    text: str
    raw: bool
    system: str | None


def model_name(name: str) -> str:
    """Ollama's `name:latest` is `name`."""
    return name.removesuffix(_LATEST) if name.endswith(_LATEST) else name


def keep_alive_seconds(value: KeepAlive | None, field: str = "keep_alive") -> float | None:
    """Ollama's keep_alive (protocols/keep_alive.py); None: not given."""
    return None if value is None else keep_alive(value, field)


def decode_chat(raw: bytes, context: int) -> OllamaCall:
    """A `/api/chat` request as the one-prompt chat call it asks for; `context`: the model's
    context length (the bound of `num_ctx`, and of `num_predict` when not given)."""
    body: OllamaChatRequest = decode_body(raw, OllamaChatRequest)
    _refuse_common(body)
    messages = tuple(_message(m, i) for i, m in enumerate(body.messages or ()))
    tool_use = _tool_use(body.tools)
    request = GenerationRequest(
        options=_options(body, context),
        messages=messages,
        tools=tool_use.tools if tool_use is not None else None,
        prompt_field="messages",
        constraint_field="format" if body.format else None,
    )
    call = _call(body, request, tool_use)
    return OllamaCall(
        call=call,
        model=model_name(body.model),
        keep_alive=keep_alive_seconds(body.keep_alive),
        load_only=not messages,
    )


def decode_generate(raw: bytes, context: int) -> OllamaGenerate:
    """A `/api/generate` request; see `OllamaGenerate` for a `context` continued."""
    body: OllamaGenerateRequest = decode_body(raw, OllamaGenerateRequest)
    _refuse_common(body)
    if body.images:
        raise invalid(_NO_IMAGES, "images")
    if body.suffix:
        raise invalid(
            "`suffix` (fill-in-the-middle) is not served: this model has no such template", "suffix"
        )
    if body.template:
        raise invalid(
            "`template` (an Ollama Go template) is not served: the model's chat template renders "
            "the prompt, or send it as it is with `raw`",
            "template",
        )
    text = body.prompt or ""
    system = None if body.raw else body.system
    request = GenerationRequest(
        options=_options(body, context),
        prompt=text if body.raw else "",
        messages=None if body.raw else turns(system, text),
        prompt_field="prompt",
        constraint_field="format" if body.format else None,
    )
    ollama = OllamaCall(
        call=_call(body, request, None),
        model=model_name(body.model),
        keep_alive=keep_alive_seconds(body.keep_alive),
        load_only=not text,
    )
    return OllamaGenerate(
        ollama=ollama, context=body.context or None, text=text, raw=body.raw, system=system
    )


def turns(system: str | None, prompt: str) -> tuple[dict[str, Any], ...]:
    turn = {"role": "user", "content": prompt}
    return ({"role": "system", "content": system}, turn) if system else (turn,)


_NO_IMAGES = "`images` is not served: this model reads text only"


def _refuse_common(body: _Common) -> None:
    if body.think is not None and body.think is not False:
        raise invalid("`think` is not served: this model does not think aloud", "think")
    if body.logprobs:
        raise invalid("`logprobs` is not served on this route", "logprobs")


def _options(body: _Common, context: int) -> SamplingOptions:
    given = body.options or OllamaOptions()
    if given.num_ctx is not None and given.num_ctx > context:
        raise invalid(
            f"num_ctx {given.num_ctx} is past this model's context length, {context} tokens",
            "options.num_ctx",
        )
    limit = given.num_predict if given.num_predict is not None and given.num_predict > 0 else 0
    temperature = DEFAULT_TEMPERATURE if given.temperature is None else given.temperature
    options = SamplingOptions(
        max_new_tokens=limit or given.num_ctx or context,
        do_sample=temperature > 0,
        temperature=temperature,
        top_p=DEFAULT_TOP_P if given.top_p is None else given.top_p,
        top_k=(given.top_k if given.top_k is not None else DEFAULT_TOP_K) or -1,
        min_p=given.min_p or 0.0,
        typical_p=1.0 if given.typical_p is None else given.typical_p,
        repetition_penalty=given.repeat_penalty or DEFAULT_REPEAT_PENALTY,
        presence_penalty=given.presence_penalty or 0.0,
        frequency_penalty=given.frequency_penalty or 0.0,
        seed=given.seed,
        stop=tuple(given.stop or ()),
        ignore_eos=given.ignore_eos,
    )
    return constrained(options, _format(body.format))


def _format(fmt: str | dict[str, Any] | None) -> Constraint | None:
    """`"json"`: some JSON object; an object: a JSON schema the answer is valid against."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return Constraint("json", ANY_OBJECT, "format")
    if isinstance(fmt, str):
        raise invalid('`format` is "json" or a JSON schema', "format")
    return Constraint("json", schema_text(fmt, "format"), "format")


def _call(body: _Common, request: GenerationRequest, tool_use: ToolUse | None) -> OpenAICall:
    # Streamed from the engine either way: the answer's durations time its prompt and its
    # generation apart (a whole answer is the stream collected).
    request = msgspec.structs.replace(request, stream=True)
    return OpenAICall(
        model=model_name(body.model),
        requests=[request],
        choices=1,
        stream=body.stream,
        include_usage=False,
        top_logprobs=None,
        tool_use=tool_use,
    )


def _message(message: OllamaMessage, index: int) -> dict[str, Any]:
    """One Ollama message as the chat template receives it: an assistant's calls with their
    arguments objects (each given an id), a tool's result after the call it answers."""
    field = f"messages[{index}]"
    if message.images:
        raise invalid(_NO_IMAGES, f"{field}.images")
    turn: dict[str, Any] = {"role": message.role, "content": message.content or ""}
    if message.tool_calls:
        if message.role != "assistant":
            raise invalid("Only an assistant message has `tool_calls`", f"{field}.tool_calls")
        turn["tool_calls"] = [
            {
                "id": f"call_{index}_{j}",
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for j, c in enumerate(message.tool_calls)
        ]
    if message.role == "tool":
        turn["tool_call_id"] = f"call_{message.tool_name or 'tool'}"
        if message.tool_name:
            turn["name"] = message.tool_name
    return turn


def _tool_use(tools: list[OllamaTool] | None) -> ToolUse | None:
    if not tools:
        return None
    return decode_tool_use([Tool(type="function", function=t.function) for t in tools], None, None)
