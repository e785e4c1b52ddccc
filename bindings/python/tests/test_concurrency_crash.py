"""A concurrency rule on a real redis-server when a holder dies: a process
holding every slot is killed with SIGKILL (it never releases); the slots
come back when their lease ends, not before; and 64 threads contending for
them, each counting itself in and out of a Redis counter while it holds a
slot, never see more than ``limit`` holders at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import throttlegate
from conftest import RedisServer

LIMIT = 4
LEASE_S = 2.0
POLICY = [{"name": "slots", "key": "slots:{job}", "algorithm": "concurrency", "limit": LIMIT, "lease": "2s"}]
ATTRS = {"job": "crash"}
WORKERS = 64

# The holder: takes every slot, says so, then waits to be killed.
HOLDER = """
import sys, time, throttlegate
limiter = throttlegate.Limiter(%r, sys.argv[1], prefix=sys.argv[2])
held = [limiter.check(%r) for _ in range(%d)]
assert all(d.allowed for d in held), held
print("held", flush=True)
time.sleep(600)
""" % (POLICY, ATTRS, LIMIT)


def redis_int(redis: RedisServer, *command: str) -> int:
    reply = redis.command(*command)
    assert reply.startswith(b":"), reply
    return int(reply[1:].strip())


def test_slots_of_a_killed_holder_come_back_after_the_lease_and_never_exceed_the_limit(
    redis_server: RedisServer, prefix: str
) -> None:
    counter = prefix + "holders"
    started = time.monotonic()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, redis_server.url, prefix],
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == b"held"
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()

    limiter = throttlegate.Limiter(POLICY, redis_server.url, prefix=prefix)
    lock = threading.Lock()
    most = 0
    admitted = 0
    first_admission: list[float] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def worker() -> None:
        nonlocal most, admitted
        try:
            while not stop.is_set():
                d = limiter.check(ATTRS)
                if not d.allowed:
                    time.sleep(0.05)
                    continue
                now = time.monotonic()
                holders = redis_int(redis_server, "INCR", counter)
                with lock:
                    if not first_admission:
                        first_admission.append(now)
                    most = max(most, holders)
                    admitted += 1
                    if admitted >= 20 * LIMIT:
                        stop.set()
                time.sleep(0.005)
                redis_int(redis_server, "DECR", counter)
                assert limiter.release(d) == 1
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=worker) for _ in range(WORKERS)]
    for t in threads:
        t.start()
    stop.wait(timeout=30)
    stop.set()
    for t in threads:
        t.join()
    limiter.close()

    assert not errors, errors
    assert first_admission, "the killed holder's slots never came back"
    # Not before the lease: the holder took its slots after `started`.
    assert first_admission[0] - started >= LEASE_S
    assert admitted >= 20 * LIMIT
    assert 1 <= most <= LIMIT, most
    # Every holder counted itself out.
    assert redis_server.command("GET", counter) == b"$1\r\n0\r\n"
