"""Flask integration: check requests, answer 429, add the rate-limit headers.

>>> from flask import Flask
>>> import throttlegate
>>> from throttlegate.flask import Throttle
>>> app = Flask(__name__)
>>> limiter = throttlegate.Limiter([{"name": "per-ip", "key": "ip:{ip}", "limit": 100, "window": "1m"}])
>>> throttle = Throttle(app, limiter=limiter)

By default every request is checked once, with the request model: ``ip``
(the client address per :class:`throttlegate.ClientIp`: the socket peer,
forwarded headers only through trusted proxies), ``method``, ``route``
(Flask's matched ``url_rule``, blueprint prefix included: ``/users/<int:id>``
is the route ``/users/{id}``), ``path``, ``host`` and the policy's
``[attributes]`` headers. ``attributes`` replaces the model,
``every_request=False`` checks only the views decorated with
:meth:`Throttle.limit`, and :meth:`Throttle.exempt` skips a view.

A limit written on a route::

    @app.post("/login")
    @throttle.limit("5/minute", key="{ip}")
    def login(): ...

is compiled into the limiter's policy (a rule matching the route's template
and methods) before the first request is checked, so it is checked in the
same single round trip as the file's rules; a decorated view is checked once
whatever ``every_request`` is. ``@throttle.limit(attributes=..., cost=...)``
adds attributes (to the model) and a cost to the view's check.

A denial is a 429 with the rate-limit headers and the core's problem+json
body, the bytes of every integration (or ``on_denied(request, decision)``'s
response); ``on_error(request, exception)`` answers a check that raised. The
decision is in ``g`` and ``request.environ["throttlegate.decision"]``.

A decision holding concurrency slots (a rule with ``algorithm =
"concurrency"``) releases them when the response is finished: ``init_app``
wraps ``app.wsgi_app``, which releases when the server closes the response
(after the last chunk of a streamed response too, and when the client
disconnects mid-stream) or when the request raises. Rate rules alone need
no release.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, Union

from flask import Flask, Request, Response, current_app, g, request

from throttlegate import wsgi
from throttlegate._http import HttpOptions, Lease, RouteLimit, denial, merged
from throttlegate._native import ClientIp, Decision, Limiter

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from throttlegate._http import HttpOptionArgs

__all__ = ["Throttle", "default_attributes"]

F = TypeVar("F", bound=Callable[..., Any])
AttributesFn = Callable[[Request], Mapping[str, Union[str, int, None]]]
CostFn = Callable[[Request], int]

_DECISION = "_throttlegate_decision"
_CHECKED = "_throttlegate_checked"
# Set on a decorated view: its _ViewLimit.
_MARK = "_throttlegate_limit"
# The environ key of the lease a request's check holds (released by _ReleasingApp).
_LEASE = "throttlegate.flask.lease"


class _ViewLimit:
    def __init__(self, limit: Optional[RouteLimit], attributes: Optional[AttributesFn], cost: Union[int, CostFn, None]) -> None:
        self.limit = limit
        self.attributes = attributes
        self.cost = cost


def default_attributes(req: Request, limiter: Limiter, client_ip: Optional[ClientIp] = None) -> dict[str, str]:
    """The request model of a request (see :func:`throttlegate.wsgi.default_attributes`),
    its route Flask's matched ``url_rule``."""
    return wsgi.default_attributes(req.environ, limiter, client_ip, _rule(req))


def _rule(req: Request) -> Optional[str]:
    """Flask's matched rule; for a method Flask refuses only for its case
    (``post``), the rule it would match once upper-cased."""
    if req.url_rule is not None:
        return req.url_rule.rule
    if req.method == req.method.upper():
        return None
    try:
        adapter = current_app.create_url_adapter(req)
        if adapter is None:
            return None
        rule, _ = adapter.match(method=req.method.upper(), return_rule=True)
    except Exception:
        return None
    return str(rule.rule)


class Throttle:
    """A Flask extension that rate-limits requests with a :class:`Limiter`
    (options: :class:`throttlegate._http.HttpOptions`; its functions receive
    the Flask ``Request``)."""

    def __init__(
        self,
        app: Optional[Flask] = None,
        *,
        limiter: Limiter,
        every_request: bool = True,
        **options: Unpack[HttpOptionArgs[Request]],
    ) -> None:
        self.options: HttpOptions[Request] = HttpOptions(limiter, **options)
        self.limiter = limiter
        self.every_request = every_request
        self._exempt: set[str] = set()
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Register the request hooks on ``app``."""
        app.extensions["throttlegate"] = self
        app.before_request(self._before_request)
        app.after_request(self._after_request)
        app.wsgi_app = _ReleasingApp(app.wsgi_app)  # type: ignore[method-assign]

    def exempt(self, view: F) -> F:
        """Never check requests to this view."""
        self._exempt.add(f"{view.__module__}.{view.__qualname__}")
        return view

    def limit(
        self,
        rate: Union[F, str, None] = None,
        *,
        key: Optional[str] = None,
        name: Optional[str] = None,
        methods: Optional[Sequence[str]] = None,
        attributes: Optional[AttributesFn] = None,
        cost: Union[int, CostFn, None] = None,
    ) -> Any:
        """Decorate a view (below ``@app.route``) with its own limit:
        ``rate`` in the core's grammar (``"5/minute"``, ``"100 per hour"``,
        ``"10/30s"``), keyed on ``key`` (default ``"{ip}"``), named ``name``,
        for ``methods`` (default: the route's); and/or extra ``attributes``
        (added to the model) and a ``cost``. The view is checked once."""
        view = rate if callable(rate) else None
        spec = _ViewLimit(RouteLimit(rate, key=key, name=name, methods=methods) if isinstance(rate, str) else None,
                          attributes, cost)

        def wrap(fn: F) -> F:
            @functools.wraps(fn)
            def inner(*args: Any, **kwargs: Any) -> Any:
                if not getattr(g, _CHECKED, False):
                    denied = self._check(spec)
                    if denied is not None:
                        return denied
                return fn(*args, **kwargs)

            setattr(inner, _MARK, spec)
            return inner  # type: ignore[return-value]

        return wrap(view) if view is not None else wrap

    def denied_response(self, decision: Decision) -> Response:
        """The 429 answer: problem+json body naming the rules, with the headers."""
        body, headers = denial(decision, self.options.legacy_headers)
        return Response(body, status=429, headers=headers)

    def _compile_routes(self) -> None:
        app = current_app
        for rule in app.url_map.iter_rules():
            spec = getattr(app.view_functions.get(rule.endpoint), _MARK, None)
            if spec is not None and spec.limit is not None:
                spec.limit.compile(self.limiter, rule.rule, rule.methods or ())

    def _view(self) -> Any:
        return current_app.view_functions.get(request.endpoint or "")

    def _check(self, spec: Optional[_ViewLimit]) -> Optional[Any]:
        options = self.options
        options.start(True, self._compile_routes)
        try:
            attrs = options.attributes_of(request, lambda: default_attributes(request, self.limiter, options.client_ip))
            units = options.cost_of(request)
            if spec is not None:
                if spec.attributes is not None:
                    attrs = merged(attrs, spec.attributes(request))
                if spec.cost is not None:
                    units = spec.cost(request) if callable(spec.cost) else spec.cost
            decision = self.limiter.check(attrs, units)
        except Exception as e:
            if options.on_error is None:
                raise
            return options.on_error(request, e)
        setattr(g, _DECISION, decision)
        setattr(g, _CHECKED, True)
        request.environ[wsgi.DECISION_KEY] = decision
        lease = Lease.of(self.limiter, decision)
        if lease is not None:
            request.environ[_LEASE] = lease
        if not decision.allowed:
            if options.on_denied is not None:
                return options.on_denied(request, decision)
            return self.denied_response(decision)
        return None

    def _before_request(self) -> Optional[Any]:
        view = self._view()
        spec = getattr(view, _MARK, None)
        if not self.every_request:
            # Only decorated views are checked (by their decorator); the
            # route limits are compiled before the first request all the same.
            self.options.start(True, self._compile_routes)
            return None
        if view is not None and f"{view.__module__}.{view.__qualname__}" in self._exempt:
            return None
        return self._check(spec)

    def _after_request(self, response: Response) -> Response:
        decision: Optional[Decision] = getattr(g, _DECISION, None)
        if decision is not None and decision.allowed:
            for name, value in decision.headers_with(legacy=self.options.legacy_headers).items():
                response.headers.setdefault(name, value)
        return response


class _ReleasingApp:
    """``app.wsgi_app`` wrapped: the lease a request's check took (in the
    environ) is released when the response is finished: when the server
    closes it, or at once when the request raises. Responses holding no
    lease are returned as they are."""

    def __init__(self, wsgi_app: wsgi.WSGIApp) -> None:
        self.wsgi_app = wsgi_app

    def __call__(self, environ: wsgi.Environ, start_response: wsgi.StartResponse) -> Any:
        try:
            body = self.wsgi_app(environ, start_response)
        except BaseException:
            _release(environ)
            raise
        if _LEASE not in environ:
            return body
        return wsgi.ReleasedOnClose(body, lambda: _release(environ))


def _release(environ: wsgi.Environ) -> None:
    lease: Optional[Lease] = environ.pop(_LEASE, None)
    if lease is not None:
        lease.release()
