"""One participant of the cross-language soak test (tests/soak/run.sh).

Hammers random keys of the shared policy from 32 asyncio tasks and 4 threads
for SECONDS and prints, as JSON, how many requests it was admitted per key,
how many calls failed, and its resident memory once a second.

    python soak.py POLICY_FILE REDIS_URL SECONDS KEYS
"""

import asyncio
import json
import random
import sys
import threading
import time

import throttlegate


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main() -> None:
    policy, url, seconds, keys = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    limiter = throttlegate.Limiter(policy, url=url)
    admitted: dict[str, int] = {}
    lock = threading.Lock()
    stats = {"calls": 0, "errors": 0}
    deadline = time.monotonic() + seconds

    def record(user: str, d: "throttlegate.Decision") -> None:
        with lock:
            stats["calls"] += 1
            if d.allowed:
                admitted[user] = admitted.get(user, 0) + 1

    def failed() -> None:
        with lock:
            stats["calls"] += 1
            stats["errors"] += 1

    def worker() -> None:
        rng = random.Random()
        while time.monotonic() < deadline:
            user = f"u{rng.randrange(keys)}"
            try:
                record(user, limiter.check({"user": user}))
            except throttlegate.ThrottlegateError:
                failed()

    async def task() -> None:
        rng = random.Random()
        while time.monotonic() < deadline:
            user = f"u{rng.randrange(keys)}"
            try:
                record(user, await limiter.check_async({"user": user}))
            except throttlegate.ThrottlegateError:
                failed()

    async def run() -> list[int]:
        samples = []
        tasks = [asyncio.create_task(task()) for _ in range(32)]
        while time.monotonic() < deadline:
            await asyncio.sleep(1)
            samples.append(rss_kib())
        await asyncio.gather(*tasks)
        return samples

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    samples = asyncio.run(run())
    for t in threads:
        t.join()
    limiter.close()
    print(json.dumps({"lang": "python", **stats, "admitted": admitted, "rss_kib": samples}))


if __name__ == "__main__":
    main()
