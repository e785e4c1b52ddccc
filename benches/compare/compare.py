#!/usr/bin/env python3
"""The side-by-side comparison behind `benches/compare/run.sh` (which installs
the peers, builds in release and starts the redis-server this talks to).

Measures, in one run against one redis-server:
  1. the ceiling: a minimal single-key sliding-log script (minimal.lua) and
     throttlegate's own script (1 rule, 4 stacked rules) through
     `redis-benchmark` EVALSHA over 10,000 keys;
  2. Redis's own cost per check, `usec_per_call` of evalsha from INFO commandstats;
  3. Redis memory per tracked key (MEMORY USAGE), token bucket and sliding log;
  4. Node: benches/node/bench.js next to rate-limiter-flexible;
  5. Python: benches/python/bench.py next to `limits`;
  6. the embedded backend from Rust next to `governor` (Criterion);
  7. every algorithm on Redis (part `algos`): memory per key at 1 to 100,000
     admitted units, Redis's cost per check with the window full at limits
     100, 10,000 and 1,000,000, and of an admitted check next to a minimal
     INCR+PEXPIRE script (minimal_incr.lua);
  8. the fixed window from Node next to RateLimiterRedis (part `node-algos`);
  9. the sliding window of counters from Python next to `limits`'
     SlidingWindowCounterRateLimiter (part `python-algos`);
 10. every one's over-admission on a boundary-burst trace (part `burst`:
     burst.py and burst.js);
 11. latency percentiles per check under an open-loop load at 25%, 50% and
     90% of saturation (part `latency`: benches/node/latency.js next to
     RateLimiterRedis, benches/python/latency.py next to `limits`' asyncio
     moving window);
 12. one hot key, 4 processes of Python then of Rust (core/examples/
     reserve_hot.rs), every algorithm with and without `reserve` (part
     `reserve`: reserve.py): checks/s, script runs per check, admitted against
     each algorithm's bound, next to `redis-benchmark -P 16 INCR`.
 13. concurrency rules (part `concurrency`): Redis's cost per check and per
     release next to a sliding-window log check, and memory per key as slots
     are held (bounded by the limit).
Writes a markdown report (--out) and prints it. Standard library only.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import secrets
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

KEYS = 10_000  # distinct keys per rule (redis-benchmark -r)
LIMIT = 1000  # per window
WINDOW_US = 60_000_000  # 60 s
REPEATS = 3  # every Redis measurement, alternating scripts; medians reported
RAND = "__rand_int__"
# A call id unique per call in practice: two independent random numbers.
CALL_ID = RAND + RAND

# (label, clients, pipeline, rough checks/s of the minimal script, for the warm-up size)
LOADS = [
    ("1 connection", 1, 1, 15_000),
    ("50 connections", 50, 1, 60_000),
    ("50 connections, pipeline 16", 50, 16, 120_000),
]

PARTS = ["redis", "memory", "node", "python", "rust", "algos", "node-algos", "python-algos", "burst", "latency",
         "reserve", "concurrency"]
# The parts that send throttlegate's script themselves (and need --script).
SCRIPT_PARTS = {"redis", "memory", "algos", "concurrency"}

GOALS: list[tuple[str, str, str]] = []  # (goal, measured, met) for the summary
AT_START: dict[str, dict[str, str]] = {}  # the native library each part loaded when it started


# ---------------------------------------------------------------------------
# A minimal RESP2 client (the comparison needs no Python packages of its own).


class RedisError(Exception):
    """An error reply from Redis."""


class Resp:
    """One connection to Redis: commands in, replies out, pipelined on request."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.file = self.sock.makefile("rb")

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    @staticmethod
    def encode(args: tuple[Any, ...] | list[Any]) -> bytes:
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            b = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
        return b"".join(out)

    def read(self) -> Any:
        line = self.file.readline()
        if not line:
            raise ConnectionError("redis-server closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.file.read(n + 2)[:-2]
            return data.decode()
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise ConnectionError(f"unexpected reply from redis-server: {line!r}")

    def pipeline(self, commands: list[list[Any]]) -> list[Any]:
        self.sock.sendall(b"".join(self.encode(c) for c in commands))
        replies = [self.read() for _ in commands]
        for r in replies:
            if isinstance(r, RedisError):
                raise r
        return replies

    def call(self, *args: Any) -> Any:
        return self.pipeline([list(args)])[0]


# ---------------------------------------------------------------------------
# Helpers


def median(values: list[float]) -> float:
    return statistics.median(values)


def fmt_int(x: float) -> str:
    return f"{x:,.0f}"


def met(ok: bool) -> str:
    return "yes" if ok else "**no**"


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, text=True, capture_output=True, cwd=ROOT, **kw)


def run_part(cmd: list[str], timeout: float, merge_stderr: bool = False,
             env: dict[str, str] | None = None) -> tuple[int | str, str]:
    """Run one part's benchmark in its own process group; on timeout the whole
    group is killed. Returns the exit status (or "timed out") and the output."""
    proc = subprocess.Popen(cmd, cwd=ROOT, text=True, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge_stderr else sys.stderr, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return f"no answer after {timeout:.0f} s (killed)", out
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def built_artifacts(part: str, work: Path) -> dict[str, str]:
    """sha256 of the native library a part loads (in a shared checkout another
    build can replace it while this run measures)."""
    if part == "node":
        paths = [ROOT / "bindings/node/throttlegate.node"]
    elif part == "python":
        paths = sorted(work.glob("python/throttlegate/_native*.so"))
    elif part == "latency":
        return {**built_artifacts("node", work), **built_artifacts("python", work)}
    else:
        return {}
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.is_file()}


def part_timeout(seconds: float) -> float:
    """The most a Node, Python or Criterion run may take before it counts as hung."""
    return 300 + 60 * seconds


def server_now_us(r: Resp) -> int:
    t = r.call("TIME")
    return int(t[0]) * 1_000_000 + int(t[1])


def commandstats_evalsha(r: Resp) -> dict[str, float]:
    info = r.call("INFO", "commandstats")
    for line in info.splitlines():
        if line.startswith("cmdstat_evalsha:"):
            return {k: float(v) for k, v in (kv.split("=") for kv in line.split(":", 1)[1].split(","))}
    return {"calls": 0.0, "usec": 0.0, "usec_per_call": 0.0, "rejected_calls": 0.0, "failed_calls": 0.0}


# ---------------------------------------------------------------------------
# 1 and 2: redis-benchmark EVALSHA, throughput and usec_per_call


def part_rows(label: str, cmd: list[str], status: int, stdout: str, result: Path):
    """The rows a benchmark part wrote to `result`; or None and the lines that
    report its failure (the failure is also recorded against its goals)."""
    if status != 0 or not result.exists():
        msg = f"FAILED: `{shlex.join(cmd)}`: exit status {status}."
        progress("  " + msg)
        GOALS.append((f"{label} (all goals)", "failed", "**failed**"))
        return None, [msg, "", "```", stdout.strip()[-2000:], "```", ""]
    data = json.loads(result.read_text())
    return (data["rows"] if isinstance(data, dict) else data), []


def script_cases(sha_min: str, sha_tg: str) -> list[tuple[str, str, list[str]]]:
    return [
        ("minimal", sha_min, [sha_min, "1", f"m:{RAND}", str(LIMIT), str(WINDOW_US), CALL_ID]),
        # One sliding-window rule: the short form the library sends (mode "t", its terse
        # admission, once it has read the server's time in the last second; "s" before).
        ("throttlegate, 1 rule", sha_tg, [sha_tg, "1", f"t1:{RAND}", "t", CALL_ID, str(LIMIT), str(WINDOW_US)]),
        # Four stacked logs: their short form (mode "n", one integer for an admission), which
        # the library sends under the same condition; the general form ("c") before it.
        (
            "throttlegate, 4 rules",
            sha_tg,
            [sha_tg, "4", *(f"t4{c}:{RAND}" for c in "abcd"), "n", CALL_ID, "", *([str(LIMIT), str(WINDOW_US)] * 4)],
        ),
    ]


def redis_benchmark(port: int, pin: list[str], clients: int, pipeline: int, n: int, args: list[str]) -> float:
    cmd = [*pin, "redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", str(clients), "-P", str(pipeline),
           "-n", str(n), "-r", str(KEYS), "--csv", "EVALSHA", *args]
    p = run(cmd, timeout=60 + 20 * n / 1000)  # far beyond any plausible run: a hang, not a slow machine
    if p.returncode != 0:
        raise RuntimeError(f"redis-benchmark failed ({p.returncode}): {p.stderr.strip() or p.stdout.strip()}")
    rows = [line for line in p.stdout.splitlines() if line.startswith('"EVALSHA')]
    if not rows:
        raise RuntimeError(f"redis-benchmark printed no result: {p.stdout.strip()} {p.stderr.strip()}")
    return float(rows[-1].split('","')[1])


def check_script_shapes(r: Resp, cases: list[tuple[str, str, list[str]]]) -> None:
    """One call of each case by hand: the argument layout is the one the script documents."""
    for name, _sha, args in cases:
        concrete = [a.replace(RAND, "000000000042") for a in args]
        reply = r.call("EVALSHA", *concrete)
        rules = int(concrete[1])
        if name == "minimal":
            ok = reply == 1
        elif concrete[3] == "t":
            # A terse admission: the bare remaining.
            ok = isinstance(reply, int) and reply == LIMIT - 1
        elif concrete[2 + rules] == "n":
            # Every rule's remaining in one integer, rule i's digit in base LIMIT + 1.
            ok = isinstance(reply, int) and reply == sum((LIMIT - 1) * (LIMIT + 1) ** i for i in range(rules))
        else:
            ok = isinstance(reply, list) and len(reply) == 2 + 4 * rules and all(
                reply[2 + 4 * i] == 1 for i in range(rules))
        if not ok:
            raise RuntimeError(f"{name}: unexpected reply {reply!r} to EVALSHA {' '.join(concrete)}; "
                               "has the script's argument layout changed?")
    r.call("FLUSHALL")


def bench_scripts(r: Resp, port: int, pin: list[str], seconds: float, sha_min: str, sha_tg: str) -> dict[str, Any]:
    cases = script_cases(sha_min, sha_tg)
    check_script_shapes(r, cases)
    rps: dict[tuple[str, str], list[float]] = {}
    upc: dict[tuple[str, str], list[float]] = {}
    sizes: dict[tuple[str, str], int] = {}
    for rep in range(REPEATS):
        for load, clients, pipeline, guess in LOADS:
            for name, _sha, args in cases:
                key = (load, name)
                if key not in sizes:
                    # Warm-up, also sizing the measured run to about `seconds`.
                    warm = max(1000, int(guess * 0.4))
                    r.call("FLUSHALL")
                    got = redis_benchmark(port, pin, clients, pipeline, warm, args)
                    # At most 500 admissions per key in one run: far below the limit of 1000.
                    sizes[key] = int(min(max(2000, got * seconds), KEYS * 500))
                r.call("FLUSHALL")
                r.call("CONFIG", "RESETSTAT")
                n = sizes[key]
                got = redis_benchmark(port, pin, clients, pipeline, n, args)
                stats = commandstats_evalsha(r)
                if stats["calls"] < n or stats["failed_calls"] or stats["rejected_calls"]:
                    raise RuntimeError(f"{name}, {load}: Redis saw {stats} for {n} requests")
                rps.setdefault(key, []).append(got)
                upc.setdefault(key, []).append(stats["usec_per_call"])
                progress(f"  run {rep + 1}/{REPEATS}  {load:<28} {name:<22} {got:>10,.0f} checks/s  "
                         f"{stats['usec_per_call']:6.2f} us/call in Redis")
    r.call("FLUSHALL")
    return {"cases": [c[0] for c in cases], "rps": rps, "upc": upc, "sizes": sizes}


def ceiling_probe(r: Resp, port: int, pin: list[str], res: dict[str, Any], sha_min: str,
                  sha_tg: str) -> Callable[[], float]:
    """One more run of table 1's pipelined case for the 1-rule script (same size), on demand."""
    load, clients, pipeline, _ = LOADS[2]
    name, _sha, args = script_cases(sha_min, sha_tg)[1]
    n = res["sizes"][(load, name)]

    def probe() -> float:
        r.call("FLUSHALL")
        got = redis_benchmark(port, pin, clients, pipeline, n, args)
        r.call("FLUSHALL")
        progress(f"  ceiling, {load}, {name}: {got:,.0f} checks/s")
        return got

    return probe


def report_scripts(res: dict[str, Any]) -> list[str]:
    names, rps, upc, sizes = res["cases"], res["rps"], res["upc"], res["sizes"]
    loads = [load for load, *_ in LOADS]
    out = ["## 1. The ceiling: one Redis core, `redis-benchmark` EVALSHA", "",
           f"Checks per second, median of {REPEATS} runs (alternating scripts), 10,000 keys per rule, "
           "limit 1000 per 60 s; in parentheses, the share of the minimal script's rate.", "",
           "| script | " + " | ".join(loads) + " |",
           "| --- | " + " | ".join("---:" for _ in loads) + " |"]
    for name in names:
        cells = []
        for load in loads:
            m = median(rps[(load, name)])
            base = median(rps[(load, "minimal")])
            cells.append(fmt_int(m) if name == "minimal" else f"{fmt_int(m)} ({100 * m / base:.0f}%)")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    runs = ", ".join(f"{load}: {fmt_int(sizes[(load, 'minimal')])}" for load in loads)
    out += ["", f"Requests per run (minimal script; the others are sized to the same duration): {runs}.", ""]

    out += ["## 2. Redis's own cost per check", "",
            f"`usec_per_call` of `evalsha` in `INFO commandstats` (`CONFIG RESETSTAT` before each run), "
            f"microseconds, median of {REPEATS} runs, under each load of table 1.", "",
            "| script | " + " | ".join(loads) + " |",
            "| --- | " + " | ".join("---:" for _ in loads) + " |"]
    med = {k: median(v) for k, v in upc.items()}
    for name in names:
        out.append(f"| {name} | " + " | ".join(f"{med[(load, name)]:.2f}" for load in loads) + " |")
    r1 = [med[(load, "throttlegate, 1 rule")] / med[(load, "minimal")] for load in loads]
    r4 = [med[(load, "throttlegate, 4 rules")] / med[(load, "throttlegate, 1 rule")] for load in loads]
    out.append("| **1 rule / minimal** (goal <= 1.0) | " + " | ".join(f"**{x:.2f}**" for x in r1) + " |")
    out.append("| **4 rules / 1 rule** (goal <= 3) | " + " | ".join(f"**{x:.2f}**" for x in r4) + " |")
    out.append("")
    for i in (0, 1):
        GOALS.append((f"Redis cost per check, 1 rule / minimal <= 1.0 ({loads[i]})", f"{r1[i]:.2f}", met(r1[i] <= 1.0)))
    GOALS.append((f"Redis cost per check, 4 rules / 1 rule <= 3 ({loads[1]})", f"{r4[1]:.2f}", met(r4[1] <= 3)))
    return out


# ---------------------------------------------------------------------------
# 3: memory per tracked key


def bench_memory(r: Resp, sha_tg: str) -> list[str]:
    rate = LIMIT / (WINDOW_US / 1_000_000)  # the bucket refills the same 1000 per 60 s
    cases = [("token bucket", ["b", str(LIMIT), repr(rate)]), ("sliding-window log", ["w", str(LIMIT), str(WINDOW_US)])]
    out = ["## 3. Redis memory per tracked key", "",
           "`MEMORY USAGE key SAMPLES 0` after N admitted checks of cost 1 on one key (limit 1000 per 60 s, "
           "each check with its own random 16-hex-digit call id, as the library makes them).", "",
           "| algorithm | admitted units | bytes per key | bytes per admitted unit |",
           "| --- | ---: | ---: | ---: |"]
    r.call("FLUSHALL")
    for name, rule in cases:
        for units in (1, 10, 100, 1000):
            key = f"mem:{name[0]}:{units}"
            replies = r.pipeline([["EVALSHA", sha_tg, "1", key, "c", "", secrets.token_hex(8), "1", *rule]
                                  for _ in range(units)])
            denied = sum(1 for rep in replies if rep[2] != 1)
            if denied:
                raise RuntimeError(f"memory, {name}: {denied} of {units} checks denied")
            used = r.call("MEMORY", "USAGE", key, "SAMPLES", "0")
            per_unit = "constant" if rule[0] == "b" else f"{used / units:,.1f}"
            out.append(f"| {name} | {units:,} | {used:,} | {per_unit} |")
    r.call("FLUSHALL")
    # A check's cost does not multiply the log's memory: one entry per admitted check.
    checks = 100
    out += ["", f"The sliding-window log after {checks} admitted checks of one cost each (limit 1,000,000,000 per "
            "60 s, general form):", "",
            "| cost per check | bytes per key | bytes per check | bytes per admitted unit |",
            "| ---: | ---: | ---: | ---: |"]
    worst = 0.0
    for cost in (1, 100, 10_000):
        key = f"mem:cost:{cost}"
        replies = r.pipeline([["EVALSHA", sha_tg, "1", key, "c", "", secrets.token_hex(8), str(cost), "w",
                               "1000000000", str(WINDOW_US)] for _ in range(checks)])
        if any(rep[2] != 1 for rep in replies):
            raise RuntimeError(f"memory, log at cost {cost}: a check was denied")
        used = r.call("MEMORY", "USAGE", key, "SAMPLES", "0")
        worst = max(worst, used / checks)
        out.append(f"| {cost:,} | {used:,} | {used / checks:,.1f} | {used / checks / cost:,.3f} |")
    GOALS.append(("Memory per key, sliding-window log, bytes per admitted check whatever its cost (1, 100, 10,000)",
                  f"{worst:,.1f} B", met(worst <= 32)))
    r.call("FLUSHALL")
    out.append("")
    return out


# ---------------------------------------------------------------------------
# 4: Node


def bench_node(r: Resp, port: int, pin: list[str], seconds: float, work: Path, ceiling_tg1: float | None,
               probe: Callable[[], float] | None) -> tuple[list[str], bool]:
    script = ROOT / "benches/node/bench.js"
    out = ["## 4. Node: throttlegate next to rate-limiter-flexible", ""]
    text = script.read_text()
    missing = [f for f in ("--redis-url", "--json") if f not in text]
    if missing:
        msg = f"NOT RUN: benches/node/bench.js does not take {' and '.join(missing)} yet."
        progress("  " + msg)
        GOALS.append(("Node (all goals)", "not run", "**not run**"))
        return out + [msg, ""], False
    # The release addon, built again right before measuring (a no-op unless another build in this
    # checkout replaced it since run.sh built it, with the dev profile of the tests for instance).
    build = run(["npm", "run", "--silent", "build"], env=dict(os.environ, THROTTLEGATE_BUILD_PROFILE="release"))
    if build.returncode != 0:
        msg = "FAILED: the release addon did not build (`npm run build`)."
        GOALS.append(("Node (all goals)", "failed", "**failed**"))
        return out + [msg, "", "```", build.stderr.strip()[-2000:], "```", ""], False
    AT_START["node"] = built_artifacts("node", work)
    # The ceiling once more right before and right after, for a comparison under the same machine load.
    brackets = [probe()] if probe else []
    r.call("FLUSHALL")
    result = work / "node.json"
    cmd = [*pin, "node", str(script), f"{seconds:g}", "--redis-url", f"redis://127.0.0.1:{port}/0",
           "--json", str(result)]
    status, stdout = run_part(cmd, part_timeout(seconds))
    if probe:
        brackets.append(probe())
    rows, failure = part_rows("Node", cmd[len(pin):], status, stdout, result)
    if rows is None:
        return out + failure, False
    # Like for like on the embedded backend: RateLimiterMemory counts a fixed window, so does this run.
    fixed_result = work / "node-memory-fixed.json"
    fixed_cmd = [*pin, "node", str(script), f"{seconds:g}", "--backend", "memory", "--algorithm", "fixed_window",
                 "--rules", "1", "--in-flight", "1,64", "--json", str(fixed_result)]
    status, stdout = run_part(fixed_cmd, part_timeout(seconds))
    fixed_rows, fixed_failure = part_rows("Node, embedded, fixed window", fixed_cmd[len(pin):], status, stdout,
                                          fixed_result)
    # The same, through Limiter.checkSync (no Promise): a synchronous loop next to RateLimiterMemory.
    sync_result = work / "node-memory-fixed-sync.json"
    sync_cmd = [*fixed_cmd[:-2], "--sync", "--json", str(sync_result)]
    status, stdout = run_part(sync_cmd, part_timeout(seconds))
    sync_rows, sync_failure = part_rows("Node, embedded, fixed window, checkSync", sync_cmd[len(pin):], status,
                                        stdout, sync_result)
    out += [f"`node benches/node/bench.js {seconds:g} --redis-url URL --json FILE`, checks per second "
            "(rate-limiter-flexible: RateLimiterRedis over ioredis, RateLimiterMemory; RateLimiterUnion "
            "for several rules); throttlegate's rules are sliding-window logs. The memory rows with a fixed "
            f"window come from `node benches/node/bench.js {seconds:g} --backend memory --algorithm fixed_window "
            "--rules 1 --in-flight 1,64`: like for like, since RateLimiterMemory counts a fixed window per key "
            "(the log rows stay for reference). The rows of `checkSync` add `--sync`: a synchronous loop of "
            "`Limiter.checkSync` (no Promise, nothing in flight) next to RateLimiterMemory at 1 and 64 in flight.",
            "",
            "| backend | throttlegate's algorithm | rules | in flight | throttlegate | rate-limiter-flexible | ratio "
            "| goal |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for row in rows + (fixed_rows or []) + (sync_rows or []):
        ratio = row["ours"] / row["theirs"]
        rules = f"{row['rules']} rule{'s' if row['rules'] > 1 else ''}"
        fixed = row.get("algorithm") == "fixed_window"
        goals = []
        if row["backend"] == "redis" and row["inFlight"] == 1:
            goals.append((f"Node, redis, {rules}, 1 in flight, >= 1.2x rate-limiter-flexible", 1.2))
            if row["rules"] == 1:
                # Like for like (issue 33): the default exact log next to RateLimiterRedis's fixed window.
                goals.append(("Node, redis, 1 rule, 1 in flight, the default log >= 1.0x RateLimiterRedis", 1.0))
        elif row["backend"] == "redis" and row["inFlight"] == 64:
            need = 1.3 if row["rules"] == 1 else 3.0
            goals.append((f"Node, redis, {rules}, 64 in flight, >= {need}x rate-limiter-flexible", need))
        elif row["backend"] == "memory" and fixed and row.get("api") == "checkSync":
            goals.append((f"Node, embedded, {rules}, checkSync vs {row['inFlight']} in flight, fixed window >= 1.5x "
                          "RateLimiterMemory (like for like)", 1.5))
        elif row["backend"] == "memory" and fixed:
            goals.append((f"Node, embedded, {rules}, {row['inFlight']} in flight, fixed window >= 1.5x "
                          "RateLimiterMemory (like for like)", 1.5))
        elif row["backend"] == "memory" and row["rules"] > 1:
            goals.append((f"Node, embedded, {rules}, {row['inFlight']} in flight, on par with RateLimiterMemory",
                          1.0))
        for name, need in goals:
            GOALS.append((name, f"{ratio:.2f}x", met(ratio >= need)))
        goal = "; ".join(f">= {need:.1f}x: {met(ratio >= need)}" for _, need in goals)
        algo = "fixed window" if fixed else "sliding-window log"
        if row.get("api") == "checkSync":
            algo += ", checkSync"
        out.append(f"| {row['backend']} | {algo} | {row['rules']} | {row['inFlight']} | {fmt_int(row['ours'])} | "
                   f"{fmt_int(row['theirs'])} | {ratio:.2f}x | {goal} |")
    if fixed_rows is None:
        out += ["", *fixed_failure]
    if sync_rows is None:
        out += ["", *sync_failure]
    one = [row for row in rows if row["backend"] == "redis" and row["rules"] == 1 and row["inFlight"] == 64]
    if one and ceiling_tg1 and brackets:
        ours = one[0]["ours"]
        adjacent = statistics.mean(brackets)
        share = ours / adjacent
        out += ["", f"Node, 1 rule, 64 in flight: {fmt_int(ours)} checks/s = **{100 * share:.0f}%** of the pipelined "
                f"`redis-benchmark` ceiling for the same 1-rule script measured right before and after the Node "
                f"run ({' and '.join(fmt_int(b) for b in brackets)}/s, mean {fmt_int(adjacent)}/s; goal >= 85%); "
                f"{100 * ours / ceiling_tg1:.0f}% of table 1's median ({fmt_int(ceiling_tg1)}/s)."]
        GOALS.append(("Node, 1 rule, 64 in flight, >= 85% of the pipelined redis-benchmark ceiling (measured "
                      "around the Node run)", f"{100 * share:.0f}%", met(share >= 0.85)))
    out.append("")
    return out, fixed_rows is not None and sync_rows is not None


# ---------------------------------------------------------------------------
# 5: Python


def bench_python(r: Resp, port: int, pin: list[str], seconds: float, work: Path) -> tuple[list[str], bool]:
    script = ROOT / "benches/python/bench.py"
    out = ["## 5. Python: throttlegate next to `limits`", ""]
    if "--json" not in script.read_text():
        msg = "NOT RUN: benches/python/bench.py does not take --json yet."
        progress("  " + msg)
        GOALS.append(("Python (all goals)", "not run", "**not run**"))
        return out + [msg, ""], False
    r.call("FLUSHALL")
    result = work / "python.json"
    calls = max(2000, int(3000 * seconds))
    cmd = [*pin, str(ROOT / ".venv/bin/python"), str(script), "--url", f"redis://127.0.0.1:{port}/0",
           "--calls", str(calls), "--json", str(result)]
    if "--repeat" in script.read_text():
        cmd += ["--repeat", str(REPEATS)]
    # The wheel run.sh built, unpacked in a private folder, comes first on the path (the peers come from .venv).
    env = dict(os.environ, PYTHONPATH=str(work / "python"))
    status, stdout = run_part(cmd, part_timeout(seconds), env=env)
    rows, failure = part_rows("Python", cmd[len(pin):], status, stdout, result)
    if rows is None:
        return out + failure, False
    redis_rows = [row for row in rows if row.get("scenario") != "embedded"]
    embedded = [row for row in rows if row.get("scenario") == "embedded"]
    shown = ["URL" if a.startswith("redis://") else "FILE" if a == str(result) else a for a in cmd[len(pin) + 2:]]
    out += [f"`.venv/bin/python benches/python/bench.py {' '.join(shown)}` "
            f"({'best of ' + str(REPEATS) + ' runs per scenario, ' if '--repeat' in cmd else ''}checks per second); "
            "`limits`: MovingWindowRateLimiter over redis-py with hiredis, one `hit` per rule.", "",
            "| scenario | rules | throttlegate (checks/s) | limits (checks/s) | ratio | goal |",
            "| --- | ---: | ---: | ---: | ---: | --- |"]
    for row in redis_rows:
        ratio = row["ours"] / row["theirs"]
        scen = str(row["scenario"])
        need = 1.5 if "sequential" in scen else 2.5 if "8 threads" in scen else 3.0 if "64" in scen else None
        goal = ""
        if need is not None and row.get("rules") == 1:
            goal = f">= {need}x: {met(ratio >= need)}"
            GOALS.append((f"Python, {scen}, 1 rule, >= {need}x limits", f"{ratio:.2f}x", met(ratio >= need)))
        out.append(f"| {scen} | {row.get('rules', '')} | {fmt_int(row['ours'])} | {fmt_int(row['theirs'])} | "
                   f"{ratio:.2f}x | {goal} |")
    if embedded:
        # A ratio, in the same run: how many times faster than `limits`' in-memory moving window
        # (like for like: a log) and its MemoryStorage fixed window (a counter, cheaper).
        out += ["", "Embedded backend: throttlegate's `check` (sliding window log) next to `limits`' "
                "MovingWindowRateLimiter and FixedWindowRateLimiter over MemoryStorage, in the same run.", "",
                "| embedded backend | rules | throttlegate (µs per check) | limits moving window (µs) | ratio "
                "| limits fixed window (µs) | ratio | goal |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for row in embedded:
            us = row["us_per_check"]
            moving = row.get("theirs_us_per_check")
            fixed = row.get("theirs_fixed_us_per_check")
            r_moving = None if moving is None else moving / us
            r_fixed = None if fixed is None else fixed / us
            goal = ""
            if row.get("rules", 1) == 1:
                for label, ratio in (("moving window", r_moving), ("fixed window", r_fixed)):
                    if ratio is None:
                        continue
                    goal += f"{label} >= 1x: {met(ratio >= 1.0)} "
                    GOALS.append((f"Python, embedded, 1 rule, >= 1x limits' in-memory {label}", f"{ratio:.2f}x",
                                  met(ratio >= 1.0)))
            fmt = lambda v: "" if v is None else f"{v:.3f}"  # noqa: E731
            rat = lambda v: "" if v is None else f"{v:.2f}x"  # noqa: E731
            out.append(f"| embedded | {row.get('rules', '')} | {us:.3f} | {fmt(moving)} | {rat(r_moving)} | "
                       f"{fmt(fixed)} | {rat(r_fixed)} | {goal.strip()} |")
    out.append("")
    return out, True


# ---------------------------------------------------------------------------
# 6: embedded backend from Rust, Criterion


CRITERION_FILTER = r"^memory/(throttlegate (1 rule|1 bucket|4 rules), 1 thread|governor keyed, 1 thread)/"


def bench_criterion(pin: list[str], seconds: float, work: Path) -> tuple[list[str], bool]:
    home = work / "criterion"
    env = dict(os.environ, CRITERION_HOME=str(home))
    cmd = [*pin, "cargo", "bench", "-q", "-p", "throttlegate", "--bench", "check", "--", CRITERION_FILTER,
           "--warm-up-time", "1", "--measurement-time", f"{seconds:g}", "--noplot"]
    out = ["## 6. Embedded backend from Rust next to `governor`", ""]
    # Criterion's progress lines go to stderr: shown only when the run fails.
    status, stdout = run_part(cmd, part_timeout(seconds), merge_stderr=True, env=env)
    if status != 0:
        msg = f"FAILED: `{shlex.join(cmd[len(pin):])}`: exit status {status}."
        progress(stdout[-4000:])
        progress("  " + msg)
        GOALS.append(("Rust embedded vs governor", "failed", "**failed**"))
        return out + [msg, ""], False
    ns: dict[tuple[str, str], float] = {}
    for bench in home.glob("memory/*/*/new/benchmark.json"):
        meta = json.loads(bench.read_text())
        est = json.loads((bench.parent / "estimates.json").read_text())
        point = (est.get("slope") or est["mean"])["point_estimate"]
        ns[(meta["function_id"], str(meta["value_str"]))] = point
    names = ["throttlegate 1 bucket, 1 thread", "throttlegate 1 rule, 1 thread", "throttlegate 4 rules, 1 thread",
             "governor keyed, 1 thread"]
    keys = ["1", "100000"]
    missing = [f"{n}/{k}" for n in names for k in keys if (n, k) not in ns]
    if missing:
        msg = f"FAILED: Criterion wrote no estimate for {', '.join(missing)}."
        GOALS.append(("Rust embedded vs governor", "failed", "**failed**"))
        return out + [msg, ""], False
    out += [f"`cargo bench -p throttlegate --bench check -- '{CRITERION_FILTER}' --measurement-time {seconds:g}`: "
            "nanoseconds per check (Criterion's estimate), one thread, building the full decision. Like for like "
            "with `governor`, which keeps one GCRA cell per key (a token bucket in other words): throttlegate's "
            "token bucket (`1 bucket`); `1 rule` is the exact sliding-window log (one entry per admitted unit), "
            "`4 rules` two logs and two buckets stacked.", "",
            "| what | 1 key | 100,000 keys |", "| --- | ---: | ---: |"]
    for n in names:
        out.append(f"| {n} | " + " | ".join(f"{ns[(n, k)]:,.0f} ns" for k in keys) + " |")
    gov = names[3]
    for n, label, need in [(names[0], "token bucket", 2.0), (names[1], "sliding-window log", 3.0)]:
        ratios = [ns[(n, k)] / ns[(gov, k)] for k in keys]
        out.append(f"| **throttlegate {label} / governor** (goal <= {need:g}) | "
                   + " | ".join(f"**{x:.1f}x**" for x in ratios) + " |")
        for k, x in zip(keys, ratios):
            GOALS.append((f"Rust embedded, 1 rule, {label}, within {need:g}x of governor at {int(k):,} "
                          f"key{'s' if k != '1' else ''}", f"{x:.1f}x", met(x <= need)))
    out.append("")
    return out, True


# ---------------------------------------------------------------------------
# 7: every algorithm on Redis: memory per key, cost per check


ALGO_LIMIT = 100_000  # the memory table's limit: every count of units it measures fits
MEMORY_UNITS = (1, 10, 100, 1_000, 10_000, 100_000)
COST_LIMITS = (100, 10_000, 1_000_000)
HOUR_US = 3_600_000_000


def algo_rules(limit: int, window_us: int) -> list[tuple[str, list[str]]]:
    """(name, script arguments of one rule) for every algorithm, at `limit` per `window_us`."""
    precision = -(-(window_us // 1000) // 60) * 1000  # the default: window / 60, rounded up to whole ms
    return [
        ("sliding-window log", ["w", str(limit), str(window_us)]),
        ("token bucket", ["b", str(limit), repr(limit / (window_us / 1_000_000))]),
        ("sliding window of counters", ["k", str(limit), f"{window_us}:{precision}"]),
        ("fixed window", ["f", str(limit), str(window_us)]),
        ("quota (day)", ["q", str(limit), "d:0"]),
    ]


def bench_algo_memory(r: Resp, sha_tg: str) -> list[str]:
    """MEMORY USAGE of one key after N admitted units spread evenly over its window."""
    out = ["## 7a. Redis memory per key, every algorithm", "",
           f"`MEMORY USAGE key SAMPLES 0` after N admitted checks of cost 1 on one key, limit {ALGO_LIMIT:,} per "
           "60 s (a quota: per day), the checks' times spread evenly over one window (explicit times, so that "
           "every sub-window of the counters is used), each with its own random 16-hex-digit call id. Mode `c` "
           "(what one Redis node gets); the last row is the counters in mode `C` (a Redis Cluster, or calls with "
           "a caller's call id), which also keep the ids of the last 64 admissions.", "",
           "| algorithm | " + " | ".join(f"{n:,}" for n in MEMORY_UNITS) + " |",
           "| --- | " + " | ".join("---:" for _ in MEMORY_UNITS) + " |"]
    window = WINDOW_US
    rules = [(name, rule, "c") for name, rule in algo_rules(ALGO_LIMIT, window)]
    rules.append(("sliding window of counters, mode C", rules[2][1], "C"))
    found: dict[str, dict[int, int]] = {}
    r.call("FLUSHALL")
    for name, rule, mode in rules:
        cells = []
        for units in MEMORY_UNITS:
            # The times: over the last window up to now (a fixed window or quota: its period so far), so
            # that no time is in the future and the key's TTL, counted from the last time, is real.
            period = {"f": window, "q": 86_400_000_000}.get(rule[0])
            now = server_now_us(r)
            while period and period - now % period < 3_000_000:  # too close to the period's end: wait
                time.sleep(0.5)
                now = server_now_us(r)
            span = now % period if period else window
            times = [now - span + (i + 1) * span // units for i in range(units)]
            key = f"mem7:{rule[0]}{mode}:{units}"
            denied = 0
            for start in range(0, units, 1000):
                replies = r.pipeline([["EVALSHA", sha_tg, "1", key, mode, str(times[i]), secrets.token_hex(8),
                                       "1", *rule] for i in range(start, min(units, start + 1000))])
                denied += sum(1 for rep in replies if rep[2] != 1)
            if denied:
                raise RuntimeError(f"memory, {name}: {denied} of {units} checks denied")
            used = int(r.call("MEMORY", "USAGE", key, "SAMPLES", "0"))
            found.setdefault(name, {})[units] = used
            cells.append(fmt_int(used))
            r.call("DEL", key)
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    r.call("FLUSHALL")
    counters, log = found["sliding window of counters"], found["sliding-window log"]
    worst = max(counters.values())
    ratio = log[10_000] / counters[10_000]
    out += ["", f"Sliding window of counters: at most {fmt_int(worst)} bytes per key at any of these counts "
            f"(goal <= 1 KB); {ratio:,.0f}x less than the log at 10,000 units (goal >= 100x).", ""]
    GOALS.append(("Memory per key, sliding window of counters <= 1 KB at 1 to 100,000 units", f"{fmt_int(worst)} B",
                  met(worst <= 1024)))
    for units in (1_000, 100_000):
        GOALS.append((f"Memory per key, sliding-window log <= 16 bytes per admitted unit at {units:,} units",
                      f"{log[units] / units:,.1f} B", met(log[units] / units <= 16)))
    GOALS.append(("Memory per key, log / sliding window of counters >= 100x at 10,000 units", f"{ratio:,.0f}x",
                  met(ratio >= 100)))
    return out


def short_form(sha_tg: str, key: str, rule: list[str], call_id: str) -> list[str]:
    """The EVALSHA arguments the library sends for one check of cost 1 on the server's clock."""
    if rule[0] == "w":
        return [sha_tg, "1", key, "t", call_id, rule[1], rule[2]]
    if rule[0] == "f":
        return [sha_tg, "1", key, "f", rule[1], rule[2], "1"]
    return [sha_tg, "1", key, "c", "", call_id, "1", *rule]


def prefill(r: Resp, sha_tg: str, key: str, rule: list[str], limit: int, window_us: int) -> None:
    """Fill `key` to its limit, its units spread over the last part of the window (all still counting
    for at least five minutes), so that every check after it is denied."""
    now = server_now_us(r)
    code = rule[0]
    if code == "k":
        # Sixty times a minute apart over the last hour, then the rest at once.
        parts = 60
        each, rest = divmod(limit, parts)
        calls = [(now - window_us + 300_000_000 + j * 55_000_000, each + (rest if j == parts - 1 else 0))
                 for j in range(parts)]
        calls = [(t, c) for t, c in calls if c > 0]
    elif code == "w":
        calls = [(now - 1_000_000, limit)]
    else:
        calls = [(None, limit)]
    for t, cost in calls:
        reply = r.call("EVALSHA", sha_tg, "1", key, "c", "" if t is None else str(t), secrets.token_hex(8), str(cost),
                       *rule)
        if reply[2] != 1:
            raise RuntimeError(f"prefill of {key}: denied {reply!r}")
    probe = r.call("EVALSHA", sha_tg, "1", key, "p", "", "probe", "1", *rule)
    if probe[2] != 0 and code != "b":  # a bucket refills meanwhile: at the largest limit, a token every 3.6 ms
        raise RuntimeError(f"prefill of {key}: not full ({probe!r})")


def bench_algo_cost(r: Resp, port: int, pin: list[str], seconds: float, sha_tg: str, sha_incr: str) -> list[str]:
    """usec_per_call of every algorithm: denied checks on a full key at three limits, and admitted
    checks on 10,000 keys next to the minimal INCR+PEXPIRE script."""
    out = ["## 7b. Redis's own cost per check, every algorithm", "",
           f"`usec_per_call` of `evalsha` (`CONFIG RESETSTAT` before each run), microseconds, median of {REPEATS} "
           "runs, 50 connections, what the library sends for a check of cost 1 on the server's clock (modes `s` "
           "and `f` for a log and a fixed window, the general form for the others).", "",
           "**Window full**: one key per algorithm and limit, filled to its limit (window 1 h, a quota per day, a "
           "bucket refilling its capacity per hour; the counters' units spread over the last hour), every "
           "check denied. The minimal INCR+PEXPIRE script counts on regardless.", "",
           "| algorithm | " + " | ".join(f"limit {n:,}" for n in COST_LIMITS) + " | 1,000,000 / 100 |",
           "| --- | " + " | ".join("---:" for _ in COST_LIMITS) + " | ---: |"]
    n = int(max(2000, 30_000 * seconds))
    r.call("FLUSHALL")
    cases: list[tuple[str, int, list[str]]] = []
    for limit in COST_LIMITS:
        for name, rule in algo_rules(limit, HOUR_US):
            key = f"full:{rule[0]}:{limit}"
            prefill(r, sha_tg, key, rule, limit, HOUR_US)
            cases.append((name, limit, short_form(sha_tg, key, rule, CALL_ID)))
        cases.append(("minimal INCR+PEXPIRE", limit, [sha_incr, "1", f"full:incr:{limit}", "3600000", str(limit)]))
    upc: dict[tuple[str, int], list[float]] = {}
    for rep in range(REPEATS):
        for name, limit, args in cases:
            r.call("CONFIG", "RESETSTAT")
            redis_benchmark(port, pin, 50, 1, n, args)
            stats = commandstats_evalsha(r)
            if stats["failed_calls"] or stats["rejected_calls"]:
                raise RuntimeError(f"{name}, limit {limit}: Redis saw {stats}")
            upc.setdefault((name, limit), []).append(stats["usec_per_call"])
            progress(f"  run {rep + 1}/{REPEATS}  full, limit {limit:>9,}  {name:<28} "
                     f"{stats['usec_per_call']:6.2f} us/call in Redis")
    r.call("FLUSHALL")
    names = [name for name, _ in algo_rules(1, HOUR_US)] + ["minimal INCR+PEXPIRE"]
    med = {k: median(v) for k, v in upc.items()}
    for name in names:
        flat = med[(name, COST_LIMITS[-1])] / med[(name, COST_LIMITS[0])]
        out.append(f"| {name} | " + " | ".join(f"{med[(name, lim)]:.2f}" for lim in COST_LIMITS) + f" | {flat:.2f} |")
    flat = med[("sliding window of counters", COST_LIMITS[-1])] / med[("sliding window of counters", COST_LIMITS[0])]
    GOALS.append(("Redis cost per check, sliding window of counters flat in the limit (1,000,000 / 100, full window)",
                  f"{flat:.2f}", met(flat <= 1.25)))

    # Admitted checks: 10,000 keys, a limit nothing reaches.
    out += ["", f"**Admitted**: 10,000 keys, limit 1,000,000 per 60 s (a quota per day), every check admitted.", "",
            "| algorithm | us per check | / minimal INCR+PEXPIRE |", "| --- | ---: | ---: |"]
    admitted: list[tuple[str, list[str]]] = [
        (name, short_form(sha_tg, f"adm:{rule[0]}:{RAND}", rule, CALL_ID)) for name, rule in algo_rules(1_000_000, WINDOW_US)]
    admitted.append(("minimal INCR+PEXPIRE", [sha_incr, "1", f"adm:incr:{RAND}", "60000", "1000000"]))
    adm: dict[str, list[float]] = {}
    for rep in range(REPEATS):
        for name, args in admitted:
            r.call("FLUSHALL")
            r.call("CONFIG", "RESETSTAT")
            redis_benchmark(port, pin, 50, 1, n, args)
            stats = commandstats_evalsha(r)
            if stats["failed_calls"] or stats["rejected_calls"]:
                raise RuntimeError(f"{name}, admitted: Redis saw {stats}")
            adm.setdefault(name, []).append(stats["usec_per_call"])
            progress(f"  run {rep + 1}/{REPEATS}  admitted  {name:<28} {stats['usec_per_call']:6.2f} us/call in Redis")
    r.call("FLUSHALL")
    base = median(adm["minimal INCR+PEXPIRE"])
    for name, _ in admitted:
        m = median(adm[name])
        out.append(f"| {name} | {m:.2f} | {m / base:.2f} |")
    fixed = median(adm["fixed window"]) / base
    GOALS.append(("Redis cost per check, fixed window / minimal INCR+PEXPIRE <= 1.3 (admitted, 50 connections)",
                  f"{fixed:.2f}", met(fixed <= 1.3)))
    out.append("")
    return out


# ---------------------------------------------------------------------------
# 12: concurrency rules

CONC_KEYS = 10_000
CONC_SLOTS = (1, 10, 100, 1_000)


def bench_concurrency(r: Resp, sha_tg: str) -> list[str]:
    """usec_per_call of a concurrency check, of a release, and of a sliding-window log check (the same
    keys, one connection, pipelined); then MEMORY USAGE of one key holding N slots."""
    n = 30_000
    lease_us, limit = WINDOW_US, 1_000_000
    conc = ["l", str(limit), str(lease_us)]
    log = ["w", str(limit), str(WINDOW_US)]

    def run(commands: list[list[str]]) -> float:
        r.call("CONFIG", "RESETSTAT")
        for start in range(0, len(commands), 1000):
            for reply in r.pipeline(commands[start:start + 1000]):
                if isinstance(reply, Exception) or (isinstance(reply, list) and len(reply) > 2 and reply[2] != 1):
                    raise RuntimeError(f"concurrency: unexpected reply {reply!r}")
        return commandstats_evalsha(r)["usec_per_call"]

    res: dict[str, list[float]] = {}
    for rep in range(REPEATS):
        ids = [secrets.token_hex(16) for _ in range(n)]
        keys = [f"conc12:{i % CONC_KEYS}" for i in range(n)]
        r.call("FLUSHALL")
        checks = [["EVALSHA", sha_tg, "1", k, "c", "", i, "1", *conc] for k, i in zip(keys, ids)]
        res.setdefault("check", []).append(run(checks))
        releases = [["EVALSHA", sha_tg, "1", k, "r", "", i, "0", *conc] for k, i in zip(keys, ids)]
        res.setdefault("release", []).append(run(releases))
        r.call("FLUSHALL")
        logs = [["EVALSHA", sha_tg, "1", f"log12:{k}", "s", i, *log[1:]] for k, i in zip(keys, ids)]
        res.setdefault("log", []).append(run(logs))
        progress(f"  run {rep + 1}/{REPEATS}  check {res['check'][-1]:.2f}  release {res['release'][-1]:.2f}  "
                 f"log check {res['log'][-1]:.2f} us/call in Redis")
    med = {k: median(v) for k, v in res.items()}
    out = ["## 13. Concurrency rules on Redis", "",
           f"`usec_per_call` of `evalsha` (`CONFIG RESETSTAT` before each run), microseconds, median of {REPEATS} "
           f"runs of {n:,} calls over {CONC_KEYS:,} keys (one connection, pipelined by 1,000; Redis's own time "
           "does not depend on the connections), on the server's clock: a concurrency check (limit 1,000,000, "
           "lease 60 s, each with its own 32-hex-digit lease id, every check admitted), the release of each, "
           "and a sliding-window log check of cost 1 (mode `s`) on as many keys.", "",
           "| call | us per call | / sliding-window log check |", "| --- | ---: | ---: |"]
    for name, label in (("check", "concurrency check"), ("release", "concurrency release"),
                        ("log", "sliding-window log check")):
        out.append(f"| {label} | {med[name]:.2f} | {med[name] / med['log']:.2f} |")
    # Memory: one key holding N slots (N leases of cost 1), a limit of 1,000.
    out += ["", "`MEMORY USAGE key SAMPLES 0` of one key holding N slots (N admitted checks of cost 1, limit "
            "1,000, lease 60 s), and after a check denied at the limit (nothing more is stored: at most `limit` "
            "members).", "", "| slots held | " + " | ".join(f"{s:,}" for s in CONC_SLOTS) + " | denied at 1,000 |",
            "| --- | " + " | ".join("---:" for _ in CONC_SLOTS) + " | ---: |"]
    r.call("FLUSHALL")
    rule = ["l", "1000", str(lease_us)]
    cells = []
    for slots in CONC_SLOTS:
        key = f"concmem12:{slots}"
        r.pipeline([["EVALSHA", sha_tg, "1", key, "c", "", secrets.token_hex(16), "1", *rule] for _ in range(slots)])
        cells.append(fmt_int(int(r.call("MEMORY", "USAGE", key, "SAMPLES", "0"))))
    denied = r.call("EVALSHA", sha_tg, "1", "concmem12:1000", "c", "", secrets.token_hex(16), "1", *rule)
    if denied[2] != 0:
        raise RuntimeError(f"concurrency: a check above the limit was admitted: {denied!r}")
    cells.append(fmt_int(int(r.call("MEMORY", "USAGE", "concmem12:1000", "SAMPLES", "0"))))
    r.call("FLUSHALL")
    out += ["| bytes | " + " | ".join(cells) + " |", ""]
    GOALS.append(("Redis cost per concurrency release <= a concurrency check", f"{med['release']:.2f} vs {med['check']:.2f} us",
                  met(med["release"] <= med["check"])))
    return out


# ---------------------------------------------------------------------------
# 8, 9: the new algorithms next to their peers' like-for-like strategies


def bench_node_algos(r: Resp, port: int, pin: list[str], seconds: float, work: Path) -> tuple[list[str], bool]:
    script = ROOT / "benches/node/bench.js"
    out = ["## 8. Node: fixed window next to rate-limiter-flexible's RateLimiterRedis", ""]
    build = run(["npm", "run", "--silent", "build"], env=dict(os.environ, THROTTLEGATE_BUILD_PROFILE="release"))
    if build.returncode != 0:
        GOALS.append(("Node, fixed window (all goals)", "failed", "**failed**"))
        return out + ["FAILED: the release addon did not build (`npm run build`).", ""], False
    AT_START["node-algos"] = built_artifacts("node", work)
    r.call("FLUSHALL")
    result = work / "node-algos.json"
    cmd = [*pin, "node", str(script), f"{seconds:g}", "--redis-url", f"redis://127.0.0.1:{port}/0", "--backend",
           "redis", "--algorithm", "fixed_window", "--rules", "1", "--in-flight", "1,64", "--json", str(result)]
    status, stdout = run_part(cmd, part_timeout(seconds))
    rows, failure = part_rows("Node, fixed window", cmd[len(pin):], status, stdout, result)
    if rows is None:
        return out + failure, False
    out += [f"`node benches/node/bench.js {seconds:g} --redis-url URL --backend redis --algorithm fixed_window "
            "--rules 1 --in-flight 1,64 --json FILE`, checks per second; both count a fixed window per key "
            "(throttlegate's aligned to the epoch, RateLimiterRedis's from the key's first request).", "",
            "| rules | in flight | throttlegate fixed window | RateLimiterRedis | ratio | goal |",
            "| ---: | ---: | ---: | ---: | ---: | --- |"]
    for row in rows:
        ratio = row["ours"] / row["theirs"]
        need = {1: 1.2, 64: 1.3}.get(row["inFlight"])
        goal = ""
        if need is not None:
            goal = f">= {need}x: {met(ratio >= need)}"
            GOALS.append((f"Node, fixed window, {row['inFlight']} in flight, >= {need}x RateLimiterRedis",
                          f"{ratio:.2f}x", met(ratio >= need)))
        out.append(f"| {row['rules']} | {row['inFlight']} | {fmt_int(row['ours'])} | {fmt_int(row['theirs'])} | "
                   f"{ratio:.2f}x | {goal} |")
    out.append("")
    return out, True


def bench_python_algos(r: Resp, port: int, pin: list[str], seconds: float, work: Path) -> tuple[list[str], bool]:
    script = ROOT / "benches/python/bench.py"
    out = ["## 9. Python: sliding window of counters next to `limits`' SlidingWindowCounterRateLimiter", ""]
    r.call("FLUSHALL")
    result = work / "python-algos.json"
    calls = max(2000, int(3000 * seconds))
    cmd = [*pin, str(ROOT / ".venv/bin/python"), str(script), "--url", f"redis://127.0.0.1:{port}/0",
           "--calls", str(calls), "--repeat", str(REPEATS), "--algorithm", "sliding_window",
           "--peer", "sliding_window_counter", "--rules", "1", "--no-embedded", "--json", str(result)]
    env = dict(os.environ, PYTHONPATH=str(work / "python"))
    status, stdout = run_part(cmd, part_timeout(seconds), env=env)
    rows, failure = part_rows("Python, sliding window of counters", cmd[len(pin):], status, stdout, result)
    if rows is None:
        return out + failure, False
    out += [f"`.venv/bin/python benches/python/bench.py --calls {calls} --repeat {REPEATS} --algorithm "
            "sliding_window --peer sliding_window_counter --rules 1 --no-embedded` (median of the rounds, checks "
            "per second); `limits`: SlidingWindowCounterRateLimiter over redis-py with hiredis, which weighs the "
            "previous window's count by the time left (an approximation that can over-admit, see table 10).", "",
            "| scenario | throttlegate sliding window | limits SlidingWindowCounter | ratio | goal |",
            "| --- | ---: | ---: | ---: | --- |"]
    for row in rows:
        ratio = row["ours"] / row["theirs"]
        GOALS.append((f"Python, {row['scenario']}, sliding window of counters, >= 1.5x limits' SlidingWindowCounter",
                      f"{ratio:.2f}x", met(ratio >= 1.5)))
        out.append(f"| {row['scenario']} | {fmt_int(row['ours'])} | {fmt_int(row['theirs'])} | {ratio:.2f}x | "
                   f">= 1.5x: {met(ratio >= 1.5)} |")
    out.append("")
    return out, True


# ---------------------------------------------------------------------------
# 12: one hot key, 4 processes, with and without reserve (docs/concepts/reserve.md)


def bench_reserve(port: int, pin: list[str], seconds: float, work: Path) -> tuple[list[str], bool]:
    out = ["## 12. One hot key, 4 processes, every algorithm with and without `reserve = 100`", ""]
    result = work / "reserve.json"
    rust = work / "reserve_hot"
    cmd = [*pin, str(ROOT / ".venv/bin/python"), str(HERE / "reserve.py"), "--port", str(port),
           "--seconds", str(seconds), "--json", str(result), *(["--rust", str(rust)] if rust.exists() else [])]
    env = dict(os.environ, PYTHONPATH=str(work / "python"))
    # Five algorithms, each with and without reserve, from Python and from Rust:
    # a throughput and an exactness run.
    status, stdout = run_part(cmd, part_timeout(seconds * 50 + 180), env=env)
    if status != 0 or not result.exists():
        return out + [f"FAILED (exit {status}):", "", "```text", stdout[-2000:], "```", ""], False
    res = json.loads(result.read_text())
    ratio = res["reserve"]["checks_per_s"] / res["direct"]["checks_per_s"]
    per_run = res["reserve"]["runs_per_check"]
    exact = all(a[k + "-exact"]["worst"] <= a[k + "-exact"]["bound"]
                for at in ("algorithms", "rust") for a in res.get(at, {}).values() for k in ("direct", "reserve"))
    GOALS.append(("One hot key, reserve = 100: >= 10x the direct path's checks/s", f"{ratio:.1f}x", met(ratio >= 10)))
    GOALS.append(("One hot key, reserve = 100: <= 1 script run per 50 checks", f"1 per {1 / per_run:.0f}" if per_run else "0",
                  met(per_run <= 1 / 50)))
    GOALS.append(("One hot key, reserve = 100, every algorithm: admitted <= its bound", "yes" if exact else "no", met(exact)))
    good = exact
    if "rust" in res:
        fw = res["rust"]["fixed_window"]["reserve"]["checks_per_s"]
        beyond = fw > res["incr_p16"]
        GOALS.append(("One hot key from Rust, fixed window, reserve = 100: beyond `INCR` pipelined 16 deep (same run)",
                      f"{fw:,.0f} vs {res['incr_p16']:,.0f} ({fw / res['incr_p16']:.2f}x)", met(beyond)))
    else:
        GOALS.append(("One hot key from Rust: beyond `INCR` pipelined 16 deep", "not run (reserve_hot not built)",
                      "**not run**"))
        good = False
    out += ["`.venv/bin/python benches/compare/reserve.py --rust target/release/examples/reserve_hot` "
            "(4 processes of the Python package on one key, then 4 processes of the Rust example "
            "`core/examples/reserve_hot.rs`, one thread each):", "",
            "```text", stdout.strip(), "```", ""]
    return out, good


# ---------------------------------------------------------------------------
# 10: over-admission on a boundary-burst trace


def bench_burst(r: Resp, port: int, pin: list[str], work: Path) -> tuple[list[str], bool]:
    out = ["## 10. Over-admission on a boundary-burst trace", ""]
    url = f"redis://127.0.0.1:{port}/0"
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    env = dict(os.environ, PYTHONPATH=str(work / "python"))
    for label, cmd, e in [
        ("Python", [*pin, str(ROOT / ".venv/bin/python"), str(HERE / "burst.py"), "--url", url, "--json",
                    str(work / "burst-py.json")], env),
        ("Node", [*pin, "node", str(HERE / "burst.js"), "--redis-url", url, "--json", str(work / "burst-js.json")],
         None),
    ]:
        r.call("FLUSHALL")
        status, stdout = run_part(cmd, part_timeout(1), env=e)
        got, failure = part_rows(f"Boundary burst, {label}", cmd[len(pin):], status, stdout, Path(cmd[-1]))
        if got is None:
            failures += failure
        else:
            rows += got
    out += ["`benches/compare/burst.py` and `burst.js`: a limit of 50 per 2 s on one key per subject; one request "
            "at a multiple of 2 s in Unix time, then bursts of 50 at 0.9, 1.02, 1.5, 1.9, 2.02 and 2.5 windows. "
            "The most admitted in any 1.98 s (the window less 20 ms for the round trip), and how far that is "
            "over the limit.", "",
            "| library | algorithm | admitted | most in a window | over the limit |",
            "| --- | --- | ---: | ---: | ---: |"]
    for row in rows:
        out.append(f"| {row['library']} | {row['algorithm']} | {row['admitted']} | {row['max_in_window']} | "
                   f"{row['over']} |")
        if row["library"] == "throttlegate" and row["algorithm"] == "sliding_window":
            GOALS.append(("Boundary burst, sliding window of counters admits no more than the limit in any window",
                          f"{row['over']} over", met(row["over"] == 0)))
    out.append("")
    return out + failures, not failures


# ---------------------------------------------------------------------------
# 11: latency percentiles under an open-loop load


def latency_table(lang: str, cmd_text: str, data: dict[str, Any], ours: str, peer: str, peer_label: str,
                  peers: str) -> list[str]:
    """One language's latency rows, and its goals: our p99 and p99.9 at or below the peer's at each load."""
    sat = data["saturation"]
    base = sat["base"]
    out = [f"**{lang}** (throttlegate {'`check_async` from asyncio tasks' if lang == 'Python' else '`check`'}): "
           f"`{cmd_text}`. Saturation (closed loop, {sat.get('inFlight') or sat.get('tasks')} in flight): "
           f"throttlegate {fmt_int(sat[ours])}/s, {peer_label} {fmt_int(sat[peer])}/s.", "",
           f"| load (share of {fmt_int(base)}/s, the lower saturation) | offered/s | library | p50 µs | p99 µs "
           "| p99.9 µs | max µs | achieved/s | most in flight | goal |",
           "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    rows = data["rows"]
    for load in dict.fromkeys(row["load"] for row in rows):
        at = {row["library"]: row for row in rows if row["load"] == load}
        mine, theirs = at.get(ours), at.get(peer)
        for lib, row in at.items():
            goal = ""
            if lib == ours and mine and theirs:
                ok = mine["p99_us"] <= theirs["p99_us"] and mine["p999_us"] <= theirs["p999_us"]
                goal = f"p99, p99.9 <= {peers}: {met(ok)}"
                GOALS.append((f"Latency, {lang}, {load:g}% of saturation: throttlegate's p99 and p99.9 at or below "
                              f"{peers}", f"p99 {fmt_int(mine['p99_us'])} / {fmt_int(theirs['p99_us'])} µs, "
                              f"p99.9 {fmt_int(mine['p999_us'])} / {fmt_int(theirs['p999_us'])} µs", met(ok)))
            name = peer_label if lib == peer else lib
            out.append(f"| {load:g}% | {fmt_int(row['rate'])} | {name} | {fmt_int(row['p50_us'])} | "
                       f"{fmt_int(row['p99_us'])} | {fmt_int(row['p999_us'])} | {fmt_int(row['max_us'])} | "
                       f"{fmt_int(row['achieved'])} | {fmt_int(row.get('maxInFlight', row.get('max_in_flight', 0)))} "
                       f"| {goal} |")
    out.append("")
    return out


def bench_latency(r: Resp, port: int, pin: list[str], seconds: float, work: Path) -> tuple[list[str], bool]:
    out = ["## 11. Latency per check, open loop at 25%, 50% and 90% of saturation", "",
           "Method (benches/node/latency.js, benches/python/latency.py): first each library's saturation, "
           "closed loop with 64 checks in flight (the better of two alternating rounds of half the case time); "
           "the offered rates are 25%, 50% and 90% of the "
           "LOWER of the two, so that both get the same load. Then, at each load, checks are issued on a fixed "
           "schedule (check i at t0 + i / rate) whether or not earlier ones have answered (open loop), by a pacer "
           "that sleeps until each send time and wakes the event loop (a worker thread in Node, a small process "
           "writing to a pipe in Python), and each check's latency runs from its *scheduled* send time to its "
           "answer, so a stall counts for every check it delays (no coordinated omission). Each point lasts the "
           "case time, or longer to reach 20,000 samples; percentiles are nearest-rank over every sample, sorted "
           "exactly. Every point runs on fresh keys with a fresh limiter warmed up by 1,000 checks; the libraries "
           "take turns to go first. Python lets at most 64 checks be in progress at once (the saturation's "
           "concurrency; the rest wait for a slot, their wait counted): redis-py takes a connection per command in "
           "flight and `limits` slows as they grow. 1 rule, 10,000 clients, 1000 per 60 s, every check admitted. "
           "`pacer alone` "
           "is the same schedule with a check that answers at once: the floor the harness adds. *Achieved* below "
           "the offered rate means the library fell behind.", ""]
    build = run(["npm", "run", "--silent", "build"], env=dict(os.environ, THROTTLEGATE_BUILD_PROFILE="release"))
    if build.returncode != 0:
        GOALS.append(("Latency (all goals)", "failed", "**failed**"))
        return out + ["FAILED: the release addon did not build (`npm run build`).", "", "```",
                      build.stderr.strip()[-2000:], "```", ""], False
    AT_START["latency"] = built_artifacts("latency", work)
    url = f"redis://127.0.0.1:{port}/0"
    good = True
    runs = [
        ("Node", [*pin, "node", str(ROOT / "benches/node/latency.js"), f"{seconds:g}", "--redis-url", url, "--json",
                  str(work / "latency-node.json")], None,
         "throttlegate", "rate-limiter-flexible", "RateLimiterRedis", "RateLimiterRedis's"),
        ("Python", [*pin, str(ROOT / ".venv/bin/python"), str(ROOT / "benches/python/latency.py"), "--url", url,
                    "--seconds", f"{seconds:g}", "--json", str(work / "latency-python.json")],
         dict(os.environ, PYTHONPATH=str(work / "python")), "throttlegate", "limits",
         "limits (asyncio moving window)", "limits'"),
    ]
    for lang, cmd, env, ours, peer, peer_label, peers in runs:
        r.call("FLUSHALL")
        # Longer than the other parts' cases: six open-loop points of up to 20,000 samples each.
        status, stdout = run_part(cmd, part_timeout(seconds) + 120, env=env)
        result = Path(cmd[-1])
        if status != 0 or not result.exists():
            _rows, failure = part_rows(f"Latency, {lang}", cmd[len(pin):], status, stdout, result)
            out += [f"**{lang}**:", "", *failure]
            good = False
            continue
        shown = ["URL" if a == url else "FILE" if a == str(result) else a for a in cmd[len(pin):]]
        shown[0:2] = [Path(shown[0]).name if lang == "Node" else ".venv/bin/python",
                      str(Path(shown[1]).relative_to(ROOT))]
        out += latency_table(lang, shlex.join(shown), json.loads(result.read_text()), ours, peer, peer_label, peers)
    r.call("FLUSHALL")
    return out, good


# ---------------------------------------------------------------------------


def machine() -> tuple[str, str]:
    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return str(os.cpu_count()), model


def versions() -> str:
    def pkg(path: str) -> str:
        try:
            return str(json.loads((ROOT / path).read_text())["version"])
        except (OSError, ValueError, KeyError):
            return "?"

    py = run([str(ROOT / ".venv/bin/python"), "-c",
              "import platform, limits, redis, throttlegate; "
              "print(platform.python_version(), limits.__version__, redis.__version__, throttlegate.__version__)"])
    pyv = py.stdout.split() if py.returncode == 0 else ["?"] * 4
    node = run(["node", "--version"]).stdout.strip()
    rustc = run(["rustc", "--version"]).stdout.strip()
    commit = run(["git", "rev-parse", "--short", "HEAD"]).stdout.strip() or "?"
    # What was built and measured is the working tree: say when it differs from the commit.
    changed = [line[3:] for line in run(["git", "status", "--porcelain", "--untracked-files=all"]).stdout.splitlines()
               if not line[3:].startswith("benches/compare/")]
    if changed:
        commit += f" plus uncommitted changes to {len(changed)} file{'s' if len(changed) > 1 else ''}"
    return (f"throttlegate {pyv[3]} (commit {commit}); Node {node}, rate-limiter-flexible "
            f"{pkg('node_modules/rate-limiter-flexible/package.json')}, ioredis {pkg('node_modules/ioredis/package.json')}; "
            f"Python {pyv[0]}, limits {pyv[1]}, redis-py {pyv[2]} with hiredis; {rustc}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True, help="the redis-server run.sh started")
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds per case")
    ap.add_argument("--work", type=Path, required=True, help="a scratch folder")
    ap.add_argument("--script", type=Path,
                    help="throttlegate's Lua script (`cargo run -q --release -p throttlegate-cli -- script`); "
                         f"needed by the parts {', '.join(sorted(SCRIPT_PARTS))}")
    ap.add_argument("--out", type=Path, required=True, help="the markdown report to write")
    ap.add_argument("--pin-client", default="", help="command prefix pinning the clients (taskset -c 1)")
    ap.add_argument("--pin-redis", default="", help="how the server was pinned (for the report)")
    ap.add_argument("--only", default=",".join(PARTS),
                    help=f"comma-separated parts to run (default all: {','.join(PARTS)})")
    ap.add_argument("--broken", action="append", default=[], metavar="PART=REASON",
                    help="a part that cannot run (its build failed): reported as not run")
    args = ap.parse_args()
    # run.sh stops this process with SIGTERM: unwind, so that a running part's process group is killed too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        ap.error(f"--only: unknown part(s) {', '.join(unknown)}; the parts are {', '.join(PARTS)}")
    if args.script is None and SCRIPT_PARTS.intersection(parts):
        ap.error(f"--script is needed by the parts {', '.join(sorted(SCRIPT_PARTS.intersection(parts)))}")
    pin = shlex.split(args.pin_client)
    started = time.monotonic()

    r = Resp(args.port)
    redis_version = next(line.split(":", 1)[1] for line in r.call("INFO", "server").splitlines()
                         if line.startswith("redis_version:"))
    sha_min = r.call("SCRIPT", "LOAD", (HERE / "minimal.lua").read_text())
    sha_tg = r.call("SCRIPT", "LOAD", args.script.read_text()) if args.script else ""
    sha_incr = r.call("SCRIPT", "LOAD", (HERE / "minimal_incr.lua").read_text())

    ok = True
    sections: list[str] = []
    ceiling_tg1 = None
    probe = None
    broken = dict(b.split("=", 1) for b in args.broken)
    titles = {"redis": "## 1-2. The ceiling and Redis's own cost per check", "memory": "## 3. Redis memory per tracked key",
              "node": "## 4. Node", "python": "## 5. Python", "rust": "## 6. Embedded backend from Rust",
              "algos": "## 7. Every algorithm on Redis", "node-algos": "## 8. Node, fixed window",
              "python-algos": "## 9. Python, sliding window of counters", "burst": "## 10. Boundary burst",
              "latency": "## 11. Latency per check, open loop", "reserve": "## 12. One hot key with reserve",
              "concurrency": "## 13. Concurrency rules"}
    for part in PARTS:
        if part not in parts:
            continue
        if part in broken:
            progress(f"== {part}: NOT RUN, {broken[part]}")
            sections += [titles[part], "", f"NOT RUN: {broken[part]}.", ""]
            GOALS.append((f"{part} (all goals)", "not run", "**not run**"))
            ok = False
        elif part == "redis":
            progress("== 1-2. redis-benchmark EVALSHA: minimal script, throttlegate 1 rule, 4 rules")
            scripts = bench_scripts(r, args.port, pin, args.seconds, sha_min, sha_tg)
            sections += report_scripts(scripts)
            ceiling_tg1 = median(scripts["rps"][(LOADS[2][0], "throttlegate, 1 rule")])
            probe = ceiling_probe(r, args.port, pin, scripts, sha_min, sha_tg)
        elif part == "memory":
            progress("== 3. memory per key")
            sections += bench_memory(r, sha_tg)
        elif part == "concurrency":
            progress("== 12. concurrency: Redis's cost per check and release, memory per key")
            sections += bench_concurrency(r, sha_tg)
        elif part == "algos":
            progress("== 7. every algorithm: memory per key, Redis's cost per check")
            sections += bench_algo_memory(r, sha_tg)
            sections += bench_algo_cost(r, args.port, pin, args.seconds, sha_tg, sha_incr)
        elif part == "burst":
            progress("== 10. boundary-burst trace")
            lines, good = bench_burst(r, args.port, pin, args.work)
            sections += lines
            ok &= good
        else:
            progress(f"== {titles[part][3:]}")
            mark = len(GOALS)
            for attempt in (1, 2):
                if part == "node":
                    lines, good = bench_node(r, args.port, pin, args.seconds, args.work, ceiling_tg1, probe)
                elif part == "node-algos":
                    lines, good = bench_node_algos(r, args.port, pin, args.seconds, args.work)
                elif part == "python":
                    AT_START["python"] = built_artifacts("python", args.work)
                    lines, good = bench_python(r, args.port, pin, args.seconds, args.work)
                elif part == "python-algos":
                    AT_START["python-algos"] = built_artifacts("python", args.work)
                    lines, good = bench_python_algos(r, args.port, pin, args.seconds, args.work)
                elif part == "latency":
                    lines, good = bench_latency(r, args.port, pin, args.seconds, args.work)
                elif part == "reserve":
                    AT_START["reserve"] = built_artifacts("python", args.work)
                    lines, good = bench_reserve(args.port, pin, args.seconds, args.work)
                else:
                    lines, good = bench_criterion(pin, args.seconds, args.work)
                before = AT_START.get(part, {})
                stable = built_artifacts("python" if part == "reserve" else part.split("-")[0], args.work) == before
                if stable or attempt == 2:
                    break
                # Another build in this checkout replaced the library under the benchmark: once more.
                progress(f"  {', '.join(before)} changed during the run (another build): running this part again")
                del GOALS[mark:]
            if not stable:
                note = (f"WARNING: {', '.join(before)} changed while this part ran (another build in the same "
                        "checkout): the figures above may mix two builds.")
                progress("  " + note)
                lines += [note, ""]
                ok = False
            sections += lines
            ok &= good
    r.close()

    cpus, model = machine()
    pinning = (f"redis-server pinned with `{args.pin_redis}`, every client with `{args.pin_client}`"
               if args.pin_client else "no pinning (taskset missing or a single core): server and clients share the cores")
    head = [
        "# throttlegate next to its peers, side by side",
        "",
        "Written by `benches/compare/run.sh` (`make compare`); overwritten on every run. "
        "See README.md here for what each table means.",
        "",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, "
        f"{time.monotonic() - started:.0f} s of measuring, {args.seconds:g} s per case",
        f"- Machine: {cpus} CPUs (nproc), {model}, {platform.system()} {platform.release()}, "
        f"load average {os.getloadavg()[0]:.1f} at the end",
        f"- Redis {redis_version}, one private redis-server, no persistence; {pinning}",
        f"- {versions()}",
        "- Method: 10,000 keys per rule, limit 1000 per 60 s (the Redis tables and the memory table); "
        f"each Redis measurement repeated {REPEATS} times, alternating scripts, medians reported; "
        "the Node and Python benchmarks run their own scenarios and policies (described in their headers) "
        "against the same redis-server.",
        "",
        "## Goals",
        "",
        "| goal | measured | met |",
        "| --- | ---: | --- |",
        *[f"| {g} | {m} | {ok_} |" for g, m, ok_ in GOALS],
        "",
    ]
    text = "\n".join(head + sections).rstrip() + "\n"
    args.out.write_text(text)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
