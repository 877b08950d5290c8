"""Settings: the typed objects every variable of `.env.example` is read into
(gateway/config/loading.py reads them)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from protocols.constraint_budget import ConstraintBudget
from protocols.constraints import MAX_CHOICES
from protocols.generation import MAX_SEQUENCES, MAX_STOP_SEQUENCES, SamplingOptions, Seed
from protocols.tgi import MAX_BEST_OF

Port = Annotated[int, Meta(ge=0, le=65535)]
Positive = Annotated[int, Meta(ge=1)]
PositiveFloat = Annotated[float, Meta(gt=0)]
SequenceBound = Annotated[int, Meta(ge=1, le=MAX_SEQUENCES)]
GENERATION_PREFIX = "DEFAULT_"


class ConfigError(ValueError):
    pass


class EngineSettings(msgspec.Struct, frozen=True, kw_only=True, rename="upper"):
    """What the engine is built with; passed to vLLM as engine arguments."""

    model: str = ""  # empty: the embedded default model, prepared on first use
    served_model_name: str = ""
    max_model_len: Positive = 2048
    # The model's RoPE scaled past its own positions (gateway/config/rope_scaling.py), a JSON
    # object such as {"rope_type": "yarn", "factor": 2}; empty: the model's own.
    rope_scaling: str = ""
    # Sampling for the fields a request of the OpenAI and Anthropic routes leaves out
    # (gateway/config/sampling_defaults.py), a JSON object such as {"temperature": 0.2};
    # empty: each API's own defaults.
    sampling_defaults: str = ""
    kv_cache_gib: PositiveFloat = 2.0
    enforce_eager: bool = False
    enable_prefix_caching: bool = True
    tensor_parallel_size: Positive = 1
    pipeline_parallel_size: Positive = 1
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "auto"
    seed: Seed = 0
    # Tokens an engine step computes (0: vLLM's own; auto: by the device, cpu_defaults.py).
    max_num_batched_tokens: Annotated[int, Meta(ge=0)] | Literal["auto"] = "auto"
    # Sequences the engine runs at once (0: vLLM's own).
    max_num_seqs: Annotated[int, Meta(ge=0)] = 0
    # "priority": requests carry their class (gateway/config/priorities.py); "fcfs": arrival order.
    scheduling_policy: Literal["priority", "fcfs"] = "priority"
    # Classes at or past BULK_PRIORITY are bulk; while an interactive request runs or waits,
    # bulk holds at most BULK_MAX_RUNNING of the running batch (0: any; auto: by the device,
    # gateway/engine/cpu_defaults.py), in the admission queue and in the engine, whose scheduler
    # pauses the excess (gateway/engine/bulk_scheduler.py).
    bulk_priority: Annotated[int, Meta(ge=1, le=9)] = 2
    bulk_max_running: Annotated[int, Meta(ge=0)] | Literal["auto"] = "auto"
    # While an interactive request is present, an engine step computes at most this many
    # tokens (0: MAX_NUM_BATCHED_TOKENS's; auto: by the device, gateway/engine/cpu_defaults.py).
    interactive_step_tokens: Annotated[int, Meta(ge=0)] | Literal["auto"] = "auto"
    # Tokens a KV-cache block holds, the prefix cache's unit (0: vLLM's own; auto: by the
    # device, gateway/engine/cpu_defaults.py; a multiple of 32 on a CPU).
    kv_block_size: Annotated[int, Meta(ge=0)] | Literal["auto"] = "auto"
    # typical_p honoured by the gateway's logits processor (auto: on a CPU; off, typical_p is
    # ignored and logged: gateway/engine/typical_sampling.py says why not on a GPU by default).
    typical_sampling: bool | Literal["auto"] = "auto"
    # LoRA adapters (docs/ADAPTERS.md): `name=path` pairs, or a directory of adapter
    # directories; with none and ENABLE_LORA off, LoRA is off and the base model keeps
    # torch.compile. MAX_LORAS adapters share one batch, each of rank <= MAX_LORA_RANK.
    adapters: str = ""
    enable_lora: bool = False
    max_loras: Positive = 4
    max_lora_rank: Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] = 16
    # An output constraint within the size limits (Settings' MAX_REGEX_CHARS, ...) is compiled
    # once in a worker process before the engine gets it (gateway/engine/constraint_check.py):
    # past this much memory the constraint is refused; past these seconds (a caller's wait for
    # a worker included) the worker is killed and the caller answered a retryable 503, no
    # verdict kept. Callers share the workers fairly, each compiling one at a time.
    constraint_compile_seconds: PositiveFloat = 5.0
    constraint_compile_memory_mib: Positive = 1024
    constraint_compile_workers: Positive = 2


# The model served with no configuration (gateway/engine/default_model.py).
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


DEFAULT_EMBEDDING_MODEL = "default"
DEFAULT_EMBEDDING_MODEL_NAME = "all-MiniLM-L6-v2"


def embedding_model_name(settings: Settings) -> str:
    """The embedding model's name as clients see it: EMBEDDING_SERVED_MODEL_NAME, else the
    default's name or EMBEDDING_MODEL."""
    if settings.embedding_served_model_name:
        return settings.embedding_served_model_name
    if settings.embedding_model == DEFAULT_EMBEDDING_MODEL:
        return DEFAULT_EMBEDDING_MODEL_NAME
    return settings.embedding_model


def models_to_load(settings: Settings) -> list[tuple[str, str]]:
    """LOAD_MODELS as (name, url) pairs, in order; DJL's `name::engine:device=url` keeps the
    name (the engine and device are vLLM's and the gateway's to choose)."""
    pairs = []
    for entry in settings.load_models.split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, _, url = entry.rpartition("=")
        name = name.split("::", 1)[0].strip() or url.rstrip("/").rsplit("/", 1)[-1]
        if not url.strip():
            raise ConfigError(f"LOAD_MODELS: `{entry}` names no model url")
        pairs.append((name, url.strip()))
    return pairs


def served_model_name(engine: EngineSettings) -> str:
    """The name clients see and may ask for: SERVED_MODEL_NAME, else the model's own name."""
    if engine.served_model_name:
        return engine.served_model_name
    if not engine.model:
        return DEFAULT_MODEL_NAME
    return engine.model


class Settings(msgspec.Struct, frozen=True, kw_only=True, rename="upper"):
    host: str = "127.0.0.1"
    # The embedding model served beside the chat model (docs/EMBEDDINGS.md): empty, none;
    # `default`, the shipped all-MiniLM-L6-v2; else a Hugging Face model directory or hub id.
    # Its own vLLM engine (the pooling runner), with these settings (`auto`: by the CPU, as
    # the chat engine's; the batch defaults are issue 45's measurements).
    embedding_model: str = ""
    embedding_served_model_name: str = ""
    embedding_dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "auto"
    embedding_max_num_batched_tokens: Positive = 8192
    embedding_max_num_seqs: Positive = 64
    embedding_kv_cache_gib: PositiveFloat = 0.25
    # The class of an embedding request that names none: bulk, so chats stay fast.
    embedding_priority: Annotated[int, Meta(ge=0, le=9)] = 2
    # The embedding engine's processes' niceness: the kernel gives the chat engine the cores
    # first when both want them (0: equal).
    embedding_niceness: Annotated[int, Meta(ge=0, le=19)] = 10
    # More embedding models from start-up, each on its own engine: `name=url` (or a bare url,
    # named by its last part) separated by commas, `url` as EMBEDDING_MODEL's; DJL's
    # SERVING_LOAD_MODELS too. The management API can unload and load them.
    load_models: str = ""
    # Embedding models loaded at run time (DJL's management API, ADMIN_API_KEYS): together at
    # most this much memory by their estimate (0: no budget of their own), and never more
    # than the machine has available less this reserve (docs/EMBEDDINGS.md).
    model_load_memory_gib: Annotated[float, Meta(ge=0)] = 0.0
    model_load_reserve_gib: Annotated[float, Meta(ge=0)] = 1.0
    # Several chat models (docs/MODELS.md): MODELS_FILE's TOML tables, in place of MODEL's
    # one. Together their engines (and the embedding models') hold at most MODEL_MEMORY_GIB by
    # their estimate (0: what the machine has available, less MODEL_LOAD_RESERVE_GIB) and at
    # most MAX_LOADED_MODELS chat models are loaded (0: no cap); a model not loaded is loaded
    # on its first request, the least recently used idle one unloaded to make room. A request
    # waits at most MODEL_LOAD_TIMEOUT_SECONDS for its model's load.
    models_file: str = ""
    model_memory_gib: Annotated[float, Meta(ge=0)] = 0.0
    max_loaded_models: Annotated[int, Meta(ge=0)] = 0
    model_load_timeout_seconds: PositiveFloat = 600.0
    port: Port = 8000
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    max_running_requests: Positive = 256
    max_waiting_requests: Annotated[int, Meta(ge=0)] = 1024
    # What is kept for callers (continuation histories, stored responses, background responses'
    # events; docs/SECURITY.md, "Stored state"): in all (entries, bytes; in this process), and
    # per API key (0: only the total), so one key's flood evicts only its own.
    continuation_max_entries: Annotated[int, Meta(ge=0)] = 4096
    continuation_max_bytes: Positive = 512 * 1024 * 1024
    continuation_max_entries_per_key: Annotated[int, Meta(ge=0)] = 1024
    continuation_max_bytes_per_key: Annotated[int, Meta(ge=0)] = 64 * 1024 * 1024
    continuation_idle_seconds: PositiveFloat = 3600.0
    # The control protocol (control-ws.md): feedback database (empty: in the cache directory)
    # and how long a paused generation waits for `resume` before it ends.
    feedback_db: str = ""
    pause_timeout_seconds: PositiveFloat = 300.0
    # How long a generation whose WebSocket dropped waits for its client to `reattach`
    # (docs/CONTROL.md, "Reattaching"); 0: a disconnect stops the generation, as the spec says.
    reattach_seconds: Annotated[float, Meta(ge=0)] = 0.0
    # Feedback kept (docs/SECURITY.md): a message's `text`, a key's messages a minute (0: no
    # limit), and the database file, past which new feedback is refused.
    feedback_max_text_bytes: Positive = 16 * 1024
    feedback_per_minute: Annotated[int, Meta(ge=0)] = 60
    feedback_max_db_bytes: Positive = 256 * 1024 * 1024
    # LMI / TGI compatibility (lmi-invocations.md): DJL Serving's own option names.
    option_tgi_compat: bool = False
    option_output_formatter: Literal["", "json", "jsonlines", "sse"] = ""
    lmi_max_new_tokens: Positive = 30
    # Chat (docs/OPENAI.md, "Tool calls"): a chat template in place of the model's own (a file,
    # or the template itself, as vLLM's --chat-template); `tool_choice: auto` (the default with
    # `tools`) read with vLLM's tool parser TOOL_CALL_PARSER (hermes, llama3_json, mistral,
    # ...; the default model's: hermes), else in the gateway's own format; false: `auto` is
    # refused, as vLLM's server without --enable-auto-tool-choice.
    chat_template: str = ""
    enable_auto_tool_choice: bool = True
    tool_call_parser: str = ""
    # API keys (docs/SECURITY.md): none set, the gateway is open.
    api_keys: str = ""  # comma-separated; `key:name` names a key
    api_keys_file: str = ""  # one key per line, `key:name`; re-read on SIGHUP
    auth_open_paths: str = "/health,/ping,/ui,/ui/*"  # need no key
    # Keys that may load and unload LoRA adapters at run time (docs/ADAPTERS.md): comma-
    # separated, apart from API_KEYS; none set, adapters and models are loaded at start-up only.
    admin_api_keys: str = ""
    metrics_public: bool = False  # true: /metrics needs no key either (a private scraper)
    # Per-key limits (per connection with keys off); 0: no limit. The keys file overrides them.
    limit_concurrent_requests: Annotated[int, Meta(ge=0)] = 0
    limit_requests_per_minute: Annotated[int, Meta(ge=0)] = 0
    limit_tokens_per_minute: Annotated[int, Meta(ge=0)] = 0
    # Web pages (origins) that may call the gateway: comma-separated, `*` for any. Empty: only
    # the gateway's own pages and clients that send no Origin.
    allowed_origins: str = ""
    # Bounded input (docs/SECURITY.md).
    max_body_bytes: Positive = 4 * 1024 * 1024
    max_ws_message_bytes: Positive = 4 * 1024 * 1024
    # Backpressure (docs/SECURITY.md): payloads running at once on one `/ws` or `/ws/events`
    # connection (more are refused), and bytes waiting for a client that does not read (past
    # them its generations end and the connection closes with 1008).
    max_payloads_per_connection: Positive = 64
    max_queued_bytes_per_connection: Positive = 4 * 1024 * 1024
    request_timeout_seconds: Annotated[float, Meta(ge=0)] = 600.0  # 0: no deadline
    # Stop strings a request may give where its protocol has no bound of its own (TGI: 4,
    # OpenAI: 16).
    max_stop_sequences: Positive = MAX_STOP_SEQUENCES
    # Engine sequences one request may ask for, each field on every protocol (beyond it: the
    # protocol's 4xx naming the field): `n`, `best_of` (TGI's max_best_of) and `num_beams`
    # (past 10 beams see fewer candidates than transformers': vLLM gives 20 alternatives).
    max_n: SequenceBound = 16
    max_best_of: SequenceBound = MAX_BEST_OF
    max_num_beams: SequenceBound = 10
    # Output constraints (docs/SECURITY.md, "Output constraints"): past any of these a request
    # is refused before the engine compiles it (protocols/constraint_budget.py has the
    # measurements they come from). Tools' `parameters` are JSON schemas too.
    max_regex_chars: Positive = 64 * 1024
    max_grammar_chars: Positive = 64 * 1024
    max_schema_bytes: Positive = 128 * 1024
    max_schema_properties: Positive = 500
    max_schema_enum_values: Positive = 5000
    max_schema_depth: Positive = 32
    max_choices: Annotated[int, Meta(ge=1, le=MAX_CHOICES)] = MAX_CHOICES
    max_choice_chars: Positive = 64 * 1024
    # Connections (docs/SECURITY.md): a request head must come whole within
    # HEADER_TIMEOUT_SECONDS of its first byte (nginx's client_header_timeout); a connection
    # with no request under way closes after KEEP_ALIVE_SECONDS (uvicorn's); connections past
    # MAX_CONNECTIONS open at once, or MAX_CONNECTIONS_PER_ADDRESS from one address, are
    # refused with 503 as they open (0: no cap).
    header_timeout_seconds: PositiveFloat = 60.0
    keep_alive_seconds: Positive = 5
    max_connections: Annotated[int, Meta(ge=0)] = 4096
    max_connections_per_address: Annotated[int, Meta(ge=0)] = 2048
    # Shutdown and recovery: SIGTERM lets running generations finish for DRAIN_SECONDS; an
    # engine that dies is rebuilt, at most ENGINE_MAX_RESTARTS times in the window.
    drain_seconds: Annotated[float, Meta(ge=0)] = 30.0
    engine_max_restarts: Annotated[int, Meta(ge=0)] = 3
    engine_restart_window_seconds: PositiveFloat = 600.0
    # Past one machine (docs/SCALE-OUT.md): continuation histories in Redis instead of this
    # process; the engine as ENGINE_REPLICAS Ray actors (RAY_ADDRESS: a cluster to
    # join). Unset: one process, no Redis, no Ray.
    redis_url: str = ""
    engine_replicas: Annotated[int, Meta(ge=0)] = 0
    ray_address: str = ""
    # affinity: by continuation key (rendezvous hashing); load: the less loaded of two drawn
    replica_routing: Literal["affinity", "load"] = "affinity"
    # Priorities (docs/PRIORITIES.md); the bulk class's cap is an engine setting.
    admission_fairness: Literal["caller", "fifo"] = "caller"
    priority_classes: dict[str, int] = msgspec.field(default_factory=dict)  # PRIORITY_<PROTOCOL>
    # Traces (docs/OBSERVABILITY.md): OpenTelemetry's own variables (OTEL_*), as it spells
    # them; none of OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: no traces.
    otel: dict[str, str] = msgspec.field(default_factory=dict)
    # The prompt's and the output's text on a span (user content): off; on, each cut at
    # TRACE_CONTENT_MAX_CHARS characters.
    trace_content: bool = False
    trace_content_max_chars: Positive = 1024
    engine: EngineSettings = EngineSettings()
    generation: SamplingOptions = SamplingOptions()


def constraint_budget(settings: Settings) -> ConstraintBudget:
    """The size limits on a request's output constraint."""
    return ConstraintBudget(
        max_regex_chars=settings.max_regex_chars,
        max_grammar_chars=settings.max_grammar_chars,
        max_schema_bytes=settings.max_schema_bytes,
        max_schema_properties=settings.max_schema_properties,
        max_schema_enum_values=settings.max_schema_enum_values,
        max_schema_depth=settings.max_schema_depth,
        max_choices=settings.max_choices,
        max_choice_chars=settings.max_choice_chars,
    )
