"""Generic ASGI middleware: any ASGI application (Starlette, Litestar, Falcon's
``falcon.asgi.App``, Django's ASGI handler, a bare callable), without
blocking the event loop.

>>> import throttlegate
>>> from throttlegate.asgi import RateLimitMiddleware
>>> limiter = throttlegate.Limiter([{"name": "per-ip", "key": "ip:{ip}", "limit": 100, "window": "1m"}])
>>> async def app(scope, receive, send): ...
>>> app = RateLimitMiddleware(app, limiter=limiter)

Every HTTP request is checked once with :meth:`throttlegate.Limiter.check_async`,
with the request model: ``ip`` (the client address per
:class:`throttlegate.ClientIp`: the socket peer, forwarded headers only
through trusted proxies), ``method``, ``route``, ``path``, ``host`` and the
headers the policy's ``[attributes]`` names. ``route`` is the template of
the route the app will dispatch to: resolved with the app's own routes when
it is a Starlette app (FastAPI included; ``Mount`` prefixes included), else
given by the ``route`` option (a function of the scope) and otherwise absent,
so rules matching a route do not apply (a warning says so at start-up).
``attributes`` (a function of the scope, plain or ``async``) replaces the
model. A request given no attribute that a rule names is admitted without a
round trip. A denial is a 429 with the rate-limit headers and the core's
``application/problem+json`` body (or ``on_denied(scope, decision)``'s ASGI
response); admitted responses get the headers too (headers the application
set itself win). The decision is in ``scope["state"]["ratelimit"]``
(Starlette's and Litestar's ``request.state.ratelimit``). Lifespan and
websocket scopes pass through unchecked. At start-up (the first scope,
lifespan included) one warning per rule needing an attribute the
integration never provides is logged to the ``throttlegate`` logger.

A decision holding concurrency slots (a rule with ``algorithm =
"concurrency"``) releases them when the response is finished: just before
its last body chunk is sent (so a client that has the whole response can
be admitted again at once), when the client disconnects
(``http.disconnect``), or when the application raises or returns without
finishing. Decisions of rate rules only need no release and cost no extra
round trip.

Run behind a server that leaves the peer address alone: uvicorn rewrites
the client address from ``X-Forwarded-For`` by default (``--proxy-headers``,
trusting 127.0.0.1); start it with ``--no-proxy-headers`` (or
``proxy_headers=False``) and list the proxies in ``ClientIp`` instead.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Iterable, MutableMapping
from typing import TYPE_CHECKING, Any, Callable, Optional

from throttlegate._http import (
    AttributeMap,
    HttpOptions,
    Lease,
    RateLimitExceeded,
    denial,
    merge_headers,
    model_attributes,
    peer_ip,
    raw_path,
)
from throttlegate._native import ClientIp, Decision, Limiter

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from throttlegate._http import HttpOptionArgs

__all__ = ["ASGIApp", "RateLimitMiddleware", "default_attributes", "is_starlette", "starlette_route"]

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

# Set in a scope's state by the middleware that checked it.
CHECKED_BY = "throttlegate"


def _header(raw: Iterable[tuple[bytes, bytes]], name: bytes) -> Optional[str]:
    values = [v.decode("latin-1") for k, v in raw if k.lower() == name]
    return ",".join(values) if values else None


@functools.lru_cache(maxsize=None)
def _starlette() -> Optional[tuple[Any, ...]]:
    # Imported on first use: this module needs no framework.
    try:
        from starlette.applications import Starlette
        from starlette.routing import Host, Match, Mount, Router
    except ImportError:
        return None
    return Starlette, Router, Host, Match, Mount


def is_starlette(app: Any) -> bool:
    """Whether ``app`` is a Starlette app or router (FastAPI included),
    whose routes :func:`starlette_route` can resolve."""
    found = _starlette()
    return found is not None and isinstance(app, (found[0], found[1]))


def starlette_route(app: Any, scope: Scope) -> Optional[tuple[str, Any]]:
    """The template (``Mount`` prefixes included) and the route object of
    the route a Starlette app (FastAPI included) will dispatch ``scope`` to,
    found with the routes' own ``matches`` as Starlette's router does; None
    when none matches or ``app`` is not a Starlette app or router."""
    if not is_starlette(app):
        return None
    _, _, Host, Match, Mount = _starlette()  # type: ignore[misc]

    def resolve(routes: Iterable[Any], scope: Scope, prefix: str) -> Optional[tuple[str, Any]]:
        partial = None
        for route in routes:
            match, child = route.matches(scope)
            if match is Match.NONE:
                continue
            if isinstance(route, (Mount, Host)):
                # Starlette dispatches to the first matching mount, whatever it holds.
                inner = {**scope, **child}
                return resolve(route.routes, inner, prefix + (route.path if isinstance(route, Mount) else ""))
            if match is Match.FULL:
                return prefix + str(getattr(route, "path", "")), route
            if partial is None:
                partial = route
        if partial is not None:
            return prefix + str(getattr(partial, "path", "")), partial
        return None

    return resolve(app.routes, scope, "")


def default_attributes(scope: Scope, limiter: Limiter, client_ip: Optional[ClientIp] = None,
                       route: Optional[str] = None) -> dict[str, str]:
    """The request model of an HTTP scope, made by the core: ``ip`` (absent
    when the peer is not an IP address), ``method``, ``route`` (the given
    template, absent when None), ``path`` (from ``raw_path``), ``host`` and
    the policy's ``[attributes]`` headers."""
    client = scope.get("client")
    raw = scope.get("headers") or []
    raw_bytes = scope.get("raw_path")
    path = raw_bytes.decode("latin-1") if isinstance(raw_bytes, (bytes, bytearray)) else raw_path(scope.get("path", ""))
    return model_attributes(
        limiter,
        ip=peer_ip(client_ip or ClientIp(), client[0] if client else None, _header(raw, b"forwarded"),
                   _header(raw, b"x-forwarded-for")),
        method=scope.get("method", "GET"),
        route=route,
        path=path,
        host=_header(raw, b"host"),
        header=lambda name: _header(raw, name.encode("latin-1")),
    )


def _encoded(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]


async def _answer(response: Any, scope: Scope, receive: Receive, send: Send) -> None:
    if inspect.isawaitable(response):
        response = await response
    await response(scope, receive, send)


class RateLimitMiddleware:
    """ASGI middleware checking every HTTP request with a :class:`Limiter`
    (options: :class:`throttlegate._http.HttpOptions`; its functions receive
    the scope)."""

    def __init__(self, app: ASGIApp, *, limiter: Limiter, **options: Unpack[HttpOptionArgs[Any]]) -> None:
        self.app = app
        self.options: HttpOptions[Any] = HttpOptions(limiter, **options)

    def user_request(self, scope: Scope) -> Any:
        """What the ``attributes``, ``cost``, ``route``, ``on_denied`` and
        ``on_error`` functions receive: the scope."""
        return scope

    def router(self, scope: Scope) -> Any:
        """The Starlette app whose routes resolve ``route``: the scope's
        ``app`` or the wrapped app, when either is one; else None."""
        for app in (scope.get("app"), self.app):
            if is_starlette(app):
                return app
        return None

    def resolve(self, scope: Scope) -> tuple[Optional[str], Any]:
        """The route template of a request (in the framework's syntax) and
        the matched route object (None for a ``route`` function's answer)."""
        if self.options.route is not None:
            return self.options.route(self.user_request(scope)), None
        app = self.router(scope)
        found = starlette_route(app, scope) if app is not None else None
        return found if found is not None else (None, None)

    def compile_routes(self, scope: Scope) -> None:
        """Add the route limits the app declares to the policy (at start-up;
        the FastAPI middleware compiles its ``RateLimit`` dependencies)."""

    def start(self, scope: Scope) -> None:
        """At the first scope: compile the route limits and log the lint warnings."""
        provides_route = self.options.route is not None or self.router(scope) is not None
        self.options.start(provides_route, lambda: self.compile_routes(scope))

    async def route_parts(self, scope: Scope, matched: Any, attrs: AttributeMap, cost: int) -> tuple[AttributeMap, int]:
        """The attributes and cost of a check once the matched route's own
        (a FastAPI ``RateLimit`` dependency's) are added; here unchanged."""
        return attrs, cost

    async def request_attributes(self, scope: Scope) -> AttributeMap:
        """The attributes a request is checked with (``attributes``, else
        the request model)."""
        route, _ = self.resolve(scope)
        return await self.options.attributes_of_async(
            self.user_request(scope), lambda: default_attributes(scope, self.options.limiter, self.options.client_ip, route)
        )

    def request_cost(self, scope: Scope) -> int:
        """The units a request costs."""
        return self.options.cost_of(self.user_request(scope))

    async def decide(self, scope: Scope) -> Decision:
        """Check one request; the decision is also stored in the scope's state."""
        self.start(scope)
        route, matched = self.resolve(scope)
        request = self.user_request(scope)
        attrs = await self.options.attributes_of_async(
            request, lambda: default_attributes(scope, self.options.limiter, self.options.client_ip, route)
        )
        attrs, cost = await self.route_parts(scope, matched, attrs, self.options.cost_of(request))
        decision = await self.options.limiter.check_async(attrs, cost)
        state = scope.setdefault("state", {})
        if isinstance(state, MutableMapping):
            state["ratelimit"] = decision
            state[CHECKED_BY] = self.options
        return decision

    async def denied(self, scope: Scope, receive: Receive, send: Send, decision: Decision,
                     options: Optional[HttpOptions[Any]] = None) -> None:
        """Answer a denial: ``on_denied``'s response, else the shared 429."""
        options = options or self.options
        if options.on_denied is not None:
            await _answer(options.on_denied(self.user_request(scope), decision), scope, receive, send)
            return
        body, headers = denial(decision, options.legacy_headers)
        await send({"type": "http.response.start", "status": 429, "headers": _encoded(headers)})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            self.start(scope)
            await self.app(scope, receive, send)
            return
        try:
            decision = await self.decide(scope)
        except Exception as e:
            if self.options.on_error is None:
                raise
            await _answer(self.options.on_error(self.user_request(scope), e), scope, receive, send)
            return
        if not decision.allowed:
            await self.denied(scope, receive, send, decision)
            return
        extra = decision.headers_with(legacy=self.options.legacy_headers)
        lease = Lease.of(self.options.limiter, decision)
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if extra:
                    present = [(bytes(k).decode("latin-1"), bytes(v).decode("latin-1")) for k, v in message.get("headers", [])]
                    added = merge_headers(present, extra)[len(present):]
                    message = dict(message)
                    message["headers"] = list(message.get("headers", [])) + _encoded(added)
            elif lease is not None and message["type"] == "http.response.body" and not message.get("more_body", False):
                # The last chunk: the slots are free before the client has it all.
                await lease.release_async()
            await send(message)

        async def receive_watching() -> Message:
            message = await receive()
            if lease is not None and message["type"] == "http.disconnect":
                await lease.release_async()
            return message

        try:
            await self.app(scope, receive if lease is None else receive_watching, send_with_headers)
        except RateLimitExceeded as e:
            # A route's own check (a dependency on another limiter) denied it.
            if started:
                raise
            await self.denied(scope, receive, send, e.decision, e.options)
        finally:
            if lease is not None:
                # An error, a cancelled task or an unfinished response: no
                # await here (a cancelled scope would cancel it too).
                lease.release_soon()
