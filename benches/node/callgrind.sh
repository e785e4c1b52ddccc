#!/usr/bin/env bash
# Instructions per embedded check under callgrind (benches/node/callgrind.js),
# for throttlegate's `check` and `checkSync` and RateLimiterMemory's
# `consume`: each mode run with N and 2N checks, (total(2N) - total(N)) / N.
#
#   benches/node/callgrind.sh [N, default 100000] [MODE...]
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
trap 'rm -rf "$WORK"' EXIT
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
