"""Throughput of throttlegate's check / check_async against a local Redis,
next to the `limits` library's moving-window limiter on the same Redis, in
the same run. Prints a markdown table.

    .venv/bin/pip install . limits redis
    .venv/bin/python benches/python/bench.py [--url redis://127.0.0.1:6379/0] [--calls 4000]

Without --url a private redis-server is started on a free loopback port.
Each scenario spreads calls over 1,000 client addresses under limits high
enough that every call is admitted, so both libraries do the same work: one
log entry per rule per call.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import shutil
import socket
import subprocess
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

import throttlegate

LIMIT = 10_000_000
CLIENTS = 1_000
RULE_ATTRS = [("ip", "ip:{ip}"), ("api_key", "key:{api_key}"), ("tenant", "tenant:{tenant}"), ("route", "route:{route}")]


def start_redis() -> tuple[subprocess.Popen[bytes], str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="throttlegate-bench-")
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL,
    )
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


def attrs_for(i: int, rules: int) -> dict[str, str]:
    n = i % CLIENTS
    values = {"ip": f"10.0.{n // 256}.{n % 256}", "api_key": f"k_{n}", "tenant": f"t_{n % 10}", "route": "/items"}
    return {name: values[name] for name, _ in RULE_ATTRS[:rules]}


def tg_limiter(url: str, rules: int) -> throttlegate.Limiter:
    policy = [{"name": f"r{i}-{name}", "key": key, "limit": LIMIT, "window": "1m"}
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

        await call(ctx, 0)  # connect before timing
        start = time.perf_counter()
        await asyncio.gather(*(work(t) for t in range(tasks)))
        return per * tasks / (time.perf_counter() - start)

    return asyncio.run(main())


def bench(url: str, calls: int) -> list[tuple[str, float, float]]:
    rows = []
    for rules in (1, 4):
        lim = tg_limiter(url, rules)
        lim.check(attrs_for(0, rules))
        storage = limits.storage.RedisStorage(url)
        moving = limits.strategies.MovingWindowRateLimiter(storage)
        item = limits.RateLimitItemPerMinute(LIMIT)
        ns = f"bench-{uuid.uuid4().hex[:8]}"

        def lim_hit(i: int) -> bool:
            a = attrs_for(i, rules)
            # limits has no stacked check: one hit per rule, as an application would.
            return all(moving.hit(item, ns, name, a[name]) for name, _ in RULE_ATTRS[:rules])

        # Warm both sides up (connections, script cache, code paths) before timing.
        for i in range(300):
            lim.check(attrs_for(i, rules))
            lim_hit(i)
        for threads in (1, 8):
            label = "sequential" if threads == 1 else f"{threads} threads"
            ours = run_threads(calls, threads, lambda i: lim.check(attrs_for(i, rules)))
            theirs = run_threads(calls, threads, lim_hit)
            rows.append((f"check, {rules} rule{'s' if rules > 1 else ''}, {label}", ours, theirs))

        def tg_make() -> throttlegate.Limiter:
            return lim

        async def tg_call(ctx: throttlegate.Limiter, i: int) -> Any:
            return await ctx.check_async(attrs_for(i, rules))

        def lim_make() -> Any:
            st = limits.aio.storage.RedisStorage("async+" + url, implementation="redispy")
            return limits.aio.strategies.MovingWindowRateLimiter(st)

        async def lim_call(ctx: Any, i: int) -> bool:
            a = attrs_for(i, rules)
            for name, _ in RULE_ATTRS[:rules]:
                if not await ctx.hit(item, ns, name, a[name]):
                    return False
            return True

        ours = run_tasks(calls, 64, tg_make, tg_call)
        theirs = run_tasks(calls, 64, lim_make, lim_call)
        rows.append((f"check_async, {rules} rule{'s' if rules > 1 else ''}, 64 tasks", ours, theirs))
        lim.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description="throttlegate vs limits (moving window) on one Redis")
    parser.add_argument("--url", help="Redis URL (default: start a private redis-server)")
    parser.add_argument("--calls", type=int, default=4000, help="requests per scenario (default 4000)")
    args = parser.parse_args()
    proc = None
    workdir = None
    url = args.url
    if url is None:
        proc, url, workdir = start_redis()
    try:
        rows = bench(url, args.calls)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"throttlegate {throttlegate.__version__} vs limits {limits.__version__} (MovingWindowRateLimiter), "
          f"Python {platform.python_version()}, local redis-server, {args.calls} requests per row\n")
    print("| scenario | throttlegate (req/s) | limits moving window (req/s) | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for label, ours, theirs in rows:
        print(f"| {label} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.1f}x |")


if __name__ == "__main__":
    main()
