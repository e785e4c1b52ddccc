"""A limiter made before os.fork() (gunicorn/uwsgi pre-fork) works in the child."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any, Callable

import pytest

import throttlegate as tg
from conftest import RedisServer

RULE = {"name": "per-ip", "key": "ip:{ip}", "limit": 10, "window": "1h"}

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork"),
    # Python >= 3.12 warns when forking once the runtime's threads exist; that
    # fork is exactly the case under test.
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]


def in_child(fn: Callable[[], Any]) -> Any:
    """Run fn in a forked child and return its JSON-able result (or raise its error)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            payload = {"ok": fn()}
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            payload = {"error": f"{type(e).__name__}: {e}"}
        os.write(w, json.dumps(payload).encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    result = json.loads(b"".join(chunks))
    assert "error" not in result, result["error"]
    return result["ok"]


def test_redis_limiter_used_before_fork_works_in_the_child(redis_server: RedisServer, prefix: str) -> None:
    limiter = tg.Limiter([RULE], url=redis_server.url, prefix=prefix, timeout=10.0, on_backend_error="error")
    attrs = {"ip": "203.0.113.7"}
    assert limiter.check(attrs).remaining == 9  # the parent's runtime and connection exist now

    def child() -> list[int]:
        sync = limiter.check(attrs).remaining

        async def main() -> int:
            return (await limiter.check_async(attrs)).remaining

        return [sync, asyncio.run(main())]

    # The child shares Redis, so it sees the parent's count.
    assert in_child(child) == [8, 7]
    assert limiter.check(attrs).remaining == 6, "the parent's limiter still works after the child"
    assert in_child(lambda: limiter.peek(attrs).remaining) == 5


def test_limiter_made_before_fork_and_never_used(redis_server: RedisServer, prefix: str) -> None:
    limiter = tg.Limiter([RULE], url=redis_server.url, prefix=prefix, timeout=10.0, on_backend_error="error")
    assert in_child(lambda: limiter.check({"ip": "1.1.1.1"}).remaining) == 9
    assert limiter.check({"ip": "1.1.1.1"}).remaining == 8


def test_embedded_backend_continues_from_a_copy_in_the_child() -> None:
    """The core's rule in every language: the child has the state as it was
    at the fork, and from then on parent and child count separately."""
    limiter = tg.Limiter([RULE])
    for _ in range(3):
        limiter.check({"ip": "1.1.1.1"})
    assert in_child(lambda: [limiter.check({"ip": "1.1.1.1"}).remaining for _ in range(2)]) == [6, 5]
    assert limiter.check({"ip": "1.1.1.1"}).remaining == 6


def test_closed_limiter_stays_closed_in_the_child() -> None:
    limiter = tg.Limiter([RULE])
    limiter.close()

    def child() -> str:
        try:
            limiter.check({"ip": "1.1.1.1"})
        except tg.ClosedError as e:
            return str(e)
        return "no error"

    assert "closed" in in_child(child)
