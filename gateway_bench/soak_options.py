"""`llm-gateway bench --scenario soak`: its options, its `--quick` preset, and its command line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import get_args, get_type_hints

import msgspec

from gateway.config.settings import EngineSettings

_DEFAULTS = EngineSettings()
_DTYPES: tuple[str, ...] = get_args(get_type_hints(EngineSettings)["dtype"])


class SoakOptions(msgspec.Struct, frozen=True, kw_only=True):
    # Workload
    requests: int = 10_000  # the measured requests, the limited key's included
    concurrency: int = 64  # clients at once while the limited key sends (its clients included)
    limited_clients: int = 4  # of those, the clients of the limited key
    limited_interval_s: float = 2.0  # a limited client's requests start this far apart
    contended: tuple[float, float] = (0.3, 0.7)  # the limited key sends between these shares done
    leave_share: float = 0.10  # clients that leave at a random moment of their request
    invalid_share: float = 0.05  # requests with an invalid field
    output_tokens: tuple[int, int] = (8, 16)
    prompt_tokens: tuple[int, int] = (16, 64)
    warmup: int = 256  # requests before the measured ones: every protocol, none leaves
    seed: int = 0
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
    model: str = ""  # empty: the gateway's embedded default model
    max_model_len: int = _DEFAULTS.max_model_len
    kv_cache_gib: float = _DEFAULTS.kv_cache_gib
    enforce_eager: bool = _DEFAULTS.enforce_eager
    dtype: str = _DEFAULTS.dtype
    # Running
    out: str = ""  # empty: bench-results/soak-<UTC timestamp>
    progress: bool = True
    start_timeout: float = 900.0
    request_timeout: float = 300.0
    quick: bool = False

    def engine_settings(self) -> EngineSettings:
        settings = EngineSettings(
            model=self.model,
            max_model_len=self.max_model_len,
            kv_cache_gib=self.kv_cache_gib,
            enforce_eager=self.enforce_eager,
        )
        return msgspec.structs.replace(settings, dtype=self.dtype)

    def out_dir(self) -> str:
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        return self.out or f"bench-results/soak-{stamp}"


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


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected an integer: {text!r}") from e
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer: {text!r}")
    return value


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a number: {text!r}") from e
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a share from 0 to below 1: {text!r}")
    return value


def _span(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    values = sorted((_positive(low), _positive(high or low)))
    return values[0], values[1]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llm-gateway bench --scenario soak",
        description="Many requests over every protocol, with clients that leave, invalid input "
        "and a key over its limit; checks that every prompt ends once, nothing outlives its "
        "client, the other key is unaffected and memory stays flat.",
    )
    add = p.add_argument
    add("--scenario", choices=["soak"], help="soak (this); without it, the sweep benchmark")
    add("--quick", action="store_true", help="100 requests at concurrency 16 (the test suite's)")
    add("--requests", type=_positive, help="measured requests (default 10000)")
    add("--concurrency", type=_positive, help="clients at once (default 64)")
    add("--limited-clients", type=_positive, help="of those, the limited key's (default 4)")
    add("--leave-share", type=_share, help="clients that leave mid-request (default 0.10)")
    add("--invalid-share", type=_share, help="requests with an invalid field (default 0.05)")
    add("--output-tokens", type=_span, help="tokens per request, N or N-M (default 8-16)")
    add("--prompt-tokens", type=_span, help="prompt length, N or N-M (default 16-64)")
    add("--warmup", type=int, help="requests before measuring (default 256)")
    add("--seed", type=int, help="workload seed (default 0)")
    add("--gateway-url", help="soak this running gateway (with --main-key, --limited-key)")
    add("--gateway-pid", type=int, help="the running gateway's pid, for its memory")
    add("--main-key", help="the running gateway's key without limits")
    add("--limited-key", help=f"its key with limits ({SoakOptions.limited_limits})")
    add("--amplifier-key", help=f"its key with limits ({SoakOptions.amplifier_limits})")
    add("--amplification-chats", type=int, help="chats per phase of the amplification (20)")
    add("--model", help="model directory or hub id (default: the embedded SmolLM2)")
    add("--max-model-len", type=_positive, help="default 2048")
    add("--kv-cache-gib", type=float, help="default 2")
    add("--dtype", choices=_DTYPES, help="as DTYPE (default auto)")
    add("--enforce-eager", action=argparse.BooleanOptionalAction, help="no torch.compile")
    add("--out", help="output directory (default bench-results/soak-<UTC time>)")
    add("--no-progress", dest="progress", action="store_false", default=None)
    add("--start-timeout", type=float, help="seconds the gateway may take to be ready")
    add("--request-timeout", type=float, help="seconds one request may take (default 300)")
    return p


def parse(argv: Sequence[str] | None) -> SoakOptions:
    args = vars(parser().parse_args(argv))
    args.pop("scenario")
    base = QUICK_SOAK if args.pop("quick") else SoakOptions()
    overrides = {key: value for key, value in args.items() if value is not None}
    options = msgspec.structs.replace(base, **overrides)
    if options.limited_clients >= options.concurrency:
        raise SystemExit("llm-gateway bench: --limited-clients must be fewer than --concurrency")
    if options.leave_share + options.invalid_share >= 1:
        raise SystemExit("llm-gateway bench: leaving and invalid shares must leave valid requests")
    if options.gateway_url and not (options.main_key and options.limited_key):
        raise SystemExit("llm-gateway bench: --gateway-url needs --main-key and --limited-key")
    return options
