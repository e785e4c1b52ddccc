"""FastAPI / Starlette integration, without blocking the event loop.

:class:`RateLimitMiddleware` checks every HTTP request (the generic
:class:`throttlegate.asgi.RateLimitMiddleware`, whose ``attributes`` and
``cost`` functions here receive a Starlette ``Request``); :class:`RateLimit`
is a dependency for chosen routes::

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
(a route's own ``RateLimit`` headers win over the middleware's). The
middleware's decision is ``request.state.ratelimit``.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable
from typing import Any, Callable, Optional, Union

from fastapi import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from throttlegate import asgi
from throttlegate._http import AttributeMap
from throttlegate._native import ClientIp, Decision, Limiter

__all__ = ["RateLimit", "RateLimitMiddleware", "default_attributes"]

AttributesFn = Callable[[Request], Union[AttributeMap, Awaitable[AttributeMap]]]
CostFn = Callable[[Request], int]


def default_attributes(req: Request, client_ip: ClientIp) -> dict[str, Optional[str]]:
    """``ip``, ``method`` and ``path`` of a request (``ip`` is None when the
    peer is not an IP address, so rules keyed on it do not apply): those of
    :func:`throttlegate.asgi.default_attributes` for its scope."""
    return asgi.default_attributes(req.scope, client_ip)


class RateLimitMiddleware(asgi.RateLimitMiddleware):
    """ASGI middleware checking every HTTP request with a :class:`Limiter`;
    ``attributes`` and ``cost`` receive the Starlette ``Request``."""

    def __init__(
        self,
        app: asgi.ASGIApp,
        *,
        limiter: Limiter,
        attributes: Optional[AttributesFn] = None,
        client_ip: Optional[ClientIp] = None,
        cost: Union[int, CostFn] = 1,
        legacy_headers: bool = False,
    ) -> None:
        super().__init__(app, limiter=limiter, client_ip=client_ip, legacy_headers=legacy_headers)
        self.request_attributes_fn = attributes
        self.request_cost_fn = cost

    async def request_attributes(self, scope: asgi.Scope) -> AttributeMap:
        """The attributes of the request: ``attributes(Request(scope))`` or the defaults."""
        if self.request_attributes_fn is None:
            return asgi.default_attributes(scope, self.client_ip)
        got = self.request_attributes_fn(Request(scope))
        return await got if inspect.isawaitable(got) else got

    def request_cost(self, scope: asgi.Scope) -> int:
        """The units the request costs: ``cost(Request(scope))`` or the number."""
        how_much = self.request_cost_fn
        return how_much(Request(scope)) if callable(how_much) else how_much


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
        self.limiter = limiter
        self.attributes = attributes
        self.client_ip = client_ip if client_ip is not None else ClientIp()
        self.cost = cost
        self.legacy_headers = legacy_headers

    async def __call__(self, request: Request, response: Response) -> Decision:
        if self.attributes is None:
            attrs: AttributeMap = default_attributes(request, self.client_ip)
        else:
            got = self.attributes(request)
            attrs = await got if inspect.isawaitable(got) else got
        units = self.cost(request) if callable(self.cost) else self.cost
        decision = await self.limiter.check_async(attrs, units)
        headers = decision.headers_with(legacy=self.legacy_headers)
        if not decision.allowed:
            detail: Any = json.loads(decision.problem_json() or "{}")
            raise HTTPException(status_code=429, detail=detail, headers=headers)
        for name, value in headers.items():
            response.headers[name] = value
        return decision
