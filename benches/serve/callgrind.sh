#!/usr/bin/env bash
# Instructions per ShouldRateLimit call in `throttlegate serve`, counted by
# valgrind's callgrind (counts, unlike times, repeat on a shared machine):
# the server runs under callgrind with instrumentation off, is warmed up,
# then instrumented while server/examples/rls_load.rs makes calls at N in
# flight over one HTTP/2 connection; the dump's instruction total divided
# by the calls answered is the figure. Prints it, and the functions with the
# most inclusive instructions (callgrind_annotate), and keeps the dump.
#
#   benches/serve/callgrind.sh [embedded|redis] [seconds, default 20] [in flight, default 64]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
BACKEND="${1:-embedded}"
SECS="${2:-20}"
INFLIGHT="${3:-64}"

cargo build --quiet --release -p throttlegate-cli --bin throttlegate
cargo build --quiet --release -p throttlegate-server --example rls_load
EXE="${TG_EXE:-$ROOT/target/release/throttlegate}"
LOAD="$ROOT/target/release/examples/rls_load"
OUT="$ROOT/target/callgrind-serve-$BACKEND.out"

. benches/serve/common.sh callgrind
url=()
if [ "$BACKEND" = redis ]; then
  rport="$(free_port)"
  redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >/dev/null &
  PIDS+=($!)
  wait_port "$rport"
  url=(--url "redis://127.0.0.1:$rport")
fi
port="$(free_port)"
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$WORK/cg.out" \
  "$EXE" serve --rules "$WORK/rules.yaml" --grpc "127.0.0.1:$port" --http "127.0.0.1:$(free_port)" \
  --on-backend-error error --timeout 30s --no-watch "${url[@]}" 2>"$WORK/serve.log" &
vg=$!
PIDS+=($vg)
wait_port "$port"
"$LOAD" "127.0.0.1:$port" 2 closed "$INFLIGHT" >/dev/null   # warm up, uninstrumented
callgrind_control -i on "$vg" >/dev/null
run="$("$LOAD" "127.0.0.1:$port" "$SECS" closed "$INFLIGHT")"
callgrind_control -d "$vg" >/dev/null
callgrind_control -i off "$vg" >/dev/null
sleep 1
dump="$(ls -t "$WORK"/cg.out* | grep -v '^$' | head -1)"
cp "$dump" "$OUT"
python3 - "$OUT" "$run" "$BACKEND" "$INFLIGHT" <<'PY'
import json, re, sys
path, run, backend, n = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
total = 0
for line in open(path, errors="replace"):
    m = re.match(r"(?:summary|totals):\s+(\d+)", line)
    if m:
        total = int(m.group(1))
calls = run["calls"] - run["errors"]
print(f"{backend}, {n} in flight: {calls} calls, {total:,} instructions, {total / max(calls, 1):,.0f} per call (errors: {run['errors']})")
PY
callgrind_annotate --inclusive=yes "$OUT" 2>/dev/null | sed -n '1,60p' | cut -c1-200
echo "dump: $OUT"
