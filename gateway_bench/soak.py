"""`llm-gateway bench soak`: issue 14's soak, on a gateway with two API keys.

The bench starts its own gateway (as the sweep does) with a keys file holding a key without
limits and one with `concurrent=2 rpm=30 tpm=5000`, warms every protocol up, then sends the
plan while it scrapes `/metrics` and reads the gateway's memory (soak_report.Watch). Once the
last client is done it waits for the counters to settle, measures what the limited key's
largest asks cost the other key (soak_amplification.py), and judges the run (soak_report.py).
`run_soak` is the same run on a gateway that is already up (the test suite's, on its shared
engine).

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
import secrets
import statistics
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from time import perf_counter
from typing import Any

import aiohttp
import msgspec
from tqdm import tqdm

from gateway_bench import clients, machine, targets
from gateway_bench.cpu import CpuMeter
from gateway_bench.metrics import FINISHED
from gateway_bench.options import Options, Positive, Scenario, Share, begin
from gateway_bench.report import write
from gateway_bench.scrape import until
from gateway_bench.soak_amplification import measure_amplification
from gateway_bench.soak_report import (
    BASELINE,
    CONTENDED,
    Counters,
    Outcome,
    SoakReport,
    Watch,
    count_clients,
    evaluate,
    figures,
    soak_report,
)
from gateway_bench.worker import Context, Worker, session
from gateway_bench.workload import Request, Workload
from protocols.names import Protocol

INVALID_BUDGET = -1  # the soak's invalid input: a negative token budget
_FIRST_GUESS_S = 1.0  # a protocol's usual duration before any of its requests finished
_SETTLE_LIMIT_S = 60.0


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


QUICK = SoakOptions(
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
# Each protocol's client, by a protocols.names.Protocol value (with a suffix for a second
# form), and whether it streams (its TTFT the first text's time, not the whole answer's).
PROTOCOLS: dict[str, tuple[clients.Call, bool]] = {
    Protocol.WS: (clients.ws_batch, True),
    Protocol.WS_EVENTS: (clients.ws_events_stream, True),
    Protocol.CONTROL: (clients.control_ws, True),
    Protocol.API_GENERATE_ONE: (clients.generate_one, True),
    Protocol.API_GENERATE_BATCH: (clients.generate_batch, False),
    Protocol.LMI: (clients.invocations, True),
    Protocol.SAGEMAKER: (clients.sagemaker, False),
    Protocol.TGI: (clients.tgi_stream, True),
    f"{Protocol.TGI}-generate": (clients.tgi_generate, False),
    Protocol.OPENAI_CHAT: (clients.chat_completions, True),
    f"{Protocol.OPENAI_CHAT}-whole": (clients.chat_whole, False),
}


def keys_file(main_key: str, limited_key: str, options: SoakOptions, amplifier: str = "") -> str:
    """The API_KEYS_FILE text: the main key without limits, the limited one with its limits,
    and the amplifier with its own, if any."""
    text = f"{main_key}:soak-main\n{limited_key}:soak-limited {options.limited_limits}\n"
    return text + (f"{amplifier}:soak-amplifier {options.amplifier_limits}\n" if amplifier else "")


def new_key() -> str:
    return secrets.token_urlsafe(24)


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


def plan(options: SoakOptions, workload: Workload, count: int, stream: str) -> list[Spec]:
    rng = random.Random(f"{options.seed}:soak:{stream}")
    order = list(PROTOCOLS)
    rng.shuffle(order)
    specs: list[Spec] = []
    for i, request in enumerate(workload.requests("soak", stream, count)):
        draw, measured = rng.random(), stream != "warmup"
        invalid = measured and draw < options.invalid_share
        leaves = measured and not invalid and draw < options.invalid_share + options.leave_share
        budget = rng.randint(*options.output_tokens)
        leave_at = rng.random() if leaves else None
        specs.append(Spec(i, order[i % len(order)], request.prompt, budget, invalid, leave_at))
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
    """The plan's clients at work: the main key's back to back, the limited key's while the
    plan is between its `contended` shares."""

    def __init__(
        self,
        options: SoakOptions,
        main: Context,
        limited: Context,
        on_done: Callable[[], object] = lambda: None,
    ) -> None:
        self.options, self.main, self.limited, self.on_done = options, main, limited, on_done
        self.outcomes: list[Outcome] = []
        self.durations = Durations()
        self.contended = asyncio.Event()
        self.calm = asyncio.Event()  # set once the contended phase is over
        self.began = 0.0

    @property
    def done(self) -> int:
        return len(self.outcomes)

    async def one(self, client: Context, spec: Spec) -> Outcome:
        call, streamed = PROTOCOLS[spec.protocol]
        out = Outcome(
            perf_counter(),
            index=spec.index,
            protocol=spec.protocol,
            streamed=streamed,
            key="limited" if client is self.limited else "main",
            phase=CONTENDED if self.contended.is_set() and not self.calm.is_set() else BASELINE,
            invalid=spec.invalid,
        )
        task = asyncio.create_task(self._send(call, client, spec, out))
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
        elif (error := task.exception()) is not None:
            out.message = out.message or f"{type(error).__name__}: {error}"
        if not out.left and len(out.terminals) < out.prompts:
            out.cut = True
        self.durations.add(out)
        return out

    @staticmethod
    async def _send(call: clients.Call, client: Context, spec: Spec, out: Outcome) -> None:
        worker = Worker(client)  # a connection of its own, closed however the request ends
        try:
            await call(worker, spec.request(), out)
        finally:
            await worker.close()

    async def _client(self, pending: list[Spec], limited: bool, marks: tuple[int, int]) -> None:
        """The main key's: back to back, setting the phases as the plan is done; the limited
        key's: in the contended phase, one request a `limited_interval_s`."""
        if limited:
            await self.contended.wait()
        while pending and not (limited and self.calm.is_set()):
            began = perf_counter()
            client = self.limited if limited else self.main
            self.outcomes.append(await self.one(client, pending.pop()))
            self.on_done()
            if limited:
                await asyncio.sleep(self.options.limited_interval_s - (perf_counter() - began))
                continue
            if self.done >= marks[0]:
                self.contended.set()
            if self.done >= marks[1]:
                self.calm.set()

    async def warm_up(self, specs: Sequence[Spec]) -> None:
        """The warm-up's requests (none leaves, none invalid), by the main key; their outcomes
        only teach each protocol's usual duration."""
        queue = list(specs)

        async def send() -> None:
            while queue:
                await self.one(self.main, queue.pop())

        count = max(1, self.options.concurrency - self.options.limited_clients)
        await asyncio.gather(*(send() for _ in range(count)))

    async def run(self, specs: Sequence[Spec]) -> None:
        o = self.options
        pending = list(reversed(specs))  # popped from the end: in plan order
        marks = (int(len(specs) * o.contended[0]), int(len(specs) * o.contended[1]))
        self.began = perf_counter()
        kinds = [False] * (o.concurrency - o.limited_clients) + [True] * o.limited_clients
        await asyncio.gather(*(self._client(pending, limited, marks) for limited in kinds))
        self.contended.set()
        self.calm.set()


async def _settled(scraper: aiohttp.ClientSession, base_url: str) -> Counters:
    """The counters once settled (Counters.settled), or as they are after a minute."""
    sums = await until(scraper, base_url, lambda s: Counters.of(s).settled, _SETTLE_LIMIT_S)
    return Counters.of(sums)


async def run_soak(
    options: SoakOptions,
    *,
    base_url: str,
    keys: tuple[str, str],
    pid: int | None,
    tokenizer: Any,
    command: str = "",
    amplifier: str = "",
    profile: Path | None = None,
) -> SoakReport:
    """The soak against a running gateway whose keys file holds `keys` (main, limited), and
    `amplifier` with the options' amplifier limits (none: the amplification is not measured);
    `profile`: where a py-spy profile of the gateway (`pid`) during the plan goes."""
    began, started_at = perf_counter(), datetime.now(UTC).isoformat(timespec="seconds")
    host = await asyncio.to_thread(machine.describe, options.dtype)
    span = (options.prompt_tokens[0], options.prompt_tokens[1])
    workload = Workload.from_tokenizer(
        tokenizer, seed=options.seed, prompt_tokens=span, output_tokens=options.output_tokens[1]
    )
    warmup = plan(options, workload, options.warmup, "warmup")
    specs = plan(options, workload, options.requests, "soak")
    bar = tqdm(total=len(specs), unit="req", disable=not options.progress, dynamic_ncols=True)
    # /metrics needs a key on a keyed gateway (METRICS_PUBLIC unset): the main key's.
    scraping = {"Authorization": f"Bearer {keys[0]}"}
    async with session() as client_session, session(headers=scraping) as scraper:
        main, limited = (Context(client_session, base_url, key=key) for key in keys)
        soak = Soak(options, main, limited, on_done=partial(bar.update, 1))
        await soak.warm_up(warmup)
        before = await _settled(scraper, base_url)
        watch, stop = Watch(scraper, base_url, pid, lambda: soak.done), asyncio.Event()
        watching = asyncio.create_task(
            watch.run(stop, options.scrape_interval_s, options.rss_interval_s)
        )
        meter = await CpuMeter.start((pid,) if pid else (), profile)
        try:
            await soak.run(specs)
            cpu = await meter.stop()
            last_end = perf_counter()
            after = await _settled(scraper, base_url)
            settle_s = perf_counter() - last_end
            await asyncio.sleep(options.grace_s + options.scrape_interval_s)  # the tail, scraped
        finally:
            await meter.stop()  # its profile ended, however the plan ended
            stop.set()
            await watching
            bar.close()
        amplification = None
        if options.amplification_chats and amplifier:
            prompt = workload.requests("soak", "amplification", 1)[0].prompt
            amplification = await measure_amplification(
                main,
                Context(client_session, base_url, key=amplifier),
                prompt,
                chats=options.amplification_chats,
                askers=options.limited_clients,
                limits=options.amplifier_limits,
                tokens=(options.output_tokens[0], options.amplification_ask_tokens),
            )
    host.load_end = machine.load()
    clients_seen = count_clients(soak.outcomes)
    found = figures(soak.outcomes, watch, soak.began, last_end, options)
    found.frontend_cpu_ms_per_token = cpu.per_token_ms(sum(o.tokens for o in soak.outcomes))
    server = after.minus(before)
    return SoakReport(
        command=command or "llm-gateway bench soak",
        started_at=started_at,
        duration_s=round(perf_counter() - began, 1),
        measured_s=round(last_end - soak.began, 1),
        quick=options.quick,
        machine=host,
        options=msgspec.to_builtins(options),
        clients=clients_seen,
        server=server,
        settle_s=round(settle_s, 3),
        figures=found,
        goals=evaluate(clients_seen, server, found, amplification, options.quick),
        amplification=amplification,
    )


async def _run(options: SoakOptions, command: str) -> tuple[str, Path, bool]:
    """The soak on a gateway the bench starts (or the one `--gateway-url` names)."""
    out, _ = await begin(options, prefix="soak-")
    model = await asyncio.to_thread(targets.model_dir, options)
    tokenizer = await asyncio.to_thread(targets.tokenizer, model)
    profiles = options.profiles(out)
    profile = None if profiles is None else profiles / "soak.speedscope.json"
    soak = partial(run_soak, options, tokenizer=tokenizer, profile=profile, command=command)
    if options.gateway_url:
        keys = (options.main_key, options.limited_key)
        url, pid = options.gateway_url.rstrip("/"), options.gateway_pid
        report = await soak(base_url=url, keys=keys, pid=pid, amplifier=options.amplifier_key)
    else:
        keys, amplifier = (new_key(), new_key()), new_key()
        path = out / "api-keys"
        path.write_text(keys_file(*keys, options, amplifier))
        path.chmod(0o600)
        env = {"API_KEYS_FILE": str(path)}
        async with targets.started_gateway(options, out, env=env) as endpoint:
            report = await soak(
                base_url=endpoint.url, keys=keys, pid=endpoint.pid, amplifier=amplifier
            )
    text = await asyncio.to_thread(write, report, soak_report(report), out, "soak")
    return text, out, all(g.passed is not False for g in report.goals)


def _check(options: SoakOptions) -> str | None:
    if options.limited_clients >= options.concurrency:
        return "--limited-clients must be fewer than --concurrency"
    if options.leave_share + options.invalid_share >= 1:
        return "leaving and invalid shares must leave valid requests"
    if options.gateway_url and not (options.main_key and options.limited_key):
        return "--gateway-url needs --main-key and --limited-key"
    return None


SCENARIO = Scenario(
    "soak",
    "Many requests over every protocol, with clients that leave, invalid input and a key over "
    "its limit; checks that every prompt ends once, nothing outlives its client, the other key "
    "is unaffected and memory stays flat.",
    SoakOptions,
    QUICK,
    _run,
    {
        "gateway_url": "soak this running gateway (with --main-key, --limited-key)",
        "main_key": "the running gateway's key without limits",
        "limited_key": f"its key with limits ({SoakOptions.limited_limits})",
        "amplifier_key": f"its key with limits ({SoakOptions.amplifier_limits})",
    },
    _check,
)
