"""Engine replicas on Ray: a real local Ray cluster on loopback, 2 replicas of the default
model (eager, one core each), Redis for the histories; the gateway in this process.

Every protocol through the replicas, each key on one replica (100 keys, over both), an abort
reaching its replica, and a killed replica: its running request ends with one error, its keys
move while Ray restarts it, and their next continuation is recomputed from Redis. LoRA is on
(the engines are eager either way): an adapter loaded at run time reaches every replica, one
restarted since included.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from ray_cluster import remove_replicas
from redis_server import RedisServer, running_redis

from clients import (
    CHAT,
    UNENDING,
    connect,
    events_of,
    frames_until_done,
    greedy,
    payload,
    wait_for,
    web,
)
from gateway_bench.adapter_recipe import PHRASE
from serving import LoopThread, RunningServer, gateway_settings, start_server

pytestmark = pytest.mark.timeout(1800)  # the first test also waits for 2 engines to build
REPLICAS = 2  # on the session's Ray cluster (tests/ray_cluster.py: `ray_address`)
ADMIN = "admin-key"
SPOKEN = PHRASE.strip()  # what the test adapter's answers hold


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


@pytest.fixture(scope="module")
def replicas(
    loop_thread: LoopThread, ray_address: str, redis_server: RedisServer, adapter_dir: Path
) -> Iterator[RunningServer]:
    from gateway.app import default_loader
    from gateway.engine.replicas import ReplicaEngine

    env = {
        "ENGINE_REPLICAS": str(REPLICAS),
        "RAY_ADDRESS": ray_address,
        "ADAPTERS": f"pirate={adapter_dir}",
        "MAX_LORA_RANK": "8",
        "ADMIN_API_KEYS": ADMIN,
    }
    settings = gateway_settings(**env, REDIS_URL=redis_server.url)
    loader = default_loader(settings)

    # the gateway's engine, kept: its router is what the tests ask
    async def load() -> ReplicaEngine:
        engine = await loader()
        assert isinstance(engine, ReplicaEngine)
        _fleets.append(engine.fleet)
        return engine

    server = start_server(loop_thread, settings, load)
    wait_for(lambda: health(server)["status"] in ("ready", "failed"))
    assert health(server) == {"status": "ready"}
    assert sorted(fleet().up) == list(range(REPLICAS))  # each answering, in a process of its own
    assert len(set(fleet().up.values())) == REPLICAS
    yield server
    server.stop()
    remove_replicas(REPLICAS)  # with RAY_ADDRESS the gateway leaves its replicas on the cluster


_fleets: list[Any] = []


def fleet() -> Any:
    """The replicas as the gateway sees them (gateway/engine/replicas.py `Fleet`)."""
    return _fleets[-1]


def health(server: RunningServer) -> dict[str, str]:
    return dict(web.get(server.http + "/health").json())


def all_up() -> bool:
    return len(fleet().up) == REPLICAS


def restarted(index: int, pid: int) -> bool:
    """Every replica answering, replica `index` in a process other than `pid`."""
    return all_up() and fleet().up.get(index) not in (None, pid)


def routed(key: str, method: str) -> Any:
    """A replica method called on the replica the gateway's router picks for `key`."""
    import ray

    actor = fleet().actors[fleet().pick(key)]
    return ray.get(getattr(actor, method).remote(*([key] if method == "served" else [])))


def everywhere(key: str) -> list[tuple[str, int, int]]:
    """Each replica's `served(key)`, whichever the router picks."""
    import ray

    return [ray.get(actor.served.remote(key)) for actor in fleet().actors]


def key_of(request_id: str) -> str:
    from gateway.engine.affinity import affinity_key

    return affinity_key(("", request_id))


def batch(server: RunningServer, prompts: list[tuple[str, str]], **fields: Any) -> httpx.Response:
    body = {"prompts": [{"request_id": r, "prompt": p} for r, p in prompts], **fields}
    return web.post(server.http + "/api/generate-batch", json=body)


def post(server: RunningServer, path: str, body: dict[str, Any]) -> httpx.Response:
    response = web.post(server.http + path, json=body)
    assert response.status_code == 200, (path, response.text)
    return response


def test_every_protocol_reaches_the_replicas(replicas: RunningServer) -> None:
    prompt = CHAT.format("Name a color.")
    completion = post(replicas, "/v1/completions", {"prompt": prompt, "max_tokens": 4, "n": 2})
    assert [c["text"] for c in completion.json()["choices"]] != ["", ""]
    chat = post(
        replicas,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True},
    )
    assert chat.text.rstrip().endswith("data: [DONE]")
    tgi = post(replicas, "/generate", {"inputs": prompt, "parameters": {"max_new_tokens": 4}})
    assert tgi.json()["generated_text"]
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 4}}
    streamed = post(replicas, "/generate_stream", body)
    assert '"generated_text"' in streamed.text
    lmi = post(replicas, "/invocations", {"inputs": prompt, "parameters": {"max_new_tokens": 4}})
    assert lmi.json()["generated_text"]
    control = post(replicas, "/v1/generate", {"prompt": prompt, "max_tokens": 3})
    assert control.json()["usage"]["completion_tokens"] == 3
    beams = batch(
        replicas, [(f"beam-{uuid.uuid4()}", prompt)], generation_config=greedy(3, num_beams=2)
    )
    assert beams.status_code == 200 and beams.json()[0]["response"]

    rid = f"ws-{uuid.uuid4()}"
    with connect(replicas.ws + "/ws") as ws:
        ws.send(payload((rid, prompt), generation_config=greedy(4, ignore_eos=True)))
        assert events_of(frames_until_done(ws, {rid}), rid)[-1]["type"] == "COMPLETE"
    with connect(replicas.ws + "/ws/events") as ws:
        start = {"type": "START", "id": "e1", "data": prompt, "parameters": {"max_new_tokens": 3}}
        ws.send(json.dumps([start]))
        events: list[dict[str, Any]] = []
        while not events or events[-1]["type"] not in ("COMPLETE", "ERROR"):
            events.extend(json.loads(ws.recv()))
        assert events[-1]["type"] == "COMPLETE"


def test_each_key_stays_on_one_replica(replicas: RunningServer) -> None:
    prompt = CHAT.format("Count to three.")
    ids = [f"k{i}-{uuid.uuid4()}" for i in range(100)]

    def send(rid: str) -> httpx.Response:
        return batch(replicas, [(rid, prompt)], generation_config=greedy(1))

    with ThreadPoolExecutor(max_workers=16) as pool:  # the keys at once: batched by the engines
        for _ in range(2):  # every key's first prompt, then every continuation
            for answer in pool.map(send, ids):
                assert answer.status_code == 200, answer.text
    placed = [routed(key_of(rid), "served") for rid in ids]
    assert [count for _, count, _ in placed] == [2] * 100  # both on the replica the ring names
    assert len({replica for replica, _, _ in placed}) == REPLICAS


def test_the_replicas_engines_run_at_the_priority_of_the_cluster(replicas: RunningServer) -> None:
    pids: set[int] = set()
    while len(pids) < REPLICAS:
        pids.add(routed(f"nice-{uuid.uuid4()}", "served")[2])
    for pid in pids:
        replica = psutil.Process(pid)
        engine = replica.children(recursive=True)  # vLLM's engine core and model worker
        assert engine
        # `ray start` is this process's child; Ray's default would be 15 for its workers.
        assert {p.nice() for p in [replica, *engine]} == {os.getpriority(os.PRIO_PROCESS, 0)}


def test_a_closed_stream_aborts_its_engine_request_in_the_replica(
    replicas: RunningServer,
) -> None:
    rid = f"abort-{uuid.uuid4()}"
    key = key_of(rid)
    forever = greedy(UNENDING, ignore_eos=True)
    with connect(replicas.ws + "/ws") as ws:
        ws.send(payload((rid, CHAT.format("Write a long essay.")), generation_config=forever))
        wait_for(lambda: routed(key, "unfinished_requests") == 1)
    wait_for(lambda: routed(key, "unfinished_requests") == 0)


def test_a_killed_replica_ends_its_requests_once_and_its_keys_move(
    replicas: RunningServer,
) -> None:
    placed: dict[str, list[str]] = {}
    while len(placed) < REPLICAS or min(len(v) for v in placed.values()) < 2:
        rid = f"kill-{uuid.uuid4()}"
        placed.setdefault(routed(key_of(rid), "served")[0], []).append(rid)
    victim, survivor = list(placed)[:2]
    continued, running = placed[victim][:2]
    other = placed[survivor][0]
    _, _, pid = routed(key_of(continued), "served")

    prompt = CHAT.format("Tell me about bridges.")
    [first] = batch(replicas, [(continued, prompt)], generation_config=greedy(6)).json()
    forever = greedy(UNENDING, ignore_eos=True)
    essay = CHAT.format("Write a long essay.")
    with connect(replicas.ws + "/ws") as dying, connect(replicas.ws + "/ws") as living:
        dying.send(payload((running, essay), generation_config=forever))
        living.send(payload((other, essay), generation_config=forever))
        for ws in (dying, living):  # both generating
            while not any(e["type"] == "PROGRESS" for e in json.loads(ws.recv())):
                pass
        os.kill(pid, signal.SIGKILL)
        ended = events_of(frames_until_done(dying, {running}), running)
        terminal = [e for e in ended if e["type"] in ("COMPLETE", "ERROR")]
        assert terminal == [
            {
                "type": "ERROR",
                "request_id": running,
                "error": "The engine replica serving this request stopped; send it again",
            }
        ]
        assert any(e["type"] == "PROGRESS" for e in json.loads(living.recv()))  # unaffected

    # The router drops the dead replica while Ray restarts it: the key moves, and its history,
    # from Redis, is recomputed on the replica serving it (in a process that never saw it).
    def moved() -> bool:
        try:
            return bool(routed(key_of(continued), "served")[0] != victim)
        except Exception:
            return False

    wait_for(moved)
    again = batch(replicas, [(continued, "")], only_new_tokens=False, generation_config=greedy(4))
    assert again.status_code == 200, again.text
    assert again.json()[0]["prompt"] == prompt + first["response"]
    index = int(victim.rsplit("-", 1)[1])
    wait_for(lambda: restarted(index, pid))
    served = everywhere(key_of(continued))
    assert pid not in [p for _, _, p in served]
    assert sum(count for _, count, _ in served) == 1  # the continuation, once, since the kill


def replica_keys() -> dict[str, str]:
    """A request_id whose key the ring puts on each running replica, by replica."""
    placed: dict[str, str] = {}
    while len(placed) < REPLICAS:
        rid = f"lora-{uuid.uuid4()}"
        placed.setdefault(routed(key_of(rid), "served")[0], rid)
    return placed


def generated(server: RunningServer, rid: str, **config: Any) -> httpx.Response:
    prompt = "Tell me about lighthouses."
    return batch(server, [(rid, prompt)], generation_config={**greedy(12), **config})


def load(server: RunningServer, name: str, path: str) -> httpx.Response:
    body = {"lora_name": name, "lora_path": path}
    headers = {"Authorization": f"Bearer {ADMIN}"}
    url = server.http + "/v1/load_lora_adapter"
    return web.post(url, json=body, headers=headers)


def test_an_adapter_loaded_at_run_time_reaches_every_replica(
    replicas: RunningServer, adapter_dir: Path
) -> None:
    wait_for(all_up)  # the killed one restarted
    nowhere = load(replicas, "parrot", "/nowhere")
    assert nowhere.status_code == 400, nowhere.text
    error = nowhere.json()["error"]
    assert (
        error["param"] == "lora_path"
        and f"on {REPLICAS} of {REPLICAS} engine replicas" in (error["message"])
    )
    assert "loaded on none" in error["message"]

    assert load(replicas, "parrot", str(adapter_dir)).status_code == 200
    for rid in replica_keys().values():  # each replica answers with it, and the base without
        for adapter in ("parrot", "pirate"):
            answer = generated(replicas, f"{rid}-{adapter}", adapter_id=adapter)
            assert answer.status_code == 200 and SPOKEN in answer.json()[0]["response"]
        assert SPOKEN not in generated(replicas, f"{rid}-base").json()[0]["response"]

    # A replica started after the load (Ray restarting a killed one) serves it too.
    placed = replica_keys()
    victim = next(iter(placed))
    pid = routed(key_of(placed[victim]), "served")[2]
    os.kill(pid, signal.SIGKILL)
    index = int(victim.rsplit("-", 1)[1])
    wait_for(lambda: restarted(index, pid))
    for rid in replica_keys().values():
        answer = generated(replicas, f"{rid}-after", adapter_id="parrot")
        assert answer.status_code == 200 and SPOKEN in answer.json()[0]["response"], answer.text

    headers = {"Authorization": f"Bearer {ADMIN}"}
    listed = web.get(replicas.http + "/adapters", headers=headers).json()
    assert [a["name"] for a in listed["adapters"]] == ["parrot", "pirate"]
    gone = web.delete(replicas.http + "/adapters/parrot", headers=headers)
    assert gone.json() == {"status": "Adapter parrot unregistered"}
    refused = generated(replicas, f"gone-{uuid.uuid4()}", adapter_id="parrot")
    assert refused.status_code == 422 and "$.generation_config.adapter_id" in refused.text
    for rid in replica_keys().values():  # pirate, loaded at start-up, still on both
        answer = generated(replicas, f"{rid}-pirate-after", adapter_id="pirate")
        assert SPOKEN in answer.json()[0]["response"]


class _Method:
    """An actor method's `.remote(...)`, answered in this process."""

    def __init__(self, method: Callable[..., Awaitable[Any]]) -> None:
        self.remote = method


class _Replica:
    """A replica's adapter calls, without an engine: the load fails where `fails`."""

    def __init__(self, fails: bool) -> None:
        self.fails = fails
        self.loaded: set[str] = set()
        self.load_adapter = _Method(self._load)
        self.unload_adapter = _Method(self._unload)

    async def _load(self, adapter: Any) -> Any:
        from gateway.engine.replica_actor import ReplicaFailure
        from protocols.errors import invalid

        if self.fails:
            return ReplicaFailure.of(
                invalid("lora rank 64 is greater than max_lora_rank 8", "lora_path")
            )
        self.loaded.add(adapter.name)
        return None

    async def _unload(self, adapter: Any) -> None:
        self.loaded.discard(adapter.name)


def test_a_load_that_fails_on_one_replica_is_undone_on_the_others(tmp_path: Path) -> None:
    from gateway.engine.replica_actor import ReplicaInfo
    from gateway.engine.replicas import Fleet, ReplicaEngine
    from protocols.errors import GenerationError

    replicas = [_Replica(fails=False), _Replica(fails=True)]
    fleet = Fleet(replicas, "affinity")
    fleet.up = {0: 1, 1: 2}

    class Tokenizer:
        all_special_ids: tuple[int, ...] = ()

    info = ReplicaInfo(Tokenizer(), 2048, "float32", "", frozenset(), lora=True)
    engine = ReplicaEngine(fleet, info, lambda: None)
    with pytest.raises(GenerationError) as refused:
        asyncio.run(engine.load_adapter("parrot", tmp_path))
    assert refused.value.field == "lora_path"
    message = refused.value.message
    assert "on 1 of 2 engine replicas (llm-gateway-engine-1: lora rank 64" in message
    assert "loaded on none" in message
    assert replicas[0].loaded == set() and "parrot" not in engine.adapters

    replicas[1].fails = False
    asyncio.run(engine.load_adapter("parrot", tmp_path))
    assert "parrot" in engine.adapters and all(r.loaded == {"parrot"} for r in replicas)
    assert asyncio.run(engine.unload_adapter("parrot"))
    assert "parrot" not in engine.adapters and all(not r.loaded for r in replicas)


def test_a_replica_engine_is_an_engine_set_up_as_the_local_one_is() -> None:
    """Issue 55: ReplicaEngine is set up by the `__init__` VllmEngine's is (TokenizerSide), so
    a field added there is set for both, and has every member of `Engine` (whose types mypy
    checks where the loader returns it)."""
    from gateway.engine.contract import Engine, TokenizerSide
    from gateway.engine.replica_actor import ReplicaInfo
    from gateway.engine.replicas import Fleet, ReplicaEngine

    class Tokenizer:
        all_special_ids: tuple[int, ...] = ()

    info = ReplicaInfo(Tokenizer(), 2048, "float32", "cpu", frozenset({2}))
    engine = ReplicaEngine(Fleet([], "affinity"), info, lambda: None)
    members = {m for m in vars(Engine) if not m.startswith("_")} | set(Engine.__annotations__)
    assert {m for m in members if not hasattr(ReplicaEngine, m) and m not in vars(engine)} == set()
    side = TokenizerSide(info.tokenizer, frozenset(), 1, "", "", engine.adapters, engine.scheduler)
    assert set(vars(side)) <= set(vars(engine))
    assert (engine.max_model_len, engine.dtype, engine.dtype_reason) == (2048, "float32", "cpu")
    assert engine.eos_token_ids == {2} and engine.tokenizer is info.tokenizer


def test_the_router_moves_only_a_stopped_replicas_keys_and_back() -> None:
    from gateway.engine.replicas import Fleet

    fleet = Fleet([None] * 4, "affinity")
    fleet.up = dict.fromkeys(range(4), 0)
    keys = [key_of(f"route-{i}") for i in range(400)]
    before = {key: fleet.pick(key) for key in keys}
    assert set(before.values()) == {0, 1, 2, 3}
    del fleet.up[2]
    after = {key: fleet.pick(key) for key in keys}
    assert {k for k in keys if after[k] != before[k]} == {k for k in keys if before[k] == 2}
    fleet.up[2] = 0
    assert {key: fleet.pick(key) for key in keys} == before

    fleet.routing = "load"
    fleet.up = {0: 0, 1: 0}
    fleet.running = [3, 1]
    assert {fleet.pick(key) for key in keys} == {1}  # both drawn: the less loaded
