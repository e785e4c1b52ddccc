"""Redis away: the timeout bounds every call (sync and async) against a
black-hole server, a paused Redis and a refused port; a check that timed out
never counts once Redis resumes; degraded decisions claim no count; outages
are logged once to the ``throttlegate`` logger, with their cause, and once
when they end; ``strict=True`` fails fast."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest

import throttlegate as tg

from conftest import RedisServer, free_port

# What a call may take beyond its timeout on a shared, noisy machine.
SLACK = 0.08
BIG = {"name": "big", "key": "ip:{ip}", "limit": 1_000_000, "window": "1h"}


class BlackHole:
    """A TCP listener that accepts every connection and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


@pytest.fixture
def hole() -> Iterator[BlackHole]:
    h = BlackHole()
    yield h
    h.close()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own, to pause."""
    server = RedisServer()
    yield server
    os.kill(server.proc.pid, signal.SIGCONT)
    server.stop()


def paused(server: RedisServer, on: bool) -> None:
    os.kill(server.proc.pid, signal.SIGSTOP if on else signal.SIGCONT)


def limiter(url: str, timeout: float, **kw: object) -> tg.Limiter:
    return tg.Limiter([BIG], url=url, timeout=timeout, on_backend_error="allow", **kw)  # type: ignore[arg-type]


def longest_sync(l: tg.Limiter, n: int = 3) -> float:
    worst = 0.0
    for _ in range(n):
        started = time.perf_counter()
        d = l.check({"ip": "a"})
        worst = max(worst, time.perf_counter() - started)
        assert d.degraded and d.allowed
    return worst


def longest_async(l: tg.Limiter, n: int = 3) -> float:
    async def main() -> float:
        worst = 0.0
        for _ in range(n):
            started = time.perf_counter()
            d = await l.check_async({"ip": "a"})
            worst = max(worst, time.perf_counter() - started)
            assert d.degraded and d.allowed
        return worst

    return asyncio.run(main())


async def first(l: tg.Limiter) -> tg.Decision:
    return await l.check_async({"ip": "a"})


@pytest.mark.parametrize("timeout", [0.1, 0.3])
def test_the_timeout_bounds_every_call(timeout: float, hole: BlackHole, own_redis: RedisServer) -> None:
    targets = {"black hole": hole.url, "refused": f"redis://127.0.0.1:{free_port()}/0", "paused": own_redis.url}
    for name, url in targets.items():
        sync, asyn = limiter(url, timeout), limiter(url, timeout)
        if name == "paused":
            assert not sync.check({"ip": "a"}).degraded
            assert not asyncio.run(first(asyn)).degraded
            paused(own_redis, True)
        try:
            for path, worst in (("sync", longest_sync(sync)), ("async", longest_async(asyn))):
                print(f"{path}, {name}: timeout {timeout * 1000:.0f} ms, longest call {worst * 1000:.1f} ms")
                assert worst <= timeout + SLACK, (path, name, worst)
        finally:
            paused(own_redis, False)


# The units a sliding-window log holds: the sum of its entries' ("<time>" one unit,
# "<time>:<units>"), after the header if any (lua/sliding_window_log.lua).
LOG_UNITS = (
    "local n = 0 for _, e in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do "
    "if string.sub(e, 1, 1) ~= '-' then n = n + (tonumber(string.match(e, ':(%d+)$')) or 1) end end return n"
)


def log_units(server: RedisServer, key: str) -> int:
    reply = server.command("EVAL", LOG_UNITS, "1", key)
    assert reply.startswith(b":"), reply
    return int(reply[1:].strip())


def test_a_timed_out_check_never_counts(own_redis: RedisServer) -> None:
    """Checks from threads and an event loop while Redis is paused, then
    resumed: the count in Redis equals the admissions the callers saw, but
    for the documented window (without the deadline, every check that timed
    out during the pause would count)."""
    l = limiter(own_redis.url, 0.1, prefix="away:")
    seen = {"admitted": 0, "degraded": 0}
    lock = threading.Lock()
    stop = threading.Event()

    def count(d: tg.Decision) -> None:
        with lock:
            seen["degraded" if d.degraded else "admitted"] += 1

    def sync_worker() -> None:
        while not stop.is_set():
            count(l.check({"ip": "x"}))

    def async_worker() -> None:
        async def main() -> None:
            async def one() -> None:
                while not stop.is_set():
                    count(await l.check_async({"ip": "x"}))

            await asyncio.gather(*(one() for _ in range(4)))

        asyncio.run(main())

    workers = [threading.Thread(target=sync_worker) for _ in range(2)] + [threading.Thread(target=async_worker)]
    for w in workers:
        w.start()
    time.sleep(0.15)
    paused(own_redis, True)
    time.sleep(0.4)
    paused(own_redis, False)
    time.sleep(0.15)
    stop.set()
    for w in workers:
        w.join()
    l.ping()
    in_flight = 2 + 4  # two threads, four tasks
    assert seen["degraded"] >= 2 * in_flight, seen
    # Every admission counts; a timed-out check counts only when its script
    # ran just before Redis stopped and its reply was held (the remaining
    # window: at most one per caller in flight).
    counted = log_units(own_redis, "away:big:ip:x")
    assert seen["admitted"] <= counted <= seen["admitted"] + in_flight, (counted, seen)


def test_degraded_decisions_claim_no_count() -> None:
    down = f"redis://127.0.0.1:{free_port()}/0"
    allow = limiter(down, 0.2).check({"ip": "a"})
    assert allow.degraded and allow.allowed
    assert allow.headers == {"RateLimit-Limit": "1000000", "RateLimit-Policy": '"big";q=1000000;w=3600'}
    assert "X-RateLimit-Remaining" not in allow.headers_with(legacy=True)
    deny = tg.Limiter([BIG], url=down, timeout=0.2, on_backend_error="deny").check({"ip": "a"})
    assert deny.degraded and not deny.allowed
    assert deny.headers["Retry-After"] == "1"
    assert "RateLimit-Remaining" not in deny.headers and "RateLimit" not in deny.headers
    body = json.loads(deny.problem_json() or "{}")
    assert body["degraded"] is True and body["violated_rules"] == ["big"]


def records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "throttlegate"]


def test_an_outage_is_logged_once_and_its_end_once(caplog: pytest.LogCaptureFixture, own_redis: RedisServer) -> None:
    caplog.set_level(logging.INFO, logger="throttlegate")
    l = limiter(f"redis://127.0.0.1:{free_port()}/0", 0.2)
    for _ in range(20):
        assert l.check({"ip": "a"}).degraded
    got = records(caplog)
    assert [r.levelno for r in got] == [logging.WARNING], got
    assert got[0].throttlegate_cause == "refused"  # type: ignore[attr-defined]
    assert "outage (refused)" in got[0].getMessage()

    caplog.clear()
    l = limiter(own_redis.url, 0.1)
    assert not l.check({"ip": "a"}).degraded
    paused(own_redis, True)
    try:
        for _ in range(3):
            assert l.check({"ip": "a"}).degraded

        async def more() -> None:
            for _ in range(3):
                assert (await l.check_async({"ip": "a"})).degraded

        asyncio.run(more())
    finally:
        paused(own_redis, False)
    deadline = time.monotonic() + 5
    while l.check({"ip": "a"}).degraded:
        assert time.monotonic() < deadline
    got = records(caplog)
    assert [r.levelno for r in got] == [logging.WARNING, logging.INFO], got
    assert got[0].throttlegate_cause == "timeout"  # type: ignore[attr-defined]
    assert "recovered" in got[1].getMessage()


def test_strict_fails_fast(hole: BlackHole, redis_server: RedisServer) -> None:
    tg.Limiter([BIG], url=redis_server.url, strict=True)
    # Off by default: made whatever the URL.
    tg.Limiter([BIG], url=f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(tg.BackendUnavailableError, match="^strict: "):
        tg.Limiter([BIG], url=f"redis://127.0.0.1:{free_port()}/0", strict=True)
    started = time.perf_counter()
    with pytest.raises(tg.BackendTimeoutError, match="^strict: "):
        tg.Limiter([BIG], url=hole.url, timeout=0.3, strict=True)
    assert time.perf_counter() - started <= 0.3 + SLACK
    assert b"+OK" in redis_server.command("ACL", "SETUSER", "py-strict", "on", ">right", "~*", "+@all")
    with pytest.raises(tg.BackendError, match="PING"):
        tg.Limiter([BIG], url=f"redis://py-strict:wrong@127.0.0.1:{redis_server.port}/0", strict=True)
    # Scripts denied by ACL: the core's one message names the cause and the fix, at start-up and at the first check.
    assert b"+OK" in redis_server.command("ACL", "SETUSER", "py-strict", "-evalsha", "-eval")
    denied = f"redis://py-strict:right@127.0.0.1:{redis_server.port}/0"
    with pytest.raises(tg.BackendError, match=r"check script.*refuses scripts: .*NOPERM.*\+evalsha \+eval \+script\|load"):
        tg.Limiter([BIG], url=denied, strict=True)
    lazy = tg.Limiter([BIG], url=denied, on_backend_error="error")
    with pytest.raises(tg.BackendError, match=r"^redis refuses scripts: .*Lua module") as caught:
        lazy.check({"ip": "203.0.113.1"})
    assert not caught.value.temporary
    assert redis_server.command("ACL", "DELUSER", "py-strict") == b":1\r\n"
