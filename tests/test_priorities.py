"""Priority classes and fairness on the real engine: who goes first, as the clients see it.

Each server here runs one request at a time (MAX_RUNNING_REQUESTS=1), so the order in which
answers come back is the order in which requests were let into the engine.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pytest
from websockets.sync.connection import Connection

from clients import (
    CHAT,
    MAX_MODEL_LEN,
    UNENDING,
    connect,
    greedy,
    payload,
    scrape,
    value,
    wait_for,
    web,
)
from serving import STEP_TOKENS, RunningServer

if TYPE_CHECKING:
    from gateway.engine.vllm_engine import VllmEngine

LONG = greedy(UNENDING, ignore_eos=True)
PROMPT = CHAT.format("Name a river.")
ALPHA, BETA = "alpha-secret", "beta-secret"


class Arrivals:
    """Requests sent one after another, each queued before the next; `done` lists them in the
    order their answers came back."""

    def __init__(self, server: RunningServer, pool: ThreadPoolExecutor) -> None:
        self.server = server
        self.pool = pool
        self.done: list[str] = []
        self.futures: list[Future[None]] = []
        self._lock = threading.Lock()

    def send(self, name: str, path: str, body: dict[str, object], key: str | None = None) -> None:
        admission = self.server.gateway.service.admission
        queued = admission.waiting
        self.futures.append(self.pool.submit(self._call, name, path, body, key))
        wait_for(lambda: admission.waiting == queued + 1)

    def _call(self, name: str, path: str, body: dict[str, object], key: str | None) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        answer = web.post(self.server.http + path, json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        with self._lock:
            self.done.append(name)

    def wait(self) -> list[str]:
        for future in self.futures:
            future.result()
        return self.done


def lmi(tokens: int = 4) -> dict[str, object]:
    return {"inputs": PROMPT, "parameters": {"max_new_tokens": tokens, "do_sample": False}}


def chat(tokens: int = 4) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": tokens, "temperature": 0}


@contextmanager
def holding_the_slot(server: RunningServer, key: str | None = None) -> Iterator[Connection]:
    """A generation that holds the one slot until the block ends (its client leaves)."""
    subprotocols = [f"bearer.{key}"] if key else None
    with connect(server.ws + "/ws", subprotocols=subprotocols) as holder:
        admission = server.gateway.service.admission
        running = admission.running
        holder.send(payload(("hold", PROMPT), generation_config=LONG))
        wait_for(lambda: admission.running == running + 1)
        yield holder


def queued_by_class(server: RunningServer) -> dict[str, float]:
    samples = scrape(server.http)
    return {
        dict(labels)["priority"]: count
        for (name, labels), count in samples.items()
        if name == "gateway_class_queue_depth" and count
    }


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_an_interactive_request_behind_a_queue_of_bulk_requests_starts_before_them(
    make_server: Callable[..., RunningServer], idle_engine: Callable[[], None], policy: str
) -> None:
    tight = make_server(MAX_RUNNING_REQUESTS="1", SCHEDULING_POLICY=policy)
    before = scrape(tight.http)
    with ThreadPoolExecutor(4) as pool:
        arrivals = Arrivals(tight, pool)
        with holding_the_slot(tight):
            for n in range(3):
                arrivals.send(f"bulk-{n}", "/invocations", lmi())
            arrivals.send("chat", "/v1/chat/completions", chat())
            if policy == "priority":
                assert queued_by_class(tight) == {"2": 3, "0": 1}
            else:
                assert queued_by_class(tight) == {"0": 4}
        order = arrivals.wait()
    if policy == "priority":
        assert order == ["chat", "bulk-0", "bulk-1", "bulk-2"]
    else:
        assert order == ["bulk-0", "bulk-1", "bulk-2", "chat"]
    after = scrape(tight.http)
    idle_engine()

    def grown(name: str, priority: str) -> float:
        return value(after, name, priority=priority) - value(before, name, priority=priority)

    classes = {"0": 1, "1": 1, "2": 3} if policy == "priority" else {"0": 5}  # and the holder
    for priority, count in classes.items():
        assert grown("gateway_class_time_to_first_token_seconds_count", priority) == count
        assert grown("gateway_class_queue_seconds_count", priority) == count


def test_a_request_may_ask_to_step_back_but_not_ahead(
    make_server: Callable[..., RunningServer], idle_engine: Callable[[], None]
) -> None:
    tight = make_server(MAX_RUNNING_REQUESTS="1")
    with ThreadPoolExecutor(4) as pool:
        arrivals = Arrivals(tight, pool)
        with holding_the_slot(tight):
            arrivals.send("pushy-bulk", "/invocations", {**lmi(), "parameters": {"priority": 0}})
            arrivals.send("polite-chat", "/v1/chat/completions", {**chat(), "priority": 5})
            arrivals.send("chat", "/v1/chat/completions", chat())
            assert queued_by_class(tight) == {"0": 1, "2": 1, "5": 1}
        assert arrivals.wait() == ["chat", "pushy-bulk", "polite-chat"]
    idle_engine()
    refused = web.post(tight.http + "/v1/chat/completions", json={**chat(), "priority": 10})
    assert refused.status_code == 400 and "priority" in refused.json()["error"]["message"]


@pytest.mark.parametrize("fairness", ["caller", "fifo"])
def test_a_caller_with_many_requests_does_not_starve_one_with_a_single_request(
    make_server: Callable[..., RunningServer], idle_engine: Callable[[], None], fairness: str
) -> None:
    shared = make_server(
        API_KEYS=f"{ALPHA}:alpha,{BETA}:beta",
        MAX_RUNNING_REQUESTS="1",
        ADMISSION_FAIRNESS=fairness,
    )
    with ThreadPoolExecutor(4) as pool:
        arrivals = Arrivals(shared, pool)
        with holding_the_slot(shared, key=ALPHA):
            for n in range(3):
                arrivals.send(f"alpha-{n}", "/invocations", lmi(), key=ALPHA)
            arrivals.send("beta", "/invocations", lmi(), key=BETA)
        order = arrivals.wait()
    idle_engine()
    if fairness == "caller":
        assert order == ["beta", "alpha-0", "alpha-1", "alpha-2"]
    else:
        assert order == ["alpha-0", "alpha-1", "alpha-2", "beta"]


def test_the_bulk_cap_holds_bulk_back_while_an_interactive_request_runs(
    make_server: Callable[..., RunningServer], idle_engine: Callable[[], None]
) -> None:
    capped = make_server(MAX_RUNNING_REQUESTS="4", BULK_MAX_RUNNING="1")
    admission = capped.gateway.service.admission
    unending = {"max_new_tokens": UNENDING, "do_sample": False, "ignore_eos_token": True}
    endless_bulk = {"inputs": PROMPT, "parameters": unending}
    sse = {"Accept": "text/event-stream"}
    with ThreadPoolExecutor(2) as pool:
        arrivals = Arrivals(capped, pool)
        with web.stream(
            "POST", capped.http + "/invocations", json=endless_bulk, headers=sse
        ) as bulk:
            assert bulk.status_code == 200
            wait_for(lambda: admission.running == 1)
            with holding_the_slot(capped):  # a standard-class generation: not bulk
                arrivals.send("bulk", "/invocations", lmi())  # waits with slots free: the cap
                assert admission.running_by_class() == {1: 1, 2: 1}
            assert arrivals.wait() == ["bulk"]  # the other class gone, the cap lifted
    idle_engine()


@pytest.mark.long  # fills the KV cache until vLLM preempts: make test-all
def test_preempted_requests_are_recomputed_to_the_same_greedy_text(
    server: RunningServer, engine: VllmEngine, idle_engine: Callable[[], None]
) -> None:
    # Four requests whose prompts fit the KV cache together but whose answers do not: the
    # scheduler preempts the lowest class (the bulk ones) to let the others go on.
    cache = engine.llm.vllm_config.cache_config
    blocks, block = int(cache.num_gpu_blocks or 0), int(cache.block_size)
    per_request = blocks // 4
    prompt_tokens = per_request * block - 40  # the chat template adds a few
    new_tokens = 56  # every request then needs per_request + 1 blocks: too many
    assert prompt_tokens + new_tokens < MAX_MODEL_LEN, "the test's KV cache is too large"

    def prompt(n: int) -> str:
        words = [f"Stream {n} passes town {t}." for t in range(prompt_tokens)]
        text = ""
        for word in words:
            if len(engine.encode(text + word)) > prompt_tokens:
                return text
            text += word
        return text

    parameters = {"max_new_tokens": new_tokens, "do_sample": False, "ignore_eos_token": True}
    calls: list[tuple[str, dict[str, object]]] = [
        ("/invocations", {"inputs": prompt(n), "parameters": parameters}) for n in range(3)
    ]
    person = [{"role": "user", "content": prompt(3)}]
    calls.append(
        (
            "/v1/chat/completions",
            {"messages": person, "max_tokens": new_tokens, "temperature": 0, "ignore_eos": True},
        )
    )

    def text_of(call: tuple[str, dict[str, object]]) -> str:
        answer = web.post(server.http + call[0], json=call[1])
        assert answer.status_code == 200, answer.text
        body = answer.json()
        if "choices" in body:
            assert body["usage"]["completion_tokens"] == new_tokens
            return str(body["choices"][0]["message"]["content"])
        return str(body["generated_text"])

    alone = [text_of(call) for call in calls]
    preempted_before = engine.scheduler.preemptions
    with ThreadPoolExecutor(len(calls)) as pool:
        together = list(pool.map(text_of, calls))
    assert engine.scheduler.preemptions > preempted_before
    assert together == alone
    idle_engine()


class EndlessStream:
    """An endless greedy generation read in a thread: its token ids so far; it ends when `stop`
    is set. Bulk through `/invocations` (jsonlines), or interactive through TGI's
    `/generate_stream` (server-sent events)."""

    def __init__(
        self,
        server: RunningServer,
        pool: ThreadPoolExecutor,
        prompt: str,
        path: str = "/invocations",
    ) -> None:
        self.ids: list[int] = []
        self.stop = threading.Event()
        unending = {"max_new_tokens": UNENDING, "do_sample": False, "ignore_eos_token": True}
        body: dict[str, object] = {"inputs": prompt, "parameters": unending}
        if path == "/invocations":
            body["stream"] = True
        self.done = pool.submit(self._read, server.http + path, body)

    def _read(self, url: str, body: dict[str, object]) -> None:
        with web.stream("POST", url, json=body) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if self.stop.is_set():
                    return
                if line:
                    self.ids.append(json.loads(line.removeprefix("data:"))["token"]["id"])


def test_bulk_is_held_to_its_share_of_the_engine_while_an_interactive_request_runs(
    server: RunningServer, engine: VllmEngine, idle_engine: Callable[[], None]
) -> None:
    cap = server.gateway.settings.engine.bulk_max_running  # the test engine's (serving.py)
    assert cap == 4
    scheduler = engine.scheduler
    preempted = scheduler.preemptions
    prompt = CHAT.format("Count the stars.")
    with ThreadPoolExecutor(cap + 1) as pool:
        streams = [EndlessStream(server, pool, prompt) for _ in range(cap + 1)]
        wait_for(lambda: scheduler.running == cap + 1 and all(s.ids for s in streams))
        with connect(server.ws + "/ws") as person:  # an interactive class (1), endless
            person.send(payload(("person", PROMPT), generation_config=LONG))
            # The newest bulk request is paused: it waits inside the engine, keeping its KV
            # cache, and is not preempted.
            wait_for(lambda: scheduler.running == cap + 1 and scheduler.waiting == 1)
            held_at = [len(s.ids) for s in streams]

            def seen_in_metrics() -> bool:
                samples = scrape(server.http)
                running = value(samples, "gateway_engine_running")
                return running == cap + 1 and value(samples, "gateway_engine_waiting") == 1

            wait_for(seen_in_metrics)
        # The person gone, bulk fills the batch again; each stream goes on where it stopped,
        # the paused one with nothing to recompute: nothing was preempted.
        wait_for(lambda: scheduler.running == cap + 1 and scheduler.waiting == 0)
        wait_for(lambda: all(len(s.ids) > n + 1 for s, n in zip(streams, held_at, strict=True)))
        assert scheduler.preemptions == preempted
        for stream in streams:
            stream.stop.set()
        for stream in streams:
            stream.done.result()
    idle_engine()
    longest = max(len(s.ids) for s in streams)
    alone = web.post(
        server.http + "/invocations",
        json={
            "inputs": prompt,
            "parameters": {
                "max_new_tokens": longest,
                "do_sample": False,
                "ignore_eos_token": True,
                "details": True,
            },
        },
    ).json()
    reference = [token["id"] for token in alone["details"]["tokens"]]
    for stream in streams:
        assert stream.ids == reference[: len(stream.ids)]


def test_a_chat_prompt_is_computed_in_bounded_steps_without_bulk(
    server: RunningServer, engine: VllmEngine, idle_engine: Callable[[], None]
) -> None:
    """While a chat's long prompt is computed: each step takes at most INTERACTIVE_STEP_TOKENS,
    so the prompt takes many steps and another chat already streaming gains a token in each
    (with the engine's budget alone, 512 tokens on a CPU, it would take 4 steps); and prompts first
    (bulk_scheduler.py): those steps carry no bulk request, so the bulk streams hardly move
    (without the rule each would gain a token per step, as the other chat does)."""
    cap = server.gateway.settings.engine.bulk_max_running
    step_tokens = server.gateway.settings.engine.interactive_step_tokens
    assert cap == 4 and step_tokens == STEP_TOKENS
    scheduler = engine.scheduler
    prompt = CHAT.format("Which word is this? " + " ".join(["river"] * 1700))
    counted = web.post(server.http + "/tokenize", json={"prompt": prompt}).json()["count"]
    steps = counted // STEP_TOKENS  # the prompt's steps at least
    # Fewer than bulk_scheduler.PROMPTS_FIRST_STEPS (16), after which bulk has a step.
    assert 10 <= steps < 16 and counted < MAX_MODEL_LEN - 8
    with ThreadPoolExecutor(cap + 1) as pool:
        streams = [EndlessStream(server, pool, CHAT.format("Count the stars.")) for _ in range(cap)]
        other_chat = EndlessStream(server, pool, PROMPT, "/generate_stream")
        wait_for(
            lambda: scheduler.running == cap + 1 and all(s.ids for s in [*streams, other_chat])
        )
        body = {"inputs": prompt, "parameters": {"max_new_tokens": 2, "do_sample": False}}
        before = [len(s.ids) for s in streams]
        other_before = len(other_chat.ids)
        with web.stream("POST", server.http + "/generate_stream", json=body) as chat:
            assert chat.status_code == 200
            first = next(line for line in chat.iter_lines() if line.startswith("data:"))
            during = [len(s.ids) - n for s, n in zip(streams, before, strict=True)]
            other_during = len(other_chat.ids) - other_before
        assert json.loads(first.removeprefix("data:"))["token"]["text"]
        for stream in [*streams, other_chat]:
            stream.stop.set()
        for stream in [*streams, other_chat]:
            stream.done.result()
    # A token or two in flight at each end: the prompt took its steps, and they carried no bulk.
    assert other_during >= 2 * steps // 3, (other_during, steps)
    assert max(during) <= steps // 3, (during, steps)
    idle_engine()


@pytest.mark.long  # fills the KV cache under the bulk cap: make test-all
def test_bulk_past_the_cap_under_kv_pressure_is_answered_with_its_own_greedy_text(
    server: RunningServer, engine: VllmEngine, idle_engine: Callable[[], None]
) -> None:
    # Twice the cap of bulk requests whose prompts fill most of the KV cache and whose answers
    # overflow it, then a person's chat: the bulk past the cap is paused (keeping its blocks),
    # and preempted when the cache runs short (bulk_scheduler.py; vLLM preempts running bulk
    # for room too). Everyone is answered, and each bulk text is the one its prompt gets alone.
    cap = server.gateway.settings.engine.bulk_max_running
    assert cap == 4  # the test engine's (serving.py)
    cache = engine.llm.vllm_config.cache_config
    blocks, block = int(cache.num_gpu_blocks or 0), int(cache.block_size)
    bulk_requests = 2 * cap
    # The prompts fill all but a block or so per request; each answer needs `extra` blocks
    # more, so together they overflow the cache by at least a block per request whatever the
    # block size (vLLM's 128 or the gateway's 32 on a CPU, which holds four times the blocks).
    per_request = blocks // bulk_requests - 1
    extra = max(2, -(-(blocks + bulk_requests - bulk_requests * per_request) // bulk_requests))
    prompt_tokens = per_request * block - 8
    new_tokens = (extra - 1) * block + 16  # 8 end the prompt's last block, then `extra` more
    assert prompt_tokens + new_tokens < MAX_MODEL_LEN, "the test's KV cache is too large"

    def prompt(n: int) -> str:
        text = ""
        for t in range(prompt_tokens):
            word = f"Cart {n} crosses bridge {t}."
            if len(engine.encode(text + word)) > prompt_tokens:
                break
            text += word
        return text

    parameters = {"max_new_tokens": new_tokens, "do_sample": False, "ignore_eos_token": True}
    bodies: list[dict[str, object]] = [
        {"inputs": prompt(n), "parameters": parameters} for n in range(bulk_requests)
    ]

    def text_of(body: dict[str, object]) -> str:
        answer = web.post(server.http + "/invocations", json=body)
        assert answer.status_code == 200, answer.text
        return str(answer.json()["generated_text"])

    alone = [text_of(body) for body in bodies]
    idle_engine()
    scheduler = engine.scheduler
    preempted = scheduler.preemptions
    person = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 32, "temperature": 0}
    with ThreadPoolExecutor(bulk_requests) as pool:
        together = pool.map(text_of, bodies)
        wait_for(lambda: scheduler.running + scheduler.waiting == bulk_requests)
        answer = web.post(server.http + "/v1/chat/completions", json=person)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] > 0
        assert list(together) == alone
    assert scheduler.preemptions > preempted
    idle_engine()
