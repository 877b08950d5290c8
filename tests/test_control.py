"""WS `/generate`: every message type and option against the real engine."""

from __future__ import annotations

import json

import pytest
from control_client import Message, config, control, receive, tokens_of, until
from websockets.exceptions import ConnectionClosed
from websockets.sync.connection import Connection

from clients import CHAT, UNENDING, connect, web
from serving import RunningServer

STORY = CHAT.format("Tell me a long story about a brave knight.")


def test_config_init_tokens_completion(server: RunningServer) -> None:
    engine = server.gateway.service.holder.engine
    assert engine is not None
    with connect(server.ws + "/generate") as ws:
        ws.send(config(STORY, max_tokens=12, temperature=0))
        messages = until(ws, "completion")
    init, *middle, completion = messages
    assert init["type"] == "init" and init["request_id"].startswith("gen_")
    assert init["model"] == "SmolLM2-135M-Instruct"
    assert init["model_info"]["max_tokens"] == 2048
    tokens = tokens_of(middle)
    assert len(tokens) == len(middle) and tokens
    assert "".join(t["token"] for t in tokens) == completion["generated_text"]
    assert [t["generated_text"] for t in tokens][-1] == completion["generated_text"]
    assert all(not t["finished"] and t["finish_reason"] is None for t in tokens[:-1])
    assert completion["finish_reason"] == "length"
    assert completion["usage"] == {
        "prompt_tokens": len(engine.encode(STORY)),
        "completion_tokens": 12,
        "total_tokens": len(engine.encode(STORY)) + 12,
    }
    assert completion["request_id"] == init["request_id"]


def test_options_echo_token_ids_logprobs_and_timing(server: RunningServer) -> None:
    engine = server.gateway.service.holder.engine
    assert engine is not None
    options = {
        "echo_prompt": True,
        "include_token_ids": True,
        "include_logprobs": True,
        "include_timing": True,
    }
    with connect(server.ws + "/generate") as ws:
        ws.send(config(STORY, options, max_tokens=10, temperature=0))
        messages = until(ws, "completion")
    tokens, completion = tokens_of(messages), messages[-1]
    assert completion["generated_text"].startswith(STORY)
    assert tokens[0]["generated_text"] == STORY + tokens[0]["token"]
    # a message normally carries one token; under load, one message may carry several
    ids = [i for t in tokens for i in t.get("token_ids", [t["token_id"]])]
    assert all(t["token_ids"][-1] == t["token_id"] for t in tokens if "token_ids" in t)
    assert engine.decode(ids) == completion["generated_text"][len(STORY) :]
    for token in tokens:
        chosen, *alternatives = token["logprobs"]
        # logprobs describe the message's last token
        assert token["token"].endswith(chosen["token"]) and chosen["logprob"] <= 0
        assert len(alternatives) >= 1
        # greedy: the chosen token is the most likely one
        assert all(alt["logprob"] <= chosen["logprob"] + 1e-4 for alt in alternatives)
        assert token["timing"]["token_ms"] >= 0
        assert token["timing"]["total_ms"] >= token["timing"]["token_ms"]
    assert 0 < completion["timing"]["first_token_ms"] <= completion["timing"]["total_ms"]


def test_stream_false_sends_only_init_and_completion(server: RunningServer) -> None:
    with connect(server.ws + "/generate") as ws:
        ws.send(config(STORY, {"stream": False}, max_tokens=6, temperature=0))
        messages = until(ws, "completion")
    assert [m["type"] for m in messages] == ["init", "completion"]
    assert messages[-1]["usage"]["completion_tokens"] == 6


def test_a_stop_string_never_reaches_the_client(server: RunningServer) -> None:
    with connect(server.ws + "/generate") as ws:
        ws.send(config(STORY, max_tokens=30, temperature=0))
        plain = until(ws, "completion")[-1]["generated_text"]
        word = plain.split()[4]
        ws.send(config(STORY, max_tokens=30, temperature=0, stop=[word]))
        messages = until(ws, "completion")
    completion = messages[-1]
    assert completion["finish_reason"] == "stop"
    assert completion["generated_text"] == plain[: plain.index(word)]
    assert all(word not in t["generated_text"] for t in tokens_of(messages))


def test_multibyte_characters_are_never_split(server: RunningServer) -> None:
    prompt = CHAT.format("Repeat exactly: 🐱🐶🎉 猫と犬 ✨ Ünïcödé 🚀")
    with connect(server.ws + "/generate") as ws:
        ws.send(config(prompt, max_tokens=40, temperature=0))
        messages = until(ws, "completion")
    tokens = tokens_of(messages)
    text = messages[-1]["generated_text"]
    assert any(ord(ch) > 0x2000 for ch in text), text  # the model did write wide characters
    assert all("\ufffd" not in t["token"] for t in tokens)
    assert "".join(t["token"] for t in tokens) == text


def test_bad_messages_get_errors_naming_the_field_and_the_connection_stays(
    server: RunningServer,
) -> None:
    with connect(server.ws + "/generate") as ws:
        ws.send(json.dumps({"type": "config", "prompt": "hi", "parameters": {"top_p": 3}}))
        error = receive(ws)
        assert error["type"] == "error" and error["error"] == "invalid_request"
        assert error["field"] == "$.parameters.top_p" and error["recoverable"] is True
        ws.send("{oops")
        assert receive(ws)["error"] == "invalid_request"
        ws.send(json.dumps({"type": "config", "prompt": "hi", "model": "gpt-9"}))
        error = receive(ws)
        assert error["field"] == "$.model" and "gpt-9" in error["message"]
        # Fields this server does not know are ignored, so the protocol may grow; in
        # `parameters` only transformers' GenerationConfig fields are (logged), so a misspelt
        # parameter never goes unnoticed.
        ws.send(config(STORY, max_tokens=3, bogus=1))
        assert receive(ws)["field"] == "$.parameters.bogus"
        options = {"stream": True, "future": 1}
        ws.send(config(STORY, options, max_tokens=3, typical_p=0.5, temperature=0))
        assert until(ws, "completion")[-1]["usage"]["completion_tokens"] == 3
        ws.send(json.dumps({"type": "dance"}))  # after the first config: recoverable
        error = receive(ws)
        assert "$.type" in error["message"] and error["recoverable"] is True
        ws.send(config(STORY, max_tokens=2, temperature=0))
        assert until(ws, "completion")[-1]["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize(
    "first", [{"type": "control", "action": "stop"}, {"type": "hello"}, {"prompt": "hi"}]
)
def test_the_first_message_must_be_a_config(server: RunningServer, first: object) -> None:
    with connect(server.ws + "/generate") as ws:
        ws.send(json.dumps(first))
        error = receive(ws)
        assert error["error"] == "invalid_request" and error["recoverable"] is False
        with pytest.raises(ConnectionClosed) as closed:
            receive(ws)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


def test_a_prompt_longer_than_the_context_fails_before_generation(server: RunningServer) -> None:
    with connect(server.ws + "/generate") as ws:
        ws.send(config("word " * 3000, max_tokens=5))
        [error] = until(ws, "error")
        assert error["error"] == "context_length_exceeded" and error["recoverable"] is True
        assert "request_id" not in error  # no init announced one
        ws.send(config(STORY, max_tokens=2, temperature=0))  # a new config after the error
        assert until(ws, "completion")[-1]["usage"]["completion_tokens"] == 2


def test_chat_messages_are_rendered_with_the_models_template(server: RunningServer) -> None:
    chat = [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    with connect(server.ws + "/generate") as ws:
        ws.send(
            json.dumps(
                {
                    "type": "config",
                    "messages": chat,
                    "parameters": {"max_tokens": 5, "temperature": 0},
                    "options": {"echo_prompt": True},
                }
            )
        )
        completion = until(ws, "completion")[-1]
        rendered = (
            "<|im_start|>system\nYou answer in one word.<|im_end|>\n"
            "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
            "<|im_start|>assistant\n"
        )
        assert completion["generated_text"].startswith(rendered)
        assert len(completion["generated_text"]) > len(rendered)
        engine = server.gateway.service.holder.engine
        assert engine is not None
        assert completion["usage"]["prompt_tokens"] == len(engine.encode(rendered))

        ws.send(json.dumps({"type": "config", "prompt": "x", "messages": chat}))
        assert "exactly one of `prompt` and `messages`" in receive(ws)["message"]
        ws.send(json.dumps({"type": "config"}))
        assert receive(ws)["field"] == "$.prompt"
        ws.send(json.dumps({"type": "config", "messages": [{"role": "robot", "content": "x"}]}))
        assert receive(ws)["field"] == "$.messages[0].role"
        ws.send(json.dumps({"type": "config", "messages": []}))
        assert receive(ws)["field"] == "$.messages"

    rest = web.post(
        server.http + "/v1/generate",
        json={"messages": chat, "max_tokens": 3, "temperature": 0},
    )
    assert rest.status_code == 200 and rest.json()["usage"]["completion_tokens"] == 3


def ending(ws: Connection, *controls: str) -> tuple[list[Message], Message]:
    """The token messages of a generation (the `controls` sent after its second), and its
    completion."""
    messages = until(ws, "token") + until(ws, "token") if controls else []
    for action in controls:
        ws.send(control(action))
    messages += until(ws, "completion")
    return tokens_of(messages), messages[-1]


def test_the_last_token_message_says_how_the_generation_ended(server: RunningServer) -> None:
    ids = {"include_token_ids": True}
    with connect(server.ws + "/generate") as ws:
        ws.send(config(STORY, max_tokens=12, temperature=0))
        plain = until(ws, "completion")[-1]["generated_text"]
        stop = " " + plain.split()[5]
        runs = {
            "eos": config(CHAT.format("Say OK."), ids, max_tokens=50, temperature=0),
            "length": config(STORY, ids, max_tokens=3, temperature=0),
            "stop string": config(STORY, ids, max_tokens=12, temperature=0, stop=[stop]),
        }
        ends: dict[str, tuple[list[Message], Message]] = {}
        for label, message in runs.items():
            ws.send(message)
            ends[label] = ending(ws)
        endless = config(STORY, max_tokens=UNENDING, ignore_eos=True, temperature=0)
        ws.send(endless)
        ends["stop"] = ending(ws, "stop")
        ws.send(endless)
        ends["pause, then stop"] = ending(ws, "pause", "stop")
    for label, (tokens, completion) in ends.items():
        *before, last = tokens
        assert all(not t["finished"] and t["finish_reason"] is None for t in before), label
        assert last["finished"] is True, (label, last)
        assert last["finish_reason"] == completion["finish_reason"], (label, last)
        assert "".join(t["token"] for t in tokens) == completion["generated_text"], label
    assert [ends[label][1]["finish_reason"] for label in ends] == [
        "stop",
        "length",
        "stop",
        "cancelled",
        "cancelled",
    ]
    eos = ends["eos"][0][-1]
    assert eos["token"] == "" and eos["generated_text"] == ends["eos"][1]["generated_text"]
    assert ends["length"][0][-1]["token"] and ends["length"][0][-1]["token_id"] >= 0
    assert ends["stop"][0][-1]["token"] == ""


def test_errors_while_a_generation_runs_name_its_request_id(server: RunningServer) -> None:
    with connect(server.ws + "/generate") as ws:
        ws.send(config(STORY, max_tokens=UNENDING, ignore_eos=True, temperature=0))
        init = until(ws, "init")[-1]
        for refused in (
            control("modify", top_p=2),  # refused by the decoder
            control("rewind"),
            "{oops",
            control("resume"),  # refused by the session
        ):
            ws.send(refused)
            error = until(ws, "error")[-1]
            assert error["request_id"] == init["request_id"], (refused, error)
        ws.send(control("stop"))
        assert until(ws, "completion")[-1]["request_id"] == init["request_id"]
