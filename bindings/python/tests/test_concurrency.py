"""The GIL and the event loop are free while a call waits, and concurrent
callers on one key never get more than the limit."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

import throttlegate as tg
from conftest import RedisServer

RULE = {"name": "hot", "key": "hot:{k}", "limit": 100, "window": "1h"}


class ThreadProxy:
    """A TCP relay to Redis written in Python: its threads need the GIL to move
    a single byte, so a call through it can only complete if the caller
    released the GIL while waiting."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.relayed = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
                with self.lock:
                    self.relayed += len(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


def test_blocking_check_releases_the_gil(redis_server: RedisServer, prefix: str) -> None:
    proxy = ThreadProxy(redis_server.port)
    try:
        # A generous timeout: the call fails only if the relay threads never run.
        limiter = tg.Limiter([RULE], url=f"redis://127.0.0.1:{proxy.port}/0", prefix=prefix,
                             timeout=60.0, on_backend_error="error")
        for expected in (99, 98, 97):
            d = limiter.check({"k": "gil"})
            assert d.allowed and not d.degraded and d.remaining == expected
        assert proxy.relayed > 0
        limiter.close()
    finally:
        proxy.close()


def test_check_async_leaves_the_event_loop_free(redis_server: RedisServer, prefix: str) -> None:
    async def main() -> int:
        relayed = 0

        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal relayed
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
                relayed += len(data)
            writer.close()

        async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", redis_server.port)
            await asyncio.gather(pump(client_r, up_w), pump(up_r, client_w), return_exceptions=True)

        # The relay runs on this event loop: if check_async blocked the loop,
        # no byte would reach Redis and the call would time out.
        server = await asyncio.start_server(relay, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with tg.Limiter([RULE], url=f"redis://127.0.0.1:{port}/0", prefix=prefix,
                              timeout=60.0, on_backend_error="error") as limiter:
            for expected in (99, 98, 97):
                d = await limiter.check_async({"k": "loop"})
                assert d.allowed and not d.degraded and d.remaining == expected
        server.close()
        return relayed

    assert asyncio.run(main()) > 0


def test_64_threads_one_key_exactly_the_limit(backend_url: str | None, prefix: str) -> None:
    limiter = tg.Limiter([RULE], url=backend_url, prefix=prefix, timeout=30.0, on_backend_error="error")
    start = threading.Barrier(64)
    allowed = [0] * 64
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            start.wait()
            for _ in range(4):
                allowed[i] += limiter.check({"k": "threads"}).allowed
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(allowed) == 100
    assert limiter.stats()["allowed"] == 100 and limiter.stats()["denied"] == 156


def test_64_tasks_one_key_exactly_the_limit(backend_url: str | None, prefix: str) -> None:
    async def main() -> int:
        limiter = tg.Limiter([RULE], url=backend_url, prefix=prefix, timeout=30.0, on_backend_error="error")

        async def task() -> int:
            n = 0
            for _ in range(4):
                n += (await limiter.check_async({"k": "tasks"})).allowed
            return n

        counts = await asyncio.gather(*(task() for _ in range(64)))
        limiter.close()
        return sum(counts)

    assert asyncio.run(main()) == 100


def test_cancelled_check_async_does_not_break_the_limiter(redis_server: RedisServer, prefix: str) -> None:
    async def main() -> None:
        limiter = tg.Limiter([RULE], url=redis_server.url, prefix=prefix, timeout=30.0)
        fut = asyncio.ensure_future(limiter.check_async({"k": "cancel"}))
        fut.cancel()
        with pytest.raises(asyncio.CancelledError):
            await fut
        assert (await limiter.check_async({"k": "cancel"})).allowed

    asyncio.run(main())


def test_64_tasks_with_tiers_an_override_and_a_block(backend_url: str | None, prefix: str) -> None:
    """The tightest of a tier, an override and a blocking rule, exactly; after
    the block is set, every later check is denied."""
    rules = [
        {"name": "plan", "key": "u:{user}", "window": "1h", "tiers": {"attribute": "plan", "pro": 40, "default": 5}},
        {"name": "tenant", "key": "t:{tenant}", "limit": 5, "window": "1h", "overrides": True},
        {"name": "ip", "key": "ip:{ip}", "limit": 20, "window": "1h", "block": "1h"},
    ]
    attrs = {"user": "u1", "plan": "pro", "tenant": "t1", "ip": "203.0.113.7"}

    async def main() -> tuple[int, float]:
        limiter = tg.Limiter(rules, url=backend_url, prefix=prefix, timeout=30.0, on_backend_error="error")
        await limiter.set_override_async("tenant", {"tenant": "t1"}, 30)

        async def task() -> int:
            n = 0
            for _ in range(4):
                n += (await limiter.check_async(attrs)).allowed
            return n

        counts = await asyncio.gather(*(task() for _ in range(64)))
        after = await limiter.peek_async(attrs)
        limiter.close()
        return sum(counts), after.retry_after

    admitted, retry_after = asyncio.run(main())
    assert admitted == 20
    assert retry_after > 3500
