#!/usr/bin/env bash
# Cross-language soak: Rust, Python and Node hammer one redis-server at once
# for SOAK_SECONDS (default 60) over many keys; then no key may have been
# admitted more than its limit, no call may have failed, and every process's
# memory must have stayed flat. Needs the Python package in .venv and the Node
# addon built (make test-python and make test-node do both).
set -euo pipefail
cd "$(dirname "$0")/../.."

SECONDS_TO_RUN="${SOAK_SECONDS:-60}"
KEYS="${SOAK_KEYS:-2000}"
OUT="$(mktemp -d)"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$OUT" >/dev/null 2>&1 &
REDIS_PID=$!
cleanup() { kill "$REDIS_PID" 2>/dev/null || true; wait "$REDIS_PID" 2>/dev/null || true; rm -rf "$OUT"; }
trap cleanup EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
URL="redis://127.0.0.1:$PORT"
POLICY=tests/soak/policy.toml

cargo build -q -p throttlegate --example soak
echo "soak: Rust, Python and Node against $URL for ${SECONDS_TO_RUN}s over $KEYS keys"
target/debug/examples/soak "$POLICY" "$URL" "$SECONDS_TO_RUN" "$KEYS" > "$OUT/rust.json" &
R=$!
.venv/bin/python tests/soak/soak.py "$POLICY" "$URL" "$SECONDS_TO_RUN" "$KEYS" > "$OUT/python.json" &
P=$!
node tests/soak/soak.js "$POLICY" "$URL" "$SECONDS_TO_RUN" "$KEYS" > "$OUT/node.json" &
N=$!
wait $R && wait $P && wait $N
echo "redis: $(redis-cli -p "$PORT" dbsize) keys, $(redis-cli -p "$PORT" info memory | grep '^used_memory_human' | tr -d '\r')"
python3 tests/soak/check.py 100 150 "$OUT/rust.json" "$OUT/python.json" "$OUT/node.json"
