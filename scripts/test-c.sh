#!/usr/bin/env bash
# The C library's tests, as a C user sees it:
#  1. build the crate (dev profile) and check the committed header is fresh;
#  2. install header, libthrottlegate.{so,a} and throttlegate.pc into
#     target/c-prefix (like `make install` would);
#  3. compile the header as C11 and as C++, included twice;
#  4. compile the C tests and examples/c with cc against that prefix
#     (pkg-config); make a private CA, server and client certificates with
#     openssl; start on free loopback ports a redis-server (plain, plus TLS
#     with client certificates required) and a Redis Cluster of 3 primaries
#     and 3 replicas; run the tests, the vectors on every backend (the
#     bad-input vectors of tests/vectors/errors included), and the example;
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
. scripts/need.sh  # need TOOL PACKAGE
need c++ g++
need pkg-config pkg-config
need valgrind valgrind
need openssl openssl
need redis-cli redis-tools
need redis-sentinel redis-sentinel

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

step "certificates: a private CA, a server and a client certificate"
REDIS_DIR=$(mktemp -d)
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$REDIS_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP PIPE
TLS=$REDIS_DIR/tls
mkdir -p "$TLS"
# P-256 keys: quick to make, and accepted by both redis-server (OpenSSL)
# and the library (rustls). The CA is a v3 CA; leaves name their purpose.
tls_quiet() { "$@" >"$TLS/openssl.log" 2>&1 || { cat "$TLS/openssl.log" >&2; return 1; }; }
tls_quiet openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj "/CN=throttlegate test CA" -keyout "$TLS/ca.key" -out "$TLS/ca.pem" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
leaf() { # name, extensions
  tls_quiet openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/CN=$1" -keyout "$TLS/$1.key" -out "$TLS/$1.csr"
  printf '%s\n' "$2" >"$TLS/$1.ext"
  tls_quiet openssl x509 -req -in "$TLS/$1.csr" -CA "$TLS/ca.pem" -CAkey "$TLS/ca.key" \
    -CAcreateserial -days 2 -extfile "$TLS/$1.ext" -out "$TLS/$1.pem"
}
leaf server "subjectAltName=DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth"
leaf client "extendedKeyUsage=clientAuth"

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
redis_ping() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1" && printf 'PING\r\n' >&3 && read -r -t 2 reply <&3 && [[ $reply == +PONG* ]]) 2>/dev/null
}
# Start a redis-server on a free loopback port with extra arguments and wait
# until it answers; sets STARTED_PORT. With "tls" first, it also listens
# for TLS on STARTED_TLS_PORT, with the server certificate, and accepts only
# clients with a certificate from the test CA.
start_redis() {
  local tls="" port tls_port="" pid dir args
  if [ "${1:-}" = tls ]; then tls=1; shift; fi
  for _ in $(seq 1 20); do
    port=$((20000 + RANDOM % 30000))
    port_free "$port" || continue
    args=(--port "$port")
    if [ -n "$tls" ]; then
      tls_port=$((20000 + RANDOM % 30000))
      if [ "$tls_port" = "$port" ] || ! port_free "$tls_port"; then continue; fi
      args+=(--tls-port "$tls_port" --tls-cert-file "$TLS/server.pem" --tls-key-file "$TLS/server.key"
             --tls-ca-cert-file "$TLS/ca.pem" --tls-auth-clients yes)
    fi
    dir=$REDIS_DIR/$port
    mkdir -p "$dir"
    redis-server "${args[@]}" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
      --logfile "$dir/redis.log" "$@" &
    pid=$!
    for _ in $(seq 1 100); do
      if redis_ping "$port"; then
        PIDS+=("$pid")
        STARTED_PORT=$port
        STARTED_TLS_PORT=$tls_port
        return 0
      fi
      if ! kill -0 "$pid" 2>/dev/null; then pid=""; break; fi
      sleep 0.05
    done
    if [ -n "$pid" ]; then kill "$pid"; wait "$pid" 2>/dev/null || true; fi
  done
  echo "could not start redis-server $*" >&2
  return 1
}

step "start redis-server (plain and TLS) on free loopback ports"
start_redis tls
export TG_REDIS_URL="redis://127.0.0.1:$STARTED_PORT"
export TG_REDIS_PORT=$STARTED_PORT
# An address, not a name: the server certificate names both, and glibc's
# resolver keeps per-thread state that valgrind would report at exit.
export TG_TLS_URL="rediss://127.0.0.1:$STARTED_TLS_PORT"
export TG_TLS_DIR=$TLS
echo "redis-server on $TG_REDIS_URL and $TG_TLS_URL"

step "start a Redis Cluster: 3 primaries, 3 replicas"
CLUSTER_NODES=()
for _ in 1 2 3 4 5 6; do
  start_redis --cluster-enabled yes --cluster-node-timeout 1000 --cluster-replica-validity-factor 0 \
    --repl-diskless-sync-delay 0
  CLUSTER_NODES+=("127.0.0.1:$STARTED_PORT")
done
if ! redis-cli --cluster create "${CLUSTER_NODES[@]}" --cluster-replicas 1 --cluster-yes \
  >"$REDIS_DIR/cluster-create.log" 2>&1; then
  cat "$REDIS_DIR/cluster-create.log" >&2
  exit 1
fi
# Every node must agree that all slots are served before the first call.
cluster_ok() {
  local node info
  for node in "${CLUSTER_NODES[@]}"; do
    info=$(redis-cli -h 127.0.0.1 -p "${node##*:}" CLUSTER INFO 2>/dev/null) || return 1
    [[ $info == *cluster_state:ok* && $info == *cluster_slots_ok:16384* ]] || return 1
  done
}
for _ in $(seq 1 200); do
  if cluster_ok; then break; fi
  sleep 0.1
done
if ! cluster_ok; then echo "the Redis Cluster did not become ok" >&2; exit 1; fi
export TG_REDIS_CLUSTER_URL="redis+cluster://$(IFS=,; echo "${CLUSTER_NODES[*]}")"
echo "Redis Cluster on $TG_REDIS_CLUSTER_URL"

step "start a redis-sentinel watching a redis-server of its own"
start_redis
SENTINEL_PRIMARY=$STARTED_PORT
for _ in $(seq 1 20); do
  port=$((20000 + RANDOM % 30000))
  port_free "$port" || continue
  mkdir -p "$REDIS_DIR/sentinel-$port"
  printf 'port %s\nbind 127.0.0.1\ndir %s\nsentinel monitor tg 127.0.0.1 %s 1\n' \
    "$port" "$REDIS_DIR/sentinel-$port" "$SENTINEL_PRIMARY" >"$REDIS_DIR/sentinel-$port/sentinel.conf"
  redis-sentinel "$REDIS_DIR/sentinel-$port/sentinel.conf" >/dev/null 2>&1 &
  PIDS+=("$!")
  for _ in $(seq 1 100); do
    if redis_ping "$port"; then break 2; fi
    sleep 0.05
  done
done
redis_ping "$port" || { echo "could not start redis-sentinel" >&2; exit 1; }
export TG_SENTINEL_URL="redis+sentinel://127.0.0.1:$port/tg"
echo "Sentinel on $TG_SENTINEL_URL"

# The bad-input vectors (tests/vectors/errors) go through the same runner,
# which tells them by their `cases` array.
VECTORS=(tests/vectors/*.json "$CRATE"/tests/vectors/*.json tests/vectors/errors/*.json)
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
# Wall-clock bounds (a call within its timeout) get a valgrind-sized slack.
TG_UNDER_VALGRIND=1 TG_TIMING_SLACK_MS=3000 "${VG[@]}" "$BUILD/test_throttlegate"
"${VG[@]}" "$BUILD/test_vectors" "${VECTORS[@]}"
"${VG[@]}" "$BUILD/example" examples/c/rules.toml

echo
echo "test-c: every C test passed (natively and under valgrind)"
