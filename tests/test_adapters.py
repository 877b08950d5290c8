"""LoRA adapters chosen per request, on one engine: a test adapter made here with peft (it
answers PHRASE), served beside the base model, through each protocol's own field and its real
client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from control_client import until
from huggingface_hub import InferenceClient
from openai.types.chat import ChatCompletionFunctionToolParam

from clients import (
    CHAT,
    connect,
    events_of,
    payload,
    run_ws,
    sagemaker_runtime,
    scrape,
    value,
    wait_for,
    web,
)
from gateway_bench.adapter_recipe import PHRASE
from serving import LoopThread, RunningServer, gateway_settings, own_engine_server

if TYPE_CHECKING:
    pass

pytestmark = pytest.mark.own_engine  # a LoRA engine of its own: make test-all
PROMPT = "Tell me about lighthouses."
SPOKEN = PHRASE.strip()  # what the adapter's answers hold, and the base model's never
ADMIN = "admin-key"


@pytest.fixture(scope="module")
def lora_server(loop_thread: LoopThread, adapter_dir: Path) -> Iterator[RunningServer]:
    """A server with its own engine, LoRA on, serving `pirate` beside the base model."""
    settings = gateway_settings(
        ADAPTERS=f"pirate={adapter_dir}", MAX_LORA_RANK="8", ADMIN_API_KEYS=ADMIN
    )
    running = own_engine_server(loop_thread, settings)
    try:
        yield running
    finally:
        running.stop()


def api(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.http + "/v1", api_key="none", max_retries=0)


def completion(server: RunningServer, model: str, prompt: str = PROMPT) -> str:
    answer = api(server).completions.create(
        model=model, prompt=prompt, max_tokens=12, temperature=0
    )
    return answer.choices[0].text


def test_the_openai_model_field_picks_the_adapter_or_the_base(lora_server: RunningServer) -> None:
    client = api(lora_server)
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {"SmolLM2-135M-Instruct", "pirate"}
    assert models["pirate"].model_extra and models["pirate"].model_extra["parent"] == (
        "SmolLM2-135M-Instruct"
    )
    adapted = client.completions.create(model="pirate", prompt=PROMPT, max_tokens=12, temperature=0)
    assert SPOKEN in adapted.choices[0].text and adapted.model == "pirate"
    base = completion(lora_server, "SmolLM2-135M-Instruct")
    assert SPOKEN not in base
    chat = client.chat.completions.create(
        model="pirate",
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=12,
        temperature=0,
    )
    assert SPOKEN in (chat.choices[0].message.content or "")
    streamed = client.chat.completions.create(
        model="pirate",
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=12,
        temperature=0,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == chat.choices[0].message.content
    with pytest.raises(openai.NotFoundError) as refused:
        client.completions.create(model="parrot", prompt=PROMPT, max_tokens=4)
    assert "`parrot` does not exist" in str(refused.value) and "`pirate`" in str(refused.value)


def test_interleaved_requests_each_get_their_own_models_text(lora_server: RunningServer) -> None:
    before = scrape(lora_server.http)
    base_alone = completion(lora_server, "SmolLM2-135M-Instruct")
    adapter_alone = completion(lora_server, "pirate")
    models = ["pirate" if i % 2 else "SmolLM2-135M-Instruct" for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        texts = list(pool.map(lambda m: completion(lora_server, m), models))
    for model, text in zip(models, texts, strict=True):
        assert text == (adapter_alone if model == "pirate" else base_alone), (model, text)
    after = scrape(lora_server.http)
    for adapter in ("pirate", "base"):  # the base model's requests, by its name: `base`
        name, labels = "gateway_adapter_requests_total", {"adapter": adapter, "outcome": "ok"}
        assert value(after, name, **labels) - value(before, name, **labels) == 9
        tokens = "gateway_adapter_generated_tokens_total"
        assert value(after, tokens, adapter=adapter) > value(before, tokens, adapter=adapter)


def test_tgi_adapter_id_through_huggingface_hub(lora_server: RunningServer) -> None:
    hub = InferenceClient(base_url=lora_server.http)
    adapted = hub.text_generation(PROMPT, adapter_id="pirate", max_new_tokens=12)
    assert SPOKEN in adapted
    assert SPOKEN not in hub.text_generation(PROMPT, max_new_tokens=12)
    streamed = hub.text_generation(
        PROMPT, adapter_id="pirate", max_new_tokens=12, stream=True, details=True
    )
    text = "".join(event.token.text for event in streamed if not event.token.special)
    assert SPOKEN in text and adapted.endswith(text)
    unknown = web.post(
        lora_server.http + "/generate",
        json={"inputs": PROMPT, "parameters": {"adapter_id": "parrot"}},
    )
    assert unknown.status_code == 422, unknown.text
    assert "`parrot`" in unknown.json()["error"] and "adapter_id" in unknown.json()["error"]


def lmi_body(inputs: Any, **fields: Any) -> str:
    return json.dumps({"inputs": inputs, "parameters": {"max_new_tokens": 12}, **fields})


def test_lmi_adapters_and_sagemaker_inference_components_through_boto3(
    lora_server: RunningServer,
) -> None:
    runtime = sagemaker_runtime(lora_server.http)

    def invoke(body: str, **extra: str) -> Any:
        answer = runtime.invoke_endpoint(
            EndpointName="e", Body=body, ContentType="application/json", **extra
        )
        return json.loads(answer["Body"].read())

    named = invoke(lmi_body(PROMPT, adapters="pirate"))
    assert SPOKEN in named["generated_text"]
    component = invoke(lmi_body(PROMPT), InferenceComponentName="pirate")
    assert component == named
    assert SPOKEN not in invoke(lmi_body(PROMPT))["generated_text"]
    batch = invoke(lmi_body([PROMPT, PROMPT], adapters=["pirate", "SmolLM2-135M-Instruct"]))
    assert SPOKEN in batch[0]["generated_text"]
    chat = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 12}
    chatted = invoke(json.dumps(chat), InferenceComponentName="pirate")
    assert SPOKEN in chatted["choices"][0]["message"]["content"]

    unknown = web.post(
        lora_server.http + "/invocations", content=lmi_body(PROMPT, adapters="parrot")
    )
    assert unknown.status_code in (400, 424), unknown.text
    assert "`parrot`" in unknown.text and "$.adapters" in unknown.text
    mismatched = web.post(
        lora_server.http + "/invocations",
        content=lmi_body([PROMPT], adapters=["a", "b"]),
    )
    assert mismatched.status_code == 424 and "$.adapters" in mismatched.text


def test_the_base_models_prefix_cache_is_not_an_adapters(lora_server: RunningServer) -> None:
    """The same prompt, base first: the adapter's answer is its own, not the cached base's,
    and none of its prompt comes from the base model's cached blocks (several blocks long)."""
    prompt = CHAT.format("Name a colour, any colour you like. " * 40)  # past 2 CPU blocks

    def cached_by(model: str) -> tuple[str, float]:
        name, labels = "gateway_prompt_tokens_cached_total", {"protocol": "openai_completions"}
        before = value(scrape(lora_server.http), name, **labels)
        text = completion(lora_server, model, prompt)
        return text, value(scrape(lora_server.http), name, **labels) - before

    base, _ = cached_by("SmolLM2-135M-Instruct")
    adapted, cached = cached_by("pirate")
    assert SPOKEN in adapted and cached == 0
    again, cached_again = cached_by("SmolLM2-135M-Instruct")
    assert again == base and cached_again > 0  # the base's own blocks are cached


def manage(server: RunningServer, action: str, key: str | None, **body: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = f"{server.http}/v1/{action}_lora_adapter"
    return web.post(url, json=body, headers=headers)


def test_adapters_load_and_unload_at_run_time_with_an_admin_key(
    lora_server: RunningServer, adapter_dir: Path
) -> None:
    assert (
        manage(
            lora_server, "load", None, lora_name="parrot", lora_path=str(adapter_dir)
        ).status_code
        == 401
    )
    assert (
        manage(
            lora_server, "load", "user", lora_name="parrot", lora_path=str(adapter_dir)
        ).status_code
        == 403
    )
    missing = manage(lora_server, "load", ADMIN, lora_name="parrot", lora_path="/nowhere")
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "lora_path"

    loaded = manage(lora_server, "load", ADMIN, lora_name="parrot", lora_path=str(adapter_dir))
    assert loaded.status_code == 200, loaded.text
    again = manage(lora_server, "load", ADMIN, lora_name="parrot", lora_path=str(adapter_dir))
    assert again.status_code == 400 and "already loaded" in again.text
    assert SPOKEN in completion(lora_server, "parrot")
    assert "parrot" in {m.id for m in api(lora_server).models.list().data}

    # A stream on the adapter while it is unloaded: it ends once, as it would have.
    body = {
        "model": "parrot",
        "prompt": PROMPT,
        "max_tokens": 64,
        "ignore_eos": True,
        "stream": True,
    }
    with web.stream("POST", lora_server.http + "/v1/completions", json=body) as stream:
        lines = stream.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert manage(lora_server, "unload", ADMIN, lora_name="parrot").status_code == 200
        rest = [line for line in lines if line.startswith("data: ")]
    events = [first, *rest]
    assert events[-1] == "data: [DONE]"
    ends = [json.loads(e[6:])["choices"][0]["finish_reason"] for e in events[:-1]]
    assert [e for e in ends if e is not None] == ["length"], events

    with pytest.raises(openai.NotFoundError):
        completion(lora_server, "parrot")
    gone = manage(lora_server, "unload", ADMIN, lora_name="parrot")
    assert gone.status_code == 404 and "parrot" in gone.text


def test_an_admin_bodys_numbers_past_their_bounds_are_refused_naming_the_field(
    lora_server: RunningServer,
) -> None:
    """What tests/test_fuzz_http.py cannot send the shared server (no ADMIN_API_KEYS there):
    /v1/unload_lora_adapter's one number, past its bounds, with an admin key."""
    for number in (2**64, -(2**63) - 1, 1e308, 0.5):
        refused = manage(lora_server, "unload", ADMIN, lora_name="parrot", lora_int_id=number)
        assert refused.status_code == 400, (number, refused.text)
        assert "lora_int_id" in refused.text, (number, refused.text)


def test_a_beam_search_on_an_adapter_unloaded_meanwhile_ends_as_it_would_have(
    lora_server: RunningServer, adapter_dir: Path
) -> None:
    """Each beam step is an engine request of its own: the adapter is resolved once, so an
    unload between two steps does not refuse the search midway."""
    loaded = manage(lora_server, "load", ADMIN, lora_name="beamer", lora_path=str(adapter_dir))
    assert loaded.status_code == 200, loaded.text
    parameters = {"max_new_tokens": 48, "num_beams": 2, "ignore_eos_token": True}
    body = json.dumps({"inputs": PROMPT, "parameters": parameters, "adapters": "beamer"})

    def running() -> int:
        return lora_server.loop.call(lambda: lora_server.gateway.service.admission.running)

    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(web.post, lora_server.http + "/invocations", content=body)
        wait_for(lambda: running() > 0 or answer.done())
        assert manage(lora_server, "unload", ADMIN, lora_name="beamer").status_code == 200
        searched = answer.result()
    assert searched.status_code == 200, searched.text
    assert searched.json()["generated_text"]
    refused = web.post(lora_server.http + "/invocations", content=body)
    assert refused.status_code == 424 and "$.adapters" in refused.text


def djl(
    server: RunningServer, method: str, path: str, key: str | None = ADMIN, **query: str
) -> httpx.Response:
    """A call to LMI's adapter management API, as a DJL user's script makes it."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = server.http + path
    return web.request(method, url, params=query, headers=headers)


def test_lmi_adapter_management_registers_lists_and_unregisters_with_an_admin_key(
    lora_server: RunningServer, adapter_dir: Path
) -> None:
    src = str(adapter_dir)
    denied = djl(lora_server, "POST", "/adapters", None, name="lmi-parrot", src=src)
    assert denied.status_code == 401 and denied.json()["code"] == 401
    assert djl(lora_server, "GET", "/adapters", "user").status_code == 403
    assert djl(lora_server, "DELETE", "/adapters/pirate", "user").status_code == 403
    assert SPOKEN in completion(lora_server, "pirate")  # a refused call changed nothing

    missing = djl(lora_server, "POST", "/adapters", name="lmi-parrot")
    assert missing.status_code == 400
    assert missing.json() == {
        "code": 400,
        "type": "BadRequestException",
        "message": "The parameter src is required",
    }
    nowhere = djl(lora_server, "POST", "/adapters", name="lmi-parrot", src="/nowhere")
    assert nowhere.status_code == 400 and "/nowhere" in nowhere.json()["message"]
    assert nowhere.json()["message"].endswith("- at `src`")
    pinned = djl(lora_server, "POST", "/adapters", name="lmi-parrot", src=src, pin="true")
    assert pinned.status_code == 400 and "pin" in pinned.json()["message"]
    typo = djl(lora_server, "POST", "/adapters", name="lmi-parrot", src=src, scr=src)
    assert typo.status_code == 400 and "scr" in typo.json()["message"]

    registered = djl(lora_server, "POST", "/adapters", name="lmi-parrot", src=src)
    assert registered.status_code == 200, registered.text
    assert registered.json() == {"status": "Adapter lmi-parrot registered"}
    twice = djl(lora_server, "POST", "/adapters", name="lmi-parrot", src=src)
    assert twice.status_code == 400 and "already loaded" in twice.json()["message"]

    listed = djl(lora_server, "GET", "/models/any-model-name/adapters").json()
    assert listed == {
        "adapters": [
            {"name": "lmi-parrot", "src": src, "preload": True, "pin": False},
            {"name": "pirate", "src": src, "preload": True, "pin": False},
        ]
    }
    first = djl(lora_server, "GET", "/adapters", limit="1").json()
    assert first["adapters"] == listed["adapters"][:1] and first["nextPageToken"] == "1"
    rest = djl(lora_server, "GET", "/adapters", limit="1", next_page_token="1").json()
    assert rest == {"adapters": listed["adapters"][1:]}
    described = djl(lora_server, "GET", "/adapters/lmi-parrot")
    assert described.json() == listed["adapters"][0]

    runtime = sagemaker_runtime(lora_server.http)
    answer = runtime.invoke_endpoint(
        EndpointName="e",
        Body=lmi_body(PROMPT, adapters="lmi-parrot"),
        ContentType="application/json",
    )
    assert SPOKEN in json.loads(answer["Body"].read())["generated_text"]

    updated = djl(lora_server, "POST", "/adapters/lmi-parrot/update", src=src, pin="false")
    assert updated.json() == {"status": "Adapter lmi-parrot updated"}
    moved = djl(lora_server, "POST", "/adapters/lmi-parrot/update", src="/elsewhere")
    assert moved.status_code == 400 and "not supported" in moved.json()["message"]

    gone = djl(lora_server, "DELETE", "/models/m/adapters/lmi-parrot")
    assert gone.json() == {"status": "Adapter lmi-parrot unregistered"}
    refused = web.post(
        lora_server.http + "/invocations", content=lmi_body(PROMPT, adapters="lmi-parrot")
    )
    assert refused.status_code == 424 and "$.adapters" in refused.text
    not_found = {
        "code": 404,
        "type": "BadRequestException",
        "message": "The adapter lmi-parrot was not found",
    }
    for method, path in (
        ("GET", "/adapters/lmi-parrot"),
        ("DELETE", "/adapters/lmi-parrot"),
        ("POST", "/adapters/lmi-parrot/update"),
    ):
        answer_ = djl(lora_server, method, path)
        assert (answer_.status_code, answer_.json()) == (404, not_found), (method, path)
    assert [a["name"] for a in djl(lora_server, "GET", "/adapters").json()["adapters"]] == [
        "pirate"
    ]


def test_lmi_adapter_pages_never_loop_and_hold_at_most_100(lora_server: RunningServer) -> None:
    """A limit of 0 was an empty page naming itself as the next (a client following it looped
    for ever); 1000 is DJL's out-of-range limit, 100."""
    for limit in ("0", "1000"):
        token, names = "0", []
        for _ in range(3):  # every adapter fits one page
            listed = djl(lora_server, "GET", "/adapters", limit=limit, next_page_token=token)
            assert listed.status_code == 200, listed.text
            names += [a["name"] for a in listed.json()["adapters"]]
            if "nextPageToken" not in listed.json():
                break
            token = listed.json()["nextPageToken"]
        assert "pirate" in names and "nextPageToken" not in listed.json()


def test_the_control_protocols_config_model_names_the_adapter(lora_server: RunningServer) -> None:
    def generate(model: str) -> list[dict[str, Any]]:
        parameters = {"max_tokens": 12, "temperature": 0}
        body = {"type": "config", "prompt": PROMPT, "model": model, "parameters": parameters}
        with connect(lora_server.ws + "/generate") as ws:
            ws.send(json.dumps(body))
            return until(ws, "completion", "error")

    adapted = generate("pirate")
    init = next(m for m in adapted if m["type"] == "init")
    assert init["model"] == "pirate" and adapted[-1]["type"] == "completion"
    assert SPOKEN in adapted[-1]["generated_text"], adapted[-1]
    base = generate("SmolLM2-135M-Instruct")
    assert SPOKEN not in base[-1]["generated_text"]
    [refused] = generate("parrot")
    assert refused["type"] == "error" and refused["field"] == "$.model"
    assert "'pirate'" in refused["message"]


def test_the_quick_adapters_bench_measures_each_variant(
    tmp_path: Path, server: RunningServer, lora_server: RunningServer
) -> None:
    """`llm-gateway bench adapters --quick` on this module's LoRA-on server and the
    session's LoRA-off one: each variant measured and reported with its ratio (what this
    asserts, never a speed figure: docs/BENCHMARKS.md has those)."""
    import asyncio

    from gateway_bench.adapters_bench import SCENARIO, VARIANTS, Targets, report, run_adapters

    options = SCENARIO.parse(["--quick", "--out", str(tmp_path)])
    at = Targets(server.http, lora_server.http, "SmolLM2-135M-Instruct", "pirate")
    result, out = asyncio.run(run_adapters(options, "bench --quick", at))
    assert {(r.concurrency, r.variant) for r in result.rows} == {
        (c, v) for c in options.concurrency for v in VARIANTS
    }
    each = options.output_tokens * options.rounds * options.repeats
    assert all(r.failed == 0 and r.tokens == r.concurrency * each for r in result.rows)
    assert all((r.ratio is None) == (r.variant == "base, LoRA off") for r in result.rows)
    assert "x base, LoRA on" in report(result).markdown() and (out / "report.json").is_file()


def test_the_seed_protocols_name_the_adapter_in_generation_config(
    lora_server: RunningServer,
) -> None:
    def batch(request_id: str, prompt: str, **config: Any) -> dict[str, Any]:
        body = payload(
            (request_id, prompt),
            generation_config={"max_new_tokens": 12, "do_sample": False, **config},
        )
        frames = run_ws(lora_server.ws, body, {request_id})
        return events_of(frames, request_id)[-1]

    made = batch("lora-c1", PROMPT, adapter_id="pirate")
    assert made["type"] == "COMPLETE" and SPOKEN in made["text"], made
    # Its history continues on the adapter that made it, and no other.
    other = batch("lora-c1", " More.")
    assert other["type"] == "ERROR" and "`$.generation_config.adapter_id`" in other["error"]
    assert "`pirate`" in other["error"]
    assert batch("lora-c1", " More.", adapter_id="pirate")["type"] == "COMPLETE"
    unknown = batch("lora-c2", PROMPT, adapter_id="parrot")
    assert unknown["type"] == "ERROR" and "`$.generation_config.adapter_id`" in unknown["error"]

    one = web.post(
        lora_server.http + "/api/generate-one",
        json={
            "request_id": "lora-one",
            "prompt": PROMPT,
            "stream_response": False,
            "generation_config": {"max_new_tokens": 12, "do_sample": False, "adapter_id": "pirate"},
        },
    )
    assert one.status_code == 200 and SPOKEN in one.text, one.text

    parameters = {"max_new_tokens": 12, "do_sample": False, "adapter_id": "pirate"}
    start = {"type": "START", "id": "e1", "data": PROMPT, "parameters": parameters}
    with connect(lora_server.ws + "/ws/events") as ws:
        ws.send(json.dumps([start]))
        complete: dict[str, Any] = {}
        while complete.get("type") not in ("COMPLETE", "ERROR"):
            complete = json.loads(ws.recv())[-1]
    assert complete["type"] == "COMPLETE" and SPOKEN in complete["data"], complete


def test_an_embedding_model_loaded_beside_the_adapters_leaves_chat_tools_and_adapters_working(
    lora_server: RunningServer,
) -> None:
    """Issue 45: an embedding model loaded at run time (DJL's management API) on the gateway
    that serves the chat model and its adapter: it embeds, and chat, tools and the adapter
    answer as before on the same gateway; unloaded, it is refused."""
    admin = {"Authorization": f"Bearer {ADMIN}"}
    url = lora_server.http + "/models"
    loaded = web.post(url, params={"url": "default", "model_name": "mini"}, headers=admin)
    assert loaded.status_code == 200, loaded.text
    client = api(lora_server)
    try:
        vector = client.embeddings.create(model="mini", input="The cat sat on the mat.")
        assert len(vector.data[0].embedding) == 384
        pirate = client.chat.completions.create(
            model="pirate", messages=[{"role": "user", "content": "Hello"}], max_tokens=12
        )
        assert SPOKEN in (pirate.choices[0].message.content or "")
        weather: ChatCompletionFunctionToolParam = {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
        called = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=[weather],
            tool_choice="required",
            max_tokens=40,
        )
        calls = [
            (c.function.name, json.loads(c.function.arguments))
            for c in called.choices[0].message.tool_calls or []
            if c.type == "function"
        ]
        assert calls and all(name == "get_weather" and "city" in args for name, args in calls)
    finally:
        assert web.delete(url + "/mini", headers=admin).status_code == 200
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="mini", input="The cat sat on the mat.")
