"""The sweep's options (`llm-gateway bench sweep`), its `--quick` preset and its checks."""

from __future__ import annotations

from gateway_bench.options import Options, Positive
from gateway_bench.runner import GATEWAY_CLIENTS
from protocols.names import Protocol

# The gateway protocols the bench measures, by their protocols.names.Protocol value.
PROTOCOL_NAMES: tuple[Protocol, ...] = tuple(Protocol(c.name) for c in GATEWAY_CLIENTS)


class BenchOptions(Options, frozen=True, kw_only=True):
    # Workload
    concurrency: tuple[Positive, ...] = (1, 8, 32, 64)
    output_tokens: Positive = 64  # tokens generated per request
    prompt_tokens: tuple[Positive, Positive] = (128, 128)
    rounds: Positive = 2  # requests per step: max(rounds * concurrency, min_requests)
    min_requests: Positive = 8
    # Targets
    ceiling: bool = True
    vllm_server: bool = True
    vllm_server_defaults: bool = True  # vLLM's server once more, with vLLM's own defaults
    gateway: bool = True
    protocols: tuple[Protocol, ...] = PROTOCOL_NAMES
    gateway_url: str = ""  # measure this running gateway instead of starting one
    gateway_pid: int | None = None  # its process, for the memory figure
    vllm_url: str = ""  # measure this running vLLM server instead of starting one
    # Continuation
    continuation: bool = True
    continuation_lengths: tuple[Positive, ...] = (512, 1024, 1536)
    continuation_repetitions: Positive = 3
    continuation_generated: Positive = 16
    continuation_new_tokens: Positive = 4
    # Connection scale
    connections: bool = True
    idle_connections: Positive = 1000
    streams: Positive = 256
    stream_tokens: Positive = 16


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
HELP = {
    "concurrency": "comma-separated sweep",
    "prompt_tokens": "prompt length N or range N-M",
    "rounds": "requests per step = rounds x concurrency",
    "min_requests": "at least this many requests per step",
    "protocols": "gateway protocols",
    "ceiling": "vLLM in-process",
    "vllm_server": "vLLM's OpenAI server (all three variants)",
    "vllm_server_defaults": "the variant of vLLM's server started with vLLM's own defaults",
    "gateway_url": "measure this running gateway (e.g. http://10.0.0.5:8000)",
    "gateway_pid": "the running gateway's pid, for memory per connection",
    "vllm_url": "measure this running vLLM OpenAI server",
    "continuation_lengths": "history tokens",
    "idle_connections": "idle WebSockets held at once",
    "streams": "concurrent short streams",
    "stream_tokens": "tokens per stream",
    "enforce_eager": "no torch.compile: engines start faster",
}


def check(options: BenchOptions) -> str | None:
    unknown = sorted(set(options.protocols) - set(PROTOCOL_NAMES))
    if unknown:
        return f"unknown protocol(s) {','.join(unknown)}; known: {','.join(PROTOCOL_NAMES)}"
    if options.continuation and min(options.continuation_lengths) <= options.continuation_generated:
        return "continuation lengths must exceed the generated tokens"
    return None
