"""Redis behind Sentinel: a redis+sentinel:// URL goes through the core's
Sentinel path (the failover itself is tested in the core, core/tests/sentinel.rs)."""

from __future__ import annotations

import asyncio

import pytest

import throttlegate as tg

from conftest import RedisSentinel, RedisServer

RULE = {"name": "r", "key": "ip:{ip}", "limit": 2, "window": "1m"}


def test_checks_on_the_primary_the_sentinel_names(redis_server: RedisServer) -> None:
    sentinel = RedisSentinel(redis_server)
    try:
        limiter = tg.Limiter([RULE], url=sentinel.url, prefix="py-sentinel", strict=True, on_backend_error="error")
        assert [limiter.check({"ip": "1.2.3.4"}).allowed for _ in range(3)] == [True, True, False]
        # The async path, and the state is on the primary itself.
        async def in_a_loop() -> bool:
            return (await limiter.check_async({"ip": "1.2.3.4"})).allowed

        assert not asyncio.run(in_a_loop())
        assert b"py-sentinel" in redis_server.command("KEYS", "py-sentinel*")
        # A service the sentinel does not monitor: a backend error naming the cause.
        other = tg.Limiter([RULE], url=sentinel.url.replace("/tg", "/nosuch"), on_backend_error="error", timeout=0.5)
        with pytest.raises(tg.ThrottlegateError, match="no primary from the sentinels"):
            other.check({"ip": "1.2.3.4"})
    finally:
        sentinel.stop()


def test_a_bad_sentinel_url_names_the_form() -> None:
    with pytest.raises(tg.InvalidArgumentError, match=r"no SERVICE.*redis\+sentinel://\[user:password@\]host:port"):
        tg.Limiter([RULE], url="redis+sentinel://127.0.0.1:26379")
