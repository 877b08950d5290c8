"""Settings from the environment and `.env`, and the CLI's refusal of a bad value."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from gateway.config.loading import load_settings
from gateway.config.settings import ConfigError
from gateway.server import run_server


def test_defaults_without_configuration() -> None:
    settings = load_settings({}, dotenv_path=None)
    assert (settings.host, settings.port) == ("127.0.0.1", 8000)
    assert settings.engine.model == "" and settings.engine.enable_prefix_caching
    assert settings.generation.max_new_tokens == 100


def test_dotenv_is_read_and_the_environment_wins(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("PORT=9001\nDEFAULT_TEMPERATURE=0.3\nENFORCE_EAGER=true\nMODEL=/m\n")
    settings = load_settings({"PORT": "9002", "DEFAULT_STOP": "###,END"}, dotenv_path=env_file)
    assert settings.port == 9002
    assert settings.generation.temperature == 0.3
    assert settings.generation.stop == ("###", "END")
    assert settings.engine.enforce_eager is True and settings.engine.model == "/m"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PORT", "eighty"),
        ("PORT", "70000"),
        ("ENFORCE_EAGER", "maybe"),
        ("MAX_RUNNING_REQUESTS", "0"),
        ("KV_CACHE_GIB", "-1"),
        ("DEFAULT_TOP_P", "1.5"),
        ("DEFAULT_MAX_NEW_TOKENS", "x"),
        ("DEFAULT_MIN_TOKENS", "1000"),
        ("LOG_LEVEL", "chatty"),
        ("DTYPE", "int3"),
    ],
)
def test_an_invalid_value_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({name: value}, dotenv_path=None)
    assert str(caught.value).startswith(f"{name}: ")


def test_every_variable_is_documented_in_env_example() -> None:
    example = (Path(__file__).parent.parent / ".env.example").read_text()
    documented = {line.split("=")[0].lstrip("# ") for line in example.splitlines() if "=" in line}
    from gateway.config.settings import GENERATION_PREFIX, EngineSettings, Settings
    from protocols.generation_config import GenerationConfig
    from protocols.names import Protocol

    # each field its own variables (OTEL_*: OpenTelemetry's, docs/OBSERVABILITY.md)
    structured = ("engine", "generation", "priority_classes", "otel")
    names = {f.upper() for f in Settings.__struct_fields__ if f not in structured}
    names |= {f"PRIORITY_{p.name}" for p in Protocol}
    names |= {f.upper() for f in EngineSettings.__struct_fields__}
    names |= {GENERATION_PREFIX + f.upper() for f in GenerationConfig.__struct_fields__}
    assert names <= documented, names - documented


def test_the_cli_refuses_to_start_on_a_bad_value(tmp_path: Path) -> None:
    env = {**os.environ, "PORT": "eighty"}
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--env-file", str(tmp_path / "none.env")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "PORT" in done.stderr and "invalid configuration" in done.stderr


def test_prepare_model_command_reuses_the_complete_copy() -> None:
    from gateway.engine.default_model import default_model_dir, prepare_default_model

    prepare_default_model()
    llm_gateway = Path(sys.executable).with_name("llm-gateway")
    done = subprocess.run([str(llm_gateway), "prepare-model"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(default_model_dir())
    assert "reusing complete copy" in done.stderr


def test_a_gateway_with_replicas_sets_grpc_s_client_before_it_imports_the_app(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gRPC reads GRPC_EXPERIMENTS once, at start: `llm-gateway serve` sets it before its
    `from gateway.app import ...` (gateway.app imports Ray, and gRPC), and keeps an
    operator's own value. The stand-in app records the environment at that import."""
    seen: dict[str, str] = {}

    class Imported(Exception):
        pass

    def imported(name: str) -> object:
        seen.update(os.environ)
        raise Imported(name)

    app = types.ModuleType("gateway.app")
    app.__dict__["__getattr__"] = imported  # runs when `from gateway.app import` looks up a name
    monkeypatch.setitem(sys.modules, "gateway.app", app)
    settings = load_settings({"ENGINE_REPLICAS": "1"}, dotenv_path=None)

    monkeypatch.delenv("GRPC_EXPERIMENTS", raising=False)
    with pytest.raises(Imported):
        run_server(settings, "127.0.0.1", 0)
    assert seen["GRPC_EXPERIMENTS"] == "-event_engine_client"

    monkeypatch.setenv("GRPC_EXPERIMENTS", "-pollset_alternative")
    with pytest.raises(Imported):
        run_server(settings, "127.0.0.1", 0)
    assert seen["GRPC_EXPERIMENTS"] == "-pollset_alternative"
