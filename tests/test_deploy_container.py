"""The container's entry point without an engine: where it listens, and what it dispatches."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import main as cli
from gateway.config.loading import load_settings
from gateway.container import container_env, is_sagemaker, main
from serving import free_port


def listens(environ: dict[str, str], sagemaker: bool = False) -> tuple[str, int]:
    settings = load_settings(container_env(environ, sagemaker), dotenv_path=None)
    return settings.host, settings.port


def test_the_image_listens_on_every_address_at_8080_unless_told() -> None:
    assert listens({}) == ("0.0.0.0", 8080)
    assert listens({"PORT": "9000", "HOST": "127.0.0.1"}) == ("127.0.0.1", 9000)
    assert listens({"HOSTNAME": "::"}) == ("::", 8080)  # TGI's name for it
    assert listens({"HOSTNAME": "3f2a9c1d0b7e"}) == ("0.0.0.0", 8080)  # Docker's container id


def test_sagemaker_gets_its_contract_whatever_else_is_set() -> None:
    assert listens({"PORT": "9000", "HOST": "127.0.0.1"}, sagemaker=True) == ("0.0.0.0", 8080)
    assert listens({"SAGEMAKER_BIND_TO_PORT": "8081"}, sagemaker=True) == ("0.0.0.0", 8081)
    assert is_sagemaker(["serve"], {}) and is_sagemaker([], {"SM_CURRENT_HOST": "algo-1"})
    assert not is_sagemaker([], {"PATH": "/usr/bin"})


def test_other_arguments_run_llm_gateway_or_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(["container", "llm-gateway", "export-feedback", "--db", str(tmp_path / "none")]) == 1
    assert "no feedback database" in capsys.readouterr().err
    assert main(["serve", "--port", "1"], {}) == 2
    assert "usage: llm-gateway container" in capsys.readouterr().err


def test_health_fails_where_nothing_answers() -> None:
    assert main(["health"], {"PORT": str(free_port())}) == 1
