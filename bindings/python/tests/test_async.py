"""The asyncio path: many checks in flight at once, cancellation, a loop that
closes while checks are pending, several loops at once, and nothing leaking
(no warnings, no unraisable exceptions, no loop error reports)."""

from __future__ import annotations

import asyncio
import collections
import gc
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

import throttlegate as tg
from conftest import RedisServer

HOT = {"name": "hot", "key": "hot:{k}", "limit": 5, "window": "1h"}


class Leaks:
    """Everything that would report a problem outside the awaited results:
    warnings, unraisable exceptions and the loops' exception handlers."""

    def __init__(self) -> None:
        self.reports: list[str] = []

    def loop_handler(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.reports.append(f"loop: {context.get('message')} {context.get('exception')!r}")

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.set_exception_handler(self.loop_handler)


@pytest.fixture
def leaks() -> Iterator[Leaks]:
    found = Leaks()
    old_hook = sys.unraisablehook

    def hook(info: Any) -> None:
        found.reports.append(f"unraisable: {info.exc_type.__name__}: {info.exc_value} ({info.object!r})")

    sys.unraisablehook = hook
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield found
            gc.collect()
        found.reports += [f"warning: {w.category.__name__}: {w.message}" for w in caught]
    finally:
        sys.unraisablehook = old_hook
    assert found.reports == []


async def awaited(aw: Any, *args: Any) -> Any:
    """Await `aw`, or `aw(*args)` (so that the call itself runs in the loop)."""
    return await (aw(*args) if args else aw)


def sync_error(limiter: tg.Limiter, attrs: Any, cost: Any = None, call_id: Any = None) -> BaseException:
    """The exception the blocking API raises for these arguments."""
    try:
        limiter.check(attrs, cost, call_id=call_id)
    except tg.ThrottlegateError as e:
        return e
    raise AssertionError("expected an error")


def test_many_checks_in_flight_mixed(backend_url: str | None, prefix: str, leaks: Leaks) -> None:
    """300 calls at once: wrong types (raised by the call), costs and call ids
    the core refuses (raised by the awaitable), admitted and denied checks."""
    limiter = tg.Limiter([HOT], url=backend_url, prefix=prefix, timeout=30.0, on_backend_error="error")
    # The same mistakes through the blocking API, on keys the run does not use.
    want_type = sync_error(limiter, {"k": 1.5})
    want_cost = sync_error(limiter, {"k": "ref"}, 6)
    want_id = sync_error(limiter, {"k": "ref"}, None, "bad id!")
    assert isinstance(want_type, tg.InvalidArgumentTypeError)
    assert type(want_cost) is tg.InvalidArgumentError and type(want_id) is tg.InvalidArgumentError

    async def main() -> list[tuple[str, Any]]:
        leaks.install(asyncio.get_running_loop())
        calls: list[tuple[str, Any]] = []
        for i in range(300):
            kind = ("type", "cost", "id", "ok", "ok", "ok")[i % 6]
            key = {"k": f"k{i % 10}"}
            if kind == "type":
                try:
                    limiter.check_async({"k": 1.5})  # type: ignore[dict-item]
                except tg.ThrottlegateError as e:
                    calls.append((kind, e))
                    continue
                raise AssertionError("a wrong type must raise at the call")
            elif kind == "cost":
                calls.append((kind, limiter.check_async(key, 6)))
            elif kind == "id":
                calls.append((kind, limiter.check_async(key, call_id="bad id!")))
            else:
                calls.append((kind, limiter.check_async(key)))
        pending = [c for _, c in calls if not isinstance(c, BaseException)]
        answers = iter(await asyncio.gather(*pending, return_exceptions=True))
        return [(kind, c if isinstance(c, BaseException) else next(answers)) for kind, c in calls]

    results = asyncio.run(main())
    allowed: collections.Counter[str] = collections.Counter()
    denied = 0
    for i, (kind, got) in enumerate(results):
        key = f"k{i % 10}"
        if kind == "type":
            assert type(got) is type(want_type) and str(got) == str(want_type)
        elif kind == "cost":
            assert type(got) is type(want_cost) and str(got) == str(want_cost) and got.code == 2
        elif kind == "id":
            assert type(got) is type(want_id) and str(got) == str(want_id)
        else:
            assert isinstance(got, tg.Decision), got
            assert got.rule == "hot" and got.limit == 5 and not got.degraded
            if got.allowed:
                allowed[key] += 1
            else:
                denied += 1
                assert got.remaining == 0 and got.retry_after > 0 and "Retry-After" in got.headers
    # 15 valid checks per key, 5 admitted each.
    assert allowed == {f"k{n}": 5 for n in range(10)} and denied == 100
    stats = limiter.stats()
    assert stats["allowed"] == 50 and stats["denied"] == 100
    limiter.close()


def pause(server: RedisServer, ms: int) -> None:
    """Hold every client's commands in Redis for `ms` milliseconds."""
    assert server.command("CLIENT", "PAUSE", str(ms)) == b"+OK\r\n"


def test_cancelled_pending_checks(redis_server: RedisServer, prefix: str, leaks: Leaks) -> None:
    """Checks cancelled while Redis holds them stay cancelled when the answer
    (or an error) arrives; the others complete; nothing is reported."""
    limiter = tg.Limiter([HOT], url=redis_server.url, prefix=prefix, timeout=30.0, on_backend_error="error")

    # A key holding a string: the script fails there (a backend error).
    wrong = limiter.keys({"k": "wrong"})[0]
    assert redis_server.command("SET", wrong, "not a log") == b"+OK\r\n"

    async def main() -> None:
        leaks.install(asyncio.get_running_loop())
        await limiter.check_async({"k": "warm"})
        pause(redis_server, 300)
        tasks = []
        for i in range(40):
            if i % 4 == 2:
                aw = limiter.check_async({"k": "wrong"})  # fails in Redis, after the cancel
            elif i % 4 == 3:
                aw = limiter.check_async({"k": f"c{i}"}, call_id="bad id!")  # fails at once
            else:
                aw = limiter.check_async({"k": f"c{i}"})
            tasks.append(asyncio.create_task(awaited(aw)))
        bare = [limiter.check_async({"k": "bare"}) for _ in range(5)]
        await asyncio.sleep(0.05)
        for t in tasks[::2]:
            t.cancel()
        for f in bare:
            f.cancel()
        out = await asyncio.gather(*tasks, return_exceptions=True)
        for i, got in enumerate(out):
            if i % 2 == 0:
                assert isinstance(got, asyncio.CancelledError), (i, got)
            elif i % 4 == 3:
                assert type(got) is tg.InvalidArgumentError and "call_id" in str(got), (i, got)
            else:
                assert isinstance(got, tg.Decision) and got.allowed, (i, got)
        assert all(f.cancelled() for f in bare)
        # Let every answer reach the loop, then use the limiter again.
        await asyncio.sleep(0.4)
        assert (await limiter.check_async({"k": "after"})).allowed
        with pytest.raises(tg.BackendError):
            await limiter.check_async({"k": "wrong"})

    asyncio.run(main())
    limiter.close()


def test_loop_closed_with_checks_pending(redis_server: RedisServer, prefix: str, leaks: Leaks) -> None:
    """A loop may close while checks are in flight: their answers arrive
    after it is gone and are dropped quietly; new loops keep working."""
    limiter = tg.Limiter([HOT], url=redis_server.url, prefix=prefix, timeout=30.0, on_backend_error="error")
    kept: list[Any] = []

    async def main() -> None:
        leaks.install(asyncio.get_running_loop())
        await limiter.check_async({"k": "warm"})
        pause(redis_server, 300)
        # Bare futures (never awaited) and tasks (cancelled by asyncio.run).
        kept.extend(limiter.check_async({"k": f"p{i}"}) for i in range(10))
        kept.extend(asyncio.create_task(awaited(limiter.check_async({"k": f"q{i}"}))) for i in range(10))
        await asyncio.sleep(0)

    asyncio.run(main())
    time.sleep(0.6)  # the answers come back to a closed loop
    gc.collect()
    assert all(not f.done() for f in kept[:10]) and all(t.cancelled() for t in kept[10:])
    kept.clear()

    async def again() -> tg.Decision:
        leaks.install(asyncio.get_running_loop())
        return await limiter.check_async({"k": "p0"})

    # The paused checks did run in Redis: p0 has used one unit.
    assert asyncio.run(again()).remaining == 3
    limiter.close()


def test_loops_in_several_threads(backend_url: str | None, prefix: str, leaks: Leaks) -> None:
    """Each thread's loop gets its own answers."""
    limiter = tg.Limiter([{**HOT, "limit": 1000}], url=backend_url, prefix=prefix, timeout=30.0,
                         on_backend_error="error")
    counts: dict[int, int] = {}
    errors: list[BaseException] = []

    def run(n: int) -> None:
        async def main() -> int:
            leaks.install(asyncio.get_running_loop())
            got = await asyncio.gather(*(limiter.check_async({"k": f"t{n}"}) for _ in range(50)))
            return sum(d.allowed for d in got)

        try:
            for _ in range(3):  # a new loop each time
                counts[n] = counts.get(n, 0) + asyncio.run(main())
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and counts == {n: 150 for n in range(4)}
    assert limiter.peek({"k": "t0"}).remaining == 849  # what a check would leave
    limiter.close()


def test_awaitables_are_asyncio_futures_of_the_running_loop(backend_url: str | None, prefix: str) -> None:
    limiter = tg.Limiter([HOT], url=backend_url, prefix=prefix, timeout=30.0)

    async def main() -> None:
        fut = limiter.check_async({"k": "f"})
        assert isinstance(fut, asyncio.Future) and fut.get_loop() is asyncio.get_running_loop()
        assert (await fut).allowed
        async with limiter as same:
            assert same is limiter

    asyncio.run(main())
    assert limiter.closed


def test_check_async_needs_a_running_loop(prefix: str) -> None:
    limiter = tg.Limiter([HOT], prefix=prefix)
    with pytest.raises(RuntimeError, match="no running event loop"):
        limiter.check_async({"k": "x"})
    # Argument errors come first, as before.
    with pytest.raises(tg.InvalidArgumentTypeError):
        limiter.check_async({"k": 1.5})  # type: ignore[dict-item]


def views(d: tg.Decision) -> dict[str, Any]:
    """Everything a Decision shows (headers, body and results are made by the
    core when asked for)."""
    return {
        "repr": repr(d),
        "headers": list(d.headers.items()),
        "legacy": list(d.headers_with(legacy=True).items()),
        "problem": d.problem_json(),
        "results": [(r.rule, r.allowed, r.shadow, r.limit, r.remaining, r.retry_after, r.reset_after,
                     r.retry_after_ms, r.reset_after_ms, r.window, repr(r)) for r in d.results],
    }


def test_awaited_decisions_show_what_blocking_ones_show(backend_url: str | None, prefix: str) -> None:
    """The same requests at the same (manual) time, blocking and awaited, on
    separate keys: every view of every decision is the same, and stays the
    same once the limiters are gone."""
    rules = [HOT, {"name": "bucket", "key": "b:{k}", "algorithm": "token_bucket", "capacity": 3,
                   "refill_rate": 1.0}, {"name": "shadow", "key": "s:{k}", "limit": 3, "window": "1m",
                                         "shadow": True}]
    clock = tg.ManualClock(1_700_000_000_000_000)
    blocking = tg.Limiter(rules, url=backend_url, prefix=prefix + "b:", clock=clock, timeout=30.0,
                          on_backend_error="error")
    later = tg.Limiter(rules, url=backend_url, prefix=prefix + "a:", clock=clock, timeout=30.0,
                         on_backend_error="error")
    steps = [({"k": "x"}, 1), ({"k": "x"}, 2), ({"k": "x"}, 1), ({"k": "x"}, 1), ({"k": "y"}, 3), ({"k": "x"}, 1)]
    loop = asyncio.new_event_loop()
    pairs = []
    for attrs, cost in steps:
        clock.advance(ms=250)
        pairs.append((blocking.check(attrs, cost), loop.run_until_complete(awaited(later.check_async, attrs, cost))))
        pairs.append((blocking.peek(attrs), loop.run_until_complete(awaited(later.peek_async, attrs))))
    loop.close()
    seen = [(views(b), views(a)) for b, a in pairs]
    assert any(not b.allowed for b, _ in pairs) and any(b.allowed for b, _ in pairs)
    blocking.close()
    later.close()
    del blocking, later
    gc.collect()
    for (b, a), (vb, va) in zip(pairs, seen):
        assert vb == va
        assert views(b) == vb and views(a) == va


class NoReaderLoop(asyncio.SelectorEventLoop):
    """A loop that cannot watch file descriptors, like Windows' proactor."""

    def add_reader(self, *args: Any) -> None:
        raise NotImplementedError


def test_loop_without_add_reader(backend_url: str | None, prefix: str, leaks: Leaks) -> None:
    """Answers reach such a loop through `call_soon_threadsafe`."""
    limiter = tg.Limiter([HOT], url=backend_url, prefix=prefix, timeout=30.0, on_backend_error="error")

    async def main() -> list[bool]:
        leaks.install(asyncio.get_running_loop())
        got = await asyncio.gather(*(awaited(limiter.check_async, {"k": "n"}) for _ in range(8)))
        with pytest.raises(tg.InvalidArgumentError):
            await limiter.check_async({"k": "n"}, 6)
        return [d.allowed for d in got]

    for admitted in (5, 0):  # a second loop of the same kind; the key is used up by then
        loop = NoReaderLoop()
        try:
            answers = loop.run_until_complete(main())
        finally:
            loop.close()
        assert sorted(answers) == [False] * (8 - admitted) + [True] * admitted
    limiter.close()


def test_uvloop(backend_url: str | None, prefix: str, leaks: Leaks) -> None:
    """The same path on uvloop's loop (add_reader on a libuv poll handle)."""
    uvloop = pytest.importorskip("uvloop")
    limiter = tg.Limiter([{**HOT, "limit": 1000}], url=backend_url, prefix=prefix, timeout=30.0,
                         on_backend_error="error")

    async def main() -> list[Any]:
        leaks.install(asyncio.get_running_loop())
        tasks = [asyncio.create_task(awaited(limiter.check_async, {"k": "uv"})) for _ in range(12)]
        await asyncio.sleep(0)
        tasks[0].cancel()  # pending on Redis; already answered on the embedded backend
        return await asyncio.gather(*tasks, return_exceptions=True)

    for _ in range(2):
        got = uvloop.run(main())
        assert all(isinstance(d, tg.Decision) and d.allowed for d in got[1:]), got
        assert isinstance(got[0], (asyncio.CancelledError, tg.Decision))
    limiter.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files through /proc")
def test_many_loops_leave_no_descriptors_behind(backend_url: str | None, prefix: str) -> None:
    """Each loop gets a wake-up socket pair; it goes with the loop."""
    limiter = tg.Limiter([{**HOT, "limit": 1000}], url=backend_url, prefix=prefix, timeout=30.0)

    async def main() -> bool:
        return (await limiter.check_async({"k": "loops"})).allowed

    assert asyncio.run(main())
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(100):
        assert asyncio.run(main())
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before
    limiter.close()


def test_settles_from_16_tasks_hold_exactly_the_real_costs(backend_url: str | None, prefix: str) -> None:
    """16 asyncio tasks check at an estimate, settle at the real cost and
    settle again: the rules end holding exactly the real costs (never more
    than the limit), and every second settle counts nothing. (A settle must
    come before 64 newer checks with call ids on its key; 16 tasks stay well
    within it.)"""
    rules = [
        {"name": "log", "key": "l:{k}", "limit": 200, "window": "1h"},
        {"name": "bucket", "key": "b:{k}", "algorithm": "token_bucket", "capacity": 200, "refill_rate": 0.0001},
        {"name": "counters", "key": "c:{k}", "algorithm": "sliding_window", "limit": 200, "window": "1h"},
    ]
    limiter = tg.Limiter({"rules": rules}, url=backend_url, prefix=prefix, timeout=5.0, on_backend_error="error")

    async def task(t: int) -> int:
        kept = 0
        for i in range(24):
            d = await limiter.check_async({"k": "x"}, 3, call_id=f"t{t}-{i}")
            if not d.allowed:
                continue
            real = (t + i) % 4
            assert await limiter.settle_async(d, real) == 3
            assert await limiter.settle_async(d, 3) == 0
            kept += real
        return kept

    async def main() -> int:
        return sum(await asyncio.gather(*(task(t) for t in range(16))))

    kept = asyncio.run(main())
    assert kept <= 200
    d = limiter.peek({"k": "x"})
    assert [r.remaining for r in d.results] == [max(0, 200 - kept - 1)] * 3
    if kept < 200:
        assert d.allowed
    limiter.close()


def test_settle_and_acquire_wiring(backend_url: str | None, prefix: str) -> None:
    """settle needs a call id on the check; acquire raises the timeout kind at
    once when the wait is longer than its timeout, and waits when it fits."""
    rules = [{"name": "per-ip", "key": "ip:{ip}", "limit": 2, "window": "1s"}]
    limiter = tg.Limiter({"rules": rules}, url=backend_url, prefix=prefix, timeout=5.0, on_backend_error="error")
    a = {"ip": "192.0.2.1"}
    d = limiter.check(a)
    with pytest.raises(tg.InvalidArgumentError, match="no call_id"):
        limiter.settle(d, 0)
    with pytest.raises(tg.InvalidArgumentError, match="actual_cost"):
        limiter.settle(d, -1)
    d = limiter.check(a, call_id="req-1")
    assert limiter.settle(d, 0) == 1
    assert limiter.settle_call(a, "req-1", 1, 2) == 0
    assert limiter.acquire(a, timeout=0).remaining == 0
    with pytest.raises(tg.BackendTimeoutError, match="acquire: not admitted within 100 ms"):
        limiter.acquire(a, timeout="100ms")
    d = limiter.acquire(a, timeout=3.0)  # waits the second or so it is told
    assert d.allowed
    async def waiting() -> tg.Decision:
        return await limiter.acquire_async(a, timeout=3.0)

    assert asyncio.run(waiting()).allowed
    denied = limiter.check(a)
    assert not denied.allowed and limiter.settle(denied, 0) == 0
    limiter.close()
