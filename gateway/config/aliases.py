"""The configuration names LMI and TGI users already have, mapped onto the gateway's settings.

One precedence: the gateway's own name (MODEL, MAX_MODEL_LEN, ...) wins; else the LMI and TGI
names that map onto the same setting, which must agree (two names with two values stop
start-up, both named), whether they come from the environment or, as `option.*` keys, from
LMI's `serving.properties` in the model directory (SAGEMAKER_MODEL_DIR); else a Hugging Face
model in that directory. An `OPTION_*` name the gateway cannot honour is logged by name.
docs/DEPLOY.md has the table.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gateway.config.settings import ConfigError, EngineSettings, Settings

log = logging.getLogger("gateway.config")

MODEL_DIR = "SAGEMAKER_MODEL_DIR"  # SageMaker's /opt/ml/model, or any directory standing in
SERVING_PROPERTIES = "serving.properties"
# Settings no gateway variable holds: derived from below (TGI's input bound, LMI's and TGI's
# bound on requests in flight).
_MAX_INPUT = "max input tokens"
_MAX_IN_FLIGHT = "requests in flight"
_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
_GIB = 1 << 30


def _same(value: str) -> str:
    return value


def _dtype(value: str) -> str:
    return _DTYPES.get(value.lower(), value.lower())


def _gib(value: str) -> str:
    return repr(int(value) / _GIB)


def _degree(value: str) -> str:
    """LMI's `max`: every GPU this process may use (one on a CPU), as CUDA counts them: those
    CUDA_VISIBLE_DEVICES names, else those NVIDIA's driver lists."""
    if value.lower() != "max":
        return value
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return str(max(1, len([d for d in visible.split(",") if d.strip()])))
    gpus = Path("/proc/driver/nvidia/gpus")
    return str(max(1, len(list(gpus.iterdir())) if gpus.is_dir() else 1))


@dataclass(frozen=True)
class Alias:
    name: str  # the LMI or TGI name, as an environment variable
    setting: str  # the gateway's variable it sets
    convert: Callable[[str], str] = _same


ALIASES: tuple[Alias, ...] = (
    # DJL LMI: environment variables, and `option.*` keys of serving.properties
    Alias("HF_MODEL_ID", "MODEL"),
    Alias("OPTION_MODEL_ID", "MODEL"),
    Alias("OPTION_SERVED_MODEL_NAME", "SERVED_MODEL_NAME"),
    Alias("OPTION_MAX_MODEL_LEN", "MAX_MODEL_LEN"),
    Alias("TENSOR_PARALLEL_DEGREE", "TENSOR_PARALLEL_SIZE", _degree),
    Alias("OPTION_TENSOR_PARALLEL_DEGREE", "TENSOR_PARALLEL_SIZE", _degree),
    Alias("OPTION_TENSOR_PARALLEL_SIZE", "TENSOR_PARALLEL_SIZE"),
    Alias("OPTION_PIPELINE_PARALLEL_DEGREE", "PIPELINE_PARALLEL_SIZE"),
    Alias("OPTION_PIPELINE_PARALLEL_SIZE", "PIPELINE_PARALLEL_SIZE"),
    Alias("MAX_BATCH_SIZE", "MAX_RUNNING_REQUESTS"),
    Alias("OPTION_MAX_ROLLING_BATCH_SIZE", "MAX_RUNNING_REQUESTS"),
    Alias("OPTION_MAX_NUM_SEQS", "MAX_RUNNING_REQUESTS"),
    Alias("OPTION_DTYPE", "DTYPE", _dtype),
    Alias("OPTION_ENABLE_PREFIX_CACHING", "ENABLE_PREFIX_CACHING"),
    Alias("OPTION_ENFORCE_EAGER", "ENFORCE_EAGER"),
    Alias("OPTION_SEED", "SEED"),
    Alias("OPTION_KV_CACHE_MEMORY_BYTES", "KV_CACHE_GIB", _gib),
    Alias("OPTION_MAX_ROLLING_BATCH_PREFILL_TOKENS", "MAX_NUM_BATCHED_TOKENS"),
    Alias("OPTION_MAX_NUM_BATCHED_TOKENS", "MAX_NUM_BATCHED_TOKENS"),
    Alias("OPTION_ENABLE_LORA", "ENABLE_LORA"),
    Alias("OPTION_MAX_LORAS", "MAX_LORAS"),
    Alias("OPTION_MAX_LORA_RANK", "MAX_LORA_RANK"),
    Alias("OPTION_CHAT_TEMPLATE", "CHAT_TEMPLATE"),
    Alias("OPTION_ENABLE_AUTO_TOOL_CHOICE", "ENABLE_AUTO_TOOL_CHOICE"),
    Alias("OPTION_TOOL_CALL_PARSER", "TOOL_CALL_PARSER"),
    Alias("SERVING_LOAD_MODELS", "LOAD_MODELS"),  # DJL Serving's models to load at start-up
    # TGI's launcher
    Alias("MODEL_ID", "MODEL"),
    Alias("MAX_TOTAL_TOKENS", "MAX_MODEL_LEN"),
    Alias("MAX_INPUT_TOKENS", _MAX_INPUT),
    Alias("MAX_INPUT_LENGTH", _MAX_INPUT),
    Alias("NUM_SHARD", "TENSOR_PARALLEL_SIZE"),
    Alias("HOSTNAME", "HOST"),  # only an address: see _hostname
    Alias("MAX_CONCURRENT_REQUESTS", _MAX_IN_FLIGHT),  # LMI's simplified name too
    Alias("MAX_BATCH_PREFILL_TOKENS", "MAX_NUM_BATCHED_TOKENS"),
    Alias("LORA_ADAPTERS", "ADAPTERS"),  # `name=path` pairs (TGI also takes Hub ids: not here)
    # SageMaker's model-server variables
    Alias("SAGEMAKER_MODEL_SERVER_TIMEOUT", "REQUEST_TIMEOUT_SECONDS"),
    Alias("SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS", "REQUEST_TIMEOUT_SECONDS"),
)
_BY_NAME = {alias.name: alias for alias in ALIASES}
NOT_HONOURED = {
    "OPTION_GPU_MEMORY_UTILIZATION": "KV_CACHE_GIB sizes the KV cache",
}
# LMI options that describe what the gateway already is: accepted without a word.
_ALREADY = {
    "OPTION_ROLLING_BATCH": {"vllm", "auto"},
    "OPTION_ENGINE": {"python"},
    "ENGINE": {"python"},  # serving.properties' `engine=Python`
    "OPTION_ASYNC_MODE": {"true"},
    "OPTION_TASK": {"text-generation", "generate", "auto"},
    "OPTION_TRUST_REMOTE_CODE": {"false"},
}


@dataclass(frozen=True)
class Given:
    name: str  # as an environment variable: OPTION_MAX_MODEL_LEN
    value: str
    where: str  # how the user wrote it: OPTION_MAX_MODEL_LEN, or option.max_model_len
    file: Path | None = None  # the serving.properties it is in

    def __str__(self) -> str:
        return f"{self.where}={self.value}" + (f" (in {self.file})" if self.file else "")


Chosen = tuple[Given, str]  # a name as the user gave it, and its value as the setting takes it


def resolve_aliases(values: Mapping[str, str]) -> dict[str, str]:
    """`values` with every setting left unset filled from its LMI or TGI names."""

    out = dict(values)
    model_dir = Path(values[MODEL_DIR]) if values.get(MODEL_DIR) else None
    given = _from_environment(values) + _from_properties(model_dir)
    chosen: dict[str, Chosen] = {}
    for item in given:
        alias = _BY_NAME.get(item.name)
        if alias is None or (alias.name == "HOSTNAME" and not _is_address(item.value)):
            continue
        value = _converted(alias, item)
        earlier = chosen.get(alias.setting)
        if earlier is not None and earlier[1] != value:
            raise ConfigError(f"{earlier[0]} and {item}: two values for {alias.setting}")
        chosen.setdefault(alias.setting, (item, value))
    origin: dict[str, str] = {}
    for setting, (item, value) in chosen.items():
        own = values.get(setting, "")
        if own != "":
            if own != value:
                log.warning("%s=%s wins over %s", setting, own, item)
            origin[setting] = f"{setting}={own}"
        elif not setting.islower():  # a gateway variable, not a derived setting
            out[setting] = value
            origin[setting] = str(item)
    for item in given:  # option.* keys that are the gateway's own names (OPTION_TGI_COMPAT)
        if item.file is not None and _is_own(item.name) and out.get(item.name, "") == "":
            out[item.name] = item.value
    _model_from_directory(out, origin, model_dir)
    _adapters_from_directory(out, origin, model_dir)
    _input_bound(out, origin, chosen.get(_MAX_INPUT))
    _in_flight(out, origin, chosen.get(_MAX_IN_FLIGHT))
    if out.get("MODEL", "").startswith("s3://"):
        where = origin.get("MODEL", f"MODEL={out['MODEL']}")
        raise ConfigError(
            f"{where}: the gateway does not fetch s3:// models; give SageMaker the S3 location "
            f"as the model's ModelDataUrl (it is unpacked into /opt/ml/model) instead"
        )
    _report_unhonoured(given)
    return out


def _converted(alias: Alias, item: Given) -> str:

    try:
        value = alias.convert(item.value)
    except ValueError as e:
        raise ConfigError(f"{item.where}: {item.value!r} is not a valid value") from e
    _check(alias.setting, value, item)
    return value


def _check(setting: str, value: str, item: Given) -> None:
    """The value as its setting would take it; an error names the user's own name for it."""
    import msgspec

    kind: type[msgspec.Struct] = Settings
    if setting in (_MAX_INPUT, _MAX_IN_FLIGHT):
        setting, kind = "MAX_MODEL_LEN", EngineSettings
    elif setting.lower() in EngineSettings.__struct_fields__:
        kind = EngineSettings
    try:
        msgspec.convert({setting: value}, kind, strict=False)
    except msgspec.ValidationError as e:
        message = str(e).split(" - at ")[0]
        raise ConfigError(f"{item.where}: {message}") from e


def _from_environment(values: Mapping[str, str]) -> list[Given]:
    names = _BY_NAME.keys() | NOT_HONOURED.keys() | {"SAGEMAKER_MODEL_SERVER_WORKERS"}
    return [
        Given(name, value, name)
        for name, value in values.items()
        if value != "" and (name in names or name.startswith("OPTION_"))
    ]


def _from_properties(model_dir: Path | None) -> list[Given]:
    """LMI's `serving.properties`: `option.x=v` is LMI's OPTION_X; other keys keep their name."""
    if model_dir is None or not (model_dir / SERVING_PROPERTIES).is_file():
        return []
    path = model_dir / SERVING_PROPERTIES
    given = []
    for key, value in read_properties(path).items():
        name = key.upper().replace(".", "_") if key.startswith("option.") else key
        given.append(Given(name, value, key, path))
    return given


def read_properties(path: Path) -> dict[str, str]:
    """A Java properties file as LMI writes them: `key=value` (or `key: value`) lines, `#` and
    `!` comments."""
    properties: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        separator = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if separator < 0:
            properties[line] = ""
            continue
        properties[line[:separator].strip()] = line[separator + 1 :].strip()
    return properties


def given_host(values: Mapping[str, str]) -> bool:
    """Whether HOST, or TGI's HOSTNAME as an address, says where to listen."""
    return bool(values.get("HOST")) or _is_address(values.get("HOSTNAME", ""))


def _is_address(host: str) -> bool:
    """TGI users set HOSTNAME to an address (0.0.0.0, ::); Docker, Kubernetes and shells set it
    to the machine's name, which must not move where the gateway listens."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _is_own(name: str) -> bool:

    field = name.lower()
    if not name.isupper() or field in ("engine", "generation"):  # those two are groups
        return False
    return field in Settings.__struct_fields__ or field in EngineSettings.__struct_fields__


def _model_from_directory(out: dict[str, str], origin: dict[str, str], where: Path | None) -> None:
    model = out.get("MODEL", "")
    if where is None:
        return
    if model and not Path(model).is_absolute() and (where / model).exists():
        out["MODEL"] = str(where / model)  # LMI's option.model_id may name a path inside it
    elif not model and (where / "config.json").is_file():
        out["MODEL"] = str(where)
        origin["MODEL"] = f"{MODEL_DIR}={where}"


def _adapters_from_directory(
    out: dict[str, str], origin: dict[str, str], where: Path | None
) -> None:
    """LMI's layout: with LoRA on, the model directory's `adapters/` holds one adapter a
    subdirectory."""
    if (
        where is None
        or out.get("ADAPTERS", "") != ""
        or out.get("ENABLE_LORA", "").lower() not in ("true", "1")
    ):
        return
    if (where / "adapters").is_dir():
        out["ADAPTERS"] = str(where / "adapters")
        origin["ADAPTERS"] = f"{MODEL_DIR}={where} (its adapters/)"


def _input_bound(
    out: dict[str, str], origin: dict[str, str], given: tuple[Given, str] | None
) -> None:
    """TGI's MAX_INPUT_TOKENS: the gateway takes prompts up to MAX_MODEL_LEN - 1 tokens."""

    if given is None:
        return
    item, value = given
    longest = int(value)
    if out.get("MAX_MODEL_LEN", "") == "":
        out["MAX_MODEL_LEN"] = str(longest + 1)
        return
    total = int(out["MAX_MODEL_LEN"])
    if longest >= total:
        where = origin.get("MAX_MODEL_LEN", f"MAX_MODEL_LEN={total}")
        raise ConfigError(f"{item} and {where}: the input must be shorter than the total")
    if longest < total - 1:
        log.warning(
            "%s is not honoured: prompts may be up to MAX_MODEL_LEN - 1 = %d tokens",
            item,
            total - 1,
        )


def _in_flight(
    out: dict[str, str], origin: dict[str, str], given: tuple[Given, str] | None
) -> None:
    """MAX_CONCURRENT_REQUESTS (TGI, LMI): the gateway's running plus waiting requests."""

    if given is None:
        return
    item, value = given
    total = int(value)
    if out.get("MAX_WAITING_REQUESTS", "") != "":
        log.warning("MAX_WAITING_REQUESTS wins over %s", item)
        return
    running = int(out.get("MAX_RUNNING_REQUESTS") or Settings().max_running_requests)
    if running > total:
        if out.get("MAX_RUNNING_REQUESTS", "") != "":
            where = origin.get("MAX_RUNNING_REQUESTS", f"MAX_RUNNING_REQUESTS={running}")
            raise ConfigError(f"{item} and {where}: more would run than may be in flight")
        running = total
        out["MAX_RUNNING_REQUESTS"] = str(running)
    out["MAX_WAITING_REQUESTS"] = str(total - running)


def _report_unhonoured(given: list[Given]) -> None:
    for item in given:
        name = item.name
        if name in _BY_NAME or _is_own(name):
            continue
        if item.value.lower() in _ALREADY.get(name, ()) or (name, item.value) == (
            "engine",
            "Python",
        ):
            continue
        if name == "SAGEMAKER_MODEL_SERVER_WORKERS":
            if item.value != "1":
                log.warning(
                    "%s: the gateway runs one worker; its one engine batches every request "
                    "(more workers would each hold a copy of the model)",
                    item,
                )
            continue
        reason = NOT_HONOURED.get(name, "an LMI setting the gateway does not honour")
        log.warning("%s is ignored: %s", item, reason)
