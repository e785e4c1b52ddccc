# Sourced by benches/serve/run.sh and callgrind.sh: a scratch folder removed
# on exit with every process started into PIDS, free_port / wait_port, and
# the benchmark's envoyproxy/ratelimit rules in $WORK/rules.yaml (one
# descriptor, a limit no run reaches).
#
#   . benches/serve/common.sh NAME     (the scratch folder's name)
WORK="$(mktemp -d "${TMPDIR:-/tmp}/throttlegate-serve-$1.XXXXXX")"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Up to a minute: a server under valgrind takes that long to start.
wait_port() { for _ in $(seq 1 600); do (echo >/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }

cat > "$WORK/rules.yaml" <<'YAML'
domain: bench
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 1000000000 }
YAML
