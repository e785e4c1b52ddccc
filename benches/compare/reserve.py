#!/usr/bin/env python3
"""One hot key, 4 processes, the same fixed-window rule with and without
`reserve` (docs/concepts/reserve.md), on one redis-server.

Throughput: each process checks the key as fast as it can for `--seconds`
(limit 10^9 per hour: nothing is denied); reported: checks per second of the
4 together, script runs per check (INFO commandstats: EVALSHA + EVAL), and
`redis-benchmark` INCR pipelined 16 deep on one key for comparison.

Exactness: windows of 1 s with a limit of `--limit` units each, demand far
above it; each process tags every admission with its window (its end is the
decision's reset_after from now, rounded to the window), so the admitted total
of every window is known: it must be at most the limit, and the largest
under-admission of a window fully inside the run is reported.

    python benches/compare/reserve.py --port 6379 [--seconds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import subprocess
import sys
import time
from collections import Counter

import throttlegate as tg

PROCS = 4


def redis_call(port: int, *args: str) -> str:
    s = socket.create_connection(("127.0.0.1", port))
    msg = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
    s.sendall(msg.encode())
    data = b""
    while True:
        chunk = s.recv(65536)
        data += chunk
        if not chunk or (data.startswith(b"$") and data.count(b"\r\n") >= 2) or (not data.startswith(b"$") and data.endswith(b"\r\n")):
            break
    s.close()
    text = data.decode()
    return text.split("\r\n", 1)[1] if text.startswith("$") else text


def script_runs(port: int) -> int:
    runs = 0
    for line in redis_call(port, "INFO", "commandstats").splitlines():
        if line.startswith(("cmdstat_evalsha:", "cmdstat_eval:")):
            runs += int(line.split("calls=")[1].split(",")[0])
    return runs


def rule(limit: int, window: str, reserve: int | None) -> dict:
    r = {"name": "hot", "key": "k:{k}", "algorithm": "fixed_window", "limit": limit, "window": window}
    if reserve:
        r["reserve"] = reserve
    return r


def worker(url: str, prefix: str, spec: dict, seconds: float, start: float, out: "mp.Queue") -> None:
    limiter = tg.Limiter([spec], url=url, prefix=prefix, timeout=5.0, on_backend_error="error")
    attrs = {"k": "hot"}
    while time.time() < start:
        time.sleep(0.001)
    checks, windows = 0, Counter()
    end = start + seconds
    window_us = 1_000_000
    while time.time() < end:
        d = limiter.check(attrs)
        checks += 1
        if d.allowed:
            # The end of the window that counted it, rounded to the window.
            w = round((time.time() + d.reset_after) * 1_000_000 / window_us)
            windows[w] += 1
    limiter.close()
    out.put((checks, dict(windows)))


def run(url: str, port: int, prefix: str, spec: dict, seconds: float) -> dict:
    ctx = mp.get_context("fork")
    out: mp.Queue = ctx.Queue()
    before = script_runs(port)
    start = time.time() + 0.5
    procs = [ctx.Process(target=worker, args=(url, prefix, spec, seconds, start, out)) for _ in range(PROCS)]
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join()
    runs = script_runs(port) - before
    checks = sum(c for c, _ in results)
    windows: Counter = Counter()
    for _, w in results:
        windows.update({int(k): v for k, v in w.items()})
    return {"checks": checks, "checks_per_s": checks / seconds, "script_runs": runs,
            "runs_per_check": runs / checks if checks else 0.0, "windows": dict(sorted(windows.items()))}


def incr_pipelined(port: int) -> float:
    out = subprocess.run(["redis-benchmark", "-p", str(port), "-q", "-n", "2000000", "-P", "16", "-c", "4",
                          "INCR", "hot-incr"], capture_output=True, text=True, check=True).stdout
    # "INCR hot-incr: 123456.78 requests per second, p50=..."
    return float(out.strip().splitlines()[-1].split(":")[1].split("requests")[0].split()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--reserve", type=int, default=100)
    ap.add_argument("--limit", type=int, default=2000, help="units per 1 s window in the exactness run")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    url = f"redis://127.0.0.1:{args.port}/0"
    res = {}
    for label, reserve in (("direct", None), ("reserve", args.reserve)):
        res[label] = run(url, args.port, f"bench-{label}-{time.time_ns()}:", rule(10**9, "1h", reserve), args.seconds)
        res[label + "-exact"] = run(url, args.port, f"exact-{label}-{time.time_ns()}:",
                                    rule(args.limit, "1s", reserve), args.seconds + 2)
    res["incr_p16"] = incr_pipelined(args.port)
    lines = ["| case | checks/s (4 processes) | script runs per check | worst window: admitted / limit | largest under-admission of a window |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for label in ("direct", "reserve"):
        t, e = res[label], res[label + "-exact"]
        full = list(e["windows"].values())[1:-1]  # windows fully inside the run
        worst = max(full) if full else 0
        under = max(args.limit - v for v in full) if full else 0
        e["worst"], e["under"] = worst, under
        lines.append(f"| {label} | {t['checks_per_s']:,.0f} | {t['runs_per_check']:.4f} | {worst} / {args.limit} | {under} |")
    lines.append(f"| INCR pipelined 16 deep, 4 clients (redis-benchmark) | {res['incr_p16']:,.0f} | | | |")
    ratio = res["reserve"]["checks_per_s"] / res["direct"]["checks_per_s"]
    lines.append("")
    lines.append(f"reserve / direct checks per second: {ratio:.1f}x; script runs per check with reserve: "
                 f"1 per {1 / res['reserve']['runs_per_check']:.0f} checks" if res["reserve"]["runs_per_check"] else "")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    ok = all(res[k + "-exact"]["worst"] <= args.limit for k in ("direct", "reserve"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
