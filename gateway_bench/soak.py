"""`llm-gateway bench soak`: issue 14's soak, on a gateway with two API keys.

The bench starts its own gateway (as the sweep does) with a keys file holding a key without
limits and one with `concurrent=2 rpm=30 tpm=5000`, warms every protocol up, then sends the
plan (soak_run.py) while it scrapes `/metrics` and reads the gateway's memory (soak_watch.py).
Once the last client is done it waits for the counters to settle, measures what the limited
key's largest asks cost the other key (soak_amplification.py), and judges the run
(soak_report.py). `run_soak` is the same run on a gateway that is already up (the test
suite's, on its shared engine).
"""

from __future__ import annotations

import asyncio
import secrets
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from time import perf_counter
from typing import Any

import aiohttp
import msgspec
from tqdm import tqdm

from gateway_bench import machine, targets
from gateway_bench.cpu import CpuMeter
from gateway_bench.metrics import FINISHED, RATE_LIMITED, percentile
from gateway_bench.options import Scenario
from gateway_bench.report import write as write_files
from gateway_bench.soak_amplification import measure_amplification
from gateway_bench.soak_report import (
    Figures,
    SoakReport,
    count_clients,
    describe_scrape,
    evaluate,
    soak_report,
    ttft_by_phase,
)
from gateway_bench.soak_run import QUICK_SOAK, Soak, SoakOptions, plan
from gateway_bench.soak_watch import MetricsWatch, Presence, RssWatch, margins, settled
from gateway_bench.worker import Context, pooled_connector
from gateway_bench.workload import Workload

MARKDOWN = "soak.md"
_SETTLE_LIMIT_S = 60.0
_MB = 1 << 20


def keys_file(main_key: str, limited_key: str, options: SoakOptions, amplifier: str = "") -> str:
    """The API_KEYS_FILE text: the main key without limits, the limited one with its limits,
    and the amplifier with its own, if any."""
    text = f"{main_key}:soak-main\n{limited_key}:soak-limited {options.limited_limits}\n"
    return text + (f"{amplifier}:soak-amplifier {options.amplifier_limits}\n" if amplifier else "")


def new_keys() -> tuple[str, str]:
    return new_key(), new_key()


def new_key() -> str:
    return secrets.token_urlsafe(24)


def _presences(soak: Soak, grace_s: float) -> list[Presence]:
    """Each client's prompts, from its request to its answer's end or its leaving plus grace."""
    ends = [o.end or o.sent if o.left_at is None else o.left_at + grace_s for o in soak.outcomes]
    return [Presence(o.sent, end, o.prompts) for o, end in zip(soak.outcomes, ends, strict=True)]


def _idle_after(watch: MetricsWatch, last_end: float) -> float | None:
    """From the last client's end to the first scrape sent after it that found the engine
    idle, provided none after that found it busy again."""
    after = [s for s in watch.scrapes if s.sent >= last_end]
    idle = next((i for i, s in enumerate(after) if s.engine_requests == 0), None)
    if idle is None or any(s.engine_requests for s in after[idle:]):
        return None
    return round(max(0.0, after[idle].answered - last_end), 3)


def _rss(watch: RssWatch | None, total: int, window: int) -> tuple[float | None, float | None]:
    if watch is None:
        return None, None
    window = min(window, max(1, total // 2))
    first = watch.mean_between(0, window)
    last = watch.mean_between(total - window, total + 1)
    return (
        None if first is None else round(first / _MB, 1),
        None if last is None else round(last / _MB, 1),
    )


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
    connector = pooled_connector()
    timeout = aiohttp.ClientTimeout(total=None)
    bar = tqdm(total=len(specs), unit="req", disable=not options.progress, dynamic_ncols=True)
    # /metrics needs a key on a keyed gateway (METRICS_PUBLIC unset): the main key's.
    scraping = {"Authorization": f"Bearer {keys[0]}"}
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        aiohttp.ClientSession(timeout=timeout, headers=scraping) as scraper,
    ):
        soak = Soak(options, session, base_url, keys, on_done=partial(bar.update, 1))
        await soak.warm_up(warmup)
        before = await settled(scraper, base_url, _SETTLE_LIMIT_S)
        metrics = MetricsWatch(scraper, base_url, options.scrape_interval_s)
        rss = RssWatch(pid, lambda: soak.done, options.rss_interval_s) if pid else None
        stop = asyncio.Event()
        watchers = [asyncio.create_task(metrics.run(stop))]
        if rss is not None:
            watchers.append(asyncio.create_task(rss.run(stop)))
        meter = await CpuMeter.start((pid,) if pid else (), profile)
        try:
            await soak.run(specs)
            cpu = await meter.stop()
            last_end = perf_counter()
            measured_s = last_end - soak.began
            after = await settled(scraper, base_url, _SETTLE_LIMIT_S)
            settle_s = perf_counter() - last_end
            await asyncio.sleep(options.grace_s + options.scrape_interval_s)  # the tail, scraped
        finally:
            await meter.stop()  # its profile ended, however the plan ended
            stop.set()
            await asyncio.gather(*watchers)
            bar.close()
        amplification = None
        if options.amplification_chats and amplifier:
            prompt = workload.requests("soak", "amplification", 1)[0].prompt
            asker = Context(session, base_url, key=amplifier)
            amplification = await measure_amplification(soak.client("main"), asker, options, prompt)
    host.load_end = machine.load()
    clients = count_clients(soak.outcomes)
    margin = margins(metrics.scrapes, _presences(soak, options.grace_s))
    found = [s for s, m in zip(metrics.scrapes, margin, strict=True) if m < 0]
    worst = max(found, key=lambda s: s.engine_requests, default=None)
    busy = [m for s, m in zip(metrics.scrapes, margin, strict=True) if s.engine_requests]
    p50, counts = ttft_by_phase(soak.outcomes)
    limited = [o for o in soak.outcomes if o.key == "limited"]
    first_mb, last_mb = _rss(rss, len(soak.outcomes), options.rss_window)
    figures = Figures(
        ttft_p50_ms=p50,
        ttft_count=counts,
        limited_sent=len(limited),
        limited_finished=sum(o.terminals.count(FINISHED) for o in limited),
        limited_rate_limited=sum(o.terminals.count(RATE_LIMITED) for o in limited),
        scrapes=len(metrics.scrapes),
        unexplained_scrapes=len(found),
        worst_unexplained=None if worst is None else describe_scrape(worst, soak.began),
        margin_p50=percentile([float(m) for m in busy], 50),
        margin_min=min(busy, default=None),
        engine_idle_after_s=_idle_after(metrics, last_end),
        rss_first_mb=first_mb,
        rss_last_mb=last_mb,
        rss_samples=0 if rss is None else len(rss.samples),
        frontend_cpu_ms_per_token=cpu.per_token_ms(sum(o.tokens for o in soak.outcomes)),
    )
    server = after.minus(before)
    return SoakReport(
        command=command or "llm-gateway bench soak",
        started_at=started_at,
        duration_s=round(perf_counter() - began, 1),
        measured_s=round(measured_s, 1),
        quick=options.quick,
        machine=host,
        options=msgspec.to_builtins(options),
        clients=clients,
        server=server,
        settle_s=round(settle_s, 3),
        figures=figures,
        goals=evaluate(clients, server, figures, amplification, options.quick),
        amplification=amplification,
    )


def write(report: SoakReport, out: Path) -> None:
    write_files(report, soak_report(report), out, "soak")


async def _run(options: SoakOptions, command: str) -> tuple[str, Path, bool]:
    """The soak on a gateway the bench starts (or the one `--gateway-url` names)."""
    out = options.out_dir("soak-")
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
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
        keys, amplifier = new_keys(), new_key()
        path = out / "api-keys"
        path.write_text(keys_file(*keys, options, amplifier))
        path.chmod(0o600)
        env = {"API_KEYS_FILE": str(path)}
        async with targets.started_gateway(options, out, env=env) as endpoint:
            report = await soak(
                base_url=endpoint.url, keys=keys, pid=endpoint.pid, amplifier=amplifier
            )
    await asyncio.to_thread(write, report, out)
    return soak_report(report).markdown(), out, all(g.passed is not False for g in report.goals)


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
    QUICK_SOAK,
    _run,
    {
        "gateway_url": "soak this running gateway (with --main-key, --limited-key)",
        "main_key": "the running gateway's key without limits",
        "limited_key": f"its key with limits ({SoakOptions.limited_limits})",
        "amplifier_key": f"its key with limits ({SoakOptions.amplifier_limits})",
    },
    _check,
)
parse = SCENARIO.parse  # this scenario's flags alone (the tests')
