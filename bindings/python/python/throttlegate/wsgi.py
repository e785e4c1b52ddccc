"""Generic WSGI middleware: any WSGI application (Falcon's ``falcon.App``,
Django's WSGI handler, Bottle, Pyramid, a bare callable).

>>> import throttlegate
>>> from throttlegate.wsgi import RateLimitMiddleware
>>> limiter = throttlegate.Limiter([{"name": "per-ip", "key": "ip:{ip}", "limit": 100, "window": "1m"}])
>>> def app(environ, start_response): ...
>>> app = RateLimitMiddleware(app, limiter=limiter)

Every request is checked once with :meth:`throttlegate.Limiter.check`, with
the request model: ``ip`` (``REMOTE_ADDR`` and the forwarded headers per
:class:`throttlegate.ClientIp`: forwarded headers count only through trusted
proxies), ``method``, ``path`` (the request target as sent: ``RAW_URI`` or
``REQUEST_URI`` when the server gives one), ``host``, the policy's
``[attributes]`` headers, and ``route`` only when the ``route`` option (a
function of the environ giving the template the app will dispatch to) is
given: a generic WSGI app has no router to ask, so rules matching a route do
not apply without it (a warning says so when the middleware is made).
``attributes`` (a function of the environ) replaces the model, and a request
given no attribute that a rule names is admitted without a round trip. A
denial is a 429 with the rate-limit headers and the core's
``application/problem+json`` body (or ``on_denied(environ, decision)``'s WSGI
response); admitted responses get the headers too (headers the application
set itself win). The decision is in ``environ["throttlegate.decision"]``.

A decision holding concurrency slots (a rule with ``algorithm =
"concurrency"``) releases them when the response is finished: when the
server closes the response iterable (after the last chunk, on an error, or
when the client went away mid-stream), or at once when the application
raises. Decisions of rate rules only need no release and cost no extra
round trip.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Optional

from throttlegate._http import HttpOptions, Lease, denial, merge_headers, model_attributes, peer_ip, raw_path
from throttlegate._native import ClientIp, Decision, Limiter

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from throttlegate._http import HttpOptionArgs

__all__ = ["DECISION_KEY", "RateLimitMiddleware", "WSGIApp", "default_attributes", "ReleasedOnClose", "path_info", "released_on_close"]

#: The environ key of a request's decision.
DECISION_KEY = "throttlegate.decision"

Environ = dict[str, Any]
_ExcInfo = tuple[type[BaseException], BaseException, Optional[TracebackType]]
#: The WSGI ``start_response`` callable.
StartResponse = Callable[..., Callable[[bytes], object]]
#: A WSGI application.
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]


def path_info(environ: Environ) -> str:
    """``PATH_INFO`` as text (WSGI carries it as bytes decoded as latin-1)."""
    raw: str = environ.get("PATH_INFO", "")
    try:
        return raw.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return raw


def request_target(environ: Environ) -> str:
    """The request target's path as the client sent it: the server's
    ``RAW_URI`` / ``REQUEST_URI``, else ``SCRIPT_NAME`` + ``PATH_INFO``
    percent-encoded again."""
    for name in ("RAW_URI", "REQUEST_URI"):
        raw = environ.get(name)
        if raw:
            return str(raw)
    return raw_path(environ.get("SCRIPT_NAME", "") + path_info(environ))


def default_attributes(environ: Environ, limiter: Limiter, client_ip: Optional[ClientIp] = None,
                       route: Optional[str] = None) -> dict[str, str]:
    """The request model of a request, made by the core: ``ip`` (absent when
    the peer is not an IP address), ``method``, ``route`` (the given
    template, absent when None), ``path``, ``host`` and the policy's
    ``[attributes]`` headers. Servers join repeated headers with commas, as
    the core reads them."""
    return model_attributes(
        limiter,
        ip=peer_ip(client_ip or ClientIp(), environ.get("REMOTE_ADDR"), environ.get("HTTP_FORWARDED"),
                   environ.get("HTTP_X_FORWARDED_FOR")),
        method=environ.get("REQUEST_METHOD", "GET"),
        route=route,
        path=request_target(environ),
        host=environ.get("HTTP_HOST"),
        header=lambda name: environ.get("HTTP_" + name.upper().replace("-", "_")),
    )


def denied_response(decision: Decision, start_response: StartResponse, legacy: bool) -> list[bytes]:
    """Start the 429 answer to a denied decision and return its body."""
    body, headers = denial(decision, legacy)
    start_response("429 Too Many Requests", headers)
    return [body]


class ReleasedOnClose:
    """A response iterable that releases a lease when it is exhausted or
    closed (PEP 3333: the server calls ``close()`` however the response
    ended), after closing the application's own iterable."""

    def __init__(self, inner: Iterable[bytes], release: Callable[[], None]) -> None:
        self.inner = inner
        self.release = release

    def __iter__(self) -> Iterator[bytes]:
        yield from self.inner
        self.release()

    def close(self) -> None:
        try:
            close = getattr(self.inner, "close", None)
            if close is not None:
                close()
        finally:
            self.release()


def released_on_close(app: WSGIApp, environ: Environ, start_response: StartResponse,
                      release: Callable[[], None]) -> Iterable[bytes]:
    """Call ``app`` and call ``release`` once its response is finished: when
    its iterable is exhausted or closed, or at once when ``app`` raises."""
    try:
        body = app(environ, start_response)
    except BaseException:
        release()
        raise
    return ReleasedOnClose(body, release)


class RateLimitMiddleware:
    """WSGI middleware checking every request with a :class:`Limiter`
    (options: :class:`throttlegate._http.HttpOptions`; its functions receive
    the environ, ``on_denied`` and ``on_error`` return a WSGI app)."""

    def __init__(self, app: WSGIApp, *, limiter: Limiter, **options: Unpack[HttpOptionArgs[Environ]]) -> None:
        self.app = app
        self.options: HttpOptions[Environ] = HttpOptions(limiter, **options)
        self.options.start(self.options.route is not None)

    def decide(self, environ: Environ) -> Decision:
        """Check one request; the decision is also stored in the environ."""
        options = self.options
        attrs = options.attributes_of(
            environ, lambda: default_attributes(environ, options.limiter, options.client_ip, options.route_of(environ))
        )
        decision = options.limiter.check(attrs, options.cost_of(environ))
        environ[DECISION_KEY] = decision
        return decision

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        try:
            decision = self.decide(environ)
        except Exception as e:
            if self.options.on_error is None:
                raise
            answer: WSGIApp = self.options.on_error(environ, e)
            return answer(environ, start_response)
        if not decision.allowed:
            if self.options.on_denied is not None:
                denied: WSGIApp = self.options.on_denied(environ, decision)
                return denied(environ, start_response)
            return denied_response(decision, start_response, self.options.legacy_headers)
        extra = decision.headers_with(legacy=self.options.legacy_headers)
        lease = Lease.of(self.options.limiter, decision)
        app = self.app if lease is None else functools.partial(released_on_close, self.app, release=lease.release)
        if not extra:
            return app(environ, start_response)

        def start_with_headers(
            status: str, headers: list[tuple[str, str]], exc_info: Optional[_ExcInfo] = None
        ) -> Callable[[bytes], object]:
            merged = merge_headers(list(headers), extra)
            return start_response(status, merged, exc_info) if exc_info is not None else start_response(status, merged)

        return app(environ, start_with_headers)
