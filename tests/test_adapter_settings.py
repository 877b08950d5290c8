"""ADAPTERS and the peers' names for it: what a user writes, read as the adapters served."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.adapters import configured_adapters, lora_enabled
from gateway.config.loading import load_settings
from gateway.config.settings import ConfigError


def adapter(where: Path) -> Path:
    where.mkdir(parents=True)
    (where / "adapter_config.json").write_text("{}")
    return where


def test_name_path_pairs_and_a_directory_of_adapters(tmp_path: Path) -> None:
    one = adapter(tmp_path / "one")
    adapter(tmp_path / "many" / "sql")
    adapter(tmp_path / "many" / "french")
    (tmp_path / "many" / "notes").mkdir()  # no adapter_config.json: not an adapter
    settings = load_settings({"ADAPTERS": f"first={one}, {tmp_path / 'many'}"}, dotenv_path=None)
    assert configured_adapters(settings.engine) == {
        "first": one,
        "french": tmp_path / "many" / "french",
        "sql": tmp_path / "many" / "sql",
    }
    assert lora_enabled(settings.engine)
    assert not lora_enabled(load_settings({}, dotenv_path=None).engine)


def test_a_missing_adapter_or_a_bad_name_stops_start_up(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"has no adapter_config\.json"):
        load_settings({"ADAPTERS": f"x={tmp_path}"}, dotenv_path=None)
    with pytest.raises(ConfigError, match="neither an adapter nor a directory"):
        load_settings({"ADAPTERS": str(tmp_path / "nowhere")}, dotenv_path=None)
    good = adapter(tmp_path / "ok")
    with pytest.raises(ConfigError, match="is not an adapter name"):
        load_settings({"ADAPTERS": f"bad name={good}"}, dotenv_path=None)
    with pytest.raises(ConfigError, match="MAX_LORA_RANK"):
        load_settings({"MAX_LORA_RANK": "9"}, dotenv_path=None)


def test_tgi_and_lmi_names(tmp_path: Path) -> None:
    pirate = adapter(tmp_path / "pirate")
    tgi = load_settings({"LORA_ADAPTERS": f"pirate={pirate}"}, dotenv_path=None)
    assert configured_adapters(tgi.engine) == {"pirate": pirate}
    model_dir = tmp_path / "model"
    (model_dir / "config.json").parent.mkdir()
    (model_dir / "config.json").write_text("{}")
    adapter(model_dir / "adapters" / "sql")
    (model_dir / "serving.properties").write_text(
        "option.enable_lora=true\noption.max_loras=2\noption.max_lora_rank=32\n"
    )
    lmi = load_settings({"SAGEMAKER_MODEL_DIR": str(model_dir)}, dotenv_path=None)
    assert lmi.engine.enable_lora and lmi.engine.max_loras == 2 and lmi.engine.max_lora_rank == 32
    assert configured_adapters(lmi.engine) == {"sql": model_dir / "adapters" / "sql"}
