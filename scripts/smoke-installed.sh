#!/usr/bin/env bash
# The installed-artifact tests of the release workflow on the targets where
# scripts/test-packaging.sh (Linux/glibc, with Redis and the examples) does
# not run: macOS, Windows and Alpine (musl). With no Rust toolchain on PATH:
# a fresh venv installs the wheel from $DIST, an empty folder the main and
# platform npm tarballs, and each checks on the embedded backend; the C
# tarball is unpacked to a prefix and examples/c/check.c built through
# pkg-config and run (not on Windows); the command answers --version and a
# check. Redis, when a redis-server is on PATH, is checked too.
set -euo pipefail
cd "$(dirname "$0")/.."
DIST=$(cd "${DIST:-dist}" && pwd)
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "smoke-installed: $*" >&2; exit 1; }

# No toolchain: drop ~/.cargo/bin (and rustup's variables) from the search.
PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -E '[/\\]\.cargo[/\\]bin$' | paste -sd: -)
unset CARGO CARGO_HOME RUSTUP_HOME RUSTUP_TOOLCHAIN
export HOME=$WORK/home
mkdir -p "$HOME"
for tool in cargo rustc; do
  if command -v "$tool" >/dev/null 2>&1; then fail "$tool is reachable: $(command -v "$tool")"; fi
done

case "$(uname -s)" in
  Darwin) OS=macos ;;
  MINGW* | MSYS* | CYGWIN*) OS=windows ;;
  *) OS=linux ;;
esac
LIBC=gnu
if [ "$OS" = linux ] && { ldd --version 2>&1 || true; } | grep -q musl; then LIBC=musl; fi
PLATFORM=$(node -p 'const { platform, arch } = process;
  platform === "linux" ? `linux-${arch}-${process.argv[1]}` : platform === "win32" ? `win32-${arch}-msvc` : `${platform}-${arch}`' "$LIBC")

echo "== Python: the wheel in a fresh venv"
PY=python3
command -v "$PY" >/dev/null 2>&1 || PY=python
"$PY" -m venv "$WORK/venv"
VPY=$WORK/venv/bin/python
[ -x "$VPY" ] || VPY=$WORK/venv/Scripts/python.exe
"$VPY" -m pip install --quiet --disable-pip-version-check --only-binary :all: --no-index --find-links "$DIST" throttlegate
"$VPY" - "$VERSION" <<'EOF'
import sys
import throttlegate
assert throttlegate.__version__ == sys.argv[1], throttlegate.__version__
with throttlegate.Limiter({"rules": [{"name": "a", "key": "ip:{ip}", "limit": 1, "window": "1m"}]}) as limiter:
    got = [limiter.check({"ip": "203.0.113.7"}).allowed for _ in range(2)]
assert got == [True, False], got
print(f"wheel: throttlegate {throttlegate.__version__} works")
EOF

echo "== Node: the main and the $PLATFORM tarball in an empty folder"
mkdir -p "$WORK/app"
(
  cd "$WORK/app"
  npm init -y >/dev/null
  npm install --no-audit --no-fund "$DIST/throttlegate-$VERSION.tgz" "$DIST/throttlegate-$PLATFORM-$VERSION.tgz"
  node -e '
    const assert = require("node:assert/strict");
    const { Limiter, VERSION } = require("throttlegate");
    assert.equal(VERSION, process.argv[1]);
    const limiter = new Limiter({ rules: [{ name: "a", key: "ip:{ip}", limit: 1, window: "1m" }] });
    (async () => {
      assert.equal((await limiter.check({ ip: "203.0.113.7" })).allowed, true);
      assert.equal((await limiter.check({ ip: "203.0.113.7" })).allowed, false);
      console.log(`npm: throttlegate ${VERSION} works`);
    })().catch((e) => { console.error(e); process.exit(1); });' "$VERSION"
)

ARCHIVE=$(cd "$DIST" && ls throttlegate-cli-"$VERSION"-*.tar.gz)
ARCHIVE=${ARCHIVE#throttlegate-cli-"$VERSION"-}
ARCHIVE=${ARCHIVE%.tar.gz}

echo "== the command ($ARCHIVE)"
mkdir -p "$WORK/cli"
tar xzf "$DIST/throttlegate-cli-$VERSION-$ARCHIVE.tar.gz" -C "$WORK/cli" --strip-components=1
EXE=$WORK/cli/throttlegate
[ "$OS" != windows ] || EXE=$WORK/cli/throttlegate.exe
[ "$("$EXE" --version | tr -d '\r')" = "throttlegate $VERSION" ] || fail "throttlegate --version"
"$EXE" check --rules examples/rules.toml --redis memory:// ip=203.0.113.9 --json

if [ "$OS" != windows ]; then
  echo "== C: the tarball in a prefix, examples/c/check.c through pkg-config"
  mkdir -p "$WORK/prefix"
  tar xzf "$DIST/throttlegate-$VERSION-$ARCHIVE.tar.gz" -C "$WORK/prefix" --strip-components=1
  export PKG_CONFIG_PATH=$WORK/prefix/lib/pkgconfig
  [ "$(pkg-config --modversion throttlegate)" = "$VERSION" ] || fail "pkg-config --modversion"
  LIBDIR=$(pkg-config --variable=libdir throttlegate)
  # shellcheck disable=SC2046 # pkg-config's output is a list of flags
  cc examples/c/check.c -o "$WORK/check" $(pkg-config --cflags --libs throttlegate) -Wl,-rpath,"$LIBDIR"
  "$WORK/check" examples/c/rules.toml
  # The .pc file's Libs.private names Linux's system libraries.
  if [ "$OS" = linux ]; then
    # shellcheck disable=SC2046
    cc examples/c/check.c -o "$WORK/check_static" $(pkg-config --cflags throttlegate) "$LIBDIR/libthrottlegate.a" \
      $(pkg-config --static --libs-only-l throttlegate | sed 's/-lthrottlegate//')
    "$WORK/check_static" examples/c/rules.toml
  fi
fi

if command -v redis-server >/dev/null 2>&1; then
  echo "== Redis"
  redis-server --port 0 --bind 127.0.0.1 --unixsocket "$WORK/redis.sock" --save "" --daemonize no >/dev/null &
  REDIS=$!
  for _ in $(seq 1 100); do [ -S "$WORK/redis.sock" ] && break; sleep 0.05; done
  "$VPY" - "redis+unix://$WORK/redis.sock" <<'EOF'
import sys
import throttlegate
with throttlegate.Limiter({"rules": [{"name": "a", "key": "ip:{ip}", "limit": 1, "window": "1m"}]}, url=sys.argv[1]) as limiter:
    assert [limiter.check({"ip": "203.0.113.7"}).allowed for _ in range(2)] == [True, False]
print("wheel: checks against Redis")
EOF
  kill "$REDIS"
fi
echo "smoke-installed: every check passed"
