#!/usr/bin/env bash
# make test-docs: the documentation site and every example in it.
#  1. build the site strictly (scripts/docs.sh: broken links fail it);
#  2. run every code block of docs/ and README.md (tests/docs/run_examples.py,
#     against the Python package in .venv and the Node package that
#     test-python and test-node built, the C library, the CLI, and a
#     redis-server it starts on a free loopback port);
#  3. compile and run the Rust blocks as doc tests (crate throttlegate-docs);
#  4. open the front page and a guide in Debian's headless Chromium;
#  5. `make demo`, the README's first command (make test runs the others:
#     docs here, dist in test-packaging).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/need.sh  # need TOOL PACKAGE
need chromium chromium
need cc gcc

t=$SECONDS
scripts/docs.sh
echo "test-docs: site built in $((SECONDS - t))s"

# The C library as test-c builds it last (same features, so nothing is rebuilt).
cargo build -q -p throttlegate-c --features test-hooks
# The Python package: make test's test-python installed it into .venv; alone, build it.
if ! .venv/bin/python -c 'import throttlegate' 2>/dev/null; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -r bindings/python/tests/requirements.txt
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps .
fi
# The Node package: make test's test-node built it; alone, build it.
if ! node -e 'require("./")' 2>/dev/null; then
  THROTTLEGATE_BUILD_PROFILE=${THROTTLEGATE_BUILD_PROFILE:-dev} npm ci --no-audit --no-fund
fi

t=$SECONDS
.venv/bin/python tests/docs/run_examples.py
cargo test -q -p throttlegate-docs --doc
node --test tests/docs/
echo "test-docs: examples and browser checks in $((SECONDS - t))s"

# The README's first command, as a new user runs it (the CLI is built already).
make --no-print-directory demo >"${TMPDIR:-/tmp}/tg-demo.$$" \
  || { cat "${TMPDIR:-/tmp}/tg-demo.$$"; rm -f "${TMPDIR:-/tmp}/tg-demo.$$"; exit 1; }
grep -q "allowed\|admitted" "${TMPDIR:-/tmp}/tg-demo.$$" \
  || { echo "make demo printed no simulation:" >&2; cat "${TMPDIR:-/tmp}/tg-demo.$$" >&2; rm -f "${TMPDIR:-/tmp}/tg-demo.$$"; exit 1; }
rm -f "${TMPDIR:-/tmp}/tg-demo.$$"
echo "test-docs: make demo ran"
