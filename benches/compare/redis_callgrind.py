#!/usr/bin/env python3
"""Redis's own instructions per check, counted by callgrind (repeatable on a busy machine).

Starts redis-server under `valgrind --tool=callgrind` on a free port, loads
throttlegate's check script (composed from `lua/` as `core/src/backend/script.rs`
does, so an edited script is measured without a build) and `minimal.lua`, and for
each case sends a warm-up, zeroes the counters, sends N calls pipelined 50 deep,
and reads the instructions of the whole server (command handling included) per call:

    python3 benches/compare/redis_callgrind.py [N=1000] [case ...]

`TG_LUA_DIR=DIR` measures the script composed from another copy of `lua/` (a
previous version, to compare in one run).

Cases: `min-fresh`, `min-warm` (minimal.lua), `s-fresh`, `s-warm` (one sliding-window
log rule, the short form the library sends; `t-fresh`, `t-warm` its terse form), `c4-fresh`, `c4-warm` (4 stacked log rules,
the general form; `cN-...` for N rules; `nN-...` the same in their short form, mode "n"; `mN-...` mode "n" with each rule's own limit and window), `s-denied` (one rule at its limit), `f-fresh`,
`f-warm` (one fixed window, mode "f"; `i-...` its terse form), `rlf-fresh`, `rlf-warm` (rate-limiter-flexible's
RateLimiterRedis script, read from `node_modules`), `floorN-...` (`floor_log.lua`: only the
commands of N log checks, no logic). "fresh": every call on a new key;
"warm": 200 keys that already hold 5 or more entries.
"""

import os
import re
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = ["deadline", "single_rule", "args", "sliding_window_log", "token_bucket", "sliding_window",
         "period_counter", "concurrency", "replay", "extensions", "settle", "reserve", "check"]


def script() -> str:
    lua = Path(os.environ.get("TG_LUA_DIR", ROOT / "lua"))
    return "#!lua\n" + "\n".join((lua / f"{p}.lua").read_text() for p in PARTS)


def peer_script() -> str | None:
    """rate-limiter-flexible's RateLimiterRedis script, from `node_modules` (None when not installed)."""
    src = ROOT / "node_modules/rate-limiter-flexible/lib/RateLimiterRedis.js"
    if not src.exists():
        return None
    m = re.search(r"const incrTtlLuaScript = `(.*?)`", src.read_text(), re.S)
    return m.group(1).replace("\\\n", "\n") if m else None


def enc(*args) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(f"${len(b)}\r\n".encode() + b + b"\r\n")
    return b"".join(out)


class Conn:
    def __init__(self, port: int):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.f = self.s.makefile("rb")

    def read(self):
        line = self.f.readline()
        t, rest = line[:1], line[1:-2]
        if t in (b"+", b"-"):
            if t == b"-":
                raise RuntimeError(rest.decode())
            return rest.decode()
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)[:-2]
            return data.decode()
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError(f"bad reply {line!r}")

    def call(self, *args):
        self.s.sendall(enc(*args))
        return self.read()

    def pipeline(self, cmds, depth=50):
        for i in range(0, len(cmds), depth):
            chunk = cmds[i:i + depth]
            self.s.sendall(b"".join(enc(*c) for c in chunk))
            for _ in chunk:
                self.read()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    cases = sys.argv[2:] or ["min-fresh", "s-fresh", "t-fresh", "min-warm", "s-warm", "t-warm", "c4-fresh", "c4-warm", "s-denied"]
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="tg-cg-"))
    out = tmp / "callgrind.out"
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "redis-server", "--port", str(port),
         "--save", "", "--appendonly", "no", "--dir", str(tmp)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(300):
            try:
                c = Conn(port)
                c.call("PING")
                break
            except OSError:
                time.sleep(0.1)
        sha_tg = c.call("SCRIPT", "LOAD", script())
        sha_min = c.call("SCRIPT", "LOAD", (Path(__file__).parent / "minimal.lua").read_text())
        rlf = peer_script()
        sha_rlf = c.call("SCRIPT", "LOAD", rlf) if rlf else None
        sha_floor = c.call("SCRIPT", "LOAD", (Path(__file__).parent / "floor_log.lua").read_text())
        rng = random.Random(7)
        results = {}
        for case in cases:
            kind, state = case.split("-")

            def call(key_i: int, i: int):
                if kind.startswith("floor"):
                    rules = int(kind[5:])
                    keys = [f"{chr(97 + r)}:{key_i}" for r in range(rules)]
                    return ["EVALSHA", sha_floor, rules, *keys]
                if kind == "min":
                    return ["EVALSHA", sha_min, 1, f"m:{key_i}", 1000, 60_000_000, f"id{i}"]
                if kind in ("f", "i"):
                    return ["EVALSHA", sha_tg, 1, f"f:{key_i}", kind, 1_000_000, 60_000_000, 1]
                if kind == "rlf":
                    # rate-limiter-flexible's RateLimiterRedis script (TG_RLF_LUA), its arguments.
                    return ["EVALSHA", sha_rlf, 1, f"r:{key_i}", 1, 60, 1_000_000, 60]
                if kind in ("s", "t"):
                    return ["EVALSHA", sha_tg, 1, f"t:{key_i}", kind, f"id{i}", 1000, 60_000_000]
                rules = int(kind[1:])
                keys = [f"{chr(97 + r)}:{key_i}" for r in range(rules)]
                if kind.startswith("n"):
                    return ["EVALSHA", sha_tg, rules, *keys, "n", f"id{i}", "", *([1000, 60_000_000] * rules)]
                if kind.startswith("m"):
                    # Mode "n" with a limit and a window of each rule's own.
                    spec = [v for r in range(rules) for v in (1000 + r, 60_000_000 + r * 1_000_000)]
                    return ["EVALSHA", sha_tg, rules, *keys, "n", f"id{i}", "", *spec]
                return ["EVALSHA", sha_tg, rules, *keys, "c", "", f"id{i}", 1, *(["w", 1000, 60_000_000] * rules)]

            def make(m: int):
                if state == "fresh":
                    return [call(rng.randrange(10**12), i) for i in range(m)]
                if state == "warm":
                    return [call(i % 200, i) for i in range(m)]
                return [call(0, i) for i in range(m)]

            c.call("FLUSHALL")
            if state == "warm":
                c.pipeline([call(i % 200, i) for i in range(200 * 5)])
            if state == "denied":
                c.pipeline([call(0, i) for i in range(1000)])
            c.pipeline(make(200))
            cmds = make(n)
            subprocess.run(["callgrind_control", "-z", str(server.pid)], capture_output=True, check=True)
            c.pipeline(cmds)
            for f in tmp.glob("callgrind.out*"):
                f.unlink()
            subprocess.run(["callgrind_control", "-d", str(server.pid)], capture_output=True, check=True)
            total = 0
            for f in tmp.glob("callgrind.out*"):
                for line in f.read_text(errors="replace").splitlines():
                    if line.startswith("totals:") or line.startswith("summary:"):
                        total = max(total, int(line.split()[1]))
            results[case] = total / n
            print(f"{case:10s} {total / n:10,.0f} instructions per call", flush=True)
        return 0
    finally:
        os.killpg(server.pid, 15)
        server.wait()


if __name__ == "__main__":
    sys.exit(main())
