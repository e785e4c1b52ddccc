#!/usr/bin/env bash
# The Python package's suite: build and install it from the repository root
# with `pip install .` into .venv, check the stubs, run pytest (which starts
# its own redis-server on a free loopback port, TLS redis-servers with a
# private CA, and a local Redis Cluster).
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
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PY="$PWD/$VENV/bin/python"

"$PY" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$PY" -m pip install --quiet --disable-pip-version-check \
  "maturin>=1.9,<2" -r bindings/python/tests/requirements.txt

# The package with the test hooks (a panic on purpose) for the suite, built
# as `pip install .` builds it (maturin via pyproject.toml; cargo reuses the
# workspace's target/).
MATURIN_PEP517_ARGS="--features test-hooks" \
  "$PY" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps .

# From outside the source tree, so the installed package is what is tested.
cd bindings/python/tests
status=0
"$PY" -m pytest -q -p no:cacheprovider "$@" . || status=$?
cd "$OLDPWD"

# Then a real install from the root, as a user would: the shipped package
# has no test hooks, and its hand-written stubs match the extension module.
# Built last, so its release build is the one scripts/dist.sh packs.
"$PY" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps .
"$PY" -m mypy.stubtest throttlegate._native
"$PY" -c 'import throttlegate._native as n, sys; sys.exit("test hooks shipped" if hasattr(n, "_panic_for_tests") else 0)'
exit "$status"
