"""Small client-side helpers shared by the tests: real clients, no server internals.

Nothing here waits against a clock: a helper waits for a condition (a message, a status, a
count) for as long as it takes; pytest-timeout's per-test limit is the only safety net.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect as _connect
from websockets.sync.connection import Connection
from websockets.typing import Origin, Subprotocol

CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
TERMINAL = {"COMPLETE", "ERROR"}
MAX_MODEL_LEN = 2048  # the test servers' context (serving.gateway_settings)
# A generation that cannot end by itself in practice: ignore_eos with every token the context
# allows (vLLM stops at the end of the context). Tests that need one running stop it.
UNENDING = MAX_MODEL_LEN
# A JSON schema the default model answers "which city, and is it a capital?" in.
CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "is_capital": {"type": "boolean"},
    },
    "required": ["city", "is_capital"],
    "additionalProperties": False,
}
POLL = 0.05  # seconds between two looks at a condition; never a bound

T = TypeVar("T")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class Web:
    """httpx's requests and clients as the tests make them: with no timeout of their own
    (httpx's default is 5 s, which a long prompt behind other streams can outlast on a slow
    machine). A test waits as long as it must; pytest-timeout's limit is the one clock."""

    @staticmethod
    def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, url, timeout=None, **kwargs)

    @staticmethod
    def get(url: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(url, timeout=None, **kwargs)

    @staticmethod
    def post(url: str, **kwargs: Any) -> httpx.Response:
        return httpx.post(url, timeout=None, **kwargs)

    @staticmethod
    def options(url: str, **kwargs: Any) -> httpx.Response:
        return httpx.options(url, timeout=None, **kwargs)

    @staticmethod
    def delete(url: str, **kwargs: Any) -> httpx.Response:
        return httpx.delete(url, timeout=None, **kwargs)

    @staticmethod
    def stream(method: str, url: str, **kwargs: Any) -> AbstractContextManager[httpx.Response]:
        return httpx.stream(method, url, timeout=None, **kwargs)

    @staticmethod
    def client(**kwargs: Any) -> httpx.Client:
        return httpx.Client(timeout=None, **kwargs)

    @staticmethod
    def async_client(**kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=None, **kwargs)


web = Web()


def greedy(max_new_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {"do_sample": False, "max_new_tokens": max_new_tokens, **extra}


def payload(*prompts: tuple[str, str], **fields: Any) -> str:
    body = {"prompts": [{"request_id": r, "prompt": p} for r, p in prompts], **fields}
    return json.dumps(body)


def connect(
    url: str,
    subprotocols: list[str] | None = None,
    origin: str | None = None,
    headers: dict[str, str] | None = None,
) -> Connection:
    """A websockets client with no opening deadline and no keepalive pings (no clocks); a
    browser's page would send its `origin`. It keeps every message it has not read
    (`max_queue=None`), so it never stops reading its socket: a test that leaves while
    frames still stream in closes at once, where websockets' bounded queue would stop the
    reading thread and its close would wait out `close_timeout` (10 s) for the server's close
    frame queued behind them. (tests/test_backpressure.py's client that does not read has a
    queue of one on purpose.)"""
    offered = [Subprotocol(s) for s in subprotocols] if subprotocols else None
    connection: Connection = _connect(
        url,
        open_timeout=None,
        ping_interval=None,
        max_queue=None,
        subprotocols=offered,
        origin=Origin(origin) if origin else None,
        additional_headers=headers,
    )
    return connection


def wait_for(condition: Callable[[], object]) -> None:
    """Polls `condition` until it holds, however long that takes."""
    while not condition():
        time.sleep(POLL)


def frames_until_done(ws: Connection, request_ids: set[str]) -> list[list[dict[str, Any]]]:
    """Every frame until each request_id has had its terminal event."""
    frames: list[list[dict[str, Any]]] = []
    waiting = set(request_ids)
    while waiting:
        frame = json.loads(ws.recv())
        assert isinstance(frame, list) and frame, frame
        frames.append(frame)
        waiting -= {e["request_id"] for e in frame if e["type"] in TERMINAL}
    return frames


def run_ws(url: str, message: str, request_ids: set[str]) -> list[list[dict[str, Any]]]:
    with connect(url + "/ws") as ws:
        ws.send(message)
        return frames_until_done(ws, request_ids)


def events_of(frames: list[list[dict[str, Any]]], request_id: str) -> list[dict[str, Any]]:
    return [e for frame in frames for e in frame if e["request_id"] == request_id]


def wait_ready(base_url: str) -> None:
    """Waits until GET /health answers 200."""
    wait_for(lambda: web.get(base_url + "/health").status_code == 200)


def scrape(base_url: str) -> Samples:
    """Every sample of GET /metrics, by name and sorted labels."""
    response = web.get(base_url + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def requests_ended(samples: Samples, protocol: str) -> dict[str, float]:
    """gateway_requests_total of one protocol, by outcome."""
    return {
        dict(labels)["outcome"]: count
        for (name, labels), count in samples.items()
        if name == "gateway_requests_total" and dict(labels).get("protocol") == protocol
    }


def outcomes_since(before: Samples, after: Samples, protocol: str) -> dict[str, float]:
    """How many engine requests of `protocol` ended between two scrapes, by outcome."""
    old, new = requests_ended(before, protocol), requests_ended(after, protocol)
    grown = {outcome: count - old.get(outcome, 0.0) for outcome, count in new.items()}
    return {outcome: count for outcome, count in grown.items() if count}


def ended_since(before: Samples, base_url: str, protocol: str) -> dict[str, float]:
    """The engine requests of `protocol` that ended since `before`, by outcome (none: {})."""
    return outcomes_since(before, scrape(base_url), protocol)


def settled_metrics(base_url: str) -> Samples:
    """The metrics once no engine request is in progress (each ended one is counted)."""
    wait_for(lambda: value(scrape(base_url), "gateway_active_streams") == 0)
    return scrape(base_url)


class LeavingClient:
    """Real httpx requests that the test makes leave on a condition, not after a time.

    The requests run on an event loop of their own; `leave()` cancels every one still waiting
    for its answer, which closes its connection, as a client that gives up does.
    """

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._client = self._run(self._open())
        self._sent: list[Future[httpx.Response]] = []

    async def _open(self) -> httpx.AsyncClient:
        return web.async_client()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def post(self, url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        """Sends the request; its answer is not awaited."""
        request = self._client.post(url, json=body, headers=headers)
        sent = asyncio.run_coroutine_threadsafe(request, self._loop)
        self._sent.append(sent)

    def unanswered(self) -> int:
        return sum(not sent.done() for sent in self._sent)

    def leave(self) -> None:
        """Every request leaves; each must still have been waiting for its answer."""
        answered = [sent.result() for sent in self._sent if not sent.cancel()]
        self._run(self._client.aclose())
        assert not answered, [(r.status_code, r.text[:200]) for r in answered]

    def close(self) -> None:
        for sent in self._sent:
            sent.cancel()
        self._run(self._client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


@contextmanager
def leaving_client() -> Iterator[LeavingClient]:
    client = LeavingClient()
    try:
        yield client
    finally:
        client.close()


def sagemaker_runtime(url: str) -> Any:
    """boto3's `sagemaker-runtime` client as a user makes it for a local endpoint: no retries
    (nothing runs twice), no timeouts."""
    import boto3  # type: ignore[import-untyped]
    from botocore.config import Config  # type: ignore[import-untyped]

    return boto3.client(
        "sagemaker-runtime",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(
            retries={"max_attempts": 0, "mode": "standard"}, connect_timeout=None, read_timeout=None
        ),
    )
