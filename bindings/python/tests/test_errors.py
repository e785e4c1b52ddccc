"""Error shapes: one base class, a subclass per kind, and bad input of every
sort answered with a typed error naming what is wrong (never a panic)."""

from __future__ import annotations

import pathlib
import random
import string

import pytest

import throttlegate as tg
from conftest import RedisServer, free_port

RULE = {"name": "per-ip", "key": "ip:{ip}", "limit": 3, "window": "10s"}


def test_hierarchy() -> None:
    kinds = {
        tg.InvalidPolicyError: ("invalid_policy", 1, ValueError),
        tg.InvalidArgumentError: ("invalid_argument", 2, ValueError),
        tg.PolicyFileError: ("io", 3, OSError),
        tg.BackendUnavailableError: ("backend_unavailable", 4, ConnectionError),
        tg.BackendTimeoutError: ("timeout", 5, TimeoutError),
        tg.BackendError: ("backend", 6, Exception),
        tg.ClosedError: ("closed", 7, Exception),
        tg.InternalError: ("internal", 8, Exception),
    }
    for cls, (kind, code, builtin) in kinds.items():
        assert issubclass(cls, tg.ThrottlegateError) and issubclass(cls, builtin)
        assert (cls.kind, cls.code) == (kind, code)
    assert issubclass(tg.InvalidArgumentTypeError, tg.InvalidArgumentError)
    assert issubclass(tg.InvalidArgumentTypeError, TypeError)


def raises(exc: type[BaseException], call, match: str | None = None) -> BaseException:  # type: ignore[no-untyped-def]
    with pytest.raises(exc, match=match) as info:
        call()
    assert isinstance(info.value, tg.ThrottlegateError)
    assert info.value.message == str(info.value)
    return info.value


def test_wrong_types_are_type_errors() -> None:
    limiter = tg.Limiter([RULE])
    T = tg.InvalidArgumentTypeError
    raises(T, lambda: limiter.check("203.0.113.7"), "attributes")  # type: ignore[arg-type]
    raises(T, lambda: limiter.check(None), "attributes")  # type: ignore[arg-type]
    raises(T, lambda: limiter.check([("ip", "x")]), "attributes")  # type: ignore[arg-type]
    raises(T, lambda: limiter.check({1: "x"}), "names must be str")  # type: ignore[dict-item]
    raises(T, lambda: limiter.check({"ip": 1.5}), r'attributes\["ip"\]')  # type: ignore[dict-item]
    raises(T, lambda: limiter.check({"ip": b"x"}), r'attributes\["ip"\]')  # type: ignore[dict-item]
    raises(T, lambda: limiter.check({"ip": "x"}, "1"), "cost")  # type: ignore[arg-type]
    raises(T, lambda: limiter.check({"ip": "x"}, 1.0), "cost")  # type: ignore[arg-type]
    raises(T, lambda: limiter.check({"ip": "x"}, True), "cost")
    raises(T, lambda: limiter.check({"ip": "x"}, call_id=5), "call_id")  # type: ignore[arg-type]
    raises(T, lambda: limiter.check_async("x"), "attributes")  # type: ignore[arg-type]
    raises(T, lambda: limiter.reset(5), "attributes")  # type: ignore[arg-type]
    raises(T, lambda: limiter.keys(5), "attributes")  # type: ignore[arg-type]
    raises(T, lambda: tg.Limiter(None), "policy")  # type: ignore[arg-type]
    raises(T, lambda: tg.Limiter(42), "policy")  # type: ignore[arg-type]
    raises(T, lambda: tg.Limiter([RULE], url=5), "url")  # type: ignore[arg-type]
    raises(T, lambda: tg.Limiter([RULE], prefix=5), "prefix")  # type: ignore[arg-type]
    raises(T, lambda: tg.Limiter([RULE], timeout=[1]), "timeout")  # type: ignore[arg-type]
    assert tg.Limiter([RULE], timeout="250ms").policy.timeout == 0.25
    raises(T, lambda: tg.Limiter([RULE], timeout=True), "timeout")
    raises(T, lambda: tg.Limiter([RULE], clock=5), "clock")  # type: ignore[arg-type]
    raises(T, lambda: tg.Limiter([RULE], key_secret=5), "key_secret")  # type: ignore[arg-type]
    raises(T, lambda: tg.Policy("rules.toml"), "Policy.from_file")  # type: ignore[arg-type]
    raises(T, lambda: tg.Policy.from_file(5), "path")  # type: ignore[arg-type]
    raises(T, lambda: tg.Policy.from_str(None), "text")  # type: ignore[arg-type]
    raises(T, lambda: tg.ManualClock("0"), "start_us")  # type: ignore[arg-type]
    raises(T, lambda: tg.ManualClock(0).advance(ms=1.5), "ms")  # type: ignore[arg-type]
    raises(T, lambda: tg.ClientIp("10.0.0.1"), "trusted_proxies")  # type: ignore[arg-type]
    raises(T, lambda: tg.ClientIp([1]), r"trusted_proxies\[0\]")  # type: ignore[list-item]
    raises(T, lambda: tg.ClientIp(ipv6_prefix="64"), "ipv6_prefix")  # type: ignore[arg-type]
    raises(T, lambda: tg.ClientIp().client_ip(None), "peer")  # type: ignore[arg-type]


def test_wrong_values_are_value_errors() -> None:
    limiter = tg.Limiter([RULE])
    A = tg.InvalidArgumentError
    raises(A, lambda: limiter.check({"ip": "x"}, 0), "cost")
    raises(A, lambda: limiter.check({"ip": "x"}, -1), "cost")
    raises(A, lambda: limiter.check({"ip": "x"}, 2**70), "cost")
    raises(A, lambda: limiter.check({"ip": "x"}, 4), 'rule "per-ip"')
    raises(A, lambda: limiter.check({"ip": "x"}, call_id="not valid!"), "call_id")
    raises(A, lambda: limiter.check({"ip": "x"}, call_id=""), "call_id")
    raises(A, lambda: limiter.check({"ip": "\udc80"}), "surrogate")
    raises(A, lambda: tg.Limiter([RULE], url="http://127.0.0.1"), "url")
    raises(A, lambda: tg.Limiter([RULE], url="redis://:bad port"), "url")
    raises(A, lambda: tg.Limiter([RULE], timeout=-1), "timeout")
    raises(A, lambda: tg.Limiter([RULE], timeout=0), "timeout")
    raises(A, lambda: tg.Limiter([RULE], timeout=float("nan")), "timeout")
    raises(A, lambda: tg.Limiter([RULE], on_backend_error="maybe"), "on_backend_error")
    raises(A, lambda: tg.Limiter([RULE], clock="sundial"), "clock")
    raises(A, lambda: tg.Limiter([RULE], key_secret=b""), "key_secret")
    raises(A, lambda: tg.Limiter([RULE], prefix="x" * 10_000), "prefix")
    raises(A, lambda: tg.ManualClock(2**64), "start_us")
    raises(A, lambda: tg.ManualClock(0).advance(ms=-1), "advance")
    raises(A, lambda: tg.ClientIp(["not-an-ip"]), "trusted_proxies")
    raises(A, lambda: tg.ClientIp(ipv6_prefix=0), "ipv6_prefix")
    raises(A, lambda: tg.ClientIp(ipv6_prefix=300), "ipv6_prefix")


def test_bad_policies() -> None:
    P = tg.InvalidPolicyError
    raises(P, lambda: tg.Limiter({"rules": []}), "at least one rule")
    raises(P, lambda: tg.Limiter([]), "at least one rule")
    raises(P, lambda: tg.Limiter([{**RULE, "bogus": 1}]), "bogus")
    raises(P, lambda: tg.Limiter([{**RULE, "limit": 0}]), "limit")
    raises(P, lambda: tg.Limiter([{**RULE, "limit": -5}]), "limit")
    raises(P, lambda: tg.Limiter([{**RULE, "window": "soon"}]), "window")
    raises(P, lambda: tg.Limiter([{**RULE, "algorithm": "leaky"}]), "leaky")
    raises(P, lambda: tg.Limiter([{**RULE, "name": ""}]), "name")
    raises(P, lambda: tg.Limiter([RULE, RULE]), "unique")
    raises(P, lambda: tg.Limiter([{**RULE, "key": "ip:{ip"}]), "key")
    raises(P, lambda: tg.Limiter([{"name": "b", "key": "{k}", "algorithm": "token_bucket", "capacity": 1,
                                   "refill_rate": float("inf")}]), "refill_rate|finite")
    raises(P, lambda: tg.Limiter({"rules": [RULE], "timeout": "forever"}), "timeout")
    raises(P, lambda: tg.Policy.from_str("rules = [ nope"), "TOML")
    raises(P, lambda: tg.Policy.from_str('{"rules": '), "JSON")
    raises(P, lambda: tg.Limiter([{**RULE, "limit": 2**80}]), "limit|large")
    raises(P, lambda: tg.Limiter([{**RULE, "limit": object()}]), r"rules\[0\]\.limit")
    raises(P, lambda: tg.Limiter({1: [RULE]}), "keys must be str")  # type: ignore[dict-item]
    raises(P, lambda: tg.Limiter({"rules": [{**RULE, "key": "\udc80"}]}), r"rules\[0\]\.key")
    deep: dict = {"rules": [RULE]}
    node = deep
    for _ in range(100):
        node["x"] = {}
        node = node["x"]
    raises(P, lambda: tg.Limiter(deep), "deep")


def test_bad_files(tmp_path: pathlib.Path) -> None:
    raises(tg.PolicyFileError, lambda: tg.Limiter(tmp_path / "missing.toml"), "missing.toml")
    raises(tg.PolicyFileError, lambda: tg.Limiter(tmp_path), str(tmp_path))
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00rules")
    raises(tg.InvalidPolicyError, lambda: tg.Limiter(binary), "UTF-8")
    empty = tmp_path / "empty.json"
    empty.write_text("")
    raises(tg.InvalidPolicyError, lambda: tg.Policy.from_file(empty), "empty.json")
    wrong = tmp_path / "wrong.toml"
    wrong.write_text('[[rules]]\nname = "a"\nkey = "{k}"\nlimit = "many"\nwindow = "1s"\n')
    raises(tg.InvalidPolicyError, lambda: tg.Limiter(str(wrong)), "limit")


def test_huge_strings_stay_bounded() -> None:
    limiter = tg.Limiter([RULE, {"name": "n", "key": "{" + "a" * 60 + "}", "limit": 1, "window": "1s"}])
    big = "x" * 5_000_000
    (key,) = limiter.keys({"ip": big})
    assert len(key.encode()) <= tg.MAX_KEY_LEN
    assert limiter.check({"ip": big}).allowed
    assert limiter.check({"ip": "\x00{}:\n" * 1000}).allowed
    assert limiter.check({big: "y"}).rule is None
    raises(tg.InvalidArgumentError, lambda: limiter.check({"ip": "x"}, call_id=big), "call_id")
    raises(tg.InvalidPolicyError, lambda: tg.Limiter([{**RULE, "name": big}]), "name")


def test_backend_down(prefix: str) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    limiter = tg.Limiter([RULE], url=url, timeout=2.0, on_backend_error="error", prefix=prefix)
    err = raises(tg.ThrottlegateError, lambda: limiter.check({"ip": "1.2.3.4"}))
    assert isinstance(err, (tg.BackendUnavailableError, tg.BackendTimeoutError)), err
    assert err.temporary is True
    allow = tg.Limiter([RULE], url=url, timeout=2.0, prefix=prefix)
    d = allow.check({"ip": "1.2.3.4"})
    assert d.allowed and d.degraded
    deny = tg.Limiter([RULE], url=url, timeout=2.0, on_backend_error="deny", prefix=prefix)
    d = deny.check({"ip": "1.2.3.4"})
    assert not d.allowed and d.degraded and d.retry_after == pytest.approx(1.0)
    assert deny.stats()["degraded_denied"] == 1
    # Building never connects: a limiter can be made while Redis is down.
    raises(tg.ThrottlegateError, limiter.ping)


def test_backend_answers_with_an_error(redis_server: RedisServer, prefix: str) -> None:
    limiter = tg.Limiter([RULE], url=redis_server.url, prefix=prefix, on_backend_error="error", timeout=5.0)
    (key,) = limiter.keys({"ip": "1.2.3.4"})
    assert redis_server.command("SET", key, "not a log") == b"+OK\r\n"
    err = raises(tg.BackendError, lambda: limiter.check({"ip": "1.2.3.4"}))
    assert err.temporary is False


def test_random_junk_never_escapes_the_hierarchy() -> None:
    """Whatever comes in, the only exceptions are ThrottlegateError (never PanicException)."""
    rng = random.Random(1234)
    junk: list[object] = [None, 0, -1, 2**64, 1.5, float("nan"), "", "x" * 10_000, "\udcff", b"\xff", [], {}, [1, 2],
                          {"ip": None}, {"": ""}, {"ip": "\x00"}, object(), pathlib.Path("/dev/null"), True]
    for _ in range(20):
        junk.append("".join(rng.choice(string.printable) for _ in range(rng.randint(0, 40))))
    limiter = tg.Limiter([RULE])
    calls = [
        lambda a: limiter.check(a),
        lambda a: limiter.check({"ip": "1"}, a),
        lambda a: limiter.check({"ip": "1"}, call_id=a),
        lambda a: limiter.peek(a),
        lambda a: limiter.reset(a),
        lambda a: limiter.keys({"ip": a}),
        lambda a: tg.Limiter(a),
        lambda a: tg.Limiter([{**RULE, "window": a}]),
        lambda a: tg.Limiter([RULE], url=a),
        lambda a: tg.Policy.from_str(a),
        lambda a: tg.ClientIp().client_ip(a, a, a),
        lambda a: tg.ManualClock(a),
    ]
    for call in calls:
        for value in junk:
            try:
                call(value)
            except tg.ThrottlegateError:
                pass
            except BaseException as e:  # noqa: BLE001 - the point is to see anything else
                pytest.fail(f"{type(e).__name__} escaped for {value!r}: {e}")


def test_a_panic_becomes_internal_error() -> None:
    import asyncio

    from throttlegate import _native

    err = raises(tg.InternalError, lambda: _native._panic_for_tests("boom"), "boom")
    assert "bug in throttlegate" in str(err)

    async def main() -> None:
        with pytest.raises(tg.InternalError, match="async boom"):
            await _native._panic_async_for_tests("async boom")
        assert await _native._panic_async_for_tests("") is None

    asyncio.run(main())
