"""Django integration: a middleware for sync and async views, and a decorator
for one view.

In ``settings.py``::

    MIDDLEWARE = [
        ...,
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "throttlegate.django.RateLimitMiddleware",
    ]
    THROTTLEGATE = {
        "policy": BASE_DIR / "rules.toml",   # a file path, or a policy dict
        "url": "redis://127.0.0.1:6379/0",   # omit for the embedded backend
        "trusted_proxies": ["10.0.0.0/8"],   # whose X-Forwarded-For is believed
    }

and for one view, its own limit and/or extra attributes (a user id)::

    from throttlegate.django import ratelimit, ratelimit_exempt

    @ratelimit("5/minute", key="{ip}", methods=["POST"])
    def login(request): ...

    @ratelimit(attributes=lambda request: {"user": str(request.user.pk)})
    def export(request): ...

``THROTTLEGATE`` takes ``policy`` (or ``limiter``, a ready
:class:`throttlegate.Limiter`), the Limiter's options (``url``, ``timeout``
in seconds, ``on_backend_error``, ``prefix``, ``clock``, ``key_secret``,
``tls_root_cert``, ``tls_client_cert``, ``deny_cache``), the client-address
rules (``trusted_proxies``, ``ipv6_prefix``, as :class:`throttlegate.ClientIp`,
or ``client_ip`` itself) and the options of every integration:
``attributes``, ``cost``, ``legacy_headers``, ``on_denied`` and ``on_error``
(functions, or their dotted paths). An unknown key is an
``ImproperlyConfigured`` error naming it.

Every request is checked once, with the request model: ``ip``
(``REMOTE_ADDR`` and the forwarded headers per the core's client-address
rules), ``method``, ``route`` (the matched URL pattern from Django's own
resolver, ``include()`` prefixes included: ``users/<int:id>`` is the route
``/users/{id}``), ``path``, ``host`` and the policy's ``[attributes]``
headers, plus those of its view's :func:`ratelimit` decorator (the
middleware resolves the URL to find it); :func:`ratelimit_exempt` views are
not checked. Each ``@ratelimit("...")`` is compiled into the policy when
the middleware is made, and one warning per rule needing an attribute the
integration never provides is logged then (``throttlegate`` logger). Under
ASGI the middleware runs async and awaits
:meth:`throttlegate.Limiter.check_async`, so a slow Redis never blocks the
event loop; under WSGI it calls :meth:`throttlegate.Limiter.check`. An
attributes function may be ``async`` (to ``await request.auser()``); a sync
one runs in the event loop, so it must not touch the database there.

A denial is a 429 with the rate-limit headers and the core's
``application/problem+json`` body; admitted responses get the headers too
(headers the view set itself win); ``on_denied(request, decision)`` gives
another response. The decision is ``request.ratelimit``. With
``on_backend_error = "error"`` a backend failure is raised (Django answers
500) unless ``on_error(request, exception)`` answers it. A decorated view works without
the middleware too: the decorator then checks the request itself.

A decision holding concurrency slots (a rule with ``algorithm =
"concurrency"``) releases them when the response is finished: when Django
(or the WSGI server) closes the response, which it does after the last
chunk of a streamed response too and when the client disconnects; at once
when the view raises or its task is cancelled. Rate rules alone need no
release.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Callable, Optional, TypeVar, Union

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction
from django.conf import settings  # type: ignore[import-untyped]
from django.core.exceptions import ImproperlyConfigured  # type: ignore[import-untyped]
from django.core.signals import setting_changed  # type: ignore[import-untyped]
from django.http import HttpRequest, HttpResponse  # type: ignore[import-untyped]
from django.urls import Resolver404, resolve  # type: ignore[import-untyped]
from django.utils.decorators import sync_and_async_middleware  # type: ignore[import-untyped]
from django.utils.module_loading import import_string  # type: ignore[import-untyped]

from throttlegate._http import OPTION_NAMES, AttributeMap, HttpOptions, Lease, RouteLimit, denial, model_attributes, peer_ip, raw_path
from throttlegate._native import ClientIp, Decision, Limiter

__all__ = ["RateLimitMiddleware", "default_attributes", "denied_response", "get_limiter", "ratelimit", "ratelimit_exempt"]

F = TypeVar("F", bound=Callable[..., Any])
AttributesFn = Callable[[Any], Union[AttributeMap, Awaitable[AttributeMap]]]
Attributes = Union[AttributeMap, AttributesFn]
CostFn = Callable[[Any], int]

_LIMITER_OPTIONS = (
    "url", "timeout", "on_backend_error", "prefix", "clock", "key_secret", "tls_root_cert", "tls_client_cert",
    "deny_cache",
)
# The options of every integration (HttpOptions), but the route function:
# Django has a router of its own.
_HTTP_OPTIONS = tuple(name for name in OPTION_NAMES if name != "route")
_FUNCTIONS = ("attributes", "cost", "on_denied", "on_error")
_OWN_OPTIONS = ("policy", "limiter", "trusted_proxies", "ipv6_prefix")
_KNOWN = _OWN_OPTIONS + _HTTP_OPTIONS + _LIMITER_OPTIONS
# Set on a view by the decorators: a _ViewLimit, or _EXEMPT.
_MARK = "_throttlegate"
_EXEMPT = "exempt"
# Set on a request once it has been checked, so a decorated view behind the
# middleware is not checked twice.
_CHECKED = "_throttlegate_checked"
# Set on a request: its ResolverMatch (or None), resolved once.
_MATCH = "_throttlegate_match"


class _ViewLimit:
    def __init__(self, limit: Optional[RouteLimit], attributes: Optional[Attributes], cost: Union[int, CostFn, None]) -> None:
        self.limit = limit
        self.attributes = attributes
        self.cost = cost


class _Config:
    """``settings.THROTTLEGATE``, validated, with the limiter made from it."""

    def __init__(self, raw: object) -> None:
        if not isinstance(raw, Mapping):
            raise ImproperlyConfigured("THROTTLEGATE: expected a dict in settings")
        unknown = sorted(str(k) for k in raw if k not in _KNOWN)
        if unknown:
            raise ImproperlyConfigured(
                f"THROTTLEGATE: unknown key {unknown[0]!r} (known: {', '.join(_KNOWN)})"
            )
        limiter = raw.get("limiter")
        if limiter is not None:
            if not isinstance(limiter, Limiter):
                raise ImproperlyConfigured("THROTTLEGATE: limiter: expected a throttlegate.Limiter")
            given = [k for k in ("policy", *_LIMITER_OPTIONS) if k in raw]
            if given:
                raise ImproperlyConfigured(
                    f"THROTTLEGATE: give either 'limiter' or 'policy' with the Limiter's options, not both ({given[0]!r})"
                )
            self.limiter = limiter
        elif "policy" in raw:
            policy = raw["policy"]
            options = {k: raw[k] for k in _LIMITER_OPTIONS if k in raw and k != "url"}
            self.limiter = Limiter(policy, raw.get("url"), **options)
        else:
            raise ImproperlyConfigured("THROTTLEGATE: expected a 'policy' (a file path or a policy dict) or a 'limiter'")
        http: dict[str, Any] = {k: raw[k] for k in _HTTP_OPTIONS if k in raw}
        for name in _FUNCTIONS:
            if isinstance(http.get(name), str):
                http[name] = import_string(http[name])
        if "client_ip" not in http and ("trusted_proxies" in raw or "ipv6_prefix" in raw):
            http["client_ip"] = ClientIp(raw.get("trusted_proxies"), raw.get("ipv6_prefix"))
        if "legacy_headers" in http:
            http["legacy_headers"] = bool(http["legacy_headers"])
        self.options: HttpOptions[Any] = HttpOptions(self.limiter, **http)
        self.legacy_headers = self.options.legacy_headers


_config: Optional[_Config] = None


def _settings() -> _Config:
    global _config
    if _config is None:
        _config = _Config(getattr(settings, "THROTTLEGATE", None))
    return _config


def _forget(*, setting: str, **_kwargs: Any) -> None:
    global _config
    if setting == "THROTTLEGATE":
        _config = None


setting_changed.connect(_forget)


def get_limiter() -> Limiter:
    """The limiter of ``settings.THROTTLEGATE`` (made on first use, shared
    by the middleware and the decorators)."""
    return _settings().limiter


def _match(request: HttpRequest) -> Any:
    """The request's ResolverMatch (Django's own resolver), or None."""
    if hasattr(request, _MATCH):
        return getattr(request, _MATCH)
    match = getattr(request, "resolver_match", None)
    if match is None:
        try:
            match = resolve(request.path_info, getattr(request, "urlconf", None))
        except Resolver404:
            match = None
    setattr(request, _MATCH, match)
    return match


def _target(request: HttpRequest) -> str:
    meta = request.META
    for name in ("RAW_URI", "REQUEST_URI"):
        if meta.get(name):
            return str(meta[name])
    scope = getattr(request, "scope", None)
    if isinstance(scope, Mapping) and isinstance(scope.get("raw_path"), (bytes, bytearray)):
        return bytes(scope["raw_path"]).decode("latin-1")
    return raw_path(request.path)


def default_attributes(request: HttpRequest, limiter: Limiter, client_ip: Optional[ClientIp] = None) -> dict[str, str]:
    """The request model of a request, made by the core: ``ip`` (absent when
    the peer is not an IP address), ``method``, ``route`` (the matched URL
    pattern's route, ``include()`` prefixes included, from Django's own
    resolver; absent when none matches), ``path``, ``host`` and the policy's
    ``[attributes]`` headers. Django joins repeated headers with commas, as
    the core reads them."""
    meta = request.META
    match = _match(request)
    route = getattr(match, "route", None) if match is not None else None
    return model_attributes(
        limiter,
        ip=peer_ip(client_ip or ClientIp(), meta.get("REMOTE_ADDR"), meta.get("HTTP_FORWARDED"),
                   meta.get("HTTP_X_FORWARDED_FOR")),
        method=request.method or "GET",
        route=("/" + route) if route is not None else None,
        path=_target(request),
        host=meta.get("HTTP_HOST"),
        header=lambda name: meta.get("HTTP_" + name.upper().replace("-", "_")),
    )


def denied_response(decision: Decision, legacy: bool = False) -> HttpResponse:
    """The 429 answer: the core's problem+json body naming the rules, with the headers."""
    body, headers = denial(decision, legacy)
    return HttpResponse(body, status=429, headers=dict(headers))


def _denied(request: HttpRequest, config: _Config, decision: Decision) -> Any:
    if config.options.on_denied is not None:
        return config.options.on_denied(request, decision)
    return denied_response(decision, config.legacy_headers)


def _add_headers(response: HttpResponse, decision: Decision, legacy: bool) -> HttpResponse:
    for name, value in decision.headers_with(legacy=legacy).items():
        if name not in response.headers:
            response.headers[name] = value
    return response


def _released_on_close(response: Any, lease: Lease) -> Any:
    """``response``, releasing ``lease`` once it is closed."""
    close = response.close

    def closing() -> None:
        try:
            close()
        finally:
            lease.release()

    response.close = closing
    return response


def _respond_sync(config: _Config, decision: Decision, get: Callable[[], Any]) -> Any:
    """The admitted request's response (``get()``) with the headers; the
    slots the decision holds are released when it is closed, or at once
    when ``get`` raises."""
    lease = Lease.of(config.limiter, decision)
    try:
        response = get()
    except BaseException:
        if lease is not None:
            lease.release()
        raise
    response = _add_headers(response, decision, config.legacy_headers)
    return response if lease is None else _released_on_close(response, lease)


async def _respond_async(config: _Config, decision: Decision, get: Callable[[], Awaitable[Any]]) -> Any:
    """``_respond_sync`` for an awaited response (a cancelled task releases
    without awaiting)."""
    lease = Lease.of(config.limiter, decision)
    try:
        response = await get()
    except BaseException:
        if lease is not None:
            lease.release_soon()
        raise
    response = _add_headers(response, decision, config.legacy_headers)
    return response if lease is None else _released_on_close(response, lease)


def _view_mark(request: HttpRequest) -> Any:
    match = _match(request)
    return getattr(match.func, _MARK, None) if match is not None else None


def _compile_routes(config: _Config) -> None:
    """Add every ``@ratelimit("...")`` view's limit to the policy, for its
    URL pattern's full route (``include()`` prefixes included)."""
    from django.urls import URLPattern, URLResolver, get_resolver

    def walk(patterns: Any, prefix: str) -> None:
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                spec = getattr(p.callback, _MARK, None)
                if isinstance(spec, _ViewLimit) and spec.limit is not None:
                    spec.limit.compile(config.limiter, "/" + prefix + str(p.pattern))

    walk(get_resolver().url_patterns, "")


def _start(config: _Config) -> None:
    config.options.start(True, lambda: _compile_routes(config))


def _parts(request: HttpRequest, config: _Config, view: Optional[_ViewLimit]) -> tuple[list[Attributes], Union[int, CostFn]]:
    """The attribute sources of a check, in order (later ones win), and its cost."""
    options = config.options
    sources: list[Attributes] = [options.attributes or (lambda r: default_attributes(r, config.limiter, options.client_ip))]
    cost = options.cost
    if view is not None:
        if view.attributes is not None:
            sources.append(view.attributes)
        if view.cost is not None:
            cost = view.cost
    return sources, cost


def _units(request: HttpRequest, cost: Union[int, CostFn]) -> int:
    return cost(request) if callable(cost) else cost


def _attributes_sync(request: HttpRequest, sources: list[Attributes]) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for source in sources:
        if not callable(source):
            attrs.update(source)
        elif iscoroutinefunction(source):
            attrs.update(async_to_sync(source)(request))
        else:
            attrs.update(source(request))  # type: ignore[arg-type]
    return attrs


async def _attributes_async(request: HttpRequest, sources: list[Attributes]) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for source in sources:
        if not callable(source):
            attrs.update(source)
            continue
        got = source(request)
        attrs.update(await got if inspect.isawaitable(got) else got)
    return attrs


def _check_sync(request: HttpRequest, config: _Config, view: Optional[_ViewLimit]) -> Decision:
    _start(config)
    sources, cost = _parts(request, config, view)
    decision = config.limiter.check(_attributes_sync(request, sources), _units(request, cost))
    request.ratelimit = decision
    setattr(request, _CHECKED, True)
    return decision


async def _check_async(request: HttpRequest, config: _Config, view: Optional[_ViewLimit]) -> Decision:
    _start(config)
    sources, cost = _parts(request, config, view)
    decision = await config.limiter.check_async(await _attributes_async(request, sources), _units(request, cost))
    request.ratelimit = decision
    setattr(request, _CHECKED, True)
    return decision


def _error(request: HttpRequest, config: _Config, e: Exception) -> Any:
    if config.options.on_error is None:
        raise e
    return config.options.on_error(request, e)


@sync_and_async_middleware
class RateLimitMiddleware:
    """Checks every request (once, with its view's extra attributes) against
    the limiter of ``settings.THROTTLEGATE``; async under ASGI."""

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)
        # A bad configuration fails at start-up, not on the first request;
        # the route limits are compiled and the lint warnings logged then.
        _start(_settings())

    def __call__(self, request: HttpRequest) -> Any:
        if self.async_mode:
            return self._acall(request)
        config = _settings()
        mark = _view_mark(request)
        if mark == _EXEMPT:
            return self.get_response(request)
        try:
            decision = _check_sync(request, config, mark)
        except Exception as e:
            return _error(request, config, e)
        if not decision.allowed:
            return _denied(request, config, decision)
        return _respond_sync(config, decision, lambda: self.get_response(request))

    async def _acall(self, request: HttpRequest) -> Any:
        config = _settings()
        mark = _view_mark(request)
        if mark == _EXEMPT:
            return await self.get_response(request)
        try:
            decision = await _check_async(request, config, mark)
        except Exception as e:
            return _error(request, config, e)
        if not decision.allowed:
            return _denied(request, config, decision)
        return await _respond_async(config, decision, lambda: self.get_response(request))


def ratelimit(
    rate: Union[str, Attributes, None] = None,
    *,
    key: Optional[str] = None,
    name: Optional[str] = None,
    methods: Optional[Sequence[str]] = None,
    attributes: Optional[Attributes] = None,
    cost: Union[int, CostFn, None] = None,
) -> Callable[[F], F]:
    """A view's own limit: ``rate`` in the core's grammar (``"5/minute"``,
    ``"100 per hour"``, ``"10/30s"``), keyed on ``key`` (default
    ``"{ip}"``), named ``name``, for ``methods`` (default: any), compiled
    into the policy at start-up for the view's URL pattern, so it is checked
    in the same single round trip as the file's rules; and/or extra
    ``attributes`` (a mapping, or a function of the request, plain or
    ``async``, giving one; added to the request model, and winning over it)
    and an own ``cost``. The view is checked once, by the middleware or,
    without it, by the decorator. Sync and async views alike. The form
    ``@ratelimit(attributes)`` (attributes first) still works."""
    if rate is not None and not isinstance(rate, str):
        if attributes is not None:
            raise TypeError("ratelimit: attributes given twice")
        attributes, rate = rate, None
    spec = _ViewLimit(RouteLimit(rate, key=key, name=name, methods=methods) if rate is not None else None,
                      attributes, cost)

    def wrap(view: F) -> F:
        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def inner_async(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                if getattr(request, _CHECKED, False):
                    return await view(request, *args, **kwargs)
                config = _settings()
                try:
                    decision = await _check_async(request, config, spec)
                except Exception as e:
                    return _error(request, config, e)
                if not decision.allowed:
                    return _denied(request, config, decision)
                return await _respond_async(config, decision, lambda: view(request, *args, **kwargs))

            setattr(inner_async, _MARK, spec)
            return inner_async  # type: ignore[return-value]

        @functools.wraps(view)
        def inner(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            if getattr(request, _CHECKED, False):
                return view(request, *args, **kwargs)
            config = _settings()
            try:
                decision = _check_sync(request, config, spec)
            except Exception as e:
                return _error(request, config, e)
            if not decision.allowed:
                return _denied(request, config, decision)
            return _respond_sync(config, decision, lambda: view(request, *args, **kwargs))

        setattr(inner, _MARK, spec)
        return inner  # type: ignore[return-value]

    return wrap


def ratelimit_exempt(view: F) -> F:
    """Never check requests to this view."""

    if iscoroutinefunction(view):

        @functools.wraps(view)
        async def inner_async(*args: Any, **kwargs: Any) -> Any:
            return await view(*args, **kwargs)

        setattr(inner_async, _MARK, _EXEMPT)
        return inner_async  # type: ignore[return-value]

    @functools.wraps(view)
    def inner(*args: Any, **kwargs: Any) -> Any:
        return view(*args, **kwargs)

    setattr(inner, _MARK, _EXEMPT)
    return inner  # type: ignore[return-value]
