#!/usr/bin/env bash
# Make sure redis-server (>= 7) is installed; install Debian's package if not.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
echo "redis-server not found: installing Debian's redis-server package" >&2
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-tools >/dev/null
# The package starts a system service on 6379; the tests never use it.
command -v redis-server >/dev/null
