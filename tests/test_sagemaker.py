"""The SageMaker runtime paths, with boto3's real `sagemaker-runtime` client."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import EventStreamError  # type: ignore[import-untyped]

from clients import CHAT, UNENDING, outcomes_since, sagemaker_runtime, settled_metrics, wait_ready
from serving import LoopThread, RunningServer, failing_loader, gateway_settings, start_server

if TYPE_CHECKING:
    from gateway.engine.vllm_engine import VllmEngine

PROMPT = CHAT.format("Name three colours.")
FAULT = CHAT.format("Fail in the engine, please.")  # fails once admitted (serving.failing_loader)
LONG = {"max_new_tokens": UNENDING, "ignore_eos_token": True}


def body(inputs: object = PROMPT, **fields: Any) -> str:
    return json.dumps({"inputs": inputs, **fields})


def parts(response: dict[str, Any]) -> bytes:
    return b"".join(event["PayloadPart"]["Bytes"] for event in response["Body"])


def test_invoke_endpoint_answers_the_lmi_json(server: RunningServer) -> None:
    client = sagemaker_runtime(server.http)
    response = client.invoke_endpoint(
        EndpointName="my-endpoint",
        Body=body(parameters={"max_new_tokens": 6, "details": True}),
        ContentType="application/json",
        CustomAttributes="trace-id=42",
    )
    assert response["ContentType"] == "application/json"
    assert response["CustomAttributes"] == "trace-id=42"
    assert response["InvokedProductionVariant"] == "AllTraffic"
    answer = json.loads(response["Body"].read())
    assert answer["generated_text"] and answer["details"]["generated_tokens"] <= 6
    batch = client.invoke_endpoint(
        EndpointName="my-endpoint", Body=body([PROMPT, "Hi"], parameters={"max_new_tokens": 3})
    )
    assert len(json.loads(batch["Body"].read())) == 2
    streamed_body = client.invoke_endpoint(
        EndpointName="e", Body=body(stream=True, parameters={"max_new_tokens": 3})
    )
    assert streamed_body["ContentType"] == "application/jsonlines"
    lines = streamed_body["Body"].read().decode().splitlines()
    assert len(lines) == 3 and "generated_text" in json.loads(lines[-1])


def test_a_bad_request_raises_model_error_with_the_original_answer(server: RunningServer) -> None:
    client = sagemaker_runtime(server.http)
    bad = body(parameters={"top_k": "many"})
    with pytest.raises(client.exceptions.ModelError) as caught:
        client.invoke_endpoint(EndpointName="e", Body=bad, ContentType="application/json")
    error = caught.value.response
    assert error["Error"]["Code"] == "ModelError"
    assert error["OriginalStatusCode"] == 424
    original = json.loads(error["OriginalMessage"])
    assert original["code"] == 424 and "$.parameters.top_k" in original["error"]
    with pytest.raises(client.exceptions.ModelError):
        client.invoke_endpoint_with_response_stream(EndpointName="e", Body=bad)
    with pytest.raises(client.exceptions.ModelError) as dynamic:
        client.invoke_endpoint(EndpointName="e", Body=body([PROMPT, 3]))
    assert "invoke handler failure" in dynamic.value.response["OriginalMessage"]


def test_response_stream_frames_every_line_as_a_payload_part(server: RunningServer) -> None:
    client = sagemaker_runtime(server.http)
    params = {"max_new_tokens": 5, "ignore_eos_token": True, "details": True}
    whole = json.loads(
        client.invoke_endpoint(EndpointName="e", Body=body(parameters=params))["Body"].read()
    )
    response = client.invoke_endpoint_with_response_stream(
        EndpointName="e",
        Body=body(stream=True, parameters=params),
        ContentType="application/json",
        CustomAttributes="trace-id=7",
    )
    assert response["ContentType"] == "application/jsonlines"
    assert response["CustomAttributes"] == "trace-id=7"
    events = list(response["Body"])
    assert len(events) == 5  # one part per token line
    lines = [json.loads(e["PayloadPart"]["Bytes"]) for e in events]
    assert [line["token"]["id"] for line in lines] == [t["id"] for t in whole["details"]["tokens"]]
    assert lines[-1]["generated_text"] == whole["generated_text"]
    assert lines[-1]["details"]["finish_reason"] == "length"


def test_response_stream_forms(server: RunningServer) -> None:
    client = sagemaker_runtime(server.http)
    json_whole = client.invoke_endpoint_with_response_stream(
        EndpointName="e", Body=body(parameters={"max_new_tokens": 3})
    )
    assert json_whole["ContentType"] == "application/json"
    assert set(json.loads(parts(json_whole))) == {"generated_text"}
    sse = client.invoke_endpoint_with_response_stream(
        EndpointName="e", Body=body(parameters={"max_new_tokens": 3}), Accept="text/event-stream"
    )
    assert sse["ContentType"] == "text/event-stream"
    events = [e for e in parts(sse).decode().split("\n\n") if e]
    assert len(events) == 3 and all(e.startswith("data: ") for e in events)
    dynamic = client.invoke_endpoint_with_response_stream(
        EndpointName="e", Body=body([PROMPT, "Hi"], stream=True, parameters={"max_new_tokens": 3})
    )
    outputs = [json.loads(line)["outputs"] for line in parts(dynamic).decode().splitlines()]
    assert outputs and all(len(o) == 2 for o in outputs)


def test_a_failure_mid_stream_raises_model_stream_error(
    loop_thread: LoopThread, engine: VllmEngine, idle_engine: Callable[..., None]
) -> None:
    # One slot: the second prompt reaches the engine, and fails there, after the first streamed.
    settings = gateway_settings(MAX_RUNNING_REQUESTS="1")
    one_slot = start_server(loop_thread, settings, failing_loader(engine, FAULT))
    try:
        wait_ready(one_slot.http)
        response = sagemaker_runtime(one_slot.http).invoke_endpoint_with_response_stream(
            EndpointName="e",
            Body=body([PROMPT, FAULT], stream=True, parameters={"max_new_tokens": 3}),
        )
        received: list[dict[str, Any]] = []
        with pytest.raises(EventStreamError) as caught:
            for event in response["Body"]:
                received.append(event)
        assert received and all("PayloadPart" in e for e in received)
        assert caught.value.response["Error"]["Code"] == "ModelStreamError"
        assert "$.inputs[1]" in caught.value.response["Error"]["Message"]
    finally:
        one_slot.stop()
    idle_engine()


def test_a_client_that_closes_the_stream_stops_its_generation(
    server: RunningServer, idle_engine: Callable[[], None]
) -> None:
    before = settled_metrics(server.http)
    response = sagemaker_runtime(server.http).invoke_endpoint_with_response_stream(
        EndpointName="e", Body=body(stream=True, parameters=LONG)
    )
    stream = response["Body"]
    assert "PayloadPart" in next(iter(stream))
    stream.close()
    idle_engine()
    after = settled_metrics(server.http)
    assert outcomes_since(before, after, "sagemaker") == {"cancelled": 1}


CHAT_BODY = {
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "temperature": 0,
    "max_tokens": 12,
}


def test_boto3_chat_completions_whole_and_streamed(server: RunningServer) -> None:
    client = sagemaker_runtime(server.http)
    whole = client.invoke_endpoint(EndpointName="e", Body=json.dumps(CHAT_BODY))
    answer = json.loads(whole["Body"].read())
    [choice] = answer["choices"]
    assert answer["object"] == "chat.completion" and "Paris" in choice["message"]["content"]

    streamed = client.invoke_endpoint_with_response_stream(
        EndpointName="e", Body=json.dumps(CHAT_BODY | {"stream": True})
    )
    assert streamed["ContentType"] == "application/jsonlines"
    chunks = [json.loads(line) for line in parts(streamed).decode().splitlines()]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == choice["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]

    with pytest.raises(client.exceptions.ModelError) as caught:
        client.invoke_endpoint(EndpointName="e", Body=json.dumps(CHAT_BODY | {"n": 0}))
    assert caught.value.response["OriginalStatusCode"] == 400
    assert json.loads(caught.value.response["OriginalMessage"])["error"]["param"] == "n"
