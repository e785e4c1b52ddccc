"""release, release_call, extend and extend_call (blocking and awaitable) on
a concurrency rule, on the embedded backend and a real Redis: the lease id on
decisions, idempotent releases, renewals, and bad input as typed errors."""

from __future__ import annotations

import asyncio

import pytest

import throttlegate as tg

POLICY = [{"name": "slots", "key": "slots:{job}", "algorithm": "concurrency", "limit": 2, "lease": "1h"}]
JOB = {"job": "export"}


def test_release_gives_the_slot_back_once(backend_url: str | None, prefix: str) -> None:
    limiter = tg.Limiter(POLICY, backend_url, prefix=prefix)
    first, second = limiter.check(JOB), limiter.check(JOB)
    assert first.allowed and second.allowed
    assert first.lease_id and second.lease_id and first.lease_id != second.lease_id
    third = limiter.check(JOB)
    assert not third.allowed and third.lease_id is None
    assert limiter.release(first) == 1
    assert limiter.release(first) == 0  # idempotent
    assert limiter.release(third) == 0  # a denial holds nothing
    assert limiter.check(JOB).allowed
    assert not limiter.check(JOB).allowed
    limiter.close()


def test_the_call_id_is_the_lease_id(backend_url: str | None, prefix: str) -> None:
    limiter = tg.Limiter(POLICY, backend_url, prefix=prefix)
    d = limiter.check(JOB, call_id="job-1")
    assert d.allowed and d.lease_id == "job-1"
    assert limiter.extend_call(JOB, "job-1", 30) == 1
    assert limiter.extend(d, "2m") == 1
    assert limiter.release_call(JOB, "job-1") == 1
    assert limiter.release_call(JOB, "job-1") == 0
    assert limiter.release(d) == 0
    assert limiter.extend(d, 30) == 0  # released: nothing to renew
    limiter.close()


def test_awaitables(backend_url: str | None, prefix: str) -> None:
    limiter = tg.Limiter(POLICY, backend_url, prefix=prefix)

    async def main() -> None:
        d = await limiter.check_async(JOB)
        assert d.lease_id is not None
        assert await limiter.extend_async(d, 60) == 1
        assert await limiter.release_async(d) == 1
        assert await limiter.release_async(d) == 0
        e = await limiter.check_async(JOB, call_id="job-2")
        assert await limiter.extend_call_async(JOB, "job-2", 0.5) == 1
        assert await limiter.release_call_async(JOB, "job-2") == 1
        assert await limiter.release_call_async(JOB, "job-2") == 0
        assert await limiter.extend_async(e, 1) == 0

    asyncio.run(main())
    limiter.close()


def test_rate_rules_hold_no_lease(backend_url: str | None, prefix: str) -> None:
    limiter = tg.Limiter([{"name": "per-ip", "key": "ip:{ip}", "limit": 5, "window": "1m"}], backend_url, prefix=prefix)
    d = limiter.check({"ip": "203.0.113.7"}, call_id="c-1")
    assert d.allowed and d.lease_id is None
    assert limiter.release(d) == 0
    assert limiter.extend(d, 10) == 0
    limiter.close()


def test_bad_input_is_a_typed_error_with_the_cores_message(prefix: str) -> None:
    limiter = tg.Limiter(POLICY, prefix=prefix)
    d = limiter.check(JOB)
    with pytest.raises(tg.InvalidArgumentError) as e:
        limiter.extend(d, 0)
    assert str(e.value) == "duration: must be between 1ms and 366d, not 0"
    with pytest.raises(tg.InvalidArgumentError) as e:
        limiter.extend(d, -1)
    assert str(e.value).startswith("duration: expected seconds")
    with pytest.raises(tg.InvalidArgumentError) as e:
        limiter.extend(d, "soon")
    assert str(e.value).startswith("duration: ")
    with pytest.raises(tg.InvalidArgumentError) as e:
        limiter.release_call(JOB, "")
    assert "call_id" in str(e.value)
    with pytest.raises(TypeError):
        limiter.release("not a decision")  # type: ignore[arg-type]
    with pytest.raises(tg.InvalidArgumentError):
        limiter.release_call(JOB, 7)  # type: ignore[arg-type]
    limiter.close()
    with pytest.raises(tg.ClosedError):
        limiter.release(d)
