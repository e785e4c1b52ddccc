#!/usr/bin/env bash
# The C library's tests, as a C user sees it:
#  1. build the crate (dev profile) and check the committed header is fresh;
#  2. install header, libthrottlegate.{so,a} and throttlegate.pc into
#     target/c-prefix (like `make install` would);
#  3. compile the header as C11 and as C++, included twice;
#  4. compile the C tests and examples/c with cc against that prefix
#     (pkg-config), start a redis-server on a free loopback port, run them;
#  5. run them again under valgrind (leaks and invalid accesses are errors).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CARGO=${CARGO:-cargo}
CC=${CC:-cc}
CXX=${CXX:-c++}
PREFIX=$ROOT/target/c-prefix
BUILD=$ROOT/target/c-tests
CRATE=$ROOT/bindings/c

step() { printf '\n== test-c: %s\n' "$*"; }

# Debian packages this script needs beyond a C compiler and redis-server.
need() {
  command -v "$1" >/dev/null 2>&1 && return 0
  echo "$1 not found: installing Debian's $2 package" >&2
  local sudo=""
  if [ "$(id -u)" != "0" ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$2" >/dev/null
}
need c++ g++
need pkg-config pkg-config
need valgrind valgrind

step "cargo test (unit tests, header staleness) and build with test hooks"
"$CARGO" test -p throttlegate-c
"$CARGO" build -p throttlegate-c --features test-hooks

step "install into $PREFIX"
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
rm -rf "$PREFIX" "$BUILD"
mkdir -p "$PREFIX/include" "$PREFIX/lib/pkgconfig" "$BUILD"
install -m 0644 "$CRATE/include/throttlegate.h" "$PREFIX/include/"
install -m 0755 target/debug/libthrottlegate_c.so "$PREFIX/lib/libthrottlegate.so.0"
ln -s libthrottlegate.so.0 "$PREFIX/lib/libthrottlegate.so"
install -m 0644 target/debug/libthrottlegate_c.a "$PREFIX/lib/libthrottlegate.a"
sed -e "s|@PREFIX@|$PREFIX|" -e "s|@VERSION@|$VERSION|" \
  "$CRATE/throttlegate.pc.in" >"$PREFIX/lib/pkgconfig/throttlegate.pc"
export PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig
CFLAGS_TG=$(pkg-config --cflags throttlegate)
LIBS_TG=$(pkg-config --libs throttlegate)
test "$(pkg-config --modversion throttlegate)" = "$VERSION"

step "header: C11 and C++, included twice, no warnings"
WARN=(-Wall -Wextra -Werror -pedantic)
"$CC" -std=c11 "${WARN[@]}" $CFLAGS_TG -c "$CRATE/tests/header_twice.c" -o "$BUILD/header_c.o"
"$CXX" -x c++ -std=c++11 "${WARN[@]}" $CFLAGS_TG -c "$CRATE/tests/header_twice.c" -o "$BUILD/header_cxx.o"

step "compile the C tests and examples/c against the installed library"
CSTD=(-std=c11 -g -O0 "${WARN[@]}")
"$CC" "${CSTD[@]}" $CFLAGS_TG -DTG_EXPECTED_VERSION="\"$VERSION\"" \
  "$CRATE/tests/test_throttlegate.c" -o "$BUILD/test_throttlegate" $LIBS_TG -lpthread
"$CC" "${CSTD[@]}" $CFLAGS_TG "$CRATE/tests/test_vectors.c" "$CRATE/tests/json.c" \
  -o "$BUILD/test_vectors" $LIBS_TG
# The example exactly as its README shows it, then linked statically.
"$CC" -I"$PREFIX/include" examples/c/check.c -o "$BUILD/example" -L"$PREFIX/lib" -lthrottlegate
STATIC_DEPS=$(pkg-config --static --libs-only-l throttlegate | sed 's/-lthrottlegate//')
"$CC" "${CSTD[@]}" $CFLAGS_TG examples/c/check.c -o "$BUILD/example_static" \
  "$PREFIX/lib/libthrottlegate.a" $STATIC_DEPS
if ldd "$BUILD/example_static" | grep -q libthrottlegate; then
  echo "example_static is linked to the shared library" >&2
  exit 1
fi

step "start redis-server on a free loopback port"
REDIS_PID=""
REDIS_DIR=$(mktemp -d)
cleanup() {
  if [ -n "$REDIS_PID" ]; then kill "$REDIS_PID" 2>/dev/null || true; wait "$REDIS_PID" 2>/dev/null || true; fi
  rm -rf "$REDIS_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP PIPE
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
redis_ping() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1" && printf 'PING\r\n' >&3 && read -r -t 2 reply <&3 && [[ $reply == +PONG* ]]) 2>/dev/null
}
for attempt in $(seq 1 20); do
  PORT=$((20000 + RANDOM % 30000))
  port_free "$PORT" || continue
  redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$REDIS_DIR" \
    --logfile "$REDIS_DIR/redis.log" &
  REDIS_PID=$!
  for _ in $(seq 1 100); do
    if redis_ping "$PORT"; then break 2; fi
    if ! kill -0 "$REDIS_PID" 2>/dev/null; then REDIS_PID=""; break; fi
    sleep 0.05
  done
  if [ -n "$REDIS_PID" ]; then kill "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null || true; REDIS_PID=""; fi
done
if [ -z "$REDIS_PID" ]; then echo "could not start redis-server" >&2; exit 1; fi
export TG_REDIS_URL="redis://127.0.0.1:$PORT"
export TG_REDIS_PORT=$PORT
echo "redis-server pid $REDIS_PID on $TG_REDIS_URL"

VECTORS=(tests/vectors/*.json "$CRATE"/tests/vectors/*.json)
export LD_LIBRARY_PATH=$PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

step "run"
"$BUILD/test_throttlegate"
"$BUILD/test_vectors" "${VECTORS[@]}"
"$BUILD/example" examples/c/rules.toml
"$BUILD/example_static" examples/c/rules.toml

step "run under valgrind"
VALGRIND=${VALGRIND:-valgrind}
# Leaks of every kind but "still reachable" are errors; the suppression
# file names the only "possibly lost" blocks allowed (see its comments).
# The fork test's child inherits memory of threads it does not have; it
# reports to its parent through a pipe, so its own valgrind output is muted.
VG=("$VALGRIND" --quiet --child-silent-after-fork=yes --error-exitcode=1 --leak-check=full --show-leak-kinds=definite,indirect,possible
    --errors-for-leak-kinds=definite,indirect,possible --suppressions="$CRATE/tests/valgrind.supp"
    --num-callers=40)
"${VG[@]}" "$BUILD/test_throttlegate"
"${VG[@]}" "$BUILD/test_vectors" "${VECTORS[@]}"
"${VG[@]}" "$BUILD/example" examples/c/rules.toml

echo
echo "test-c: every C test passed (natively and under valgrind)"
