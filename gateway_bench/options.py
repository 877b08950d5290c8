"""The bench's options: the full defaults, the `--quick` preset, and the command line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import get_args, get_type_hints

import msgspec

from gateway.config.settings import EngineSettings
from gateway_bench.clients import GATEWAY_CLIENTS
from protocols.names import Protocol

# The gateway protocols the bench measures, by their protocols.names.Protocol value.
PROTOCOL_NAMES: tuple[Protocol, ...] = tuple(Protocol(c.name) for c in GATEWAY_CLIENTS)
_DEFAULTS = EngineSettings()
_DTYPES: tuple[str, ...] = get_args(get_type_hints(EngineSettings)["dtype"])


class BenchOptions(msgspec.Struct, frozen=True, kw_only=True):
    # Workload
    concurrency: tuple[int, ...] = (1, 8, 32, 64)
    output_tokens: int = 64
    prompt_tokens: tuple[int, int] = (128, 128)
    rounds: int = 2  # requests per step: max(rounds * concurrency, min_requests)
    min_requests: int = 8
    seed: int = 0
    # Targets
    ceiling: bool = True
    vllm_server: bool = True
    vllm_server_defaults: bool = True  # vLLM's server once more, with vLLM's own defaults
    gateway: bool = True
    protocols: tuple[Protocol, ...] = PROTOCOL_NAMES
    gateway_url: str = ""  # measure this running gateway instead of starting one
    gateway_pid: int | None = None  # its process, for the memory figure
    vllm_url: str = ""  # measure this running vLLM server instead of starting one
    # Engine settings, for every target the bench starts
    model: str = ""  # empty: the gateway's embedded default model
    max_model_len: int = _DEFAULTS.max_model_len
    kv_cache_gib: float = _DEFAULTS.kv_cache_gib
    enforce_eager: bool = _DEFAULTS.enforce_eager
    dtype: str = _DEFAULTS.dtype  # as DTYPE: "auto" resolves as the gateway does (machine.py)
    # Continuation
    continuation: bool = True
    continuation_lengths: tuple[int, ...] = (512, 1024, 1536)
    continuation_repetitions: int = 3
    continuation_generated: int = 16
    continuation_new_tokens: int = 4
    # Connection scale
    connections: bool = True
    idle_connections: int = 1000
    streams: int = 256
    stream_tokens: int = 16
    # Running
    out: str = ""  # empty: bench-results/<UTC timestamp>
    progress: bool = True
    start_timeout: float = 900.0
    request_timeout: float = 300.0
    quick: bool = False

    def engine_settings(self) -> EngineSettings:
        """The settings as requested: `dtype` may be "auto" (see machine.cpu_defaults)."""
        settings = EngineSettings(
            model=self.model,
            max_model_len=self.max_model_len,
            kv_cache_gib=self.kv_cache_gib,
            enforce_eager=self.enforce_eager,
        )
        return msgspec.structs.replace(settings, dtype=self.dtype)  # one of _DTYPES

    def out_dir(self) -> str:
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        return self.out or f"bench-results/{stamp}"


QUICK = BenchOptions(
    concurrency=(1, 4),
    output_tokens=8,
    prompt_tokens=(32, 32),
    rounds=1,
    min_requests=2,
    continuation_lengths=(160, 288),
    continuation_repetitions=1,
    continuation_generated=8,
    continuation_new_tokens=2,
    idle_connections=16,
    streams=8,
    stream_tokens=4,
    enforce_eager=True,
    quick=True,
)


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text!r}") from e
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers: {text!r}")
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected an integer: {text!r}") from e
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer: {text!r}")
    return value


def _span(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    values = _ints(low + ("," + high if high else ""))
    return (values[0], values[-1]) if values[0] <= values[-1] else (values[-1], values[0])


def _protocols(text: str) -> tuple[Protocol, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    known = ",".join(PROTOCOL_NAMES)
    unknown = sorted(set(names) - set(PROTOCOL_NAMES))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown protocol(s) {','.join(unknown)}; known: {known}")
    if not names:
        raise argparse.ArgumentTypeError(f"expected protocol names: {known}")
    return tuple(Protocol(n) for n in names)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llm-gateway bench",
        description="Load-test vLLM in-process, vLLM's OpenAI server and every streaming "
        "protocol of the gateway on the same engine settings (and vLLM's server once more with "
        "its own defaults), and write a report.",
    )
    add = p.add_argument
    add(
        "--scenario",
        choices=["sweep", "soak", "mixed", "replicas", "constrained", "adapters"],
        help="sweep (default: this benchmark), soak, mixed, replicas, constrained or adapters "
        "(--scenario NAME --help for each)",
    )
    add("--quick", action="store_true", help="a few seconds of measuring (the test suite's)")
    add("--concurrency", type=_ints, help="comma-separated sweep (default 1,8,32,64)")
    add("--output-tokens", type=_positive, help="tokens generated per request (default 64)")
    add("--prompt-tokens", type=_span, help="prompt length N or range N-M (default 128)")
    add("--rounds", type=_positive, help="requests per step = rounds x concurrency (default 2)")
    add("--min-requests", type=_positive, help="at least this many requests per step (default 8)")
    add("--seed", type=int, help="workload seed (default 0)")
    add(
        "--protocols",
        type=_protocols,
        help=f"gateway protocols (default all: {','.join(PROTOCOL_NAMES)})",
    )
    add(
        "--no-ceiling",
        dest="ceiling",
        action="store_false",
        default=None,
        help="skip vLLM in-process",
    )
    add(
        "--no-vllm-server",
        dest="vllm_server",
        action="store_false",
        default=None,
        help="skip vLLM's OpenAI server (all three variants)",
    )
    add(
        "--no-vllm-server-defaults",
        dest="vllm_server_defaults",
        action="store_false",
        default=None,
        help="skip the variant of vLLM's server started with vLLM's own defaults",
    )
    add("--no-gateway", dest="gateway", action="store_false", default=None, help="skip the gateway")
    add("--gateway-url", help="measure this running gateway (e.g. http://10.0.0.5:8000)")
    add("--gateway-pid", type=int, help="the running gateway's pid, for memory per connection")
    add("--vllm-url", help="measure this running vLLM OpenAI server")
    add("--model", help="model directory or hub id (default: the embedded SmolLM2)")
    add("--max-model-len", type=_positive, help="default 2048")
    add("--kv-cache-gib", type=float, help="default 2")
    add("--dtype", choices=_DTYPES, help="as DTYPE (default auto: the gateway's CPU defaults)")
    add(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        help="no torch.compile: engines start faster (default: off; on with --quick)",
    )
    add("--no-continuation", dest="continuation", action="store_false", default=None)
    add("--continuation-lengths", type=_ints, help="history tokens (default 512,1024,1536)")
    add("--continuation-repetitions", type=_positive, help="default 3")
    add("--no-connections", dest="connections", action="store_false", default=None)
    add("--idle-connections", type=_positive, help="idle WebSockets held at once (default 1000)")
    add("--streams", type=_positive, help="concurrent short streams (default 256)")
    add("--stream-tokens", type=_positive, help="tokens per stream (default 16)")
    add("--out", help="output directory (default bench-results/<UTC time>)")
    add("--no-progress", dest="progress", action="store_false", default=None)
    add("--start-timeout", type=float, help="seconds a server may take to be ready (default 900)")
    add("--request-timeout", type=float, help="seconds one request may take (default 300)")
    return p


def parse(argv: Sequence[str] | None) -> BenchOptions:
    args = vars(parser().parse_args(argv))
    args.pop("scenario")
    base = QUICK if args.pop("quick") else BenchOptions()
    overrides = {key: value for key, value in args.items() if value is not None}
    options = msgspec.structs.replace(base, **overrides)
    if options.continuation and min(options.continuation_lengths) <= options.continuation_generated:
        raise SystemExit("llm-gateway bench: continuation lengths must exceed the generated tokens")
    return options
