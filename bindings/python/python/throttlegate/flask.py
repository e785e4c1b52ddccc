"""Flask integration: check requests, answer 429, add the rate-limit headers.

>>> from flask import Flask
>>> import throttlegate
>>> from throttlegate.flask import Throttle
>>> app = Flask(__name__)
>>> limiter = throttlegate.Limiter([{"name": "per-ip", "key": "ip:{ip}", "limit": 100, "window": "1m"}])
>>> throttle = Throttle(app, limiter=limiter)

By default every request is checked with the attributes ``ip`` (the client
address per :class:`throttlegate.ClientIp`: the socket peer, forwarded headers
only through trusted proxies), ``method`` and ``path``. Pass ``attributes`` to
choose others, ``every_request=False`` to check only the views decorated with
:meth:`Throttle.limit`, and :meth:`Throttle.exempt` to skip a view.

The extension is :mod:`throttlegate.wsgi` with Flask's routing: the same
attributes from the WSGI environ, the same 429 answer, and the decision in
``environ["throttlegate.decision"]`` (and ``g``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Callable, Optional, TypeVar, Union

from flask import Flask, Request, Response, current_app, g, request

from throttlegate import wsgi
from throttlegate._http import denial
from throttlegate._native import ClientIp, Decision, Limiter

__all__ = ["Throttle", "default_attributes"]

F = TypeVar("F", bound=Callable[..., Any])
AttributesFn = Callable[[Request], Mapping[str, Union[str, int, None]]]
CostFn = Callable[[Request], int]

_DECISION = "_throttlegate_decision"


def default_attributes(req: Request, client_ip: ClientIp) -> dict[str, Optional[str]]:
    """``ip``, ``method`` and ``path`` of a request (``ip`` is None when the
    peer is not an IP address, so rules keyed on it do not apply): those of
    :func:`throttlegate.wsgi.default_attributes` for its environ."""
    return wsgi.default_attributes(req.environ, client_ip)


class Throttle:
    """A Flask extension that rate-limits requests with a :class:`Limiter`."""

    def __init__(
        self,
        app: Optional[Flask] = None,
        *,
        limiter: Limiter,
        attributes: Optional[AttributesFn] = None,
        client_ip: Optional[ClientIp] = None,
        cost: Union[int, CostFn] = 1,
        legacy_headers: bool = False,
        every_request: bool = True,
    ) -> None:
        self.limiter = limiter
        self.client_ip = client_ip if client_ip is not None else ClientIp()
        self.attributes = attributes
        self.cost = cost
        self.legacy_headers = legacy_headers
        self.every_request = every_request
        self._exempt: set[str] = set()
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Register the request hooks on ``app``."""
        app.extensions["throttlegate"] = self
        if self.every_request:
            app.before_request(self._before_request)
        app.after_request(self._after_request)

    def exempt(self, view: F) -> F:
        """Never check requests to this view."""
        self._exempt.add(f"{view.__module__}.{view.__qualname__}")
        return view

    def limit(
        self,
        view: Optional[F] = None,
        *,
        attributes: Optional[AttributesFn] = None,
        cost: Union[int, CostFn, None] = None,
    ) -> Any:
        """Decorate a view to check its requests (with its own attributes or cost)."""

        def wrap(fn: F) -> F:
            @functools.wraps(fn)
            def inner(*args: Any, **kwargs: Any) -> Any:
                denied = self._check(attributes, cost)
                if denied is not None:
                    return denied
                return fn(*args, **kwargs)

            return inner  # type: ignore[return-value]

        return wrap(view) if view is not None else wrap

    def denied_response(self, decision: Decision) -> Response:
        """The 429 answer: problem+json body naming the rules, with the headers."""
        body, headers = denial(decision, self.legacy_headers)
        return Response(body, status=429, headers=headers)

    def _check(self, attributes: Optional[AttributesFn], cost: Union[int, CostFn, None]) -> Optional[Response]:
        pick = attributes or self.attributes
        attrs = pick(request) if pick is not None else default_attributes(request, self.client_ip)
        how_much = self.cost if cost is None else cost
        units = how_much(request) if callable(how_much) else how_much
        decision = self.limiter.check(attrs, units)
        setattr(g, _DECISION, decision)
        request.environ[wsgi.DECISION_KEY] = decision
        if not decision.allowed:
            return self.denied_response(decision)
        return None

    def _before_request(self) -> Optional[Response]:
        view = current_app.view_functions.get(request.endpoint or "")
        if view is not None and f"{view.__module__}.{view.__qualname__}" in self._exempt:
            return None
        return self._check(None, None)

    def _after_request(self, response: Response) -> Response:
        decision: Optional[Decision] = getattr(g, _DECISION, None)
        if decision is not None and decision.allowed:
            for name, value in decision.headers_with(legacy=self.legacy_headers).items():
                response.headers.setdefault(name, value)
        return response
