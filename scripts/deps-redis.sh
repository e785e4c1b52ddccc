#!/usr/bin/env bash
# Make sure redis-server (>= 7) and redis-sentinel are installed; install
# Debian's packages if not (the Sentinel tests start their own sentinels).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/need.sh
need redis-server redis-server
# The package starts a system service on 6379; the tests never use it.
need redis-cli redis-tools
need redis-sentinel redis-sentinel
