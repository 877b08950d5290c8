"""Ollama's API with the real clients, unchanged, on the session's engines: the `ollama` client
(chat, generate, streamed and not, `format` from a pydantic model, tools, embed, list, ps,
show), langchain-ollama's `ChatOllama` (invoke, stream, bind_tools, with_structured_output) and
`OllamaEmbeddings`, llama-index's `Ollama`; a two-turn `/api/generate` whose second turn
continues the first's `context` on the prefix cache; and bad input, each Ollama's error and no
5xx. Loading and unloading a model with keep_alive: tests/test_ollama_residency.py."""

from __future__ import annotations

import json
from typing import Any

import ollama
import pydantic
import pytest

from clients import MAX_MODEL_LEN, scrape, settled_metrics, value, web
from serving import RunningServer

MODEL = "SmolLM2-135M-Instruct"
EMBEDDER = "all-MiniLM-L6-v2"
GREEDY: Any = {"temperature": 0, "num_predict": 12}
HELLO: Any = [{"role": "user", "content": "Say hello."}]
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
        },
    },
}


def _called(city: str) -> dict[str, Any]:
    call = {"function": {"name": "get_weather", "arguments": {"city": city}}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


FEW_SHOT: Any = [
    {"role": "user", "content": "Weather in Paris?"},
    _called("Paris"),
    {"role": "user", "content": "Weather in London?"},
    _called("London"),
    {"role": "user", "content": "Weather in Rome?"},
]


class City(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=20)
    is_capital: bool


def client(server: RunningServer) -> ollama.Client:
    return ollama.Client(host=server.http, timeout=120)


# `make test-all` only (issue 55: `make test`'s time on the slowest CPU); /api/generate's whole
# and streamed answers stay in `make test`.
@pytest.mark.long
def test_chat_whole_and_streamed_give_the_same_text(embedding_server: RunningServer) -> None:
    api = client(embedding_server)
    whole = api.chat(model=MODEL, messages=HELLO, options=GREEDY)
    assert whole.done and whole.done_reason in ("stop", "length") and whole.message.content
    assert whole.message.role == "assistant" and whole.model == MODEL
    assert whole.prompt_eval_count and 0 < (whole.eval_count or 0) <= 12
    assert (whole.total_duration or 0) >= (whole.eval_duration or 0) > 0
    parts = list(api.chat(model=MODEL, messages=HELLO, options=GREEDY, stream=True))
    assert [p.done for p in parts][-1] and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    raw = web.post(embedding_server.http + "/api/chat", json={"model": MODEL, "messages": HELLO})
    assert raw.headers["content-type"].startswith("application/x-ndjson")  # stream by default


def test_generate_whole_and_streamed_hand_back_the_context(embedding_server: RunningServer) -> None:
    api = client(embedding_server)
    whole = api.generate(model=MODEL, prompt="The capital of France is", options=GREEDY)
    assert whole.done and whole.response and whole.context
    streamed = list(
        api.generate(model=MODEL, prompt="The capital of France is", options=GREEDY, stream=True)
    )
    assert "".join(p.response or "" for p in streamed) == whole.response
    assert streamed[-1].context == whole.context
    raw = api.generate(model=MODEL, prompt="1, 2, 3,", raw=True, options=GREEDY)
    assert raw.response and raw.prompt_eval_count and raw.prompt_eval_count < 10


# `make test-all` only (issue 55: `make test`'s time on the slowest CPU); the prefix cache's
# continuations stay in `make test` (test_openai.py, test_responses.py).
@pytest.mark.long
def test_a_second_turn_continues_the_firsts_context_on_the_prefix_cache(
    embedding_server: RunningServer,
) -> None:
    api = client(embedding_server)
    story = "Tell me a long story about a dragon who guards a library of old maps."
    first = api.generate(model=MODEL, prompt=story, options={"temperature": 0, "num_predict": 48})
    assert first.context and len(first.context) > 64
    before = settled_metrics(embedding_server.http)
    second = api.generate(model=MODEL, prompt="And then?", context=first.context, options=GREEDY)
    assert second.response and second.context
    assert second.context[: len(first.context)] == first.context
    assert (second.prompt_eval_count or 0) > len(first.context)
    after = settled_metrics(embedding_server.http)
    name = "gateway_prompt_tokens_cached_total"
    cached = value(after, name, protocol="ollama") - value(before, name, protocol="ollama")
    assert cached >= 32  # the first turn's KV blocks, whole ones (32 tokens each on a CPU)


def test_format_from_a_pydantic_model_holds_the_answer(embedding_server: RunningServer) -> None:
    answer = client(embedding_server).chat(
        model=MODEL,
        messages=[{"role": "user", "content": "Paris: city and whether it is a capital, JSON."}],
        format=City.model_json_schema(),
        options={"temperature": 0, "num_predict": 60},
    )
    City.model_validate_json(answer.message.content or "")
    anything = client(embedding_server).generate(
        model=MODEL, prompt="A JSON object about Paris:", format="json", options={"num_predict": 40}
    )
    assert (anything.response or "").lstrip().startswith("{")


def test_tools_the_model_calls_come_whole(embedding_server: RunningServer) -> None:
    api = client(embedding_server)
    options = {"temperature": 0, "num_predict": 80}
    whole = api.chat(model=MODEL, messages=FEW_SHOT, tools=[WEATHER], options=options)
    [call] = whole.message.tool_calls or []
    assert call.function.name == "get_weather" and call.function.arguments["city"] == "Rome"
    parts = list(
        api.chat(model=MODEL, messages=FEW_SHOT, tools=[WEATHER], options=options, stream=True)
    )
    calls = [c for p in parts for c in p.message.tool_calls or []]
    assert [c.function.arguments for c in calls] == [call.function.arguments]


def test_embed_and_the_older_embeddings(embedding_server: RunningServer) -> None:
    api = client(embedding_server)
    answer = api.embed(model=EMBEDDER, input=["a cat", "a dog"])
    assert len(answer.embeddings) == 2 and len(answer.embeddings[0]) == 384
    assert answer.prompt_eval_count
    old = api.embeddings(model=EMBEDDER, prompt="a cat")
    assert list(old.embedding) == pytest.approx(list(answer.embeddings[0]), abs=1e-5)


def test_list_ps_show_and_version(embedding_server: RunningServer) -> None:
    api = client(embedding_server)
    names = [m.model for m in api.list().models]
    assert MODEL in names and EMBEDDER in names
    running = {m.model: m for m in api.ps().models}
    assert running[MODEL].context_length == MAX_MODEL_LEN and running[MODEL].expires_at
    shown = api.show(MODEL)
    assert shown.capabilities is not None and "tools" in shown.capabilities
    assert shown.modelinfo is not None
    assert "embedding" in (api.show(EMBEDDER).capabilities or [])
    version = web.get(embedding_server.http + "/api/version").json()["version"]
    assert version
    assert web.get(embedding_server.http + "/").text == "Ollama is running"
    assert web.request("HEAD", embedding_server.http + "/").status_code == 200


def test_a_request_with_no_prompt_loads_the_model(embedding_server: RunningServer) -> None:
    loaded = client(embedding_server).generate(model=MODEL)
    assert loaded.done and loaded.done_reason == "load"
    chat = client(embedding_server).chat(model=MODEL, messages=[])
    assert chat.done_reason == "load"


def test_langchain_chat_ollama(embedding_server: RunningServer) -> None:
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.messages.tool import tool_call
    from langchain_core.tools import tool
    from langchain_ollama import ChatOllama

    chat = ChatOllama(model=MODEL, base_url=embedding_server.http, temperature=0, num_predict=12)
    answer = chat.invoke("Say hello.")
    assert answer.content
    pieces = list(chat.stream("Say hello."))
    assert "".join(str(p.content) for p in pieces) == answer.content

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return "sunny"

    long = ChatOllama(model=MODEL, base_url=embedding_server.http, temperature=0, num_predict=80)
    few_shot: list[Any] = []
    for i, message in enumerate(FEW_SHOT):
        if message["role"] == "user":
            few_shot.append(HumanMessage(message["content"]))
        else:
            [call] = message["tool_calls"]
            args = call["function"]["arguments"]
            few_shot.append(
                AIMessage("", tool_calls=[tool_call(name="get_weather", args=args, id=f"c{i}")])
            )
    called = long.bind_tools([get_weather]).invoke(few_shot)
    assert [c["name"] for c in called.tool_calls] == ["get_weather"]
    structured = long.with_structured_output(City).invoke(
        "Paris: city and whether it is a capital."
    )
    assert isinstance(structured, City)


def test_langchain_ollama_embeddings(embedding_server: RunningServer) -> None:
    from langchain_ollama import OllamaEmbeddings

    embedder = OllamaEmbeddings(model=EMBEDDER, base_url=embedding_server.http)
    vectors = embedder.embed_documents(["a cat", "a dog"])
    assert len(vectors) == 2 and len(embedder.embed_query("a cat")) == 384


def test_llama_index_ollama(embedding_server: RunningServer) -> None:
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.ollama import Ollama

    llm = Ollama(
        model=MODEL,
        base_url=embedding_server.http,
        temperature=0,
        request_timeout=120,
        additional_kwargs={"num_predict": 12},
    )
    completed = llm.complete("The capital of France is")
    assert completed.text
    chatted = llm.chat([ChatMessage(role="user", content="Say hello.")])
    assert chatted.message.content
    streamed = list(llm.stream_complete("The capital of France is"))
    assert streamed[-1].text == completed.text


def _refusal(server: RunningServer, path: str, body: Any, status: int) -> str:
    answer = web.post(
        server.http + path,
        content=body if isinstance(body, bytes) else None,
        json=None if isinstance(body, bytes) else body,
    )
    assert answer.status_code == status, answer.text
    document = answer.json()
    assert set(document) == {"error"}
    return str(document["error"])


def test_bad_input_is_ollamas_error_never_a_5xx(embedding_server: RunningServer) -> None:
    server = embedding_server
    with pytest.raises(ollama.ResponseError) as caught:
        client(server).chat(model="no-such-model", messages=HELLO)
    assert caught.value.status_code == 404 and "no-such-model" in caught.value.error
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(600)}}
    past = _refusal(server, "/api/chat", {"model": MODEL, "messages": HELLO, "format": wide}, 400)
    assert "format" in past
    big = {"model": MODEL, "messages": HELLO, "options": {"num_ctx": MAX_MODEL_LEN * 2}}
    assert "num_ctx" in _refusal(server, "/api/chat", big, 400)
    image = [{"role": "user", "content": "What is it?", "images": ["aGk="]}]
    assert "images" in _refusal(server, "/api/chat", {"model": MODEL, "messages": image}, 400)
    _refusal(server, "/api/generate", b"{not json", 400)
    assert "downloaded" in _refusal(server, "/api/pull", {"model": MODEL}, 403)
    with pytest.raises(ollama.ResponseError) as pulled:
        client(server).pull(MODEL)
    assert pulled.value.status_code == 403
    unknown = _refusal(server, "/api/embed", {"model": "nope", "input": "x"}, 404)
    assert "nope" in unknown
    too_long = "word " * (MAX_MODEL_LEN * 2)
    assert _refusal(server, "/api/generate", {"model": MODEL, "prompt": too_long}, 400)


def test_ollama_chat_is_counted_as_its_protocol(embedding_server: RunningServer) -> None:
    before = value(
        scrape(embedding_server.http),
        "gateway_requests_total",
        protocol="ollama",
        outcome="ok",
    )
    client(embedding_server).chat(model=MODEL, messages=HELLO, options=GREEDY)
    after = settled_metrics(embedding_server.http)
    assert value(after, "gateway_requests_total", protocol="ollama", outcome="ok") > before
    assert json.loads(web.get(embedding_server.http + "/openapi.json").text)["paths"]["/api/chat"]
