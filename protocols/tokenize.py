"""vLLM's POST `/tokenize` and `/detokenize`: the request and answer shapes of vLLM 0.32's
server (`vllm/entrypoints/serve/tokenize/protocol.py`), decoded and checked without I/O. Errors
are OpenAI's error object, as vLLM's server answers them.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from protocols.errors import invalid
from protocols.openai_requests import ChatMessage, chat_message, decode_body
from protocols.tool_calls import Tools, decode_tool_use


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """A text (`prompt`, vLLM's TokenizeCompletionRequest) or a conversation rendered with the
    model's chat template (`messages`, its TokenizeChatRequest)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    # None: vLLM's default, true for a prompt and false for messages (the template has them)
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool | None = False
    # Rendered into the template with `messages`, as the chat route renders them
    tools: Tools | None = None
    # vLLM's, refused: this server renders the model's own template
    chat_template: str | None = None

    @property
    def special_tokens(self) -> bool:
        if self.add_special_tokens is not None:
            return self.add_special_tokens
        return self.messages is None

    def conversation(self) -> list[dict[str, Any]]:
        return [chat_message(m, i) for i, m in enumerate(self.messages or ())]

    def tool_definitions(self) -> tuple[dict[str, Any], ...] | None:
        """`tools` as the chat template receives them (the chat route's decoding and checks)."""
        use = decode_tool_use(self.tools, None, None)
        return use.tools if use is not None else None


class TokenizeResponse(msgspec.Struct):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None  # written as null when not asked for, as vLLM does


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    tokens: list[Annotated[int, Meta(ge=0, le=2**63 - 1)]]


class DetokenizeResponse(msgspec.Struct):
    prompt: str


def decode_tokenize(raw: bytes) -> TokenizeRequest:
    body: TokenizeRequest = decode_body(raw, TokenizeRequest)
    if (body.prompt is None) == (body.messages is None):
        raise invalid("Send either `prompt` or `messages`", "prompt")
    if body.messages is not None:
        if body.continue_final_message and body.add_generation_prompt:
            raise invalid(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                "continue_final_message",
            )
        if body.chat_template is not None:
            raise invalid("This server renders the model's own chat template", "chat_template")
    elif body.tools is not None:
        raise invalid(
            "`tools` are rendered with `messages`: a prompt is tokenized as it is", "tools"
        )
    return body


def decode_detokenize(raw: bytes) -> DetokenizeRequest:
    body: DetokenizeRequest = decode_body(raw, DetokenizeRequest)
    return body


_ENCODER = msgspec.json.Encoder()


def encode(answer: TokenizeResponse | DetokenizeResponse) -> bytes:
    return _ENCODER.encode(answer)
