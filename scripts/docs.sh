#!/usr/bin/env bash
# make docs: the documentation site from docs/ into target/site.
#
# MkDocs with the Material theme, from PyPI into target/docs-venv at the
# versions pinned in docs/requirements.txt (a pip install of pure-Python
# wheels: seconds, where building a Rust tool from source would take minutes
# on every fresh CI machine). The build is strict: a broken internal link or
# anchor, a page outside the navigation, or a chart the hooks cannot draw fails
# it. scripts/docs_hooks.py draws the algorithm pictures with the CLI's
# `simulate`, the performance charts from the tables, renders the Python and
# TypeScript signatures, and adds rustdoc's output under api/rust/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CARGO=${CARGO:-cargo}
PYTHON=${PYTHON:-python3}
VENV=target/docs-venv

if [ ! -x "$VENV/bin/mkdocs" ] || ! cmp -s docs/requirements.txt "$VENV/requirements.txt"; then
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r docs/requirements.txt
  cp docs/requirements.txt "$VENV/requirements.txt"
fi

"$CARGO" build -q -p throttlegate-cli
"$CARGO" doc -q -p throttlegate --no-deps
rm -rf target/site
NO_MKDOCS_2_WARNING=1 THROTTLEGATE_CLI="$ROOT/target/debug/throttlegate" "$VENV/bin/mkdocs" build --strict
echo "make docs: the site is in target/site (open target/site/index.html)"
