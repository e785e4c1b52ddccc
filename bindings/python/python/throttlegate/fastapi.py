"""FastAPI / Starlette integration, without blocking the event loop.

:class:`RateLimitMiddleware` checks every HTTP request once (the generic
:class:`throttlegate.asgi.RateLimitMiddleware`, whose functions here receive
a Starlette ``Request``), with the request model: ``ip``, ``method``,
``route`` (resolved with the app's routes before routing, ``Mount`` prefixes
included: ``/users/{id:int}`` is the route ``/users/{id}``), ``path``,
``host`` and the policy's ``[attributes]`` headers. :class:`RateLimit` is a
route's own limit, as a dependency::

    app = FastAPI()
    app.add_middleware(RateLimitMiddleware, limiter=limiter)

    @app.post("/login", dependencies=[Depends(RateLimit("5/minute"))])
    async def login(): ...

The middleware compiles each ``RateLimit("5/minute", key="{ip}")`` into
the limiter's policy at start-up (a rule matching the route's template and
methods), so it is checked in the same single round trip as the file's
rules, before the handler runs; ``RateLimit(attributes=..., cost=...)`` adds
attributes and a cost to that route's check. The dependency then returns the
middleware's :class:`Decision`; it checks by itself only without the
middleware (give it ``limiter=``) or with a limiter of its own. A denial,
middleware's or dependency's, is the same 429 with the rate-limit headers and
the ``application/problem+json`` body (or ``on_denied(request, decision)``'s
response); admitted responses get the headers too. The middleware's
decision is ``request.state.ratelimit``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Optional, Union

from starlette.requests import Request
from starlette.responses import Response

from throttlegate import asgi
from throttlegate._errors import InvalidArgumentError
from throttlegate._http import AttributeMap, HttpOptions, Lease, RateLimitExceeded, RouteLimit, denial, merged
from throttlegate._native import ClientIp, Decision, Limiter

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from throttlegate._http import HttpOptionArgs

__all__ = ["RateLimit", "RateLimitExceeded", "RateLimitMiddleware", "default_attributes", "rate_limit_exceeded"]


def default_attributes(req: Request, limiter: Limiter, client_ip: Optional[ClientIp] = None) -> dict[str, str]:
    """The request model of a request (see :func:`throttlegate.asgi.default_attributes`),
    its route resolved with the app's routes."""
    found = asgi.starlette_route(req.scope.get("app"), req.scope)
    return asgi.default_attributes(req.scope, limiter, client_ip, found[0] if found else None)


def _model_of(scope: asgi.Scope, options: HttpOptions[Any], route: Optional[str]) -> dict[str, str]:
    """The request model of a scope with ``options``' limiter and client address rules."""
    return asgi.default_attributes(scope, options.limiter, options.client_ip, route)


def rate_limit_exceeded(request: Request, exc: Exception) -> Response:
    """The exception handler answering a :class:`RateLimitExceeded`: the
    shared 429 (or the raiser's ``on_denied`` response). :class:`RateLimit`
    installs it on the app by itself when it checks without the middleware."""
    if not isinstance(exc, RateLimitExceeded):
        raise exc
    if exc.options.on_denied is not None:
        answer: Response = exc.options.on_denied(request, exc.decision)
        return answer
    body, headers = denial(exc.decision, exc.options.legacy_headers)
    return Response(body, status_code=429, headers=dict(headers))


def _route_limits(route: Any) -> list[RateLimit]:
    """The :class:`RateLimit` dependencies of a route, sub-dependencies included."""
    dependant = getattr(route, "dependant", None)
    found: list[RateLimit] = []
    stack = list(getattr(dependant, "dependencies", []))
    while stack:
        dep = stack.pop()
        if isinstance(dep.call, RateLimit) and dep.call not in found:
            found.append(dep.call)
        stack.extend(dep.dependencies)
    return found


def _walk(routes: Any, prefix: str = "") -> list[tuple[str, Any]]:
    from starlette.routing import Host, Mount

    out: list[tuple[str, Any]] = []
    for route in routes or []:
        if isinstance(route, (Mount, Host)):
            out += _walk(route.routes, prefix + (route.path if isinstance(route, Mount) else ""))
        else:
            out.append((prefix + str(getattr(route, "path", "")), route))
    return out


class RateLimitMiddleware(asgi.RateLimitMiddleware):
    """ASGI middleware checking every HTTP request with a :class:`Limiter`;
    ``attributes``, ``cost``, ``on_denied`` and ``on_error`` receive the
    Starlette ``Request`` (``on_denied`` and ``on_error`` return a
    ``Response``)."""

    def __init__(self, app: asgi.ASGIApp, *, limiter: Limiter, **options: Unpack[HttpOptionArgs[Request]]) -> None:
        super().__init__(app, limiter=limiter)
        # The options with functions of a Starlette Request (see user_request).
        self.options = HttpOptions(limiter, **options)
        self._mine: dict[int, list[RateLimit]] = {}

    def user_request(self, scope: asgi.Scope) -> Request:
        """What the option functions receive: ``Request(scope)``."""
        return Request(scope)

    def _limits(self, route: Any) -> list[RateLimit]:
        """A route's dependencies that this middleware checks for it (those
        without a limiter of their own, or with the middleware's)."""
        key = id(route)
        got = self._mine.get(key)
        if got is None:
            limiter = self.options.limiter
            got = [d for d in _route_limits(route) if d.limiter is None or d.limiter is limiter]
            self._mine[key] = got
        return got

    def compile_routes(self, scope: asgi.Scope) -> None:
        """Add every ``RateLimit("...")`` dependency of the app's routes to
        the policy, for its route's template and methods."""
        app = self.router(scope)
        for template, route in _walk(getattr(app, "routes", None)):
            for dep in self._limits(route):
                if dep.limit is not None:
                    dep.limit.compile(self.options.limiter, template, getattr(route, "methods", None) or ())

    async def route_parts(self, scope: asgi.Scope, matched: Any, attrs: AttributeMap, cost: int) -> tuple[AttributeMap, int]:
        """The matched route's ``RateLimit`` attributes and cost, in this check."""
        deps = self._limits(matched) if matched is not None else []
        if not deps:
            return attrs, cost
        if self.options.attributes is not None:
            # A route with a RateLimit is checked with the request model
            # too, whatever the middleware's own attributes function gives.
            route, _ = self.resolve(scope)
            attrs = merged(_model_of(scope, self.options, route), attrs)
        request = self.user_request(scope)
        for dep in deps:
            if dep.attributes is not None:
                attrs = merged(attrs, await dep.options.attributes_of_async(request, dict))
            if dep.cost is not None:
                cost = dep.options.cost_of(request)
        return attrs, cost


class RateLimit:
    """A route's limit, as a FastAPI dependency: ``Depends(RateLimit("5/minute"))``.

    ``rate`` (the core's grammar: ``"5/minute"``, ``"100 per hour"``,
    ``"10/30s"``), keyed on ``key`` (default ``"{ip}"``), named ``name``,
    for ``methods`` (default: the route's): compiled by the middleware into
    its policy at start-up. ``attributes`` and ``cost`` (functions of the
    request) add to the route's check. The other options are those of every
    integration (:class:`throttlegate._http.HttpOptions`); ``limiter`` is
    needed only without the middleware (or to check on another limiter).

    Gives the request's :class:`Decision` when allowed (a dependency with
    ``yield``: the concurrency slots of its own check are released when the
    response is sent, or the endpoint raised); a denial raises
    :class:`RateLimitExceeded`, answered by the middleware (or by the
    handler :func:`rate_limit_exceeded`, installed on the app when the
    dependency checks by itself) with the shared 429.

    The form ``RateLimit(limiter, attributes=..., cost=...)`` (a limiter
    first, no rate) still works.
    """

    def __init__(
        self,
        rate: Union[str, Limiter, None] = None,
        *,
        limiter: Optional[Limiter] = None,
        key: Optional[str] = None,
        name: Optional[str] = None,
        methods: Optional[Sequence[str]] = None,
        **options: Unpack[HttpOptionArgs[Request]],
    ) -> None:
        if isinstance(rate, Limiter):
            limiter, rate = rate, None
        self.limiter = limiter
        self.limit = RouteLimit(rate, key=key, name=name, methods=methods) if rate is not None else None
        self.attributes = options.get("attributes")
        self.cost = options.get("cost")
        self._compiled: set[str] = set()
        self.options: HttpOptions[Request] = HttpOptions(limiter, **options) if limiter is not None else _Unbound(options)

    async def __call__(self, request: Request, response: Response) -> AsyncIterator[Decision]:
        state = request.scope.get("state") or {}
        checked_by = state.get(asgi.CHECKED_BY)
        if checked_by is not None and (self.limiter is None or self.limiter is checked_by.limiter):
            # The middleware checked this request once, this route's limit
            # included (and releases its slots).
            decision: Decision = state["ratelimit"]
            yield decision
            return
        if self.limiter is None:
            raise InvalidArgumentError(
                "RateLimit: no limiter: add throttlegate.fastapi.RateLimitMiddleware to the app, or give limiter="
            )
        options = self.options
        scope = request.scope
        route = scope.get("route")
        template = None
        if route is not None:
            root = str(scope.get("root_path", ""))[len(str(scope.get("app_root_path", ""))):]
            template = root + str(getattr(route, "path", ""))
            if self.limit is not None and template not in self._compiled:
                self.limit.compile(options.limiter, template, getattr(route, "methods", None) or ())
                self._compiled.add(template)
        attrs = await options.attributes_of_async(
            request, lambda: asgi.default_attributes(scope, options.limiter, options.client_ip, template)
        )
        if self.attributes is not None:
            # The dependency's attributes add to the request model.
            attrs = merged(asgi.default_attributes(scope, options.limiter, options.client_ip, template), attrs)
        decision = await options.limiter.check_async(attrs, options.cost_of(request))
        if not decision.allowed:
            handlers = scope.get("starlette.exception_handlers")
            if handlers is not None and checked_by is None:
                # The app's live handlers: the denial is answered like the middleware's.
                handlers[0].setdefault(RateLimitExceeded, rate_limit_exceeded)
            raise RateLimitExceeded(decision, options)
        for name, value in decision.headers_with(legacy=options.legacy_headers).items():
            response.headers[name] = value
        lease = Lease.of(options.limiter, decision)
        if lease is None:
            yield decision
            return
        # A dependency with yield: FastAPI finishes it once the response is
        # sent, or when the endpoint raised or the client went away.
        try:
            yield decision
        finally:
            lease.release_soon()


class _Unbound(HttpOptions[Request]):
    """A dependency's options without a limiter (the middleware's is used):
    only its ``attributes`` and ``cost`` are read."""

    def __init__(self, options: Any) -> None:  # noqa: D107
        self.attributes = options.get("attributes")
        self.cost = options.get("cost", 1)
        self.legacy_headers = bool(options.get("legacy_headers", False))
        self.on_denied = options.get("on_denied")
        self.on_error = options.get("on_error")
        self.route = None
        self.client_ip = options.get("client_ip") or ClientIp()
