#!/usr/bin/env bash
# Installs the coding agents the suite runs against the gateway (tests/test_agents.py, in `make test-all`):
# Claude Code and Codex CLI, pinned, from the npm registry into $VENV/agents (no global
# install; their native binaries come as optional npm dependencies). Once: idempotent.
set -euo pipefail
VENV="${VENV:-.venv}"
PREFIX="${AGENTS_DIR:-$VENV/agents}"
CLAUDE_CODE="@anthropic-ai/claude-code@2.1.332"
CODEX="@openai/codex@0.171.0"
installed() {  # the binary answers with the pinned version
  local bin="$PREFIX/node_modules/.bin/$1"
  [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -qF "$2"
}
if installed claude "${CLAUDE_CODE##*@}" && installed codex "${CODEX##*@}"; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "install Node.js and npm for the agent tests (Claude Code, Codex CLI; no apt-get here)" >&2
    exit 1
  fi
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "installing Debian's nodejs and npm for the agent tests ..."
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nodejs npm >/dev/null
fi
mkdir -p "$PREFIX"
echo "installing $CLAUDE_CODE and $CODEX into $PREFIX ..."
# --no-save: no package.json is written into the prefix; the pins are here.
npm install --prefix "$PREFIX" --no-save --no-audit --no-fund --loglevel=error \
  "$CLAUDE_CODE" "$CODEX" >/dev/null
installed claude "${CLAUDE_CODE##*@}" && installed codex "${CODEX##*@}"
