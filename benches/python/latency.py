"""Latency per check under an open-loop load, from asyncio: throttlegate's
`Limiter.check_async` on Redis next to the `limits` library's asyncio
MovingWindowRateLimiter (redis-py's asyncio client with hiredis), in one run
on the same Redis. Prints a markdown table.

    .venv/bin/pip install . limits redis hiredis
    .venv/bin/python benches/python/latency.py [--url redis://127.0.0.1:6379/0] [--seconds 3] [--json FILE]
        [--loads 25,50,90] [--samples 20000]

Why asyncio: it is how a Python service that handles many requests at once
in one process calls a rate limiter (FastAPI, Starlette, aiohttp: one task
per request), and both libraries have an asyncio API. The blocking `check`
serves one request per thread; an open-loop driver made of threads would
mostly measure the GIL's handover (a 5 ms switch interval) rather than
either library.

Method:
  1. Saturation: each library, warmed up, runs closed-loop with 64 asyncio
     tasks checking one after another, in two rounds of --seconds / 2
     (default 3 s in all) that alternate the libraries; its better round's
     checks per second is its saturation. The offered rates below are fractions of
     the LOWER of the two, so that both libraries get exactly the same load at
     each level.
  2. Open loop: at each load (default 25%, 50% and 90% of that saturation)
     each library gets checks issued on a fixed schedule, check i at
     t0 + i / rate, whether or not earlier checks have answered (so a slow
     answer cannot hold back the next request: no coordinated omission), each
     check in its own task, as a server runs each request. The latency of a
     check runs from its *scheduled* send time to the moment its task has the
     answer, so a late send counts against the library too. A point lasts
     --seconds, or longer if needed to reach --samples (default 20,000, enough
     for a p99.9 from the 20 slowest); the libraries take turns to go first
     from one load to the next.
     Each load also gets a row "pacer alone": the same schedule with a check
     that answers at once, the floor that the harness itself adds.
  3. Percentiles p50, p99 and p99.9 (nearest rank over every sample, sorted
     exactly: no histogram buckets) and the largest, in microseconds; and the
     rate actually achieved (samples / time to the last answer), which falls
     below the offered rate when a library cannot keep up.

The schedule is kept by a pacer: a small separate process that sleeps until
each send time (time.sleep, precise to tens of microseconds) and then writes
one byte to a pipe the event loop watches (`add_reader`), as a request
arriving from the network would; on each wake-up the loop starts every check
due by then. Nothing spins and no thread of this process competes for the GIL
to keep time. Both processes read the same clock (CLOCK_MONOTONIC).

The scenario is bench.py's: 10,000 distinct clients, 1 rule of 1000 per 60 s
(throttlegate: the exact sliding-window log; limits: its moving window, also
a log), so every check is admitted and both do their full work. Every point
starts on fresh keys (a fresh throttlegate limiter with its own prefix; a
fresh `limits` namespace) and is warmed up with 1,000 checks before timing.
At most 64 checks are in progress at once, the saturation's concurrency
(--max-in-flight): checks due meanwhile wait for a slot, as requests wait for
a service's worker, and the wait counts in their latency. Without such a
bound `limits` cannot hold even a fraction of its saturation through a
stall: redis-py takes a connection of its own for every command in flight
(its default asyncio pool raises "Too many connections" past 100), and
`limits`' throughput falls as their number grows (about 5x lower at 1,000
tasks than at 64 on a 2-core machine), so the backlog of one stall never
drains; throttlegate multiplexes its checks on its own connections.
Without --url a private redis-server is started on a free loopback port,
pinned to core 0 and this process to core 1 on a machine with 2 or more
cores (--no-pin leaves both unpinned); with --url the caller pins. --json FILE
also writes {"saturation": {"throttlegate", "limits", "base", "tasks"},
"rows": [{"load", "rate", "library", "samples", "seconds", "p50_us",
"p99_us", "p999_us", "max_us", "achieved", "max_in_flight"}]}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import limits
import limits.aio.storage
import limits.aio.strategies
import redis
import redis.utils

import throttlegate
# bench.py, beside this file (the script's folder comes first on sys.path): the same scenario and server.
from bench import KEYS, LIMIT, client_attrs, redis_for

OURS = "throttlegate"
THEIRS = "limits"
FLOOR = "pacer alone"
TASKS = 64
# The open loop's checks in progress at most, by default (--max-in-flight): the saturation's concurrency.
MAX_IN_FLIGHT = TASKS
WARM_CHECKS = 1000

# The pacer process: argv = interval (s), count, the pipe's write end. It says
# it is ready ("r"), reads t0 from stdin, then writes one byte at each send
# time (once per wake-up: a late wake-up covers every send due by then).
PACER = r"""
import os, sys, time
interval, n, fd = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
os.write(fd, b"r")
t0 = float(sys.stdin.readline())
i = 0
while i < n:
    wait = t0 + i * interval - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    i = min(n, int((time.monotonic() - t0) / interval) + 1)
    os.write(fd, b"x")
"""

Call = Callable[[int], Awaitable[bool]]


async def closed_loop(call: Call, tasks: int, seconds: float, max_calls: float = math.inf) -> float:
    """`tasks` tasks checking one after another for `seconds` (or `max_calls` checks): checks per second."""
    made = 0
    end = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal made
        while made < max_calls and time.monotonic() < end:
            made += 1
            if not await call(made):
                raise RuntimeError("unexpected denial: the benchmark would not compare like with like")

    start = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(tasks)))
    return made / (time.monotonic() - start)


async def open_loop(call: Call, rate: float, n: int, max_in_progress: int = MAX_IN_FLIGHT) -> tuple[list[float], float, int]:
    """`n` checks, check i due at t0 + i / rate whatever the earlier ones are doing, each in its own
    task, at most `max_in_progress` of them past the slot at once. Returns each check's latency (s, from its scheduled send time), the time from t0 to the
    last answer and the most checks in flight."""
    loop = asyncio.get_running_loop()
    interval = 1.0 / rate
    lat = [0.0] * n
    rfd, wfd = os.pipe()
    os.set_blocking(rfd, False)
    pacer = subprocess.Popen([sys.executable, "-I", "-S", "-c", PACER, repr(interval), str(n), str(wfd)],
                             stdin=subprocess.PIPE, pass_fds=(wfd,))
    os.close(wfd)
    finished: asyncio.Future[float] = loop.create_future()
    running: set[asyncio.Task[None]] = set()
    slots = asyncio.Semaphore(max_in_progress)
    t0 = math.inf  # set once the pacer runs
    sent = done = in_flight = max_in_flight = 0

    async def one(i: int, due: float) -> None:
        nonlocal done, in_flight
        try:
            async with slots:
                allowed = await call(i)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            if not finished.done():
                finished.set_exception(exc)
            return
        lat[i] = time.monotonic() - due
        in_flight -= 1
        if not allowed and not finished.done():
            finished.set_exception(RuntimeError("unexpected denial: the benchmark would not compare like with like"))
        done += 1
        if done == n and not finished.done():
            finished.set_result(time.monotonic() - t0)

    def wake() -> None:
        nonlocal t0, sent, in_flight, max_in_flight
        data = os.read(rfd, 65536)
        if not data:  # the pacer is gone
            loop.remove_reader(rfd)
            if sent < n and not finished.done():
                finished.set_exception(RuntimeError(f"the pacer exited with status {pacer.wait()} early"))
            return
        if t0 == math.inf:  # b"r": the pacer runs; start the clock
            t0 = time.monotonic() + 0.002
            assert pacer.stdin is not None
            pacer.stdin.write(f"{t0!r}\n".encode())
            pacer.stdin.close()
            data = data[1:]
            if not data:
                return
        now = time.monotonic()
        while sent < n and t0 + sent * interval <= now:
            task = loop.create_task(one(sent, t0 + sent * interval))
            running.add(task)
            task.add_done_callback(running.discard)
            sent += 1
            in_flight += 1
            max_in_flight = max(max_in_flight, in_flight)

    loop.add_reader(rfd, wake)
    try:
        elapsed = await finished
    finally:
        loop.remove_reader(rfd)
        os.close(rfd)
        if pacer.poll() is None:
            pacer.kill()
        pacer.wait()
        for task in list(running):
            task.cancel()
    return lat, elapsed, max_in_flight


async def answer_at_once(i: int) -> bool:
    """The floor: a check that answers at once (the pacer's wake-up, a task and its first step)."""
    return True


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of sorted values."""
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


async def measure(url: str, seconds: float, samples: int, loads: list[float],
                  max_in_progress: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
    attrs = client_attrs(1)
    ips = [a["ip"] for a in attrs]
    item = limits.RateLimitItemPerMinute(LIMIT)
    storage = limits.aio.storage.RedisStorage("async+" + url, implementation="redispy")
    moving = limits.aio.strategies.MovingWindowRateLimiter(storage)
    tag = uuid.uuid4().hex[:8]
    serial = 0

    async def fresh(lib: str) -> tuple[Call, Callable[[], None]]:
        """A fresh limiter of `lib` on fresh keys, warmed up: its call and how to close it."""
        nonlocal serial
        serial += 1
        if lib == OURS:
            lim = throttlegate.Limiter([{"name": "ip", "key": "ip:{ip}", "limit": LIMIT, "window": "1m"}], url=url,
                                       prefix=f"lat-{tag}-{serial}:", timeout=5.0, on_backend_error="error")

            async def ours(i: int) -> bool:
                return (await lim.check_async(attrs[i % KEYS])).allowed

            call, close = ours, lim.close
        else:
            ns = f"lat-{tag}-{serial}"

            async def theirs(i: int) -> bool:
                return await moving.hit(item, ns, "ip", ips[i % KEYS])

            call, close = theirs, (lambda: None)
        await closed_loop(call, TASKS, 60, WARM_CHECKS)
        return call, close

    libs = [OURS, THEIRS]
    saturation: dict[str, float] = {}
    sat = {lib: await fresh(lib) for lib in libs}
    for lib in libs:
        await closed_loop(sat[lib][0], TASKS, min(0.5, seconds / 4))  # warm-up
        saturation[lib] = 0.0
    # Two rounds of half the time each, the libraries alternating, the better of each counting.
    for order in (libs, libs[::-1]):
        for lib in order:
            saturation[lib] = max(saturation[lib], await closed_loop(sat[lib][0], TASKS, seconds / 2))
    for lib in libs:
        sat[lib][1]()
        print(f"  saturation, {lib}: {saturation[lib]:,.0f} checks/s", file=sys.stderr, flush=True)
    base = min(saturation.values())
    rows: list[dict[str, Any]] = []
    for k, load in enumerate(loads):
        rate = base * load / 100
        n = max(samples, round(rate * seconds))
        for lib in [*(libs if k % 2 == 0 else libs[::-1]), FLOOR]:
            call, close = (answer_at_once, lambda: None) if lib == FLOOR else await fresh(lib)
            lat, elapsed, max_in_flight = await open_loop(call, rate, n, max_in_progress)
            close()
            lat.sort()

            def us(q: float) -> int:
                return round(percentile(lat, q) * 1e6)  # noqa: B023 - used right away

            rows.append({"load": load, "rate": round(rate), "library": lib, "samples": n,
                         "seconds": round(n / rate, 2), "p50_us": us(0.5), "p99_us": us(0.99), "p999_us": us(0.999),
                         "max_us": round(lat[-1] * 1e6), "achieved": round(n / elapsed),
                         "max_in_flight": max_in_flight})
            r = rows[-1]
            print(f"  {load:g}% ({r['rate']:,}/s), {lib}: p50 {r['p50_us']} p99 {r['p99_us']} "
                  f"p99.9 {r['p999_us']} us", file=sys.stderr, flush=True)
    return saturation, rows


def main() -> None:
    parser = argparse.ArgumentParser(description="open-loop latency percentiles, throttlegate vs limits (asyncio)")
    parser.add_argument("--url", help="Redis URL (default: start a private redis-server)")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="seconds of the saturation run and (at least) of each open-loop point (default 3)")
    parser.add_argument("--samples", type=int, default=20_000,
                        help="at least this many checks per open-loop point (default 20000)")
    parser.add_argument("--loads", default="25,50,90", help="percentages of saturation, comma-separated (default 25,50,90)")
    parser.add_argument("--json", metavar="FILE", help="also write the saturation and the rows to FILE as JSON")
    parser.add_argument("--max-in-flight", type=int, default=MAX_IN_FLIGHT,
                        help=f"checks in progress at once in the open loop; more wait (default {MAX_IN_FLIGHT})")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the private redis-server and the clients")
    args = parser.parse_args()
    try:
        loads = [float(x) for x in args.loads.split(",")]
    except ValueError:
        loads = []
    if not loads or any(not 0 < x <= 100 for x in loads):
        parser.error(f"--loads: expected percentages in (0, 100], got {args.loads!r}")
    if args.max_in_flight < 1:
        parser.error(f"--max-in-flight: expected at least 1, got {args.max_in_flight}")
    if args.samples < 1000:
        parser.error(f"--samples: expected at least 1000, got {args.samples}")
    if not args.seconds > 0:
        parser.error(f"--seconds: expected a positive number, got {args.seconds}")
    with redis_for(args.url, args.no_pin) as (url, pinned):
        saturation, rows = asyncio.run(measure(url, args.seconds, args.samples, loads, args.max_in_flight))
    base = min(saturation.values())
    hiredis = "with hiredis" if redis.utils.HIREDIS_AVAILABLE else "WITHOUT hiredis"
    print(f"throttlegate {throttlegate.__version__} (check_async) vs limits {limits.__version__} (asyncio "
          f"MovingWindowRateLimiter, redis-py {redis.__version__} {hiredis}), Python {platform.python_version()}, "
          f"{'Redis at ' + args.url if args.url else 'private redis-server'}"
          f"{' (pinned to one core, clients to another)' if pinned else ''}, {KEYS:,} keys, limit {LIMIT}/60 s; "
          f"saturation ({TASKS} tasks, closed loop, {args.seconds:g} s): throttlegate {saturation[OURS]:,.0f}/s, "
          f"limits {saturation[THEIRS]:,.0f}/s; offered rates are shares of the lower, {base:,.0f}/s. Open loop, "
          f"at most {args.max_in_flight} checks in progress, latency from the scheduled send time, microseconds "
          "(lower is better)\n")
    print("| load | offered/s | library | samples | p50 | p99 | p99.9 | max | achieved/s |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['load']:g}% | {r['rate']:,} | {r['library']} | {r['samples']:,} | {r['p50_us']:,} | "
              f"{r['p99_us']:,} | {r['p999_us']:,} | {r['max_us']:,} | {r['achieved']:,} |")
    if args.json:
        sat = {OURS: round(saturation[OURS]), THEIRS: round(saturation[THEIRS]), "base": round(base), "tasks": TASKS,
               "max_in_progress": args.max_in_flight}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"saturation": sat, "rows": rows}, f, indent=2)
            f.write("\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
