"""The conformance vectors (tests/vectors/*.json, plus this package's own)
replayed against the embedded backend, a real Redis and a real local Redis
Cluster, through the Python API: the blocking calls, and the awaitables
(whose decisions are completed on the event loop, headers included)."""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from pathlib import Path
from typing import Any

import pytest

import throttlegate as tg
from conftest import REPO

VECTOR_FILES = sorted((REPO / "tests" / "vectors").glob("*.json")) + sorted(
    (Path(__file__).parent / "vectors").glob("*.json")
)
DECISION_KEYS = {"allowed", "limit", "remaining", "retry_after_ms", "reset_after_ms", "rule", "results", "headers"}
RESULT_KEYS = {"rule", "allowed", "shadow", "limit", "remaining", "retry_after_ms", "reset_after_ms"}


def ms(seconds: float) -> int:
    """Seconds as whole milliseconds rounded up, through whole microseconds
    so that float noise cannot change a comparison."""
    return math.ceil(round(seconds * 1e6) / 1000)


def decision_view(d: tg.Decision, wanted: dict[str, Any]) -> dict[str, Any]:
    unknown = set(wanted) - DECISION_KEYS
    assert not unknown, f"unknown expect keys {unknown}"
    got: dict[str, Any] = {
        "allowed": d.allowed,
        "limit": d.limit,
        "remaining": d.remaining,
        "retry_after_ms": ms(d.retry_after),
        "reset_after_ms": ms(d.reset_after),
        "rule": d.rule,
        "headers": [list(pair) for pair in d.headers.items()],
        "results": [
            {
                "rule": r.rule,
                "allowed": r.allowed,
                "shadow": r.shadow,
                "limit": r.limit,
                "remaining": r.remaining,
                "retry_after_ms": ms(r.retry_after),
                "reset_after_ms": ms(r.reset_after),
            }
            for r in d.results
        ],
    }
    # The _ms fields must agree with the float seconds.
    assert got["retry_after_ms"] == d.retry_after_ms and got["reset_after_ms"] == d.reset_after_ms
    if "results" in wanted:
        for want in wanted["results"]:
            assert not set(want) - RESULT_KEYS, f"unknown result keys {set(want) - RESULT_KEYS}"
        got["results"] = [
            {k: r[k] for k in want} for r, want in zip(got["results"], wanted["results"])
        ] + got["results"][len(wanted["results"]):]
    return {k: got[k] for k in wanted}


def replay(path: Path, url: str | None, api: str = "sync") -> None:
    case = json.loads(path.read_text())
    clock = tg.ManualClock(case["start_us"])
    prefix = f"v-{uuid.uuid4().hex[:12]}:"
    limiter = tg.Limiter(case["policy"], url=url, prefix=prefix, clock=clock, timeout=10.0, on_backend_error="error")

    # The decisions of the checks made with a call id, for release and extend by decision.
    made: dict[str, tuple[tg.Decision, dict[str, Any]]] = {}

    def decision_of(attrs: dict[str, Any], call_id: str | None) -> tg.Decision | None:
        """The decision of the check ``call_id`` when it was made with these attributes."""
        got = made.get(call_id or "")
        return got[0] if got is not None and got[1] == attrs else None

    def listed(out: list[dict[str, Any]]) -> dict[str, Any]:
        return {"overrides": [{"attributes": o["attributes"], "limit": o["limit"]} for o in out]}

    async def run_async(op: str, attrs: dict[str, Any], cost: int, call_id: str | None, step: dict[str, Any]) -> Any:
        if op == "override_set":
            await limiter.set_override_async(step["rule"], attrs, step["limit"])
            return {}
        if op == "override_clear":
            return {"cleared": await limiter.clear_override_async(step["rule"], attrs)}
        if op == "overrides":
            return listed(await limiter.overrides_async(step["rule"]))
        if op == "settle":
            return await limiter.settle_call_async(attrs, call_id, cost, step["actual_cost"])
        if op == "acquire":
            return await limiter.acquire_async(attrs, cost, timeout=step["timeout_ms"] / 1000)
        if op == "release":
            d = decision_of(attrs, call_id)
            n = await (limiter.release_async(d) if d is not None else limiter.release_call_async(attrs, call_id))
            return {"released": n}
        if op == "extend":
            d, seconds = decision_of(attrs, call_id), step["duration_ms"] / 1000
            n = await (limiter.extend_async(d, seconds) if d is not None
                       else limiter.extend_call_async(attrs, call_id, seconds))
            return {"extended": n}
        if op == "check":
            return await limiter.check_async(attrs, cost, call_id=call_id)
        if op == "peek":
            return await limiter.peek_async(attrs, cost)
        if op == "reset":
            return await limiter.reset_async(attrs)
        raise AssertionError(f"unknown op {op!r}")

    def run(op: str, attrs: dict[str, Any], cost: int, call_id: str | None, step: dict[str, Any]) -> Any:
        if api == "async":
            return loop.run_until_complete(run_async(op, attrs, cost, call_id, step))
        if op == "override_set":
            limiter.set_override(step["rule"], attrs, step["limit"])
            return {}
        if op == "override_clear":
            return {"cleared": limiter.clear_override(step["rule"], attrs)}
        if op == "overrides":
            return listed(limiter.overrides(step["rule"]))
        if op == "settle":
            return limiter.settle_call(attrs, call_id, cost, step["actual_cost"])
        if op == "acquire":
            return limiter.acquire(attrs, cost, timeout=step["timeout_ms"] / 1000)
        if op == "release":
            d = decision_of(attrs, call_id)
            return {"released": limiter.release(d) if d is not None else limiter.release_call(attrs, call_id)}
        if op == "extend":
            d, seconds = decision_of(attrs, call_id), step["duration_ms"] / 1000
            return {"extended": limiter.extend(d, seconds) if d is not None else limiter.extend_call(attrs, call_id, seconds)}
        if op == "check":
            return limiter.check(attrs, cost, call_id=call_id)
        if op == "peek":
            return limiter.peek(attrs, cost)
        if op == "reset":
            return limiter.reset(attrs)
        raise AssertionError(f"unknown op {op!r}")

    loop = asyncio.new_event_loop()
    try:
        for i, step in enumerate(case["steps"]):
            where = f"{path.name} step {i} ({api})"
            clock.advance(ms=step.get("advance_ms", 0))
            op = step.get("op", "check")
            try:
                if op == "reload":
                    out = limiter.reload(step["policy"])
                elif op == "metrics":
                    metrics = limiter.metrics()
                    assert metrics is not None, where
                    out = {"rules": metrics["rules"]}
                else:
                    out = run(op, step.get("attributes", {}), step.get("cost", 1), step.get("call_id"), step)
                    if op == "check" and step.get("call_id") is not None:
                        made[step["call_id"]] = (out, step.get("attributes", {}))
            except tg.ThrottlegateError as e:
                assert "expect_error" in step, f"{where}: unexpected {type(e).__name__}: {e}"
                assert e.kind == step["expect_error"], f"{where}: {e.kind} ({e}) instead of {step['expect_error']}"
                continue
            assert "expect_error" not in step, f"{where}: expected {step['expect_error']}, got {out!r}"
            want = step["expect"]
            if op == "reload":
                assert want == {} and sorted(out) == ["rules", "settings"], where
            elif op == "reset":
                assert {"deleted": out} == want, where
            elif op.startswith("override"):
                assert out == want, f"{where}: {out!r} != {want!r}"
            elif op == "settle":
                assert {"settled": out} == want, where
            elif op in ("metrics", "release", "extend"):
                assert out == want, f"{where}: {out!r} != {want!r}"
            else:
                assert decision_view(out, want) == want, where
    finally:
        loop.close()
        limiter.close()


@pytest.mark.parametrize("api", ["sync", "async"])
@pytest.mark.parametrize("path", VECTOR_FILES, ids=[p.stem for p in VECTOR_FILES])
def test_vector_embedded(path: Path, api: str) -> None:
    replay(path, None, api)


@pytest.mark.parametrize("api", ["sync", "async"])
@pytest.mark.parametrize("path", VECTOR_FILES, ids=[p.stem for p in VECTOR_FILES])
def test_vector_redis(path: Path, redis_server: Any, api: str) -> None:
    replay(path, redis_server.url, api)


@pytest.mark.parametrize("path", VECTOR_FILES, ids=[p.stem for p in VECTOR_FILES])
def test_vector_cluster(path: Path, redis_cluster: Any) -> None:
    replay(path, redis_cluster.url)


def test_cluster_url_gives_a_cluster_backend(redis_cluster: Any) -> None:
    rules = [{"name": "n", "key": "k:{ip}", "limit": 1, "window": "1m"}]
    with tg.Limiter(rules, url=redis_cluster.url, prefix=f"c-{uuid.uuid4().hex[:12]}:") as limiter:
        assert limiter.backend == "cluster"
        limiter.ping()
        attrs = {"ip": "198.51.100.7"}
        assert limiter.check(attrs).allowed
        key = limiter.keys(attrs)[0]
        # Exactly one node holds the key: its slot's primary (the others,
        # replicas included, answer with a redirection).
        holders = [n.port for n in redis_cluster.nodes if n.command("EXISTS", key) == b":1\r\n"]
        assert len(holders) == 1, holders


def test_own_vector_is_found() -> None:
    assert any(p.stem == "python-window-and-bucket" for p in VECTOR_FILES)
