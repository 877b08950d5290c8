"""Claude Code and Codex CLI against the gateway on the real engine (issue 58): their recorded
requests (tests/data/agents/, every body as the agent sent it) replayed, each answered 200
with every event validated strictly by the anthropic and openai SDKs' own types; and the
agents themselves (`make agents` installs them, pinned, into the venv's `agents/`), each
completing a turn (`claude --bare -p`, `codex exec` with its default features).

Their default prompts (about 12,400 and 9,100 tokens) are past the default model's own 8,192
positions: the module's engine serves it with its RoPE scaled by YaRN (ROPE_SCALING, factor 2:
16,384 positions) and MAX_MODEL_LEN 12,800 within them. Neither agent sends a temperature, and
the default model sampled at the APIs' temperature 1 over its whole vocabulary rarely ends a
turn (Claude Code takes an answer cut by `max_tokens` as a failure; Codex sends no bound): the
engine serves the model with its model card's sampling (temperature 0.2, top_p 0.9) and a
repetition penalty for the fields a request leaves out (SAMPLING_DEFAULTS), as an operator
would serve it. Codex's default prompt then ends its turn; Claude Code's 12,400 tokens do not
(the model writes off the subject to the bound, measured): Claude Code runs with the prompt it
lets a user trim (`--bare`: no hooks, skills, CLAUDE.md or extra tools, about 1,200 tokens)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anthropic.types as at
import pydantic
import pytest
from agent_bodies import CLAUDE_CODE, CODEX, Recorded, recorded
from openai.types.responses import ResponseStreamEvent

from clients import web
from serving import LoopThread, RunningServer, gateway_settings, own_engine_server

if TYPE_CHECKING:
    pass

pytestmark = [pytest.mark.own_engine, pytest.mark.timeout(1800)]
MODEL = "SmolLM2-135M-Instruct"
# Within the 16,384 positions of the default model scaled by YaRN: Claude Code's default
# prompt (12,353 tokens recorded) and a few hundred tokens of answer (its replay's
# `max_tokens` is cut to them: past its prompt the model does not end its turn).
LONG_CONTEXT = 12800
ROPE_SCALING = '{"rope_type": "yarn", "factor": 2}'
# SmolLM2's model card's sampling, and a repetition penalty: at temperature 0.2 alone the model
# may repeat one sentence to the bound.
SAMPLING_DEFAULTS = '{"temperature": 0.2, "top_p": 0.9, "repetition_penalty": 1.1}'
REPLAY_OUTPUT_TOKENS = 32  # what a Codex replay adds: Codex sends no bound
AGENTS = Path(os.environ.get("AGENTS_DIR") or Path(sys.prefix) / "agents") / "node_modules/.bin"


@pytest.fixture(scope="module")
def long_server(loop_thread: LoopThread) -> Iterator[RunningServer]:
    """A server on an engine of its own with a context the agents' prompts fit in."""
    settings = gateway_settings(
        MAX_MODEL_LEN=str(LONG_CONTEXT),
        ROPE_SCALING=ROPE_SCALING,
        SAMPLING_DEFAULTS=SAMPLING_DEFAULTS,
        KV_CACHE_GIB="2",
    )
    running = own_engine_server(loop_thread, settings)
    try:
        yield running
    finally:
        running.stop()


def _strict(kind: Any, data: Any) -> Any:
    return pydantic.TypeAdapter(kind).validate_python(data, strict=True)


def _frames(text: str) -> Iterator[tuple[str | None, Any]]:
    """Each server-sent event's name and its data, read as JSON."""
    for frame in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in frame.split("\n") if ": " in line)
        if "data" in fields:
            yield fields.get("event"), json.loads(fields["data"])


def _replayed(server: RunningServer, request: Recorded, raw: bytes | None = None) -> Any:
    url = server.http + request.path
    answer = web.post(url, content=raw or request.raw, headers=request.headers)
    assert answer.status_code == 200, answer.text
    return answer


@pytest.mark.parametrize("request_", recorded(CLAUDE_CODE), ids=lambda r: r.name)
def test_claude_codes_recorded_requests_are_answered(
    long_server: RunningServer, request_: Recorded
) -> None:
    answer = _replayed(long_server, request_)
    if request_.path.startswith("/v1/messages/count_tokens"):
        _strict(at.MessageTokensCount, answer.json())
    elif not request_.body.get("stream"):
        _strict(at.Message, answer.json())
    else:
        events = [
            (name, _strict(at.RawMessageStreamEvent, data))
            for name, data in _frames(answer.text)
            if name != "ping"  # the SDK reads it apart from its union
        ]
        assert all(name == event.type for name, event in events)
        assert [e.type for _, e in events][-1] == "message_stop"


@pytest.mark.parametrize("request_", recorded(CODEX), ids=lambda r: r.name)
def test_codexs_recorded_requests_are_answered(
    long_server: RunningServer, request_: Recorded
) -> None:
    body = {**request_.body, "max_output_tokens": REPLAY_OUTPUT_TOKENS}
    answer = _replayed(long_server, request_, json.dumps(body).encode())
    events = []
    for name, data in _frames(answer.text):
        event = _strict(ResponseStreamEvent, data)
        assert name == event.type == data["type"]
        events.append(event)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type in ("response.completed", "response.incomplete")


def test_the_models_sampling_is_what_a_request_leaving_it_out_gets(
    long_server: RunningServer,
) -> None:
    """SAMPLING_DEFAULTS on the engine: the Responses object says what the turn sampled with."""
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 1}
    answer = web.post(long_server.http + "/v1/responses", json=body).json()
    assert (answer["temperature"], answer["top_p"]) == (0.2, 0.9)
    given = web.post(long_server.http + "/v1/responses", json={**body, "temperature": 1.0})
    assert (given.json()["temperature"], given.json()["top_p"]) == (1.0, 0.9)


def _agent(name: str) -> Path:
    """The installed agent; missing, the test fails in CI (which installs it) and is skipped
    elsewhere."""
    path = AGENTS / name
    if not path.exists():
        why = f"{name} is not installed at {path}: `make agents` installs it"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return path


def _quiet_env(home: Path) -> dict[str, str]:
    """The machine's environment with a home of its own (no user settings, no login)."""
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR")
    return {**{k: v for k, v in os.environ.items() if k in keep}, "HOME": str(home)}


def test_claude_code_completes_a_turn(long_server: RunningServer) -> None:
    claude = _agent("claude")
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch)
        env = {
            **_quiet_env(home),
            "ANTHROPIC_BASE_URL": long_server.http,
            "ANTHROPIC_API_KEY": "unused",
            "ANTHROPIC_MODEL": MODEL,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL,
            "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
            # Its own bound on an answer (else 32,000, cut to the context's room): an answer
            # the model does not end is cut soon, and Claude Code asks it to go on.
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "400",
        }
        done = subprocess.run(
            [str(claude), "--bare", "-p", "say hi"],
            env=env,
            cwd=home,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stdout.strip(), done.stderr


def test_codex_completes_a_turn(long_server: RunningServer) -> None:
    codex = _agent("codex")
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch)
        (home / "codex").mkdir()
        (home / "codex" / "config.toml").write_text(
            f'model = "{MODEL}"\n'
            'model_provider = "gateway"\n\n'
            "[model_providers.gateway]\n"
            'name = "llm-gateway"\n'
            f'base_url = "{long_server.http}/v1"\n'
            'env_key = "GATEWAY_API_KEY"\n'
            'wire_api = "responses"\n'
        )
        env = {**_quiet_env(home), "CODEX_HOME": str(home / "codex"), "GATEWAY_API_KEY": "unused"}
        done = subprocess.run(
            [str(codex), "exec", "--skip-git-repo-check", "say hi"],
            env=env,
            cwd=home,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stdout.strip(), done.stderr
