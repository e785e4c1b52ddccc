"""Generic WSGI middleware: any WSGI application (Falcon's ``falcon.App``,
Django's WSGI handler, Bottle, Pyramid, a bare callable).

>>> import throttlegate
>>> from throttlegate.wsgi import RateLimitMiddleware
>>> limiter = throttlegate.Limiter([{"name": "per-ip", "key": "ip:{ip}", "limit": 100, "window": "1m"}])
>>> def app(environ, start_response): ...
>>> app = RateLimitMiddleware(app, limiter=limiter)

Every request is checked with :meth:`throttlegate.Limiter.check`. The
default attributes are ``ip`` (``REMOTE_ADDR`` and the forwarded headers per
:class:`throttlegate.ClientIp`: forwarded headers count only through trusted
proxies), ``method`` and ``path`` (``PATH_INFO``); ``attributes`` (a function
of the environ) chooses others, and a request given no attribute that a rule
names is admitted without a round trip. A denial is a 429 with the
rate-limit headers and the core's ``application/problem+json`` body; admitted
responses get the headers too (headers the application set itself win).
The decision is in ``environ["throttlegate.decision"]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import Any, Callable, Optional, Union

from throttlegate._http import AttributeMap, HttpOptions, denial, merge_headers, request_attributes
from throttlegate._native import ClientIp, Decision, Limiter

__all__ = ["DECISION_KEY", "RateLimitMiddleware", "WSGIApp", "default_attributes", "path_info"]

#: The environ key of a request's decision.
DECISION_KEY = "throttlegate.decision"

Environ = dict[str, Any]
_ExcInfo = tuple[type[BaseException], BaseException, Optional[TracebackType]]
#: The WSGI ``start_response`` callable.
StartResponse = Callable[..., Callable[[bytes], object]]
#: A WSGI application.
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]

AttributesFn = Callable[[Environ], AttributeMap]
CostFn = Callable[[Environ], int]


def path_info(environ: Environ) -> str:
    """``PATH_INFO`` as text (WSGI carries it as bytes decoded as latin-1)."""
    raw: str = environ.get("PATH_INFO", "")
    try:
        return raw.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return raw


def default_attributes(environ: Environ, client_ip: ClientIp) -> dict[str, Optional[str]]:
    """``ip``, ``method`` and ``path`` of a request (``ip`` is None when the
    peer is not an IP address, so rules keyed on it do not apply). Servers
    join repeated headers with commas, as the core reads them."""
    return request_attributes(
        client_ip,
        environ.get("REMOTE_ADDR"),
        environ.get("HTTP_FORWARDED"),
        environ.get("HTTP_X_FORWARDED_FOR"),
        environ.get("REQUEST_METHOD", "GET"),
        path_info(environ),
    )


def denied_response(decision: Decision, start_response: StartResponse, legacy: bool) -> list[bytes]:
    """Start the 429 answer to a denied decision and return its body."""
    body, headers = denial(decision, legacy)
    start_response("429 Too Many Requests", headers)
    return [body]


class RateLimitMiddleware:
    """WSGI middleware checking every request with a :class:`Limiter`."""

    def __init__(
        self,
        app: WSGIApp,
        *,
        limiter: Limiter,
        attributes: Optional[AttributesFn] = None,
        client_ip: Optional[ClientIp] = None,
        cost: Union[int, CostFn] = 1,
        legacy_headers: bool = False,
    ) -> None:
        self.app = app
        self.options: HttpOptions[Environ] = HttpOptions(limiter, attributes, client_ip, cost, legacy_headers)

    def decide(self, environ: Environ) -> Decision:
        """Check one request; the decision is also stored in the environ."""
        attrs = self.options.attributes_of(environ, lambda client_ip: default_attributes(environ, client_ip))
        decision = self.options.limiter.check(attrs, self.options.cost_of(environ))
        environ[DECISION_KEY] = decision
        return decision

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        decision = self.decide(environ)
        if not decision.allowed:
            return denied_response(decision, start_response, self.options.legacy_headers)
        extra = decision.headers_with(legacy=self.options.legacy_headers)
        if not extra:
            return self.app(environ, start_response)

        def start_with_headers(
            status: str, headers: list[tuple[str, str]], exc_info: Optional[_ExcInfo] = None
        ) -> Callable[[bytes], object]:
            merged = merge_headers(list(headers), extra)
            return start_response(status, merged, exc_info) if exc_info is not None else start_response(status, merged)

        return self.app(environ, start_with_headers)
