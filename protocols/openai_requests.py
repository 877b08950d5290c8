"""OpenAI's `/v1/chat/completions` and `/v1/completions` requests, decoded to the neutral
vocabulary (no I/O). Fields this server does not know are ignored, as vLLM's server does;
known fields with bad values are 400s naming the field.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from protocols.constraints import (
    Constraint,
    ResponseFormat,
    constrained,
    only_one,
    response_format,
    structured_outputs,
)
from protocols.errors import invalid, validation_error
from protocols.events import History, token_array
from protocols.generation import (
    MAX_TOKEN_ID,
    MAX_TOKENS,
    Count,
    GenerationRequest,
    LogprobCount,
    MaxNewTokens,
    MinP,
    MinTokens,
    Penalty,
    Priority,
    RepetitionPenalty,
    SamplingOptions,
    Seed,
    TokenId,
    TopK,
    TopP,
    sequences_asked,
)
from protocols.json_body import MALFORMED, malformed
from protocols.sampling_defaults import left_out
from protocols.tool_calls import (
    ToolCall,
    ToolChoice,
    Tools,
    ToolUse,
    decode_tool_use,
    history_fields,
)

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
Stop = str | Annotated[list[str], Meta(max_length=16)]
TokenIds = Annotated[list[TokenId], Meta(min_length=1)]


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class _Common(msgspec.Struct, kw_only=True):
    """What both routes take: OpenAI's sampling fields and vLLM's extensions."""

    model: str | None = None  # None: the served model, as vLLM's server reads it
    max_tokens: MaxNewTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: Count = 1
    stop: Stop | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]] | None = None
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM's extensions, for the same engine
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    ignore_eos: bool = False
    min_tokens: MinTokens = 0
    priority: Priority | None = None  # a class at or behind the route's (docs/PRIORITIES.md)
    structured_outputs: dict[str, Any] | None = None  # protocols/constraints.py reads it


class TextPart(msgspec.Struct):
    # A field, not msgspec's tag: a lone tagged Struct decodes without its tag, and OpenAI's
    # schema requires `type`.
    type: Literal["text"]
    text: str


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool message: the call it answers


class ChatRequest(_Common, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_completion_tokens: MaxNewTokens | None = None
    logprobs: bool = False
    top_logprobs: LogprobCount | None = None
    response_format: ResponseFormat | None = None
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    tool_prompt: str | None = None  # TGI's Messages API: for a model without a tool parser


class CompletionRequest(_Common, kw_only=True):
    """`prompt`: a string, strings, token ids, or lists of token ids (as OpenAI and vLLM take
    it); `max_tokens` 0 with `echo` scores the prompt alone."""

    prompt: str | Annotated[list[str | TokenId | TokenIds], Meta(min_length=1)]
    max_tokens: Annotated[int, Meta(ge=0, le=MAX_TOKENS)] | None = None
    logprobs: LogprobCount | None = None
    echo: bool = False


class OpenAICall(msgspec.Struct, frozen=True, kw_only=True):
    """A decoded request: one GenerationRequest per prompt (or per prompt and choice when
    streaming), `choices` choices per prompt."""

    model: str | None
    requests: list[GenerationRequest]
    choices: int
    stream: bool
    include_usage: bool
    top_logprobs: int | None  # set: report log-probabilities, with this many alternatives
    echo_prompts: list[str] | None = None  # each prompt's text, to put before its choices
    prompt_only: bool = False  # `max_tokens` 0: the one token generated is not reported
    token_prompts: bool = False  # some prompts are token ids, their text yet to spell
    tool_use: ToolUse | None = None  # the chat's tools: calls parsed from its answers

    @property
    def names_token_ids(self) -> bool:
        """Its prompts or its `logit_bias` name token ids, to check against the vocabulary
        (`spelled`)."""
        return self.token_prompts or any(r.options.logit_bias for r in self.requests)


def decode_chat(raw: bytes, context: int) -> OpenAICall:
    body = decode_body(raw, ChatRequest)
    tool_use = decode_tool_use(
        body.tools, body.tool_choice, body.parallel_tool_calls, body.tool_prompt
    )
    if body.top_logprobs is not None and not body.logprobs:
        raise invalid("top_logprobs needs logprobs set to true", "top_logprobs")
    messages = tuple(chat_message(m, i) for i, m in enumerate(body.messages))
    top = (body.top_logprobs or 0) if body.logprobs else None
    limit = body.max_completion_tokens or body.max_tokens or context
    options = _options(body, limit, top)
    fmt = None if body.response_format is None else response_format(body.response_format)
    constraint = only_one(fmt, _structured(body))
    tools = tool_use.tools if tool_use is not None else None
    prompt = GenerationRequest(
        options=constrained(options, constraint),
        messages=messages,
        tools=tools,
        prompt_field="messages",
        constraint_field=constraint.field if constraint is not None else None,
    )
    return msgspec.structs.replace(_call(body, [prompt], top), tool_use=tool_use)


def decode_completion(raw: bytes, context: int) -> OpenAICall:
    """Token-id prompts come as histories without their text: `spelled` gives it."""
    body = decode_body(raw, CompletionRequest)
    prompts = _prompts(body.prompt)
    prompt_only = body.max_tokens == 0
    if prompt_only and not body.echo:
        raise invalid("max_tokens 0 needs echo: true (it scores the prompt alone)", "max_tokens")
    # OpenAI's default: 16. The prompt alone: vLLM's way, one token generated, not reported.
    limit = 16 if body.max_tokens is None else max(body.max_tokens, 1)
    options = _options(body, limit, body.logprobs)
    constraint = _structured(body)
    options = constrained(options, constraint)
    if body.echo and body.logprobs is not None:
        options = msgspec.structs.replace(options, prompt_logprobs=body.logprobs)
    requests = [_prompt_request(options, prompt, field) for prompt, field in prompts]
    if constraint is not None:
        requests = [msgspec.structs.replace(r, constraint_field=constraint.field) for r in requests]
    call = _call(body, requests, body.logprobs)
    if body.echo:
        # A streamed echo comes whole, one chunk per choice: the prompt's log-probabilities
        # arrive with the end of its generation.
        requests = [msgspec.structs.replace(r, stream=False) for r in call.requests]
        texts = [p if isinstance(p, str) else "" for p, _ in prompts]
        call = msgspec.structs.replace(call, requests=requests, echo_prompts=texts)
    token_prompts = any(not isinstance(p, str) for p, _ in prompts)
    return msgspec.structs.replace(call, prompt_only=prompt_only, token_prompts=token_prompts)


def spelled(
    call: OpenAICall, vocabulary: int, decode: Callable[[Sequence[int]], str]
) -> OpenAICall:
    """`call` with its token-id prompts checked against the model's `vocabulary` (its number of
    token ids) and given their text, decoded as vLLM's server decodes them; its `logit_bias` ids
    checked too (OpenAI's 400 naming `logit_bias`, where vLLM's own check would be a 422)."""
    for token_id in sorted({t for r in call.requests for t, _ in r.options.logit_bias}):
        if token_id >= vocabulary:
            raise invalid(
                f"logit_bias names token id {token_id}, out of vocabulary: this model's token "
                f"ids are 0 to {vocabulary - 1}",
                "logit_bias",
            )
    per_prompt = call.choices if call.stream else 1
    echoed = list(call.echo_prompts) if call.echo_prompts is not None else None
    texts: dict[int, str] = {}
    requests = []
    for request in call.requests:
        history = request.history
        if history is not None:
            prompt = request.index // per_prompt
            if prompt not in texts:
                check_token_ids(history.token_ids, vocabulary, request.prompt_field)
                texts[prompt] = decode(history.token_ids)
            history = History(history.token_ids, texts[prompt])
            request = msgspec.structs.replace(request, history=history)
            if echoed is not None:
                echoed[prompt] = texts[prompt]
        requests.append(request)
    return msgspec.structs.replace(
        call, requests=requests, echo_prompts=echoed, token_prompts=False
    )


def check_token_ids(token_ids: Sequence[int], vocabulary: int, field: str) -> None:
    """Every id within the model's `vocabulary` (its number of token ids), else a 400 naming
    the first that is not (`field[i]`)."""
    for i, token_id in enumerate(token_ids):
        if token_id >= vocabulary:
            raise invalid(
                f"Token id {token_id} is out of vocabulary: this model's token ids are 0 to "
                f"{vocabulary - 1}",
                f"{field}[{i}]",
            )


def _prompts(prompt: str | list[str | int | list[int]]) -> list[tuple[str | list[int], str]]:
    """Each prompt, text or token ids, with the field its errors name."""
    if isinstance(prompt, str):
        return [(prompt, "prompt")]
    ids = [p for p in prompt if isinstance(p, int)]
    if len(ids) == len(prompt):
        return [(ids, "prompt")]
    each = [p for p in prompt if not isinstance(p, int)]
    if len(each) == len(prompt) and len({type(p) for p in each}) == 1:
        return [(p, f"prompt[{i}]") for i, p in enumerate(each)]
    raise invalid(
        "`prompt` is a string, a list of strings, a list of token ids or a list of lists of "
        "token ids, not a mix",
        "prompt",
    )


def _prompt_request(
    options: SamplingOptions, prompt: str | list[int], field: str
) -> GenerationRequest:
    if isinstance(prompt, str):
        return GenerationRequest(options=options, prompt=prompt, prompt_field=field)
    history = History(token_array(prompt), "")
    return GenerationRequest(options=options, history=history, prompt_field=field)


def _structured(body: _Common) -> Constraint | None:
    """vLLM's `structured_outputs` extension, when given."""
    if body.structured_outputs is None:
        return None
    return structured_outputs(body.structured_outputs, "structured_outputs")


def decode_body(raw: bytes, kind: type[Any]) -> Any:
    """The body as `kind`; errors name the field, as OpenAI's do."""
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as e:
        raise validation_error(e) from e
    except MALFORMED as e:
        raise malformed(e, raw) from e


def chat_message(message: ChatMessage, index: int) -> dict[str, Any]:
    content = message.content
    if isinstance(content, list):
        content = "\n".join(part.text for part in content)
    tools = history_fields(message.role, message.tool_calls, message.tool_call_id, index)
    if content is None and "tool_calls" not in tools:
        raise invalid("A message needs `content`", f"messages[{index}].content")
    return {"role": message.role, "content": content or "", **tools}


def _options(body: _Common, limit: int, top_logprobs: int | None) -> SamplingOptions:
    if body.min_tokens > limit:
        raise invalid(
            f"min_tokens ({body.min_tokens}) must not exceed max_tokens ({limit})", "min_tokens"
        )
    temperature = 1.0 if body.temperature is None else body.temperature
    return SamplingOptions(
        max_new_tokens=limit,
        do_sample=temperature > 0,
        temperature=temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=-1 if body.top_k is None else body.top_k,
        min_p=body.min_p or 0.0,
        repetition_penalty=body.repetition_penalty or 1.0,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        seed=body.seed,
        stop=(body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ()),
        ignore_eos=body.ignore_eos,
        min_tokens=body.min_tokens,
        logit_bias=tuple(_bias(body.logit_bias or {})),
        logprobs=top_logprobs,
        n=1 if body.stream else body.n,
    )


def _bias(bias: dict[str, float]) -> list[tuple[int, float]]:
    try:
        pairs = [(int(token), value) for token, value in bias.items()]
    except ValueError as e:
        raise invalid("logit_bias keys must be token ids", "logit_bias") from e
    if any(not 0 <= token <= MAX_TOKEN_ID for token, _ in pairs):
        raise invalid(f"logit_bias keys must be token ids, 0 to {MAX_TOKEN_ID}", "logit_bias")
    return pairs


def _call(body: _Common, prompts: list[GenerationRequest], top_logprobs: int | None) -> OpenAICall:
    """Streaming answers each choice from a request of its own (the engine streams one
    sequence per request); otherwise one request per prompt generates all `n`. Either way
    each request names `n`, for its bound and the caller's limit."""
    per_prompt = body.n if body.stream else 1
    asked = sequences_asked("$", n=body.n)
    unset = left_out(
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        min_p=body.min_p,
        repetition_penalty=body.repetition_penalty,
    )
    requests = [
        msgspec.structs.replace(
            p,
            index=i * per_prompt + j,
            stream=body.stream,
            priority=body.priority,
            asked=asked,
            left_out=unset,
        )
        for i, p in enumerate(prompts)
        for j in range(per_prompt)
    ]
    usage = body.stream_options is not None and body.stream_options.include_usage
    return OpenAICall(
        model=body.model,
        requests=requests,
        choices=body.n,
        stream=body.stream,
        include_usage=usage,
        top_logprobs=top_logprobs,
    )


# What TGI's clients send for "the model this server serves": TGI's docs write "tgi";
# huggingface_hub's InferenceClient(base_url=...) sends "dummy".
ANY_MODEL = frozenset({"tgi", "dummy"})


def unknown_model(model: str | None, served: str, adapters: Sequence[str] = ()) -> str | None:
    """Why `model` is refused (404), or None: it names the served model (or any, as TGI's
    clients do) or one of its LoRA `adapters`."""
    if model is None or model == served or model in ANY_MODEL or model in adapters:
        return None
    others = "".join(f", `{a}`" for a in adapters)
    return f"The model `{model}` does not exist; this server serves `{served}`{others}"
