"""Generic ASGI middleware: any ASGI application (Starlette, Litestar, Falcon's
``falcon.asgi.App``, Django's ASGI handler, a bare callable), without
blocking the event loop.

>>> import throttlegate
>>> from throttlegate.asgi import RateLimitMiddleware
>>> limiter = throttlegate.Limiter([{"name": "per-ip", "key": "ip:{ip}", "limit": 100, "window": "1m"}])
>>> async def app(scope, receive, send): ...
>>> app = RateLimitMiddleware(app, limiter=limiter)

Every HTTP request is checked with :meth:`throttlegate.Limiter.check_async`.
The default attributes are ``ip`` (the client address per
:class:`throttlegate.ClientIp`: the socket peer, forwarded headers only
through trusted proxies), ``method`` and ``path``; ``attributes`` (a function
of the ASGI scope, plain or ``async``) chooses others, and a request given no
attribute that a rule names is admitted without a round trip. A denial is a
429 with the rate-limit headers and the core's ``application/problem+json``
body; admitted responses get the headers too (headers the application set
itself win). The decision is in ``scope["state"]["ratelimit"]``
(Starlette's and Litestar's ``request.state.ratelimit``). Lifespan and
websocket scopes pass through unchecked.

Run behind a server that leaves the peer address alone: uvicorn rewrites
the client address from ``X-Forwarded-For`` by default (``--proxy-headers``,
trusting 127.0.0.1); start it with ``--no-proxy-headers`` (or
``proxy_headers=False``) and list the proxies in ``ClientIp`` instead.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, MutableMapping
from typing import Any, Callable, Optional, Union

from throttlegate._http import AttributeMap, HttpOptions, denial, merge_headers, request_attributes
from throttlegate._native import ClientIp, Decision, Limiter

__all__ = ["ASGIApp", "RateLimitMiddleware", "default_attributes"]

#: An ASGI connection scope.
Scope = MutableMapping[str, Any]
#: An ASGI event.
Message = MutableMapping[str, Any]
#: The ASGI ``receive`` callable.
Receive = Callable[[], Awaitable[Message]]
#: The ASGI ``send`` callable.
Send = Callable[[Message], Awaitable[None]]
#: An ASGI 3 application.
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

AttributesFn = Callable[[Scope], Union[AttributeMap, Awaitable[AttributeMap]]]
CostFn = Callable[[Scope], int]


def _header(raw: Iterable[tuple[bytes, bytes]], name: bytes) -> Optional[str]:
    values = [v.decode("latin-1") for k, v in raw if k.lower() == name]
    return ",".join(values) if values else None


def default_attributes(scope: Scope, client_ip: ClientIp) -> dict[str, Optional[str]]:
    """``ip``, ``method`` and ``path`` of an HTTP scope (``ip`` is None when
    the peer is not an IP address, so rules keyed on it do not apply)."""
    client = scope.get("client")
    raw = scope.get("headers") or []
    return request_attributes(
        client_ip,
        client[0] if client else None,
        _header(raw, b"forwarded"),
        _header(raw, b"x-forwarded-for"),
        scope.get("method", "GET"),
        scope.get("path", ""),
    )


def _encoded(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]


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
        self.options: HttpOptions[Any] = HttpOptions(limiter, attributes, client_ip, cost, legacy_headers)

    def user_request(self, scope: Scope) -> Any:
        """What the ``attributes`` and ``cost`` functions receive: the scope."""
        return scope

    async def request_attributes(self, scope: Scope) -> AttributeMap:
        """The attributes a request is checked with (``attributes``, else
        :func:`default_attributes`)."""
        return await self.options.attributes_of_async(
            self.user_request(scope), lambda client_ip: default_attributes(scope, client_ip)
        )

    def request_cost(self, scope: Scope) -> int:
        """The units a request costs."""
        return self.options.cost_of(self.user_request(scope))

    async def decide(self, scope: Scope) -> Decision:
        """Check one request; the decision is also stored in the scope's state."""
        decision = await self.options.limiter.check_async(await self.request_attributes(scope), self.request_cost(scope))
        state = scope.setdefault("state", {})
        if isinstance(state, MutableMapping):
            state["ratelimit"] = decision
        return decision

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        decision = await self.decide(scope)
        if not decision.allowed:
            body, headers = denial(decision, self.options.legacy_headers)
            await send({"type": "http.response.start", "status": 429, "headers": _encoded(headers)})
            await send({"type": "http.response.body", "body": body})
            return
        extra = decision.headers_with(legacy=self.options.legacy_headers)
        if not extra:
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = [(bytes(k).decode("latin-1"), bytes(v).decode("latin-1")) for k, v in message.get("headers", [])]
                added = merge_headers(present, extra)[len(present):]
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + _encoded(added)
            await send(message)

        await self.app(scope, receive, send_with_headers)
