"""The Python surface: constructors, decision fields, headers, policy sources."""

from __future__ import annotations

import asyncio
import json
import math
import pathlib

import pytest

import throttlegate
from throttlegate import Decision, Limiter, ManualClock, Policy

WINDOW_RULE = {"name": "per-ip", "key": "ip:{ip}", "limit": 3, "window": "10s"}
BUCKET_RULE = {"name": "per-key", "key": "key:{api_key}", "algorithm": "token_bucket", "capacity": 2, "refill_rate": 0.5}
START_US = 1_700_000_000_000_000


def make(url: str | None, prefix: str, rules: list[dict] | None = None, **kw: object) -> tuple[Limiter, ManualClock]:
    clock = ManualClock(START_US)
    return Limiter(rules or [WINDOW_RULE, BUCKET_RULE], url=url, prefix=prefix, clock=clock, **kw), clock


def test_version_matches_the_package() -> None:
    assert throttlegate.__version__ == "0.1.0"
    assert throttlegate.DEFAULT_PREFIX == "throttlegate:"
    assert throttlegate.MAX_KEY_LEN == 128


def test_check_fields_and_types(backend_url: str | None, prefix: str) -> None:
    limiter, clock = make(backend_url, prefix)
    assert limiter.backend == ("memory" if backend_url is None else "redis")
    d = limiter.check({"ip": "203.0.113.7", "api_key": "k_1"}, cost=1)
    assert isinstance(d, Decision)
    assert d.allowed is True and d.degraded is False
    # Most restrictive when allowed: fewest remaining (the bucket: 1 of 2 left).
    assert (d.rule, d.limit, d.remaining) == ("per-key", 2, 1)
    assert isinstance(d.retry_after, float) and d.retry_after == 0.0
    assert isinstance(d.reset_after, float) and d.reset_after == pytest.approx(2.0)
    assert d.reset_after_ms == 2000 and d.retry_after_ms == 0
    assert [r.rule for r in d.results] == ["per-ip", "per-key"]
    r = d.results[0]
    assert (r.allowed, r.shadow, r.limit, r.remaining) == (True, False, 3, 2)
    assert r.reset_after == pytest.approx(10.0) and r.window == pytest.approx(10.0)
    assert r.retry_after == 0.0 and r.reset_after_ms == 10000 and r.retry_after_ms == 0
    assert d.results[1].window == pytest.approx(4.0)
    assert "per-key" in repr(d) and "per-ip" in repr(r)


def test_denial_headers_and_problem_json(backend_url: str | None, prefix: str) -> None:
    limiter, clock = make(backend_url, prefix)
    attrs = {"ip": "198.51.100.1"}
    for _ in range(3):
        assert limiter.check(attrs).allowed
    clock.advance(ms=2500)
    d = limiter.check(attrs)
    assert not d.allowed and d.rule == "per-ip"
    assert d.retry_after == pytest.approx(7.5)
    assert d.retry_after_ms == 7500
    assert list(d.headers.items()) == [
        ("RateLimit-Limit", "3"),
        ("RateLimit-Remaining", "0"),
        ("RateLimit-Reset", "8"),
        ("RateLimit-Policy", '"per-ip";q=3;w=10'),
        ("RateLimit", '"per-ip";r=0;t=8'),
        ("Retry-After", "8"),
    ]
    legacy = d.headers_with(legacy=True)
    assert legacy["X-RateLimit-Limit"] == "3" and legacy["X-RateLimit-Reset"] == "8"
    assert "X-RateLimit-Limit" not in d.headers
    problem = json.loads(d.problem_json())
    assert problem["status"] == 429 and problem["violated_rules"] == ["per-ip"] and problem["retry_after"] == 8


def test_peek_reset_keys_stats(backend_url: str | None, prefix: str) -> None:
    limiter, _ = make(backend_url, prefix)
    attrs = {"ip": "192.0.2.1", "api_key": "secret"}
    # A peek answers what a check would: one of the bucket's two tokens left.
    assert limiter.peek(attrs).remaining == 1
    assert limiter.peek(attrs).remaining == 1, "peek consumes nothing"
    limiter.check(attrs, 2)
    assert not limiter.peek(attrs).allowed
    keys = limiter.keys(attrs)
    assert keys == [f"{prefix}per-ip:ip:192.0.2.1", f"{prefix}per-key:key:secret"]
    assert limiter.reset(attrs) == 2
    assert limiter.reset(attrs) == 0
    assert limiter.peek(attrs).remaining == 1
    stats = limiter.stats()
    assert stats["calls"] == 5 and stats["allowed"] == 4 and stats["denied"] == 1
    assert set(stats) == {
        "calls", "allowed", "denied", "degraded_allowed", "degraded_denied", "backend_errors", "timeouts",
        "settled", "refunded", "debited",
    }
    limiter.ping()


def test_no_rule_applies() -> None:
    limiter = Limiter([WINDOW_RULE])
    d = limiter.check({"user": "u1"})
    assert d.allowed and d.rule is None and d.limit == 0 and d.results == [] and d.headers == {}


def test_attribute_values_none_and_int() -> None:
    limiter = Limiter([{"name": "u", "key": "user:{user}", "limit": 1, "window": "1m"}])
    assert limiter.keys({"user": 42}) == ["throttlegate:u:user:42"]
    assert limiter.keys({"user": None}) == []
    assert limiter.check({"user": None}).rule is None


def test_call_id_makes_retries_idempotent(backend_url: str | None, prefix: str) -> None:
    limiter, _ = make(backend_url, prefix, [WINDOW_RULE])
    attrs = {"ip": "192.0.2.9"}
    assert limiter.check(attrs, call_id="req-1").remaining == 2
    assert limiter.check(attrs, call_id="req-1").remaining == 2
    assert limiter.check(attrs).remaining == 1


def test_async_variants(backend_url: str | None, prefix: str) -> None:
    limiter, _ = make(backend_url, prefix, [WINDOW_RULE])

    async def main() -> None:
        attrs = {"ip": "192.0.2.2"}
        d = await limiter.check_async(attrs, 2, call_id="a-1")
        assert isinstance(d, Decision) and d.remaining == 1
        assert (await limiter.peek_async(attrs)).remaining == 0
        assert await limiter.ping_async() is None
        assert await limiter.reset_async(attrs) == 1
        with pytest.raises(throttlegate.InvalidArgumentError):
            await limiter.check_async(attrs, 4)

    asyncio.run(main())


def test_policy_sources(tmp_path: pathlib.Path) -> None:
    toml = tmp_path / "rules.toml"
    toml.write_text('prefix = "p:"\ntimeout = "250ms"\non_backend_error = "deny"\n'
                    '[[rules]]\nname = "per-ip"\nkey = "ip:{ip}"\nlimit = 3\nwindow = "10s"\n')
    js = tmp_path / "rules.json"
    js.write_text(json.dumps({"prefix": "p:", "timeout": 250, "on_backend_error": "deny", "rules": [WINDOW_RULE]}))
    from_toml = Policy.from_file(toml)
    assert from_toml == Policy.from_file(str(js))
    assert from_toml == Policy.from_str(toml.read_text())
    assert from_toml == Policy({"prefix": "p:", "timeout": "250ms", "on_backend_error": "deny", "rules": [WINDOW_RULE]})
    assert (from_toml.prefix, from_toml.timeout, from_toml.on_backend_error) == ("p:", 0.25, "deny")
    assert from_toml.rule_names == ["per-ip"] and len(from_toml) == 1
    assert Policy.from_str(json.dumps(from_toml.to_dict())) == from_toml
    assert Policy([WINDOW_RULE]) != from_toml
    for source in (from_toml, toml, str(toml), js, {"rules": [WINDOW_RULE]}, [WINDOW_RULE]):
        limiter = Limiter(source)
        assert limiter.policy.rule_names == ["per-ip"]
        assert limiter.backend == "memory"
    overridden = Limiter(toml, prefix="q:", timeout=0.5, on_backend_error="error")
    assert (overridden.policy.prefix, overridden.policy.timeout, overridden.policy.on_backend_error) == ("q:", 0.5, "error")


def test_clock_options() -> None:
    clock = ManualClock(5_000_000)
    assert clock.now_us == 5_000_000
    clock.advance(ms=2)
    clock.advance(us=3)
    clock.advance(1)
    assert clock.now_us == 5_003_003
    clock.set_us(10)
    assert clock.now_us == 10
    assert ManualClock().now_us == 0
    for c in ("system", "backend", clock, None):
        assert Limiter([WINDOW_RULE], clock=c).check({"ip": "1.1.1.1"}).allowed


def test_manual_clock_drives_the_window() -> None:
    clock = ManualClock(START_US)
    limiter = Limiter([{"name": "w", "key": "{k}", "limit": 1, "window": "1s"}], clock=clock)
    assert limiter.check({"k": "a"}).allowed
    assert not limiter.check({"k": "a"}).allowed
    clock.advance(ms=1000)
    assert limiter.check({"k": "a"}).allowed


def test_key_secret_hides_values() -> None:
    for secret in ("s3cret", b"s3cret"):
        limiter = Limiter([{"name": "k", "key": "key:{api_key}", "limit": 1, "window": "1m"}], key_secret=secret)
        (key,) = limiter.keys({"api_key": "k_live_123"})
        assert "k_live_123" not in key


def test_close_and_context_managers() -> None:
    with Limiter([WINDOW_RULE]) as limiter:
        assert not limiter.closed
        assert limiter.check({"ip": "1.2.3.4"}).allowed
    assert limiter.closed
    limiter.close()
    assert limiter.backend == "closed"
    for call in (lambda: limiter.check({"ip": "1.2.3.4"}), lambda: limiter.peek({}), lambda: limiter.reset({}),
                 limiter.ping):
        with pytest.raises(throttlegate.ClosedError, match="^the limiter is closed$"):
            call()
    # As in every language: the counters, keys and policy still answer.
    assert limiter.stats()["calls"] == 1 and limiter.stats()["allowed"] == 1
    assert limiter.keys({"ip": "1.2.3.4"}) == ["throttlegate:per-ip:ip:1.2.3.4"]
    assert "closed=True" in repr(limiter)

    async def main() -> Limiter:
        async with Limiter([WINDOW_RULE]) as inner:
            assert (await inner.check_async({"ip": "1.2.3.4"})).allowed
        with pytest.raises(throttlegate.ClosedError):
            await inner.check_async({"ip": "1.2.3.4"})
        return inner

    assert asyncio.run(main()).closed


def test_client_ip() -> None:
    default = throttlegate.ClientIp()
    assert default.client_ip("203.0.113.7:5555", None, "1.1.1.1") == "203.0.113.7"
    assert default.client_ip("2001:db8:1:2:3:4:5:6") == "2001:db8:1:2::/64"
    assert default.client_ip("::ffff:192.0.2.1") == "192.0.2.1"
    assert default.client_ip("/run/app.sock") is None
    trusted = throttlegate.ClientIp(trusted_proxies=["10.0.0.0/8"], ipv6_prefix=48)
    assert trusted.client_ip("10.0.0.1", x_forwarded_for="6.6.6.6, 198.51.100.9, 10.0.0.2") == "198.51.100.9"
    assert trusted.client_ip("10.0.0.1", forwarded='for="[2001:db8:cafe::17]:4711"') == "2001:db8:cafe::/48"
    assert trusted.client_ip("198.51.100.1", x_forwarded_for="1.2.3.4") == "198.51.100.1"


def test_times_round_trip_through_microseconds(backend_url: str | None, prefix: str) -> None:
    limiter, clock = make(backend_url, prefix, [{"name": "w", "key": "{k}", "limit": 1, "window": 1001}])
    limiter.check({"k": "x"})
    clock.advance(us=1)
    d = limiter.check({"k": "x"})
    assert round(d.retry_after * 1e6) == 1_000_999
    assert d.retry_after_ms == math.ceil(round(d.retry_after * 1e6) / 1000)


def test_any_mapping_is_accepted() -> None:
    import collections
    import types

    limiter = Limiter([WINDOW_RULE])
    for attrs in (types.MappingProxyType({"ip": "192.0.2.5"}), collections.OrderedDict(ip="192.0.2.5")):
        assert limiter.keys(attrs) == ["throttlegate:per-ip:ip:192.0.2.5"]


def test_the_extension_is_an_abi3_module() -> None:
    from throttlegate import _native

    assert _native.__file__ is not None and _native.__file__.endswith(".abi3.so")


def _evalsha_calls(server) -> int:
    info = server.command("INFO", "commandstats").decode()
    for line in info.splitlines():
        if line.startswith("cmdstat_evalsha:calls="):
            return int(line.split("=", 1)[1].split(",", 1)[0])
    return 0


def test_deny_cache_answers_denials_without_redis(redis_server, prefix: str) -> None:
    rule = {"name": "per-ip", "key": "ip:{ip}", "limit": 1, "window": "1s"}
    cached, clock = make(redis_server.url, prefix, [rule], deny_cache=True)
    a = {"ip": "203.0.113.9"}
    assert cached.check(a).allowed
    first = cached.check(a)
    assert not first.allowed and first.retry_after_ms == 1000
    calls = _evalsha_calls(redis_server)
    clock.advance(ms=300)
    d = cached.check(a)
    assert not d.allowed and d.retry_after_ms == 700 and d.headers["Retry-After"] == "1"

    async def awaited() -> Decision:
        return await cached.check_async(a)

    assert not asyncio.run(awaited()).allowed
    assert _evalsha_calls(redis_server) == calls  # answered in process
    clock.advance(ms=700)
    assert cached.check(a).allowed  # the wait is over: Redis again


def test_deny_cache_takes_a_bool() -> None:
    with pytest.raises(throttlegate.InvalidArgumentTypeError, match="deny_cache"):
        Limiter([WINDOW_RULE], deny_cache="yes")  # type: ignore[arg-type]
    assert Limiter([WINDOW_RULE], deny_cache=True).check({"ip": "1.2.3.4"}).allowed
