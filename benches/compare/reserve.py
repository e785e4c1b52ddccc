#!/usr/bin/env python3
"""One hot key, 4 processes, the same rule with and without `reserve`
(docs/concepts/reserve.md), on one redis-server, for every algorithm that
takes it: fixed window, quota, sliding window (counters), sliding-window log
and token bucket.

Throughput: each process checks the key as fast as it can for `--seconds`
(limits of 10^9: nothing is denied; the bucket refills at 1 per second, so it
is never full again during the run); reported: checks per second of the 4
together, script runs per check (INFO commandstats: EVALSHA + EVAL), and
`redis-benchmark` INCR pipelined 16 deep on one key for comparison.

Exactness: demand far above the limit for `--seconds` + 2; each process
records every admission (the time it was answered, and for a fixed window the
window that counted it). Reported per algorithm: the most admitted against
the bound, and the largest under-admission:

  fixed window   per 1 s window of `--limit` units (windows fully inside the run)
  quota          the whole run, inside one hour of `--limit` x 4 units
  sliding window / log   every interval of 1 s less JITTER (by the
                 admissions' times) against a 1 s window of `--limit` units
  token bucket   every interval [a, b]: admitted - rate x (b - a), against a
                 capacity of `--limit` units refilled at `--limit` per second,
                 plus rate x JITTER

Times are taken in the processes after each answer, not where the backend
counted them: JITTER (10 ms) allows for that at the ends of an interval.

With `--rust BIN` (core/examples/reserve_hot.rs, built in release), every
case is measured a second time from Rust: 4 processes of BIN, each checking
the key from one thread with a limiter of its own, the same rules, script
runs and exactness checks.

    python benches/compare/reserve.py --port 6379 [--seconds 3] [--rust BIN] [--json out.json]
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


# How late an admission's time may be taken after the moment it counts from (seconds).
JITTER = 0.01
ALGORITHMS = ("fixed_window", "quota", "sliding_window", "sliding_window_log", "token_bucket")


def rule(algorithm: str, limit: int, reserve: int | None) -> dict:
    """The rule of `algorithm` at `limit` units (1 s windows, an hour's quota, a bucket refilled at `limit`/s)."""
    r: dict = {"name": "hot", "key": "k:{k}", "algorithm": algorithm}
    if algorithm == "quota":
        r.update(limit=limit, period="hour")
    elif algorithm == "token_bucket":
        # Throughput: a bucket that never runs dry but is never full either (a budget
        # refilled slowly): a reservation lasts only until the bucket could be full again.
        r.update(capacity=limit, refill_rate=limit if limit < 10**9 else 1)
    else:
        r.update(limit=limit, window="1s" if limit < 10**9 else "1h")
    if reserve:
        r["reserve"] = reserve
    return r


def worker(url: str, prefix: str, spec: dict, seconds: float, start: float, out: "mp.Queue") -> None:
    limiter = tg.Limiter([spec], url=url, prefix=prefix, timeout=5.0, on_backend_error="error")
    attrs = {"k": "hot"}
    while time.time() < start:
        time.sleep(0.001)
    checks, windows, times = 0, Counter(), []
    end = start + seconds
    window_us = 1_000_000
    record = spec.get("limit", spec.get("capacity")) < 10**9
    while time.time() < end:
        d = limiter.check(attrs)
        checks += 1
        if d.allowed and record:
            now = time.time()
            times.append(now)
            if spec["algorithm"] == "fixed_window":
                # The end of the window that counted it, rounded to the window.
                windows[round((now + d.reset_after) * 1_000_000 / window_us)] += 1
    limiter.close()
    out.put((checks, dict(windows), times))


def rust_workers(rust: str, url: str, prefix: str, spec: dict, seconds: float, start: float) -> list:
    """4 processes of the Rust benchmark (reserve_hot), one thread each: (checks, windows, times) per process."""
    policy = json.dumps({"prefix": prefix, "timeout": "5s", "on_backend_error": "error", "rules": [spec]})
    record = "1" if spec.get("limit", spec.get("capacity")) < 10**9 else "0"
    procs = [subprocess.Popen([rust, url, policy, str(seconds), repr(start), record, "1"], stdout=subprocess.PIPE,
                              text=True) for _ in range(PROCS)]
    results = []
    for p in procs:
        stdout, _ = p.communicate(timeout=seconds + 60)
        if p.returncode != 0:
            raise RuntimeError(f"{rust} exited with {p.returncode}")
        for line in stdout.splitlines():
            r = json.loads(line)
            results.append((r["checks"], r["windows"], r["times"]))
    return results


def run(url: str, port: int, prefix: str, spec: dict, seconds: float, rust: str | None = None) -> dict:
    before = script_runs(port)
    start = time.time() + 0.5
    if rust:
        results = rust_workers(rust, url, prefix, spec, seconds, start)
    else:
        ctx = mp.get_context("fork")
        out: mp.Queue = ctx.Queue()
        procs = [ctx.Process(target=worker, args=(url, prefix, spec, seconds, start, out)) for _ in range(PROCS)]
        for p in procs:
            p.start()
        results = [out.get(timeout=seconds + 60) for _ in procs]
        for p in procs:
            p.join()
    runs = script_runs(port) - before
    checks = sum(c for c, _, _ in results)
    windows: Counter = Counter()
    times: list[float] = []
    for _, w, t in results:
        windows.update({int(k): v for k, v in w.items()})
        times.extend(t)
    times.sort()
    return {"checks": checks, "checks_per_s": checks / seconds, "script_runs": runs,
            "runs_per_check": runs / checks if checks else 0.0, "windows": dict(sorted(windows.items())),
            "times": times, "start": start, "end": start + seconds}


def most_in_window(times: list[float], window: float) -> int:
    """The most admissions in any interval of `window` seconds."""
    best, i = 0, 0
    for j, t in enumerate(times):
        while times[i] <= t - window:
            i += 1
        best = max(best, j - i + 1)
    return best


def most_above_refill(times: list[float], rate: float) -> float:
    """The most of admitted - rate x length over the intervals [t_i, t_j]."""
    best, low = 0.0, float("inf")
    for j, t in enumerate(times):
        low = min(low, j - rate * t)
        best = max(best, (j + 1) - rate * t - low)
    return best


def exactness(algorithm: str, e: dict, limit: int) -> tuple[float, float, float]:
    """(most admitted, its bound, largest under-admission) of an exactness run."""
    times = e["times"]
    if algorithm == "fixed_window":
        full = list(e["windows"].values())[1:-1]  # windows fully inside the run
        return (max(full) if full else 0), limit, (max(limit - v for v in full) if full else 0)
    if algorithm == "quota":
        return len(times), limit, limit - len(times)
    if algorithm == "token_bucket":
        return round(most_above_refill(times, limit), 1), limit + limit * JITTER, 0
    # Sliding windows: every 1 s interval; under-admission over the 1 s windows fully inside the run.
    most = most_in_window(times, 1.0 - JITTER)
    least = min((sum(1 for t in times if a <= t < a + 1.0) for a in range(int(e["start"]) + 1, int(e["end"]) - 1)),
                default=limit)
    return most, limit, max(0, limit - least)


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
    ap.add_argument("--limit", type=int, default=2000, help="units per 1 s (window, bucket capacity and rate)")
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS), help="comma-separated, of " + ", ".join(ALGORITHMS))
    ap.add_argument("--rust", help="the Rust benchmark (core/examples/reserve_hot.rs, release): measure from Rust too")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    url = f"redis://127.0.0.1:{args.port}/0"
    res: dict = {"algorithms": {}}
    lines = ["| algorithm | from | case | checks/s (4 processes) | script runs per check | most admitted / bound | "
             "largest under-admission |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    ok = True
    clients = [("Python", None, "algorithms")] + ([("Rust", args.rust, "rust")] if args.rust else [])
    for algorithm in args.algorithms.split(","):
        limit = args.limit * 4 if algorithm == "quota" else args.limit
        for client, rust, at in clients:
            per = res.setdefault(at, {})[algorithm] = {}
            for label, reserve in (("direct", None), ("reserve", args.reserve)):
                t = run(url, args.port, f"bench-{at}-{algorithm}-{label}-{time.time_ns()}:",
                        rule(algorithm, 10**9, reserve), args.seconds, rust)
                e = run(url, args.port, f"exact-{at}-{algorithm}-{label}-{time.time_ns()}:",
                        rule(algorithm, limit, reserve), args.seconds + 2, rust)
                most, bound, under = exactness(algorithm, e, limit)
                ok = ok and most <= bound
                for r in (t, e):
                    del r["times"]
                e.update(worst=most, bound=bound, under=under)
                per[label], per[label + "-exact"] = t, e
                lines.append(f"| {algorithm} | {client} | {label} | {t['checks_per_s']:,.0f} | {t['runs_per_check']:.4f} | "
                             f"{most:g} / {bound} | {under:g} |")
            if algorithm == "fixed_window" and at == "algorithms":
                # The figures of the earlier fixed-window-only report.
                for k in ("direct", "reserve", "direct-exact", "reserve-exact"):
                    res[k] = per[k]
    res["incr_p16"] = incr_pipelined(args.port)
    lines.append(f"| INCR pipelined 16 deep, 4 clients (redis-benchmark) | | | {res['incr_p16']:,.0f} | | | |")
    lines.append("")
    for client, _, at in clients:
        for algorithm, per in res[at].items():
            ratio = per["reserve"]["checks_per_s"] / per["direct"]["checks_per_s"]
            runs = per["reserve"]["runs_per_check"]
            vs_incr = per["reserve"]["checks_per_s"] / res["incr_p16"]
            lines.append(f"{client}, {algorithm}: reserve / direct checks per second {ratio:.1f}x, "
                         f"{vs_incr:.2f}x INCR -P 16; script runs with reserve: "
                         + (f"1 per {1 / runs:.0f} checks" if runs else "none"))
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
