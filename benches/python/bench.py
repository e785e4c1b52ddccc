"""Throughput of throttlegate's check / check_async against one Redis, next to
the `limits` library's moving-window limiter (redis-py with hiredis) on the
same Redis in the same run, and the cost of an embedded-backend check.

    .venv/bin/pip install . limits redis hiredis
    .venv/bin/python benches/python/bench.py [--url redis://127.0.0.1:6379/0] [--calls 10000] [--json FILE]

Without --url a private redis-server is started on a free loopback port;
on a machine with 2 or more cores it is pinned to core 0 and this process
(the clients of both libraries) to core 1, as in the performance issue's
method (--no-pin leaves both unpinned). With --url nothing is pinned here:
the caller decides (`taskset -c 1 .venv/bin/python ...`).

The setup is the one of the performance issue: 10,000 distinct clients, a
limit of 1000 per 60 s for both libraries, 1 rule or 4 stacked rules (each
keyed by its own attribute, so every rule has 10,000 keys). Every round
starts on fresh keys and stays under the limit, so every call is admitted and
both libraries do the same work: one log entry per rule per call. `limits`
has no stacked check, so it makes one `hit` per rule, as an application
would. Attribute dicts are built before timing. Each scenario runs --repeat
rounds (default 3), the two libraries taking turns to go first, and reports
the median round of each, so that the ratio compares like with like on a
machine whose load changes.

Rows: `check` sequential and from 8 threads, `check_async` from 64 asyncio
tasks, and the embedded backend (microseconds per `check`, next to `limits`'
in-memory moving window). `--json FILE` writes the rows as a JSON array:
`{"scenario", "rules", "ours", "theirs"}` in checks/s, and for the embedded
backend `{"scenario": "embedded", "rules", "us_per_check", "theirs_us_per_check",
"theirs_fixed_us_per_check"}` (limits' MovingWindowRateLimiter and
FixedWindowRateLimiter over MemoryStorage, in the same run).

`--algorithm NAME` gives throttlegate's rules another algorithm (default
sliding_window_log; sliding_window, fixed_window, quota with a period of a
day, token_bucket with the same 1000 per 60 s), `--peer NAME` picks `limits`'
strategy (moving_window, the default; sliding_window_counter; fixed_window),
`--rules 1,4` the rule counts and `--no-embedded` skips the embedded rows.
`--algorithm sliding_window --peer sliding_window_counter` compares like with
like: both keep counters per window instead of a log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import limits
import limits.aio.storage
import limits.aio.strategies
import limits.storage
import limits.strategies
import redis.utils

import throttlegate

KEYS = 10_000
LIMIT = 1000
WINDOW = "1m"
RULE_ATTRS = [("ip", "ip:{ip}"), ("api_key", "key:{api_key}"), ("user", "user:{user}"), ("device", "device:{device}")]

SEQUENTIAL = "sequential"
THREADS = "8 threads"
TASKS = "64 asyncio tasks"
EMBEDDED = "embedded"


def can_pin() -> bool:
    return hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2 and shutil.which("taskset") is not None


def start_redis(pin: bool) -> tuple[subprocess.Popen[bytes], str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="throttlegate-bench-")
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    cores = sorted(os.sched_getaffinity(0)) if pin else []
    prefix = ["taskset", "-c", str(cores[0])] if pin else []
    proc = subprocess.Popen(
        [*prefix, exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir],
        stdout=subprocess.DEVNULL,
    )
    if pin:
        os.sched_setaffinity(0, {cores[1]})
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    return proc, f"redis://127.0.0.1:{port}/0", workdir


@contextlib.contextmanager
def redis_for(url: str | None, no_pin: bool):
    """The Redis to measure, as `(url, pinned)`: `url` itself, or else a
    private redis-server (pinned to one core, this process to another, when
    it can be and `no_pin` is false), stopped on exit."""
    pinned = url is None and not no_pin and can_pin()
    proc = workdir = None
    if url is None:
        proc, url, workdir = start_redis(pinned)
    try:
        yield url, pinned
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)

def client_attrs(rules: int) -> list[dict[str, str]]:
    """One attribute dict per client, each rule's attribute distinct per client."""
    out = []
    for n in range(KEYS):
        values = {"ip": f"10.{n // 65536}.{n // 256 % 256}.{n % 256}", "api_key": f"k_{n}", "user": f"u_{n}",
                  "device": f"d_{n}"}
        out.append({name: values[name] for name, _ in RULE_ATTRS[:rules]})
    return out


ALGORITHM = "sliding_window_log"  # throttlegate's (--algorithm)
PEER = "moving_window"  # limits' strategy (--peer)
ALGORITHMS = {
    "sliding_window_log": {"limit": LIMIT, "window": WINDOW},
    "sliding_window": {"algorithm": "sliding_window", "limit": LIMIT, "window": WINDOW},
    "fixed_window": {"algorithm": "fixed_window", "limit": LIMIT, "window": WINDOW},
    "quota": {"algorithm": "quota", "limit": LIMIT, "period": "day"},
    "token_bucket": {"algorithm": "token_bucket", "capacity": LIMIT, "refill_rate": LIMIT / 60},
}
PEERS = {"moving_window": "MovingWindowRateLimiter", "sliding_window_counter": "SlidingWindowCounterRateLimiter",
         "fixed_window": "FixedWindowRateLimiter"}


def tg_limiter(url: str | None, rules: int) -> throttlegate.Limiter:
    policy = [{"name": f"r{i}-{name}", "key": key, **ALGORITHMS[ALGORITHM]}
              for i, (name, key) in enumerate(RULE_ATTRS[:rules])]
    return throttlegate.Limiter(policy, url=url, prefix=f"bench-{uuid.uuid4().hex[:8]}:", timeout=5.0,
                                on_backend_error="error")


def run_threads(total: int, threads: int, call: Callable[[int], Any]) -> float:
    per = total // threads
    barrier = threading.Barrier(threads + 1)

    def work(t: int) -> None:
        barrier.wait()
        for i in range(t * per, (t + 1) * per):
            call(i)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    start = time.perf_counter()
    for w in workers:
        w.join()
    return per * threads / (time.perf_counter() - start)


def run_tasks(total: int, tasks: int, make: Callable[[], Any], call: Callable[[Any, int], Any]) -> float:
    per = total // tasks

    async def main() -> float:
        ctx = make()

        async def work(t: int) -> None:
            for i in range(t * per, (t + 1) * per):
                await call(ctx, i)

        for i in range(64):  # connect and warm up before timing
            await call(ctx, total + i)
        start = time.perf_counter()
        await asyncio.gather(*(work(t) for t in range(tasks)))
        return per * tasks / (time.perf_counter() - start)

    return asyncio.run(main())


class Row:
    """One scenario's throughput for both libraries (median of the rounds)."""

    def __init__(self, scenario: str, rules: int, ours: list[float], theirs: list[float]) -> None:
        self.scenario = scenario
        self.rules = rules
        self.ours = statistics.median(ours)
        self.theirs = statistics.median(theirs)


def ours_round(url: str, rules: int, attrs: list[dict[str, str]], calls: int, scenario: str) -> float:
    """throttlegate's checks/s in one round, on fresh keys."""
    lim = tg_limiter(url, rules)
    for i in range(300):  # connect and warm up
        lim.check(attrs[(calls + i) % KEYS])
    denied = 0
    if scenario == TASKS:

        async def call(ctx: throttlegate.Limiter, i: int) -> None:
            nonlocal denied
            if not (await ctx.check_async(attrs[i % KEYS])).allowed:
                denied += 1

        rate = run_tasks(calls, 64, lambda: lim, call)
    else:

        def check(i: int) -> None:
            nonlocal denied
            if not lim.check(attrs[i % KEYS]).allowed:
                denied += 1

        rate = run_threads(calls, 1 if scenario == SEQUENTIAL else 8, check)
    lim.close()
    assert denied == 0, f"throttlegate denied {denied} checks: the bench would not compare like with like"
    return rate


def theirs_round(url: str, rules: int, attrs: list[dict[str, str]], calls: int, scenario: str) -> float:
    """limits' checks/s in one round (one `hit` per rule), on fresh keys."""
    item = limits.RateLimitItemPerMinute(LIMIT)
    names = [name for name, _ in RULE_ATTRS[:rules]]
    ns = f"bench-{uuid.uuid4().hex[:8]}"
    denied = 0
    if scenario == TASKS:

        def make() -> Any:
            st = limits.aio.storage.RedisStorage("async+" + url, implementation="redispy")
            return getattr(limits.aio.strategies, PEERS[PEER])(st)

        async def call(ctx: Any, i: int) -> None:
            nonlocal denied
            a = attrs[i % KEYS]
            for name in names:
                if not await ctx.hit(item, ns, name, a[name]):
                    denied += 1
                    return

        rate = run_tasks(calls, 64, make, call)
    else:
        moving = getattr(limits.strategies, PEERS[PEER])(limits.storage.RedisStorage(url))

        def hit(i: int) -> None:
            nonlocal denied
            a = attrs[i % KEYS]
            for name in names:
                if not moving.hit(item, ns, name, a[name]):
                    denied += 1
                    return

        for i in range(300):
            hit(calls + i)
        rate = run_threads(calls, 1 if scenario == SEQUENTIAL else 8, hit)
    assert denied == 0, f"limits denied {denied} hits"
    return rate


def redis_rows(url: str, calls: int, repeat: int, rule_counts: list[int]) -> list[Row]:
    rows = []
    for rules in rule_counts:
        attrs = client_attrs(rules)
        for scenario in (SEQUENTIAL, THREADS, TASKS):
            ours: list[float] = []
            theirs: list[float] = []
            for r in range(repeat):
                # Alternate who goes first, so that a change of load on the
                # machine falls on both sides.
                if r % 2 == 0:
                    ours.append(ours_round(url, rules, attrs, calls, scenario))
                    theirs.append(theirs_round(url, rules, attrs, calls, scenario))
                else:
                    theirs.append(theirs_round(url, rules, attrs, calls, scenario))
                    ours.append(ours_round(url, rules, attrs, calls, scenario))
            rows.append(Row(scenario, rules, ours, theirs))
            print(f"  {scenario}, {rules} rule{'s' if rules > 1 else ''}: "
                  f"{rows[-1].ours:,.0f} vs {rows[-1].theirs:,.0f} checks/s", file=sys.stderr, flush=True)
    return rows


def embedded_rows(checks: int, repeat: int) -> list[dict[str, Any]]:
    rows = []
    item = limits.RateLimitItemPerMinute(LIMIT)
    for rules in (1, 4):
        attrs = client_attrs(rules)
        names = [name for name, _ in RULE_ATTRS[:rules]]
        ours_us: list[float] = []
        theirs_us: list[float] = []
        fixed_us: list[float] = []
        for _ in range(repeat):
            lim = tg_limiter(None, rules)
            check = lim.check
            for a in attrs:
                check(a)
            start = time.perf_counter()
            for i in range(checks):
                check(attrs[i % KEYS])
            ours_us.append((time.perf_counter() - start) / checks * 1e6)
            lim.close()

            moving = limits.strategies.MovingWindowRateLimiter(limits.storage.MemoryStorage())
            hit = moving.hit
            theirs_checks = max(checks // 10, KEYS)
            start = time.perf_counter()
            for i in range(theirs_checks):
                a = attrs[i % KEYS]
                for name in names:
                    hit(item, "bench", name, a[name])
            theirs_us.append((time.perf_counter() - start) / theirs_checks * 1e6)

            fixed = limits.strategies.FixedWindowRateLimiter(limits.storage.MemoryStorage())
            hit = fixed.hit
            start = time.perf_counter()
            for i in range(theirs_checks):
                a = attrs[i % KEYS]
                for name in names:
                    hit(item, "bench", name, a[name])
            fixed_us.append((time.perf_counter() - start) / theirs_checks * 1e6)
        rows.append({"scenario": EMBEDDED, "rules": rules, "us_per_check": round(statistics.median(ours_us), 3),
                     "theirs_us_per_check": round(statistics.median(theirs_us), 3),
                     "theirs_fixed_us_per_check": round(statistics.median(fixed_us), 3)})
    return rows


def main() -> None:
    global ALGORITHM, PEER
    parser = argparse.ArgumentParser(description="throttlegate vs limits (moving window) on one Redis")
    parser.add_argument("--url", help="Redis URL (default: start a private redis-server)")
    parser.add_argument("--calls", type=int, default=10_000, help="checks per Redis scenario (default 10000)")
    parser.add_argument("--embedded-checks", type=int, default=200_000,
                        help="checks timed on the embedded backend (default 200000)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds per scenario, alternating which library goes first; the median is kept "
                             "(default 3)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows to FILE as a JSON array")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the private redis-server and the clients")
    parser.add_argument("--algorithm", choices=sorted(ALGORITHMS), default=ALGORITHM,
                        help="throttlegate's algorithm (default sliding_window_log)")
    parser.add_argument("--peer", choices=sorted(PEERS), default=PEER, help="limits' strategy (default moving_window)")
    parser.add_argument("--rules", default="1,4", help="comma-separated rule counts, of 1 and 4 (default 1,4)")
    parser.add_argument("--no-embedded", action="store_true", help="skip the embedded-backend rows")
    args = parser.parse_args()
    ALGORITHM, PEER = args.algorithm, args.peer
    rule_counts = [int(x) for x in args.rules.split(",")]
    if not rule_counts or any(x not in (1, 4) for x in rule_counts):
        parser.error(f"--rules: expected a comma-separated list of 1 and 4, got {args.rules!r}")
    load_at_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    with redis_for(args.url, args.no_pin) as (url, pinned):
        rows = redis_rows(url, args.calls, args.repeat, rule_counts)
    embedded = [] if args.no_embedded else embedded_rows(args.embedded_checks, args.repeat)

    hiredis = "with hiredis" if redis.utils.HIREDIS_AVAILABLE else "WITHOUT hiredis"
    load = f", load average {load_at_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end" \
        if hasattr(os, "getloadavg") else ""
    print(f"throttlegate {throttlegate.__version__} ({ALGORITHM}) vs limits {limits.__version__} ({PEERS[PEER]}, "
          f"redis-py {redis.__version__} {hiredis}), Python {platform.python_version()}, "
          f"{'Redis at ' + args.url if args.url else 'private redis-server'}"
          f"{' (pinned to one core, clients to another)' if pinned else ''}, {KEYS:,} keys, limit {LIMIT}/60 s, "
          f"{args.calls:,} checks per round, median of {args.repeat} rounds{load}\n")
    print("| scenario | rules | throttlegate (checks/s) | limits (checks/s) | ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r.scenario} | {r.rules} | {r.ours:,.0f} | {r.theirs:,.0f} | {r.ours / r.theirs:.2f}x |")
    print()
    print("| embedded backend | rules | throttlegate (µs/check) | limits moving window in memory (µs/check) | ratio "
          "| limits fixed window in memory (µs/check) | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for e in embedded:
        print(f"| {EMBEDDED} | {e['rules']} | {e['us_per_check']:.3f} | {e['theirs_us_per_check']:.3f} | "
              f"{e['theirs_us_per_check'] / e['us_per_check']:.2f}x | {e['theirs_fixed_us_per_check']:.3f} | "
              f"{e['theirs_fixed_us_per_check'] / e['us_per_check']:.2f}x |")
    if args.json:
        out: list[dict[str, Any]] = [
            {"scenario": r.scenario, "rules": r.rules, "ours": round(r.ours, 1), "theirs": round(r.theirs, 1),
             "algorithm": ALGORITHM, "peer": PEER}
            for r in rows
        ]
        out += embedded
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
