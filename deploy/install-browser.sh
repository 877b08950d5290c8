#!/usr/bin/env bash
# Installs Debian's Chromium and ChromeDriver for the browser tests of the playground, once.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install chromium and chromedriver for the browser tests (no apt-get here)" >&2
  exit 1
fi
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
echo "installing Debian's chromium and chromium-driver for the browser tests ..."
$sudo apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >/dev/null
