#!/usr/bin/env python3
"""The boundary-burst trace: how many requests a limiter admits in one window
when the traffic bunches up around window boundaries.

    .venv/bin/python benches/compare/burst.py --url redis://127.0.0.1:6379/0 [--json FILE]

Every subject gets a limit of LIMIT per WINDOW_MS on one key of its own, and
the same trace (TRACE, in units of the window, from a start aligned to a
multiple of the window in Unix time, so windows that start at the first
request and windows aligned to the epoch start together): one request at 0,
then bursts of LIMIT requests, sent one after another, at 0.9, 1.02, 1.5,
1.9, 2.02 and 2.5 windows. The subjects take turns within each burst. The
client notes when each admitted answer arrived; the most admitted in any
window of WINDOW_MS - TOLERANCE_MS (the tolerance covers the round trip
between the server deciding and the client noting the time) minus the limit
is the subject's over-admission. An exact sliding window never exceeds 0.

Subjects: throttlegate's sliding_window (counters), sliding_window_log and
fixed_window; `limits`' SlidingWindowCounterRateLimiter,
MovingWindowRateLimiter and FixedWindowRateLimiter (redis-py). benches/compare/burst.js
runs the same trace for rate-limiter-flexible's RateLimiterRedis. Writes
`[{"library", "algorithm", "admitted", "max_in_window", "over"}]` to --json.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Callable

import limits
import limits.storage
import limits.strategies

import throttlegate

LIMIT = 50
WINDOW_MS = 2000
TOLERANCE_MS = 20
# (offset in windows, requests): one request opens the windows, then bursts.
TRACE = [(0.0, 1), (0.9, LIMIT), (1.02, LIMIT), (1.5, LIMIT), (1.9, LIMIT), (2.02, LIMIT), (2.5, LIMIT)]


def max_in_window(times: list[float], span: float) -> int:
    """The most times in any half-open interval (t - span, t]."""
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] <= t - span:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def subjects(url: str) -> list[tuple[str, str, Callable[[], bool]]]:
    tag = uuid.uuid4().hex[:8]
    out: list[tuple[str, str, Callable[[], bool]]] = []
    for algo in ("sliding_window", "sliding_window_log", "fixed_window"):
        rule = {"name": "burst", "key": "k", "limit": LIMIT, "window": WINDOW_MS}
        if algo != "sliding_window_log":
            rule["algorithm"] = algo
        lim = throttlegate.Limiter([rule], url=url, prefix=f"burst-{tag}-{algo}:", timeout=5.0,
                                   on_backend_error="error")
        out.append(("throttlegate", algo, lambda lim=lim: lim.check({}).allowed))
    item = limits.RateLimitItemPerSecond(LIMIT, WINDOW_MS // 1000)
    storage = limits.storage.RedisStorage(url)
    for name in ("SlidingWindowCounterRateLimiter", "MovingWindowRateLimiter", "FixedWindowRateLimiter"):
        strategy = getattr(limits.strategies, name)(storage)
        out.append(("limits", name, lambda s=strategy, n=name: s.hit(item, f"burst-{tag}", n)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="the Redis URL")
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args()
    subs = subjects(args.url)
    window = WINDOW_MS / 1000
    start = (int(time.time() / window) + 2) * window
    admitted: list[list[float]] = [[] for _ in subs]
    for offset, requests in TRACE:
        delay = start + offset * window - time.time()
        if delay > 0:
            time.sleep(delay)
        for _ in range(requests):
            for i, (_, _, call) in enumerate(subs):
                if call():
                    admitted[i].append(time.time())
    rows = []
    for (library, algo, _), times in zip(subs, admitted):
        most = max_in_window(times, (WINDOW_MS - TOLERANCE_MS) / 1000)
        rows.append({"library": library, "algorithm": algo, "admitted": len(times), "max_in_window": most,
                     "over": max(0, most - LIMIT)})
    for r in rows:
        print(f"{r['library']:<13} {r['algorithm']:<32} admitted {r['admitted']:>4}, "
              f"most in a window {r['max_in_window']:>4}, over the limit {r['over']:>3}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
