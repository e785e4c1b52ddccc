"""The bad-input conformance vectors (tests/vectors/errors/*.json, format in
tests/vectors/README.md) through the Python API: each malformed policy text
given to Policy.from_str, each bad option given to Limiter, each bad call made
on the embedded backend and a real Redis, through the blocking calls and the
awaitables. The exception must be of the class of the expected kind and
str(exc) must be the core's message, byte for byte."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

import throttlegate as tg
from conftest import REPO

ERROR_FILES = sorted((REPO / "tests" / "vectors" / "errors").glob("*.json"))
CASES: list[tuple[str, dict[str, Any]]] = [
    (f"{path.stem}/{case['name']}", case)
    for path in ERROR_FILES
    for case in json.loads(path.read_text(encoding="utf-8"))["cases"]
]
POLICY_CASES = [(i, c) for i, c in CASES if "policy_text" in c]
OPTION_CASES = [(i, c) for i, c in CASES if "options" in c]
CALL_CASES = [(i, c) for i, c in CASES if "steps" in c]

CLASS_OF_KIND: dict[str, type[tg.ThrottlegateError]] = {
    "invalid_policy": tg.InvalidPolicyError,
    "invalid_argument": tg.InvalidArgumentError,
    "io": tg.PolicyFileError,
    "backend_unavailable": tg.BackendUnavailableError,
    "timeout": tg.BackendTimeoutError,
    "backend": tg.BackendError,
    "closed": tg.ClosedError,
    "internal": tg.InternalError,
}
# The vector's option names as Limiter's keyword arguments.
OPTION_NAMES = {"url": "url", "prefix": "prefix"}


def outcome(call: Callable[[], Any]) -> tuple[str, str, str]:
    """(exception class, kind, message) of what `call` raised."""
    try:
        call()
    except tg.ThrottlegateError as e:
        return (type(e).__name__, e.kind, str(e))
    return ("no error", "", "")


def wanted(want: dict[str, Any]) -> tuple[str, str, str]:
    kind = want["expect_error"]
    return (CLASS_OF_KIND[kind].__name__, kind, want["message"])


def limiter_for(case: dict[str, Any], url: str | None) -> tg.Limiter:
    kwargs: dict[str, Any] = {"url": url, "prefix": f"e-{uuid.uuid4().hex[:12]}:"}
    for name, value in case.get("options", {}).items():
        kwargs[OPTION_NAMES[name]] = value
    return tg.Limiter(case["policy"], timeout=10.0, on_backend_error="error", **kwargs)


@pytest.mark.parametrize("case", [c for _, c in POLICY_CASES], ids=[i for i, _ in POLICY_CASES])
def test_error_vector_policy_text(case: dict[str, Any]) -> None:
    assert outcome(lambda: tg.Policy.from_str(case["policy_text"])) == wanted(case)


@pytest.mark.parametrize("case", [c for _, c in OPTION_CASES], ids=[i for i, _ in OPTION_CASES])
def test_error_vector_option(case: dict[str, Any], backend_url: str | None) -> None:
    assert outcome(lambda: limiter_for(case, backend_url)) == wanted(case)


def as_text_ms(ms: Any) -> Any:
    """A vector's ``duration_ms`` as Python gives it: text in milliseconds
    (``"1500ms"``), exact where seconds as a float would not be."""
    return f"{ms}ms" if isinstance(ms, int) and not isinstance(ms, bool) else ms


@pytest.mark.parametrize("api", ["sync", "async"])
@pytest.mark.parametrize("case", [c for _, c in CALL_CASES], ids=[i for i, _ in CALL_CASES])
def test_error_vector_calls(case: dict[str, Any], backend_url: str | None, api: str) -> None:
    limiter = limiter_for(case, backend_url)
    loop = asyncio.new_event_loop()

    async def run_async(op: str, attrs: dict[str, Any], cost: int, call_id: str | None, step: dict[str, Any]) -> Any:
        if op == "override_set":
            return await limiter.set_override_async(step.get("rule", ""), attrs, step.get("limit", 0))
        if op == "override_clear":
            return await limiter.clear_override_async(step.get("rule", ""), attrs)
        if op == "overrides":
            return await limiter.overrides_async(step.get("rule", ""))
        if op == "settle":
            return await limiter.settle_call_async(attrs, call_id, cost, step["actual_cost"])
        if op == "release":
            return await limiter.release_call_async(attrs, call_id)
        if op == "extend":
            return await limiter.extend_call_async(attrs, call_id, as_text_ms(step["duration_ms"]))
        if op == "acquire":
            return await limiter.acquire_async(attrs, cost, timeout=step["timeout_ms"] / 1000)
        if op == "check":
            return await limiter.check_async(attrs, cost, call_id=call_id)
        if op == "peek":
            return await limiter.peek_async(attrs, cost)
        if op == "reset":
            return await limiter.reset_async(attrs)
        raise AssertionError(f"unknown op {op!r}")

    def run(step: dict[str, Any]) -> Any:
        op = step.get("op", "check")
        attrs = step.get("attributes", {})
        cost = step.get("cost", 1)
        if op == "reload":
            return limiter.reload(step["policy"])
        if api == "async":
            return loop.run_until_complete(run_async(op, attrs, cost, step.get("call_id"), step))
        if op == "override_set":
            return limiter.set_override(step.get("rule", ""), attrs, step.get("limit", 0))
        if op == "override_clear":
            return limiter.clear_override(step.get("rule", ""), attrs)
        if op == "overrides":
            return limiter.overrides(step.get("rule", ""))
        if op == "settle":
            return limiter.settle_call(attrs, step["call_id"], cost, step["actual_cost"])
        if op == "release":
            return limiter.release_call(attrs, step["call_id"])
        if op == "extend":
            return limiter.extend_call(attrs, step["call_id"], as_text_ms(step["duration_ms"]))
        if op == "acquire":
            return limiter.acquire(attrs, cost, timeout=step["timeout_ms"] / 1000)
        if op == "check":
            return limiter.check(attrs, cost, call_id=step.get("call_id"))
        if op == "peek":
            return limiter.peek(attrs, cost)
        if op == "reset":
            return limiter.reset(attrs)
        raise AssertionError(f"unknown op {op!r}")

    mismatches = []
    try:
        for i, step in enumerate(case["steps"]):
            if step.get("op") == "close":
                limiter.close()
                continue
            got = outcome(lambda: run(step))
            if got != wanted(step):
                mismatches.append(f"step {i}: expected {wanted(step)!r}, got {got!r}")
    finally:
        loop.close()
        limiter.close()
    assert not mismatches, "\n".join(mismatches)


def test_error_vectors_are_found() -> None:
    assert len(CASES) >= 30 and POLICY_CASES and OPTION_CASES and CALL_CASES
