"""The soak's options, and its clients at work: the seeded plan of requests, and the clients
that send it.

Every request is drawn from the seed: its protocol (each in turn, in a shuffled order), its
prompt and token budget, whether its field is invalid, and whether (and at what share of its
protocol's usual duration) its client leaves. The main key's clients send the plan back to
back. Between two shares of the plan done (`contended`), the limited key's clients send too,
one request a `limited_interval_s` each, far over their key's limit; each outcome is tagged
with the phase it was sent in, so the main key's TTFT with and without them can be compared.
Each request is one protocol client of clients.py, on a connection of its own (a connection
left idle meanwhile would not answer the server's pings), its key sent the way each
protocol's clients send it: `Authorization: Bearer` on HTTP and on the WebSocket handshake.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter

import aiohttp
import msgspec

from gateway_bench import clients
from gateway_bench.metrics import FINISHED, Record
from gateway_bench.options import Options, Positive, Share
from gateway_bench.worker import Context, Worker
from gateway_bench.workload import Request, Workload
from protocols.names import Protocol

BASELINE = "baseline"
CONTENDED = "contended"
INVALID_BUDGET = -1  # the soak's invalid input: a negative token budget
_FIRST_GUESS_S = 1.0  # a protocol's usual duration before any of its requests finished


class SoakOptions(Options, frozen=True, kw_only=True):
    # Workload
    requests: Positive = 10_000  # the measured requests, the limited key's included
    concurrency: Positive = 64  # clients at once while the limited key sends (its clients included)
    limited_clients: Positive = 4  # of those, the clients of the limited key
    limited_interval_s: float = 2.0  # a limited client's requests start this far apart
    contended: tuple[float, float] = (0.3, 0.7)  # the limited key sends between these shares done
    leave_share: Share = 0.10  # clients that leave at a random moment of their request
    invalid_share: Share = 0.05  # requests with an invalid field
    output_tokens: tuple[Positive, Positive] = (8, 16)
    prompt_tokens: tuple[Positive, Positive] = (16, 64)
    warmup: int = 256  # requests before the measured ones: every protocol, none leaves
    # The limited key's limits, as written in the keys file
    limited_limits: str = "concurrent=2 rpm=30 tpm=5000"
    # Amplification, after the plan: the main key's chats alone, then while a third key, whose
    # one limit is its concurrency, asks for its most sequences (n, num_beams) of this many
    # tokens each; 0 chats (or no amplifier key for a running gateway): not measured.
    amplifier_limits: str = "concurrent=2"
    amplification_chats: int = 20
    amplification_ask_tokens: int = 64
    # What is measured
    grace_s: float = 1.0  # an engine request may outlive its client by this much
    scrape_interval_s: float = 0.25
    rss_interval_s: float = 1.0
    rss_window: int = 1000  # the first and the last this many requests' memory are compared
    # The gateway
    gateway_url: str = ""  # soak this running gateway instead of starting one
    gateway_pid: int | None = None  # its process, for the memory figure
    main_key: str = ""  # with --gateway-url: its keys (the limited one must have the limits)
    limited_key: str = ""
    amplifier_key: str = ""  # with --gateway-url: a key with the amplifier's limits, if any


QUICK_SOAK = SoakOptions(
    requests=100,
    concurrency=16,
    limited_clients=2,
    limited_interval_s=0.5,
    warmup=22,
    rss_window=25,
    amplification_chats=3,
    amplification_ask_tokens=16,
    enforce_eager=True,
    quick=True,
)


class Spec(msgspec.Struct, frozen=True):
    """One request of the soak, drawn from the seed (`plan`)."""

    index: int
    protocol: str
    prompt: str
    max_new_tokens: int
    invalid: bool = False
    leave_at: float | None = None  # a share of the protocol's usual duration, then cancelled

    def request(self) -> Request:
        budget = INVALID_BUDGET if self.invalid else self.max_new_tokens
        return Request(f"soak-{self.index}", self.prompt, budget, 0)


class Outcome(Record, kw_only=True):
    """What a request's client saw (metrics.Record), tagged with who sent it and when."""

    index: int
    protocol: str
    key: str  # "main" or "limited"
    phase: str  # "baseline" or "contended": whether the limited key was sending
    invalid: bool
    left_at: float | None = None  # the client left (closed its connection) then

    @property
    def left(self) -> bool:
        return self.left_at is not None


@dataclass(frozen=True)
class SoakProtocol:
    name: str  # a protocols.names.Protocol value, or one with a suffix for a second form
    call: clients.Call
    streamed: bool  # TTFT is the first text's time, not the whole answer's


PROTOCOLS: tuple[SoakProtocol, ...] = (
    SoakProtocol(Protocol.WS, clients.ws_batch, True),
    SoakProtocol(Protocol.WS_EVENTS, clients.ws_events_stream, True),
    SoakProtocol(Protocol.CONTROL, clients.control_ws, True),
    SoakProtocol(Protocol.API_GENERATE_ONE, clients.generate_one, True),
    SoakProtocol(Protocol.API_GENERATE_BATCH, clients.generate_batch, False),
    SoakProtocol(Protocol.LMI, clients.invocations, True),
    SoakProtocol(Protocol.SAGEMAKER, clients.sagemaker, False),
    SoakProtocol(Protocol.TGI, clients.tgi_stream, True),
    SoakProtocol(f"{Protocol.TGI}-generate", clients.tgi_generate, False),
    SoakProtocol(Protocol.OPENAI_CHAT, clients.chat_completions, True),
    SoakProtocol(f"{Protocol.OPENAI_CHAT}-whole", clients.chat_whole, False),
)
BY_NAME = {p.name: p for p in PROTOCOLS}


def plan(options: SoakOptions, workload: Workload, count: int, stream: str) -> list[Spec]:
    rng = random.Random(f"{options.seed}:soak:{stream}")
    order = [p.name for p in PROTOCOLS]
    rng.shuffle(order)
    requests = workload.requests("soak", stream, count)
    specs: list[Spec] = []
    for i, request in enumerate(requests):
        draw = rng.random()
        invalid = stream != "warmup" and draw < options.invalid_share
        leaves = (
            stream != "warmup"
            and not invalid
            and draw < options.invalid_share + options.leave_share
        )
        specs.append(
            Spec(
                index=i,
                protocol=order[i % len(order)],
                prompt=request.prompt,
                max_new_tokens=rng.randint(*options.output_tokens),
                invalid=invalid,
                leave_at=rng.random() if leaves else None,
            )
        )
    return specs


class Durations:
    """Each protocol's usual duration: the median of its last finished requests."""

    def __init__(self) -> None:
        self._seen: dict[str, list[float]] = {}

    def add(self, out: Outcome) -> None:
        if not out.left and out.terminals == [FINISHED] * out.prompts:
            seen = self._seen.setdefault(out.protocol, [])
            seen.append(out.end - out.sent)
            del seen[:-50]

    def usual(self, protocol: str) -> float:
        seen = self._seen.get(protocol)
        return statistics.median(seen) if seen else _FIRST_GUESS_S


class Soak:
    def __init__(
        self,
        options: SoakOptions,
        session: aiohttp.ClientSession,
        base_url: str,
        keys: tuple[str, str],
        on_done: Callable[[], object] = lambda: None,
    ) -> None:
        self.options = options
        self.session = session
        self.base_url = base_url
        self.main_key, self.limited_key = keys
        self.on_done = on_done
        self.outcomes: list[Outcome] = []
        self.durations = Durations()
        self.contended = asyncio.Event()
        self.calm = asyncio.Event()  # set once the contended phase is over
        self.began = 0.0

    @property
    def done(self) -> int:
        return len(self.outcomes)

    def _phase(self) -> str:
        return CONTENDED if self.contended.is_set() and not self.calm.is_set() else BASELINE

    async def one(self, client: Context, spec: Spec) -> Outcome:
        out = Outcome(
            perf_counter(),
            index=spec.index,
            protocol=spec.protocol,
            key="limited" if client.key == self.limited_key else "main",
            phase=self._phase(),
            invalid=spec.invalid,
        )
        task = asyncio.create_task(self._send(BY_NAME[spec.protocol].call, client, spec, out))
        limit = self.options.request_timeout
        if spec.leave_at is not None:
            limit = min(limit, spec.leave_at * self.durations.usual(spec.protocol))
        done, _ = await asyncio.wait({task}, timeout=limit)
        if not done:  # leaving: the call closes its connection as it is cancelled
            if spec.leave_at is None:
                out.message = out.message or f"no answer after {limit:g} s"
            else:
                out.left_at = perf_counter()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        elif task.exception() is not None:
            error = task.exception()
            out.message = out.message or f"{type(error).__name__}: {error}"
        if not out.left and len(out.terminals) < out.prompts:
            out.cut = True
        self.durations.add(out)
        return out

    async def _main_client(
        self, pending: list[Spec], client: Context, marks: tuple[int, int]
    ) -> None:
        while pending:
            spec = pending.pop()
            self.outcomes.append(await self.one(client, spec))
            self.on_done()
            if self.done >= marks[0]:
                self.contended.set()
            if self.done >= marks[1]:
                self.calm.set()

    async def _limited_client(self, pending: list[Spec], client: Context) -> None:
        await self.contended.wait()
        while pending and not self.calm.is_set():
            began = perf_counter()
            spec = pending.pop()
            self.outcomes.append(await self.one(client, spec))
            self.on_done()
            wait = self.options.limited_interval_s - (perf_counter() - began)
            if wait > 0:
                await asyncio.sleep(wait)

    @staticmethod
    async def _send(call: clients.Call, client: Context, spec: Spec, out: Outcome) -> None:
        worker = Worker(client)  # a connection of its own, closed however the request ends
        try:
            await call(worker, spec.request(), out)
        finally:
            await worker.close()

    def client(self, name: str) -> Context:
        key = self.limited_key if name == "limited" else self.main_key
        return Context(self.session, self.base_url, key=key)

    async def warm_up(self, specs: Sequence[Spec]) -> None:
        """The warm-up's requests (none leaves, none invalid), by the main key; their outcomes
        only teach each protocol's usual duration."""
        queue = list(specs)

        async def send(client: Context) -> None:
            while queue:
                self.durations.add(await self.one(client, queue.pop()))

        count = max(1, self.options.concurrency - self.options.limited_clients)
        await asyncio.gather(*(send(self.client("main")) for _ in range(count)))

    async def run(self, specs: Sequence[Spec]) -> None:
        o = self.options
        pending = list(reversed(specs))  # popped from the end: in plan order
        marks = (int(len(specs) * o.contended[0]), int(len(specs) * o.contended[1]))
        mains = o.concurrency - o.limited_clients
        self.began = perf_counter()
        await asyncio.gather(
            *(self._main_client(pending, self.client("main"), marks) for _ in range(mains)),
            *(
                self._limited_client(pending, self.client("limited"))
                for _ in range(o.limited_clients)
            ),
        )
        self.contended.set()
        self.calm.set()
