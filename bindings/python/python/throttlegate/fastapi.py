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

import json
from collections.abc import Awaitable
from typing import Any, Callable, Optional, Union

from fastapi import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from throttlegate import asgi
from throttlegate._http import AttributeMap, HttpOptions
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
        super().__init__(app, limiter=limiter)
        # The options with functions of a Starlette Request (see user_request).
        self.options = HttpOptions(limiter, attributes, client_ip, cost, legacy_headers)

    def user_request(self, scope: asgi.Scope) -> Request:
        """What the ``attributes`` and ``cost`` functions receive: ``Request(scope)``."""
        return Request(scope)


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
        self.options: HttpOptions[Request] = HttpOptions(limiter, attributes, client_ip, cost, legacy_headers)

    async def __call__(self, request: Request, response: Response) -> Decision:
        options = self.options
        attrs = await options.attributes_of_async(request, lambda client_ip: default_attributes(request, client_ip))
        decision = await options.limiter.check_async(attrs, options.cost_of(request))
        headers = decision.headers_with(legacy=options.legacy_headers)
        if not decision.allowed:
            detail: Any = json.loads(decision.problem_json() or "{}")
            raise HTTPException(status_code=429, detail=detail, headers=headers)
        for name, value in headers.items():
            response.headers[name] = value
        return decision
