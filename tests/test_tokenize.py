"""vLLM's `/tokenize` and `/detokenize` on the gateway: the model's own tokenizer and chat
template, vLLM 0.32's shapes, OpenAI's errors, the API-key check. (tests/test_vllm_parity.py
sends the same requests to vLLM's own server.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai

from clients import CHAT, MAX_MODEL_LEN, web
from serving import RunningServer

MODEL = "SmolLM2-135M-Instruct"
PARIS = [504, 3575, 282, 4649, 314]  # "The capital of France is"


def post(server: RunningServer, path: str, body: dict[str, Any], **headers: str) -> Any:
    return web.post(server.http + path, json=body, headers=headers)


def test_a_prompt_becomes_its_tokens_and_back(server: RunningServer) -> None:
    answer = post(server, "/tokenize", {"prompt": "The capital of France is"})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "count": 5,
        "max_model_len": MAX_MODEL_LEN,
        "tokens": PARIS,
        "token_strs": None,
    }
    strings = post(
        server, "/tokenize", {"model": MODEL, "prompt": "The capital", "return_token_strs": True}
    )
    assert strings.json()["token_strs"] == ["The", "Ġcapital"]
    back = post(server, "/detokenize", {"model": MODEL, "tokens": PARIS})
    assert back.status_code == 200 and back.json() == {"prompt": "The capital of France is"}


def test_messages_are_tokenized_in_the_chat_template(server: RunningServer) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    chat = post(server, "/tokenize", {"messages": messages}).json()
    # The template's default system prompt, then the user's turn, then the assistant's.
    whole = post(server, "/detokenize", {"tokens": chat["tokens"]}).json()["prompt"]
    assert whole.endswith(CHAT.format("Hi")) and chat["count"] == len(chat["tokens"])
    reply = [*messages, {"role": "assistant", "content": "Hel"}]
    body = {"messages": reply, "add_generation_prompt": False, "continue_final_message": True}
    continued = post(server, "/tokenize", body).json()
    text = post(server, "/detokenize", {"tokens": continued["tokens"]}).json()["prompt"]
    assert text.endswith("<|im_start|>assistant\nHel")  # inside the last message, not closed


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city today.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_tools_are_rendered_as_the_chat_route_renders_them(server: RunningServer) -> None:
    """`tools` with `messages`, as vLLM's server takes them: the count is the prompt a chat
    completion with the same messages and tools is billed for."""
    messages = [{"role": "user", "content": "Is it raining in Oslo?"}]
    plain = post(server, "/tokenize", {"messages": messages}).json()
    answer = post(server, "/tokenize", {"messages": messages, "tools": [WEATHER]})
    assert answer.status_code == 200, answer.text
    counted = answer.json()
    text = post(server, "/detokenize", {"tokens": counted["tokens"]}).json()["prompt"]
    assert "get_weather" in text and "The weather in a city today." in text
    assert counted["count"] > plain["count"]
    client = openai.OpenAI(base_url=server.http + "/v1", api_key="none", max_retries=0)
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Is it raining in Oslo?"}],
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "The weather in a city today.",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                },
            }
        ],
        max_tokens=1,
    )
    assert chat.usage is not None and chat.usage.prompt_tokens == counted["count"]


def test_refusals_name_the_field_in_openais_shape(server: RunningServer) -> None:
    def refused(path: str, body: dict[str, Any], status: int = 400) -> dict[str, Any]:
        answer = post(server, path, body)
        assert answer.status_code == status, answer.text
        error: dict[str, Any] = answer.json()["error"]
        return error

    assert refused("/detokenize", {"tokens": [504, 10**6]})["param"] == "tokens[1]"
    assert refused("/detokenize", {"tokens": [-1]})["param"] == "tokens[0]"
    assert refused("/tokenize", {})["message"] == "Send either `prompt` or `messages`"
    both = {"messages": [{"role": "user", "content": "Hi"}], "continue_final_message": True}
    assert refused("/tokenize", both)["param"] == "continue_final_message"
    hi = [{"role": "user", "content": "Hi"}]
    assert refused("/tokenize", {"prompt": "Hi", "tools": [WEATHER]})["param"] == "tools"
    unnamed = {**WEATHER, "function": {"name": "get weather"}}
    assert refused("/tokenize", {"messages": hi, "tools": [unnamed]})["param"] == (
        "tools[0].function.name"
    )
    twice = refused("/tokenize", {"messages": hi, "tools": [WEATHER, WEATHER]})
    assert twice["param"] == "tools[1].function.name"
    unknown = refused("/tokenize", {"model": "gpt-9", "prompt": "Hi"}, 404)
    assert unknown["code"] == "model_not_found"


def test_the_api_key_guards_both_routes(make_server: Callable[..., RunningServer]) -> None:
    guarded = make_server(API_KEYS="tokenize-key")
    for path, body in (("/tokenize", {"prompt": "Hi"}), ("/detokenize", {"tokens": PARIS})):
        refused = post(guarded, path, body)
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
        allowed = post(guarded, path, body, authorization="Bearer tokenize-key")
        assert allowed.status_code == 200, allowed.text


def test_the_openapi_document_lists_both_routes(server: RunningServer) -> None:
    paths = web.get(server.http + "/openapi.json").json()["paths"]
    assert "post" in paths["/tokenize"] and "post" in paths["/detokenize"]
