#!/usr/bin/env bash
# One command for the side-by-side comparison: installs the peers into the
# local folders (node_modules/, .venv/), builds what is measured in release,
# starts a private redis-server on a free loopback port (pinned to core 0),
# runs every comparison from core 1, writes benches/compare/RESULTS.md and
# prints it. Every server it starts is stopped on exit.
#
#   benches/compare/run.sh [seconds per case, default 3]    (or: make compare)
#
# COMPARE_SECONDS=N is the same knob for `make compare COMPARE_SECONDS=N`.
# COMPARE_ONLY=PART,PART runs only those parts of compare.py (redis, memory,
# node, python, rust, algos, node-algos, python-algos, burst, latency, reserve, concurrency), builds only
# what they need, and writes benches/compare/RESULTS-partial.md instead of
# RESULTS.md (which only a full run writes).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
HERE="$ROOT/benches/compare"

SECS="${1:-${COMPARE_SECONDS:-3}}"
if ! [[ "$SECS" =~ ^[0-9]+(\.[0-9]+)?$ ]] || [ "$(awk -v s="$SECS" 'BEGIN { print (s > 0) }')" != 1 ]; then
  echo "run.sh: seconds per case must be a positive number, got '$SECS'" >&2
  exit 2
fi

ONLY="${COMPARE_ONLY:-}"
OUT="$HERE/RESULTS.md"
ONLY_ARGS=()
if [ -n "$ONLY" ]; then
  OUT="$HERE/RESULTS-partial.md"
  ONLY_ARGS=(--only "$ONLY")
fi
# Whether a part that needs this build is selected.
wants() {
  [ -z "$ONLY" ] && return 0
  local p
  for p in "$@"; do
    case ",$ONLY," in *",$p,"*) return 0 ;; esac
  done
  return 1
}

# ---- tools ---------------------------------------------------------------
. scripts/need.sh  # need TOOL PACKAGE
scripts/deps-redis.sh
need redis-cli redis-tools
need redis-benchmark redis-tools
for tool in cargo node npm python3; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "run.sh: $tool not found; the comparison needs cargo, node, npm and python3" >&2
    exit 2
  fi
done

# Redis on core 0, every client on core 1 (when there are two cores to split).
PIN_REDIS=()
PIN_CLIENT=()
if command -v taskset >/dev/null 2>&1 && [ "$(nproc)" -ge 2 ]; then
  PIN_REDIS=(taskset -c 0)
  PIN_CLIENT=(taskset -c 1)
fi

# A scratch folder, and everything this run starts stopped on exit.
WORK="$(mktemp -d "${TMPDIR:-/tmp}/throttlegate-compare.XXXXXX")"
REDIS_PID=""
COMPARE_PID=""
cleanup() {
  if [ -n "$COMPARE_PID" ] && kill -0 "$COMPARE_PID" 2>/dev/null; then
    kill "$COMPARE_PID" 2>/dev/null || true
    wait "$COMPARE_PID" 2>/dev/null || true
  fi
  if [ -n "$REDIS_PID" ] && kill -0 "$REDIS_PID" 2>/dev/null; then
    kill "$REDIS_PID" 2>/dev/null || true
    wait "$REDIS_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"

# ---- peers and builds (release) -------------------------------------------
# A part whose build fails is reported as not run (never measured with a stale build).
BROKEN=()
if wants node node-algos burst latency; then
echo "== Node: peers from package.json's devDependencies, addon built in release" >&2
if [ ! -f node_modules/rate-limiter-flexible/package.json ] || [ ! -f node_modules/ioredis/package.json ]; then
  npm ci --no-audit --no-fund >&2
fi
if ! THROTTLEGATE_BUILD_PROFILE=release npm run --silent build >&2; then
  echo "run.sh: the Node addon did not build; the Node parts will not run" >&2
  BROKEN+=(--broken "node=the Node addon did not build (npm run build failed)")
  BROKEN+=(--broken "node-algos=the Node addon did not build (npm run build failed)")
  BROKEN+=(--broken "latency=the Node addon did not build (npm run build failed)")
fi
fi

if wants python python-algos burst latency reserve; then
echo "== Python: .venv with limits, redis, hiredis and the package (pip install .)" >&2
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check "maturin>=1.9,<2" limits redis hiredis >&2
# One wheel (release, as `pip install .` builds it): installed into .venv, and
# unpacked into a private folder that the benchmark imports first, so that
# another install into the shared .venv during the run cannot change what is measured.
PIP=(.venv/bin/python -m pip --disable-pip-version-check)
if "${PIP[@]}" wheel --quiet --no-deps --wheel-dir "$WORK/wheel" . >&2 \
  && "${PIP[@]}" install --quiet --force-reinstall --no-deps "$WORK"/wheel/throttlegate-*.whl >&2 \
  && "${PIP[@]}" install --quiet --no-deps --target "$WORK/python" "$WORK"/wheel/throttlegate-*.whl >&2; then
  :
else
  echo "run.sh: the Python package did not build; the Python parts will not run" >&2
  BROKEN+=(--broken "python=the Python package did not build (pip wheel . failed)")
  BROKEN+=(--broken "python-algos=the Python package did not build (pip wheel . failed)")
  BROKEN+=(--broken "burst=the Python package did not build (pip wheel . failed)")
  BROKEN+=(--broken "latency=the Python package did not build (pip wheel . failed)")
  BROKEN+=(--broken "reserve=the Python package did not build (pip wheel . failed)")
fi
fi

SCRIPT_ARGS=()
if wants redis memory algos concurrency; then
echo "== Rust: the CLI, release" >&2
cargo build -q --release -p throttlegate-cli >&2
# The exact script every check runs, as the CLI prints it (for the parts that send it themselves).
cargo run -q --release -p throttlegate-cli -- script >"$WORK/throttlegate.lua"
SCRIPT_ARGS=(--script "$WORK/throttlegate.lua")
fi
if wants reserve; then
  echo "== Rust: the hot-key example (core/examples/reserve_hot.rs), release" >&2
  # Copied into the scratch folder: another build cannot replace it during the run.
  if cargo build -q --release -p throttlegate --example reserve_hot >&2; then
    cp "$CARGO_TARGET_DIR/release/examples/reserve_hot" "$WORK/reserve_hot"
  else
    echo "run.sh: the hot-key example did not build; the reserve part will run from Python only" >&2
  fi
fi
if wants rust; then echo "== Rust: the Criterion benchmark, release" >&2; fi
if wants rust && ! cargo bench -q -p throttlegate --bench check --no-run >&2; then
  echo "run.sh: the Criterion benchmark did not build; the Rust part will not run" >&2
  BROKEN+=(--broken "rust=the Criterion benchmark did not build")
fi

# ---- a private redis-server ------------------------------------------------
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

for attempt in 1 2 3 4 5; do
  PORT="$(free_port)"
  "${PIN_REDIS[@]}" redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$WORK" --logfile "$WORK/redis.log" &
  REDIS_PID=$!
  for _ in $(seq 1 100); do
    if redis-cli -h 127.0.0.1 -p "$PORT" ping >/dev/null 2>&1; then break; fi
    kill -0 "$REDIS_PID" 2>/dev/null || break
    sleep 0.05
  done
  if redis-cli -h 127.0.0.1 -p "$PORT" ping >/dev/null 2>&1; then break; fi
  # Lost the port to another process between picking and binding: try another.
  kill "$REDIS_PID" 2>/dev/null || true
  wait "$REDIS_PID" 2>/dev/null || true
  REDIS_PID=""
  if [ "$attempt" = 5 ]; then
    echo "run.sh: redis-server did not start; its log:" >&2
    cat "$WORK/redis.log" >&2 || true
    exit 1
  fi
done
echo "== redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') on 127.0.0.1:$PORT" \
  "${PIN_REDIS[*]:+(${PIN_REDIS[*]})}, clients ${PIN_CLIENT[*]:-unpinned}" >&2

# ---- the comparison ---------------------------------------------------------
# In the background so that an interrupt stops it too (its clients fail fast
# once the server is gone).
python3 "$HERE/compare.py" \
  --port "$PORT" \
  --seconds "$SECS" \
  --work "$WORK" \
  ${SCRIPT_ARGS[@]:+"${SCRIPT_ARGS[@]}"} \
  --out "$OUT" \
  ${ONLY_ARGS[@]:+"${ONLY_ARGS[@]}"} \
  ${PIN_CLIENT[@]:+--pin-client "${PIN_CLIENT[*]}"} \
  ${PIN_REDIS[@]:+--pin-redis "${PIN_REDIS[*]}"} \
  "${BROKEN[@]}" &
COMPARE_PID=$!
wait "$COMPARE_PID"
