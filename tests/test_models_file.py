"""MODELS_FILE (docs/MODELS.md): what a file of chat models configures, and what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.loading import load_settings
from gateway.config.models_file import DEFAULT_KEEP_ALIVE, configured_models, keep_alive_seconds
from gateway.config.settings import ConfigError
from protocols.keep_alive import FOREVER


def _model_dir(tmp_path: Path, name: str) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    return directory


def _configured(tmp_path: Path, text: str, **env: str) -> object:
    path = tmp_path / "models.toml"
    path.write_text(text)
    settings = load_settings({"MODELS_FILE": str(path), **env}, dotenv_path=None)
    return configured_models(settings)


def test_one_model_without_a_file_is_models_own_pinned() -> None:
    configured = configured_models(load_settings({}, dotenv_path=None))
    [only] = configured.models
    assert configured.default == only.name == "SmolLM2-135M-Instruct"
    assert only.pinned and only.keep_alive_seconds == FOREVER


def test_each_table_is_a_model_with_the_environments_settings_but_its_own(
    tmp_path: Path,
) -> None:
    tiny = _model_dir(tmp_path, "tiny")
    configured = _configured(
        tmp_path,
        f"""
default = "smol"
[models.smol]
source = "default"
[models.tiny]
source = "{tiny}"
max_model_len = 1024
keep_alive = "90s"
tool_call_parser = "hermes"
""",
        MAX_MODEL_LEN="4096",
        DTYPE="float32",
        ADAPTERS="",
    )
    smol, small = configured.models  # type: ignore[attr-defined]
    assert configured.default == "smol"  # type: ignore[attr-defined]
    assert smol.pinned and smol.keep_alive_seconds == FOREVER  # the default stays
    assert smol.settings.engine.max_model_len == 4096 and smol.settings.engine.model == ""
    assert not small.pinned and small.keep_alive_seconds == 90
    assert small.settings.engine.max_model_len == 1024
    assert small.settings.engine.dtype == "float32"  # the environment's
    assert small.settings.engine.served_model_name == "tiny"
    assert small.settings.engine.model == str(tiny)
    assert small.settings.tool_call_parser == "hermes"


def test_a_model_but_the_default_keeps_ollamas_five_minutes(tmp_path: Path) -> None:
    other = _model_dir(tmp_path, "other")
    configured = _configured(
        tmp_path, f'[models.a]\nsource = "default"\n[models.b]\nsource = "{other}"\n'
    )
    _, b = configured.models  # type: ignore[attr-defined]
    assert configured.default == "a"  # type: ignore[attr-defined]  # the first
    assert b.keep_alive_seconds == DEFAULT_KEEP_ALIVE and not b.pinned


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (300, 300.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("90s", 90.0),
        ("0", 0.0),
        (0, 0.0),
        (-1, FOREVER),
        ("-1", FOREVER),
        ("-5m", FOREVER),
        ("250ms", 0.25),
    ],
)
def test_keep_alive_is_ollamas_duration(value: float | str, seconds: float) -> None:
    assert keep_alive_seconds(value, "here") == seconds


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[models.a]\nsource = "default"\ncolour = "red"\n', "colour"),
        ('[models.a]\nsource = "/nowhere"\n', "/nowhere"),
        ('default = "b"\n[models.a]\nsource = "default"\n', "'b'"),
        ('[models.a]\nkeep_alive = "soon"\n', "soon"),
        ("models = {}\n", "names no model"),
        ("[models.a\n", "models.toml"),
        ('[models."a b"]\nsource = "default"\n', "[models.a b]"),
        ('[models.a]\nadapters = "x=/nowhere"\n', "[models.a]"),
    ],
)
def test_a_bad_file_stops_start_up_naming_what(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(ConfigError) as refused:
        _configured(tmp_path, text)
    assert "MODELS_FILE" in str(refused.value) or "[models." in str(refused.value)
    assert named in str(refused.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    settings = load_settings({"MODELS_FILE": str(tmp_path / "none.toml")}, dotenv_path=None)
    with pytest.raises(ConfigError, match=r"none\.toml"):
        configured_models(settings)
