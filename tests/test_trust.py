"""Issue 31, "Trust, round two": an attacker's findings against a gateway with keys and limits,
each through a real client on the real engine (docs/SECURITY.md)."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from control_client import receive
from huggingface_hub import InferenceClient
from huggingface_hub.errors import ValidationError as HfValidationError

from clients import CHAT, connect, sagemaker_runtime, web
from gateway.config.loading import load_settings
from gateway.config.settings import ConfigError
from gateway.edge.api_keys import parse_keys
from gateway.edge.auth import open_paths_of
from protocols.control import decode_client
from protocols.errors import GenerationError
from serving import RunningServer

PROMPT = CHAT.format("Hi")
HUGE = 2**64  # past what the engine carries (an int64)


def _openai(route: str, **fields: Any) -> tuple[str, dict[str, Any]]:
    if route == "/v1/chat/completions":
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, **fields}
    else:
        body = {"prompt": "Hi", "max_tokens": 1, **fields}
    return route, body


def _generation_config(route: str, **config: Any) -> tuple[str, dict[str, Any]]:
    config = {"max_new_tokens": 1, **config}
    if route == "/api/generate-one":
        body = {"request_id": "n", "prompt": PROMPT, "stream_response": False}
        return route, {**body, "generation_config": config}
    body = {"prompts": [{"request_id": "n", "prompt": PROMPT}]}
    return route, {**body, "generation_config": config}


def _http_refusal(server: RunningServer, route: str, body: dict[str, Any]) -> tuple[int, str]:
    """The status and the whole answer's text of one POST."""
    answer = web.post(server.http + route, json=body)
    return answer.status_code, answer.text


def _field_of_http(server: RunningServer, route: str, body: dict[str, Any]) -> str | None:
    status, text = _http_refusal(server, route, body)
    assert 400 <= status < 500, (route, body, status, text)
    answer = json.loads(text)
    if isinstance(answer, list):  # /api/generate-batch: each prompt's answer
        answer = answer[0]
    if "error" in answer and isinstance(answer["error"], dict):  # OpenAI's error object
        return str(answer["error"]["param"])
    field = answer.get("field")
    return None if field is None else str(field)


def _error_of_ws(server: RunningServer, config: dict[str, Any]) -> str:
    """The ERROR of `/ws`: its message names the field (`- at `$...``); it has no `field`."""
    body = {"prompts": [{"request_id": "w", "prompt": PROMPT}], "stream_response": False}
    with connect(server.ws + "/ws") as ws:
        ws.send(json.dumps({**body, "generation_config": {"max_new_tokens": 1, **config}}))
        while True:
            frame = json.loads(ws.recv())
            ended = [e for e in frame if e["type"] in ("COMPLETE", "ERROR")]
            if ended:
                assert ended[0]["type"] == "ERROR", ended
                return str(ended[0]["error"])


def _field_of_ws_events(server: RunningServer, parameters: dict[str, Any]) -> str | None:
    start = {"type": "START", "id": "e", "data": PROMPT, "parameters": parameters}
    with connect(server.ws + "/ws/events") as ws:
        ws.send(json.dumps([start]))
        while True:
            frame = json.loads(ws.recv())
            ended = [e for e in frame if e["type"] in ("COMPLETE", "ERROR")]
            if ended:
                assert ended[0]["type"] == "ERROR", ended
                return str(ended[0].get("field"))


def _field_of_control(server: RunningServer, parameters: dict[str, Any]) -> str | None:
    with connect(server.ws + "/generate") as ws:
        message = {"type": "config", "prompt": PROMPT, "parameters": parameters}
        ws.send(json.dumps(message))
        while True:
            answer = receive(ws)
            if answer["type"] in ("error", "completion"):
                assert answer["type"] == "error", answer
                return str(answer.get("field"))


# --- (a) every number range-checked in every protocol's codec, never a 500 --------------------


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        (*_openai("/v1/chat/completions", seed=HUGE), "seed"),
        (*_openai("/v1/completions", seed=HUGE), "seed"),
        (*_openai("/v1/completions", seed=-HUGE), "seed"),
        (*_generation_config("/api/generate-one", seed=HUGE), "$.generation_config.seed"),
        (*_generation_config("/api/generate-batch", seed=HUGE), "$.generation_config.seed"),
        ("/v1/generate", {"prompt": PROMPT, "max_tokens": 1, "seed": HUGE}, "$.seed"),
        (
            *_generation_config(
                "/api/generate-one", num_beams=2, length_penalty=1e308, max_new_tokens=3
            ),
            "$.generation_config.length_penalty",
        ),
        (
            *_generation_config("/api/generate-one", max_new_tokens=HUGE, min_tokens=HUGE),
            "$.generation_config.max_new_tokens",
        ),
        (*_openai("/v1/completions", n=HUGE), "n"),
        (*_openai("/v1/completions", max_tokens=HUGE, min_tokens=HUGE), "max_tokens"),
        ("/v1/generate", {"prompt": PROMPT, "max_tokens": HUGE}, "$.max_tokens"),
    ],
)
def test_a_number_out_of_range_is_a_4xx_naming_its_field_on_http(
    server: RunningServer, route: str, body: dict[str, Any], field: str
) -> None:
    assert _field_of_http(server, route, body) == field


def test_a_number_out_of_range_is_an_error_event_naming_its_field_on_websockets(
    server: RunningServer,
) -> None:
    assert "`$.generation_config.seed`" in _error_of_ws(server, {"seed": HUGE})
    assert _field_of_ws_events(server, {"seed": HUGE}) == "$[0].parameters.seed"
    assert _field_of_control(server, {"seed": HUGE}) == "$.parameters.seed"
    assert _field_of_control(server, {"max_tokens": HUGE}) == "$.parameters.max_tokens"


def test_lmi_and_tgi_refuse_an_unbounded_length_penalty_or_seed(server: RunningServer) -> None:
    lmi = {"inputs": "Hi", "parameters": {"num_beams": 2, "length_penalty": 1e308}}
    status, text = _http_refusal(server, "/invocations", lmi)
    assert 400 <= status < 500 and "length_penalty" in text, (status, text)
    tgi = {"inputs": "Hi", "parameters": {"seed": HUGE, "max_new_tokens": 1}}
    status, text = _http_refusal(server, "/generate", tgi)
    assert 400 <= status < 500 and "seed" in text, (status, text)


def test_a_feedback_position_past_what_the_store_holds_is_refused() -> None:
    with pytest.raises(GenerationError) as refused:
        decode_client(json.dumps({"type": "feedback", "rating": 1, "position": HUGE}))
    assert refused.value.field == "$.position"


# --- (a') n, best_of and num_beams bounded by settings, refused in each protocol's shape ---------

PAST_N, PAST_BEST_OF, PAST_BEAMS = 17, 3, 11  # one past each default: MAX_N 16, MAX_BEST_OF
# 2 (TGI's max_best_of), MAX_NUM_BEAMS 10


def test_sequences_past_their_bounds_are_refused_naming_the_field_in_each_protocol(
    server: RunningServer,
) -> None:
    api = openai.OpenAI(base_url=server.http + "/v1", api_key="none", max_retries=0)
    model = api.models.list().data[0].id
    chat: list[Any] = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError) as refused:
        api.chat.completions.create(model=model, messages=chat, max_tokens=1, n=PAST_N)
    assert refused.value.param == "n" and "MAX_N" in refused.value.message
    with pytest.raises(openai.BadRequestError) as refused:
        api.completions.create(model=model, prompt="Hi", max_tokens=1, n=PAST_N, stream=True)
    assert refused.value.param == "n"
    tgi = InferenceClient(base_url=server.http)
    with pytest.raises(HfValidationError, match=r"`best_of` must be > 0 and <= 2"):
        tgi.text_generation(PROMPT, max_new_tokens=1, best_of=PAST_BEST_OF, do_sample=True)
    for parameters, field in (
        ({"n": PAST_N, "do_sample": True}, "$.parameters.n"),
        ({"best_of": PAST_BEST_OF, "do_sample": True}, "$.parameters.best_of"),
        ({"num_beams": PAST_BEAMS}, "$.parameters.num_beams"),
    ):
        lmi = {"inputs": "Hi", "parameters": {"max_new_tokens": 1, **parameters}}
        status, text = _http_refusal(server, "/invocations", lmi)
        assert status == 424 and field in text, (status, text)
    runtime = sagemaker_runtime(server.http)
    beams = {"inputs": "Hi", "parameters": {"max_new_tokens": 1, "num_beams": PAST_BEAMS}}
    with pytest.raises(runtime.exceptions.ModelError) as caught:
        runtime.invoke_endpoint(EndpointName="e", Body=json.dumps(beams))
    assert caught.value.response["OriginalStatusCode"] == 424
    assert "$.parameters.num_beams" in caught.value.response["OriginalMessage"]
    config = {"num_beams": PAST_BEAMS, "max_new_tokens": 1}
    one = _generation_config("/api/generate-one", **config)
    assert _field_of_http(server, *one) == "$.generation_config.num_beams"
    batch = _generation_config("/api/generate-batch", **config)
    assert _field_of_http(server, *batch) == "$.generation_config.num_beams"
    assert "`$.generation_config.num_beams`" in _error_of_ws(server, config)


def test_the_sequence_bounds_are_settings(make_server: Callable[..., RunningServer]) -> None:
    tight = make_server(MAX_N="2", MAX_BEST_OF="3", MAX_NUM_BEAMS="2")
    api = openai.OpenAI(base_url=tight.http + "/v1", api_key="none", max_retries=0)
    model = api.models.list().data[0].id
    with pytest.raises(openai.BadRequestError) as refused:
        api.completions.create(model=model, prompt="Hi", max_tokens=1, n=3)
    assert refused.value.param == "n"
    assert len(api.completions.create(model=model, prompt="Hi", max_tokens=1, n=2).choices) == 2
    info = InferenceClient(base_url=tight.http, provider="hf-inference").get_endpoint_info()
    assert info["max_best_of"] == 3  # where TGI's clients read the bound
    best = InferenceClient(base_url=tight.http).text_generation(
        PROMPT, max_new_tokens=1, best_of=3, do_sample=True, details=True
    )
    assert best.details is not None and len(best.details.best_of_sequences or []) == 2
    refused_beams = _generation_config("/api/generate-one", num_beams=3, max_new_tokens=1)
    assert _field_of_http(tight, *refused_beams) == "$.generation_config.num_beams"
    route, body = _generation_config("/api/generate-one", num_beams=2, max_new_tokens=1)
    answer = web.post(tight.http + route, json=body)
    assert answer.status_code == 200, answer.text


def test_sequence_bounds_are_checked_at_start_up() -> None:
    with pytest.raises(ConfigError, match="MAX_N"):
        load_settings({"MAX_N": "129"}, dotenv_path=None)  # MAX_SEQUENCES stays the ceiling
    with pytest.raises(ConfigError, match=r"DEFAULT_NUM_BEAMS.*MAX_NUM_BEAMS"):
        load_settings({"DEFAULT_NUM_BEAMS": "4", "MAX_NUM_BEAMS": "3"}, dotenv_path=None)
    assert load_settings({"MAX_BEST_OF": "4"}, dotenv_path=None).max_best_of == 4  # TGI's name


# --- (b) one rule for unknown fields: refused, naming them ------------------------------------


def test_v1_generate_refuses_an_unknown_field_naming_it(server: RunningServer) -> None:
    misspelt = {"prompt": PROMPT, "max_tokenz": 1}
    assert _field_of_http(server, "/v1/generate", misspelt) == "$.max_tokenz"
    nested = {"prompt": PROMPT, "parameters": {"max_tokenz": 1}}
    assert _field_of_http(server, "/v1/generate", nested) == "$.parameters.max_tokenz"
    # transformers' GenerationConfig names stay accepted (and ignored), and a WebSocket config
    # posted as it is still works.
    posted = {"type": "config", "prompt": PROMPT, "max_tokens": 1, "typical_p": 0.5}
    answer = web.post(server.http + "/v1/generate", json=posted)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 1


# --- (c) stop lists bounded by MAX_STOP_SEQUENCES ---------------------------------------------

STOPS = [f"stop-{i}" for i in range(17)]  # one past the default, 16


def test_a_stop_list_past_max_stop_sequences_is_refused_naming_its_field(
    server: RunningServer,
) -> None:
    one = _generation_config("/api/generate-one", stop=STOPS)
    assert _field_of_http(server, *one) == "$.generation_config.stop"
    batch = _generation_config("/api/generate-batch", stop=STOPS)
    assert _field_of_http(server, *batch) == "$.generation_config.stop"
    flat = {"prompt": PROMPT, "max_tokens": 1, "stop": STOPS}
    assert _field_of_http(server, "/v1/generate", flat) == "$.stop"
    lmi = {"inputs": "Hi", "parameters": {"max_new_tokens": 1, "stop_sequences": STOPS}}
    status, text = _http_refusal(server, "/invocations", lmi)
    assert 400 <= status < 500 and "stop_sequences" in text, (status, text)
    assert "`$.generation_config.stop`" in _error_of_ws(server, {"stop": STOPS})
    assert _field_of_ws_events(server, {"stop": STOPS}) == "$[0].parameters.stop"
    assert _field_of_control(server, {"stop": STOPS}) == "$.parameters.stop"
    # TGI keeps its own max_stop_sequences (4), and reports it.
    tgi = {"inputs": "Hi", "parameters": {"max_new_tokens": 1, "stop": STOPS[:5]}}
    assert _http_refusal(server, "/generate", tgi)[0] == 422
    assert web.get(server.http + "/info").json()["max_stop_sequences"] == 4


def test_max_stop_sequences_is_a_setting(make_server: Callable[..., RunningServer]) -> None:
    tight = make_server(MAX_STOP_SEQUENCES="2")
    refused = _generation_config("/api/generate-one", stop=STOPS[:3])
    assert _field_of_http(tight, *refused) == "$.generation_config.stop"
    route, body = _generation_config("/api/generate-one", stop=STOPS[:2])
    answer = web.post(tight.http + route, json=body)
    assert answer.status_code == 200, answer.text


# --- (d) /metrics behind a key when keys are on -----------------------------------------------

KEY = "sk-metrics-0123456789"


def test_metrics_need_a_key_when_keys_are_on_unless_public(
    make_server: Callable[..., RunningServer],
) -> None:
    guarded = make_server(API_KEYS=KEY)
    assert web.get(guarded.http + "/metrics").status_code == 401
    keyed = web.get(guarded.http + "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    assert keyed.status_code == 200 and "gateway_" in keyed.text
    assert web.get(guarded.http + "/health").status_code == 200  # still open
    public = make_server(API_KEYS=KEY, METRICS_PUBLIC="true")
    assert web.get(public.http + "/metrics").status_code == 200


def test_metrics_open_by_metrics_public_alone() -> None:
    assert "/metrics" not in open_paths_of("/health,/ui/*", metrics_public=False)
    assert "/metrics" in open_paths_of("/health,/ui/*", metrics_public=True)
    with pytest.raises(ConfigError, match="METRICS_PUBLIC"):
        open_paths_of("/health,/metrics", metrics_public=False)


# --- (e) the same-origin check does not trust Host (DNS rebinding) ----------------------------


def test_a_rebound_page_is_not_the_gateways_own(server: RunningServer) -> None:
    rebound = f"evil.example.net:{server.port}"  # a name the attacker pointed at 127.0.0.1
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    answer = web.post(
        server.http + "/v1/chat/completions",
        json=chat,
        headers={"Origin": f"http://{rebound}", "Host": rebound},
    )
    assert answer.status_code == 403, answer.text
    # Pages on the machine's loopback names still pass, on any port (a `docker run -p` map).
    for own in (f"http://127.0.0.1:{server.port}", f"http://localhost:{server.port + 1}"):
        answer = web.post(server.http + "/v1/chat/completions", json=chat, headers={"Origin": own})
        assert answer.status_code == 200, (own, answer.text)
    # A rebound name that starts like a loopback one is still the attacker's.
    lookalike = {"Origin": f"http://localhost.evil.example.net:{server.port}"}
    answer = web.post(server.http + "/v1/chat/completions", json=chat, headers=lookalike)
    assert answer.status_code == 403


# --- (f) key ownership by the whole SHA-256 of the key ----------------------------------------


def colliding_keys() -> tuple[str, str]:
    """Two keys whose SHA-256 share their first 32 bits (a birthday search: ~2^16 keys)."""
    seen: dict[str, str] = {}
    for i in itertools.count():
        key = f"sk-collide-{i}"
        prefix = hashlib.sha256(key.encode()).hexdigest()[:8]
        if prefix in seen:
            return seen[prefix], key
        seen[prefix] = key
    raise AssertionError("unreachable")


def test_keys_whose_short_hashes_collide_share_neither_histories_nor_limits(
    make_server: Callable[..., RunningServer],
) -> None:
    first, second = colliding_keys()
    guarded = make_server(API_KEYS=f"{first},{second}", LIMIT_REQUESTS_PER_MINUTE="1")

    def generate(key: str, prompt: str) -> httpx.Response:
        body = {
            "prompts": [{"request_id": "shared-id", "prompt": prompt}],
            "only_new_tokens": False,
            "generation_config": {"do_sample": False, "max_new_tokens": 2, "ignore_eos": True},
        }
        headers = {"Authorization": f"Bearer {key}"}
        return web.post(guarded.http + "/api/generate-batch", json=body, headers=headers)

    secret = "My password is swordfish."
    mine = generate(first, secret)
    assert mine.status_code == 200 and mine.json()[0]["prompt"] == secret, mine.text
    # The other key has a minute of its own, and a history of its own under the same id.
    theirs = generate(second, "Hello")
    assert theirs.status_code == 200, theirs.text
    assert theirs.json()[0]["prompt"] == "Hello"
    assert generate(first, "again").status_code == 429  # the first key's minute is used


def test_colliding_labels_name_two_keys_that_own_apart() -> None:
    first, second = colliding_keys()
    keys = parse_keys(f"{first},{second}")
    assert keys[first].label == keys[second].label  # a label names; it never owns
    assert keys[first].owner != keys[second].owner
    assert keys[first].owner == hashlib.sha256(first.encode()).hexdigest()
