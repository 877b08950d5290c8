"""The soak's clients at work: the seeded plan of requests, and the clients that send it.

Every request is drawn from the seed: its protocol (each in turn, in a shuffled order), its
prompt and token budget, whether its field is invalid, and whether (and at what share of its
protocol's usual duration) its client leaves. The main key's clients send the plan back to
back. Between two shares of the plan done (`contended`), the limited key's clients send too,
one request a `limited_interval_s` each, far over their key's limit; each outcome is tagged
with the phase it was sent in, so the main key's TTFT with and without them can be compared.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Callable, Sequence
from time import perf_counter

import aiohttp

from gateway_bench.soak_calls import BY_NAME, PROTOCOLS, Client, Outcome, Spec
from gateway_bench.soak_options import SoakOptions
from gateway_bench.workload import Workload

BASELINE = "baseline"
CONTENDED = "contended"
_FIRST_GUESS_S = 1.0  # a protocol's usual duration before any of its requests finished


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
        if out.end is not None and not out.left and out.terminals == ["finished"] * out.prompts:
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

    async def one(self, client: Client, spec: Spec) -> Outcome:
        out = Outcome(
            index=spec.index,
            protocol=spec.protocol,
            key=client.name,
            phase=self._phase(),
            invalid=spec.invalid,
            sent=perf_counter(),
        )
        task = asyncio.create_task(BY_NAME[spec.protocol].call(client, spec, out))
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
        self, pending: list[Spec], client: Client, marks: tuple[int, int]
    ) -> None:
        while pending:
            spec = pending.pop()
            self.outcomes.append(await self.one(client, spec))
            self.on_done()
            if self.done >= marks[0]:
                self.contended.set()
            if self.done >= marks[1]:
                self.calm.set()

    async def _limited_client(self, pending: list[Spec], client: Client) -> None:
        await self.contended.wait()
        while pending and not self.calm.is_set():
            began = perf_counter()
            spec = pending.pop()
            self.outcomes.append(await self.one(client, spec))
            self.on_done()
            wait = self.options.limited_interval_s - (perf_counter() - began)
            if wait > 0:
                await asyncio.sleep(wait)

    def client(self, name: str) -> Client:
        key = self.limited_key if name == "limited" else self.main_key
        return Client(self.session, self.base_url, key, name)

    async def warm_up(self, specs: Sequence[Spec]) -> None:
        """The warm-up's requests (none leaves, none invalid), by the main key; their outcomes
        only teach each protocol's usual duration."""
        queue = list(specs)

        async def send(client: Client) -> None:
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
