"""FastAPI / Starlette integration, without blocking the event loop.

:class:`RateLimitMiddleware` checks every HTTP request (a plain ASGI
middleware); :class:`RateLimit` is a dependency for chosen routes::

    app = FastAPI()
    app.add_middleware(RateLimitMiddleware, limiter=limiter)

    per_key = RateLimit(limiter, attributes=lambda r: {"api_key": r.headers.get("x-api-key")})

    @app.get("/items", dependencies=[Depends(per_key)])
    async def items(): ...

Both call :meth:`throttlegate.Limiter.check_async`. The default attributes
are ``ip`` (the client address per :class:`throttlegate.ClientIp`), ``method``
and ``path``. A denial is a 429 with the rate-limit headers and (middleware)
an ``application/problem+json`` body or (dependency) an ``HTTPException``
whose detail is that problem object; allowed responses get the headers too
(a route's own ``RateLimit`` headers win over the middleware's).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Mapping
from typing import Any, Callable, Optional, Union

from fastapi import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from throttlegate._native import ClientIp, Decision, Limiter

__all__ = ["RateLimit", "RateLimitMiddleware", "default_attributes"]

AttributeMap = Mapping[str, Union[str, int, None]]
AttributesFn = Callable[[Request], Union[AttributeMap, Awaitable[AttributeMap]]]
CostFn = Callable[[Request], int]


def _joined(req: Request, name: str) -> Optional[str]:
    values = req.headers.getlist(name)
    return ",".join(values) if values else None


def default_attributes(req: Request, client_ip: ClientIp) -> dict[str, Optional[str]]:
    """``ip``, ``method`` and ``path`` of a request (``ip`` is None when the
    peer is not an IP address, so rules keyed on it do not apply)."""
    ip = None
    if req.client is not None and req.client.host:
        ip = client_ip.client_ip(req.client.host, _joined(req, "forwarded"), _joined(req, "x-forwarded-for"))
    return {"ip": ip, "method": req.method, "path": req.url.path}


class _Checker:
    def __init__(
        self,
        limiter: Limiter,
        attributes: Optional[AttributesFn],
        client_ip: Optional[ClientIp],
        cost: Union[int, CostFn],
        legacy_headers: bool,
    ) -> None:
        self.limiter = limiter
        self.attributes = attributes
        self.client_ip = client_ip if client_ip is not None else ClientIp()
        self.cost = cost
        self.legacy_headers = legacy_headers

    async def decide(self, req: Request) -> Decision:
        if self.attributes is None:
            attrs: AttributeMap = default_attributes(req, self.client_ip)
        else:
            got = self.attributes(req)
            attrs = await got if inspect.isawaitable(got) else got
        units = self.cost(req) if callable(self.cost) else self.cost
        return await self.limiter.check_async(attrs, units)

    def headers(self, decision: Decision) -> dict[str, str]:
        return decision.headers_with(legacy=self.legacy_headers)


class RateLimitMiddleware:
    """ASGI middleware checking every HTTP request with a :class:`Limiter`."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limiter: Limiter,
        attributes: Optional[AttributesFn] = None,
        client_ip: Optional[ClientIp] = None,
        cost: Union[int, CostFn] = 1,
        legacy_headers: bool = False,
    ) -> None:
        self.app = app
        self.checker = _Checker(limiter, attributes, client_ip, cost, legacy_headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        decision = await self.checker.decide(Request(scope))
        headers = self.checker.headers(decision)
        if not decision.allowed:
            response = Response(
                decision.problem_json() or "", status_code=429, headers=headers, media_type="application/problem+json"
            )
            await response(scope, receive, send)
            return
        raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                # Headers already set by a route's own check (RateLimit) are
                # more specific than the middleware's: keep them.
                present = {bytes(k).lower() for k, _ in message.get("headers", [])}
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + [
                    (k, v) for k, v in raw if k.lower() not in present
                ]
            await send(message)

        await self.app(scope, receive, send_with_headers)


class RateLimit:
    """A FastAPI dependency: ``Depends(RateLimit(limiter, ...))``.

    Returns the :class:`Decision` when allowed (its headers are added to the
    response); raises ``HTTPException(429)`` with the headers otherwise.
    """

    def __init__(
        self,
        limiter: Limiter,
        *,
        attributes: Optional[AttributesFn] = None,
        client_ip: Optional[ClientIp] = None,
        cost: Union[int, CostFn] = 1,
        legacy_headers: bool = False,
    ) -> None:
        self.checker = _Checker(limiter, attributes, client_ip, cost, legacy_headers)

    async def __call__(self, request: Request, response: Response) -> Decision:
        decision = await self.checker.decide(request)
        headers = self.checker.headers(decision)
        if not decision.allowed:
            detail: Any = json.loads(decision.problem_json() or "{}")
            raise HTTPException(status_code=429, detail=detail, headers=headers)
        for name, value in headers.items():
            response.headers[name] = value
        return decision
