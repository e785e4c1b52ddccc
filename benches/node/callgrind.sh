#!/usr/bin/env bash
# Instructions per check under callgrind (benches/node/callgrind.js): on
# the embedded backend throttlegate's `check` and `checkSync` and
# RateLimiterMemory's `consume`; on Redis (modes `redis` and
# `redis-flexible`, the client's side) throttlegate's `check` and
# RateLimiterRedis's `consume`. Each mode is run with N and 2N checks,
# (total(2N) - total(N)) / N.
#
#   benches/node/callgrind.sh [N, default 100000] [MODE...]
#
# The default modes are the embedded ones. The Redis modes use REDIS_URL,
# or a private redis-server started on a free loopback port (pinned to CPU
# 0 when `taskset` is there) and stopped on exit; N = 10000 is plenty there.
#
# `--single-threaded` keeps V8's compilations on the main thread, so the
# counts repeat (within about 100 instructions per check).
# Needs valgrind, the release addon (`npm run build`) and the peers
# (`npm ci`, as benches/compare/run.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/../.."
N="${1:-100000}"
shift || true
MODES=("$@")
[ ${#MODES[@]} -gt 0 ] || MODES=(checkSync check flexible)
WORK="$(mktemp -d "${TMPDIR:-/tmp}/throttlegate-callgrind.XXXXXX")"
REDIS_PID=""
cleanup() {
  if [ -n "$REDIS_PID" ]; then
    kill "$REDIS_PID" 2>/dev/null || true
    wait "$REDIS_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
if [[ " ${MODES[*]} " == *" redis"* ]] && [ -z "${REDIS_URL:-}" ]; then
  PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  PIN=()
  if command -v taskset >/dev/null 2>&1 && [ "$(nproc)" -ge 2 ]; then PIN=(taskset -c 0); fi
  "${PIN[@]}" redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no >"$WORK/redis.log" 2>&1 &
  REDIS_PID=$!
  for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
  export REDIS_URL="redis://127.0.0.1:$PORT"
fi
total() {
  valgrind --tool=callgrind --smc-check=all-non-file --callgrind-out-file="$WORK/out" \
    node --single-threaded benches/node/callgrind.js "$1" "$2" >/dev/null 2>"$WORK/log"
  grep -o 'Collected : [0-9]*' "$WORK/log" | grep -o '[0-9]*$'
}
echo "| mode | instructions per check (N = $N and $((2 * N))) |"
echo "| --- | ---: |"
for mode in "${MODES[@]}"; do
  a="$(total "$mode" "$N")"
  b="$(total "$mode" "$((2 * N))")"
  echo "| $mode | $(( (b - a) / N )) |"
done
