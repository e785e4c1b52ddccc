"""Typed use of the public API, checked by mypy --strict against the shipped
stubs (test_typing.py); it is also run, so the types describe real behaviour."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Callable, Optional

import throttlegate
from throttlegate import Decision, Limiter, ManualClock, Policy, RuleResult
from throttlegate.asgi import RateLimitMiddleware as AsgiRateLimit
from throttlegate.wsgi import DECISION_KEY
from throttlegate.wsgi import RateLimitMiddleware as WsgiRateLimit

policy: Policy = Policy([{"name": "per-ip", "key": "ip:{ip}", "limit": 3, "window": "1s"}])
clock = ManualClock(1_000_000)
limiter: Limiter = Limiter(policy, None, timeout=0.5, on_backend_error="deny", prefix="typed:", clock=clock)
decision: Decision = limiter.check({"ip": "203.0.113.7", "unused": None, "n": 3}, 1, call_id="c-1")
allowed: bool = decision.allowed
wait: float = decision.retry_after + decision.reset_after
wait_ms: int = decision.retry_after_ms + decision.reset_after_ms
rule: Optional[str] = decision.rule
results: list[RuleResult] = decision.results
headers: dict[str, str] = decision.headers_with(legacy=True)
body: Optional[str] = decision.problem_json()
settled: int = limiter.settle(decision, 0) + limiter.settle_call({"ip": "203.0.113.7"}, "c-1", 1, 1)
lease: Optional[str] = decision.lease_id
released: int = limiter.release(decision) + limiter.release_call({"ip": "203.0.113.7"}, "c-1")
extended: int = limiter.extend(decision, 30) + limiter.extend(decision, "30s") + limiter.extend_call({"ip": "x"}, "c-1", 1.5)
acquired: Decision = limiter.acquire({"ip": "203.0.113.7"}, 1, timeout="10ms", call_id="c-2")
deleted: int = limiter.reset({"ip": "203.0.113.7"})
keys: list[str] = limiter.keys({"ip": "203.0.113.7"})
stats: dict[str, int] = limiter.stats()
client: Optional[str] = throttlegate.ClientIp(["10.0.0.0/8"], 64).client_ip("10.0.0.1", None, "192.0.2.1")
clock.advance(ms=5)
clock.set_us(clock.now_us + 1)


async def main() -> Decision:
    async with Limiter([{"name": "a", "key": "{k}", "limit": 1, "window": 1000}]) as inner:
        await inner.ping_async()
        peeked: Decision = await inner.peek_async({"k": "v"})
        assert peeked.allowed
        waited: Decision = await inner.acquire_async({"k": "v"}, timeout=0.01, call_id="c-3")
        assert await inner.settle_async(waited, 0) == 1
        assert await inner.settle_call_async({"k": "v"}, "c-3", 1, 1) == 0
        assert await inner.release_async(waited) == 0 and await inner.release_call_async({"k": "v"}, "c-3") == 0
        assert await inner.extend_async(waited, 1) == 0 and await inner.extend_call_async({"k": "v"}, "c-3", "1s") == 0
        return await inner.check_async({"k": "v"}, 1)


with limiter:
    final: Decision = asyncio.run(main())
    assert final.allowed and decision.allowed and deleted == 1 and client == "192.0.2.1"
    assert settled == 1 and acquired.allowed
    assert lease is None and released == 0 and extended == 0



async def asgi_app(scope: Any, receive: Any, send: Any) -> None:
    decision: Decision = scope["state"]["ratelimit"]
    assert decision.allowed


def wsgi_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    decision: Decision = environ[DECISION_KEY]
    start_response("200 OK", [])
    return [str(decision.remaining).encode()]


web_limiter = Limiter(policy)
wrapped_asgi = AsgiRateLimit(asgi_app, limiter=web_limiter, client_ip=throttlegate.ClientIp(["10.0.0.1"]),
                             attributes=lambda scope: {"ip": scope["client"][0]}, cost=lambda scope: 1)
wrapped_wsgi = WsgiRateLimit(wsgi_app, limiter=web_limiter, legacy_headers=True, cost=2)
body_parts: list[bytes] = list(wrapped_wsgi({"REMOTE_ADDR": "203.0.113.9", "PATH_INFO": "/"}, lambda status, headers: lambda b: None))
assert body_parts == [b"1"], body_parts

# The request model and route limits, as the web integrations use them.
model: dict[str, str] = web_limiter.request_attributes(method="post", path="/%6Cogin?x=1", ip="203.0.113.9",
                                                       route="/login", host="API.example.com:8080",
                                                       headers=[("X-Api-Key", "k_1")])
assert model == {"ip": "203.0.113.9", "method": "POST", "route": "/login", "path": "/login",
                 "host": "api.example.com"}, model
route_rules: list[str] = web_limiter.add_route_limit("5/minute", "/users/<int:id>", methods=["POST"], key="{ip}")
warnings: list[str] = web_limiter.attribute_warnings(list(throttlegate.REQUEST_MODEL))
header_names: list[str] = web_limiter.request_headers()
rates: list[tuple[int, float]] = throttlegate.parse_rate("10/30s; 100 per hour")
assert route_rules == ["route.POST.users.id"] and warnings == [] and header_names == [], (route_rules, warnings)
assert rates == [(10, 30.0), (100, 3600.0)], rates
wrapped_routed = WsgiRateLimit(wsgi_app, limiter=web_limiter, route=lambda environ: "/users/<int:id>",
                               on_denied=lambda environ, decision: wsgi_app,
                               on_error=lambda environ, error: wsgi_app)

try:
    Limiter({"rules": []})
except throttlegate.InvalidPolicyError as e:
    kind: str = e.kind
    code: int = e.code
    temporary: bool = e.temporary
