"""What every HTTP integration shares, with no framework imported: its
options (:class:`HttpOptions`, one object every constructor uses), the
request model handed to the core (:func:`model_attributes`), route limits
(:class:`RouteLimit`), the start-up lint warnings and the 429 answer's
parts. The semantics (normalising the method, the route template, the path
and the host, reading the policy's ``[attributes]`` headers) are the core's:
an integration passes the framework's raw parts and its router's rules."""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable, Generic, Optional, TypeVar, Union
from urllib.parse import quote

from throttlegate._errors import InvalidArgumentTypeError
from throttlegate._native import REQUEST_MODEL, ClientIp, Decision, Limiter

if TYPE_CHECKING:
    from typing_extensions import TypedDict

#: Request attributes as the integrations pass them to a check.
AttributeMap = Mapping[str, Union[str, int, None]]

#: The media type of a denial's body.
PROBLEM_JSON = "application/problem+json"

#: The logger of the start-up lint warnings.
logger = logging.getLogger("throttlegate")

#: What an integration hands the user's functions: an ASGI scope, a WSGI
#: environ, a Starlette, Flask or Django request.
Req = TypeVar("Req")

#: The option names every integration takes besides ``limiter`` (Django's
#: ``THROTTLEGATE`` setting validates its keys against them).
OPTION_NAMES = ("attributes", "client_ip", "cost", "legacy_headers", "on_denied", "on_error", "route")

if TYPE_CHECKING:

    class HttpOptionArgs(TypedDict, Generic[Req], total=False):
        """The keyword options of every integration's constructor, typed
        for its request type ``Req`` (see :class:`HttpOptions`)."""

        attributes: Optional[Callable[[Req], Union[AttributeMap, Awaitable[AttributeMap]]]]
        client_ip: Optional[ClientIp]
        cost: Union[int, Callable[[Req], int]]
        legacy_headers: bool
        on_denied: Optional[Callable[[Req, Decision], Any]]
        on_error: Optional[Callable[[Req, Exception], Any]]
        route: Optional[Callable[[Req], Optional[str]]]


def peer_ip(client_ip: ClientIp, peer: Optional[str], forwarded: Optional[str], x_forwarded_for: Optional[str]) -> Optional[str]:
    """The client address per ``client_ip`` (the core's rules); None when
    the peer is not an IP address (a Unix socket), so rules keyed on ``ip``
    do not apply."""
    return client_ip.client_ip(peer, forwarded, x_forwarded_for) if peer else None


def raw_path(decoded: str) -> str:
    """A request path as sent, for a framework that keeps only its decoded
    form: percent-encoded again (the core decodes it once)."""
    return quote(decoded, safe="/:@!$&'()*+,;=-._~")


def model_attributes(
    limiter: Limiter,
    *,
    ip: Optional[str],
    method: str,
    route: Optional[str],
    path: str,
    host: Optional[str],
    header: Callable[[str], Optional[str]],
) -> dict[str, str]:
    """The request model (``ip``, ``method``, ``route``, ``path``, ``host``
    and the policy's ``[attributes]`` headers) as the core makes it from the
    framework's raw parts: ``route`` is the template of the route the
    framework dispatches to, in its own syntax (None when none matches),
    ``path`` the request target's path as received, ``header(name)`` the
    value of a request header (a lower-case name) or None."""
    headers = []
    for name in limiter.request_headers():
        value = header(name)
        if value is not None:
            headers.append((name, value))
    return limiter.request_attributes(ip=ip, method=method, route=route, path=path, host=host, headers=headers)


def denial(decision: Decision, legacy: bool) -> tuple[bytes, list[tuple[str, str]]]:
    """The body and headers of the 429 answer to a denied decision: the
    core's problem+json body, its content type and length, and the
    rate-limit headers. Every integration answers with these bytes."""
    body = (decision.problem_json() or "").encode()
    headers = [("Content-Type", PROBLEM_JSON), ("Content-Length", str(len(body)))]
    headers += list(decision.headers_with(legacy=legacy).items())
    return body, headers


def merge_headers(present: list[tuple[str, str]], extra: Mapping[str, str]) -> list[tuple[str, str]]:
    """``present`` plus those of ``extra`` not already set (a route's own
    rate-limit headers are more specific than a middleware's)."""
    names = {name.lower() for name, _ in present}
    return present + [(name, value) for name, value in extra.items() if name.lower() not in names]


class RouteLimit:
    """A limit written on a route (a decorator, a dependency): ``rate`` in
    the core's grammar (``"5/minute"``, ``"100 per hour"``, ``"10/30s"``,
    several joined by ``;``), keyed on ``key`` (a template, default
    ``"{ip}"``), named ``name`` (default: derived from the route), for the
    route's ``methods`` (default: those the framework routes to the view).
    The integration compiles it into the limiter's policy with
    :meth:`throttlegate.Limiter.add_route_limit` once it knows the route's
    template, so it is checked in the same single round trip as the file's
    rules. The rate is validated at once (:func:`throttlegate.parse_rate`)."""

    def __init__(self, rate: str, *, key: Optional[str] = None, name: Optional[str] = None,
                 methods: Optional[Sequence[str]] = None) -> None:
        from throttlegate._native import parse_rate

        parse_rate(rate)
        self.rate = rate
        self.key = key
        self.name = name
        self.methods = list(methods) if methods is not None else None

    def compile(self, limiter: Limiter, route: str, methods: Iterable[str] = ()) -> list[str]:
        """Add this limit for ``route`` (the framework's template, mount
        prefix included) to ``limiter``'s policy; returns the rule names.
        Adding it again is harmless (the core answers the same names)."""
        chosen = self.methods if self.methods is not None else sorted(set(methods) - {"HEAD", "OPTIONS"})
        return limiter.add_route_limit(self.rate, route, methods=chosen, key=self.key, name=self.name)


class HttpOptions(Generic[Req]):
    """The options every HTTP integration takes (Flask, FastAPI/Starlette,
    any ASGI app, Django, any WSGI app), resolved for one request. Units are
    seconds wherever there is a duration (the Limiter's ``timeout``).

    - ``limiter``: the :class:`throttlegate.Limiter` that decides.
    - ``attributes``: a function of the request (plain or, for the asyncio
      integrations and Django, ``async``) giving the attributes instead of
      the request model (``ip``, ``method``, ``route``, ``path``, ``host``
      and the policy's ``[attributes]`` headers); the start-up lint warnings
      are then skipped.
    - ``client_ip``: a :class:`throttlegate.ClientIp` (trusted proxies, IPv6
      grouping); default: the socket peer only.
    - ``cost``: a number or a function of the request (default 1).
    - ``legacy_headers``: add the ``X-RateLimit-*`` headers too.
    - ``on_denied``: a function of the request and the denied
      :class:`throttlegate.Decision` giving the framework's response (default:
      the 429 with the rate-limit headers and the problem+json body).
    - ``on_error``: a function of the request and the exception a check
      raised (with ``on_backend_error = "error"``) giving the framework's
      response (default: the exception propagates).
    - ``route``: for a generic ASGI or WSGI app (no router of its own): a
      function of the request giving its route template, or None.
    """

    def __init__(
        self,
        limiter: Limiter,
        *,
        attributes: Optional[Callable[[Req], Union[AttributeMap, Awaitable[AttributeMap]]]] = None,
        client_ip: Optional[ClientIp] = None,
        cost: Union[int, Callable[[Req], int]] = 1,
        legacy_headers: bool = False,
        on_denied: Optional[Callable[[Req, Decision], Any]] = None,
        on_error: Optional[Callable[[Req, Exception], Any]] = None,
        route: Optional[Callable[[Req], Optional[str]]] = None,
    ) -> None:
        if not isinstance(limiter, Limiter):
            raise InvalidArgumentTypeError(f"limiter: expected a throttlegate.Limiter, got {type(limiter).__name__}")
        for name, value in (("attributes", attributes), ("on_denied", on_denied), ("on_error", on_error), ("route", route)):
            if value is not None and not callable(value):
                raise InvalidArgumentTypeError(f"{name}: expected a function, got {type(value).__name__}")
        self.limiter = limiter
        self.attributes = attributes
        self.client_ip = client_ip if client_ip is not None else ClientIp()
        self.cost = cost
        self.legacy_headers = legacy_headers
        self.on_denied = on_denied
        self.on_error = on_error
        self.route = route
        self._started = False
        self._lock = threading.Lock()

    def start(self, provides_route: bool, compile_routes: Optional[Callable[[], None]] = None) -> None:
        """Once per integration, at start-up: compile the route limits the
        app declares (``compile_routes``), then log one warning per rule
        that needs an attribute the integration never provides (none when
        the user gives ``attributes``)."""
        if self._started:
            return
        with self._lock:
            if self._started:
                return
            if compile_routes is not None:
                compile_routes()
            if self.attributes is None:
                provided = [a for a in REQUEST_MODEL if a != "route" or provides_route]
                for message in self.limiter.attribute_warnings(provided):
                    logger.warning("throttlegate: %s", message)
            self._started = True

    def attributes_of(self, request: Req, model: Callable[[], AttributeMap]) -> AttributeMap:
        """``attributes(request)``, else the request model (synchronous
        integrations: an ``async`` function is refused)."""
        if self.attributes is None:
            return model()
        got = self.attributes(request)
        if inspect.isawaitable(got):
            if inspect.iscoroutine(got):
                got.close()
            raise InvalidArgumentTypeError("attributes: expected a function returning a mapping, got an async function")
        return got

    async def attributes_of_async(self, request: Req, model: Callable[[], AttributeMap]) -> AttributeMap:
        """``attributes(request)`` (awaited when ``async``), else the request model."""
        if self.attributes is None:
            return model()
        got = self.attributes(request)
        return await got if inspect.isawaitable(got) else got

    def cost_of(self, request: Req) -> int:
        """The units ``request`` costs: ``cost(request)`` or the number."""
        return self.cost(request) if callable(self.cost) else self.cost

    def route_of(self, request: Req) -> Optional[str]:
        """The ``route`` function's template for ``request`` (None without one)."""
        return self.route(request) if self.route is not None else None


def merged(base: AttributeMap, extra: Optional[AttributeMap]) -> AttributeMap:
    """``base`` with ``extra`` on top (a view's own attributes win)."""
    if not extra:
        return base
    out = dict(base)
    out.update(extra)
    return out


class RateLimitExceeded(Exception):
    """Raised by a route's check (a FastAPI dependency) when its request is
    denied; the middleware (or the handler the dependency installs) answers
    it with the same 429 as every other denial, or ``on_denied``'s response."""

    def __init__(self, decision: Decision, options: HttpOptions[Any]) -> None:
        super().__init__(f"rate limited by {decision.rule!r}; retry in {decision.retry_after:g} s")
        self.decision = decision
        self.options = options


class Lease:
    """The concurrency slots an admitted decision holds, given back once
    when the response is finished (sent in full, failed, or abandoned by
    the client): whichever of :meth:`release` and :meth:`release_async`
    comes first releases, the others do nothing. A release that fails (the
    backend is down) is logged at DEBUG: the slots come back when their
    lease ends (the outage itself is logged by the limiter)."""

    __slots__ = ("decision", "done", "limiter")

    def __init__(self, limiter: Limiter, decision: Decision) -> None:
        self.limiter = limiter
        self.decision = decision
        self.done = False

    @staticmethod
    def of(limiter: Limiter, decision: Decision) -> Optional[Lease]:
        """The lease of ``decision``; None when it holds no slot (a denial,
        or no concurrency rule applied): nothing to release, no round trip."""
        if decision.allowed and decision.lease_id is not None:
            return Lease(limiter, decision)
        return None

    def _first(self) -> bool:
        if self.done:
            return False
        self.done = True
        return True

    def release(self) -> None:
        """Release the slots now (blocking this thread for the round trip)."""
        if not self._first():
            return
        try:
            self.limiter.release(self.decision)
        except Exception as e:
            logger.debug("throttlegate: releasing %s failed: %s", self.decision.lease_id, e)

    async def release_async(self) -> None:
        """Release the slots, awaiting the round trip."""
        if not self._first():
            return
        try:
            await self.limiter.release_async(self.decision)
        except Exception as e:
            logger.debug("throttlegate: releasing %s failed: %s", self.decision.lease_id, e)

    def release_soon(self) -> None:
        """Start the release without waiting for it (where awaiting is not
        possible: a cancelled task's clean-up); it completes on the core's
        runtime whatever happens to the caller."""
        if not self._first():
            return
        try:
            fut = asyncio.ensure_future(self.limiter.release_async(self.decision))
        except Exception as e:
            logger.debug("throttlegate: releasing %s failed: %s", self.decision.lease_id, e)
            return
        fut.add_done_callback(_forget_outcome)


def _forget_outcome(fut: Any) -> None:
    """Retrieve a background release's outcome (no 'never retrieved' warning)."""
    if not fut.cancelled() and fut.exception() is not None:
        logger.debug("throttlegate: a release failed: %s", fut.exception())
