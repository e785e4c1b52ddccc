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

and for one view, extra attributes (a user id, a route name)::

    from throttlegate.django import ratelimit, ratelimit_exempt

    @ratelimit(attributes=lambda request: {"user": str(request.user.pk), "route": "export"})
    def export(request): ...

``THROTTLEGATE`` takes ``policy`` (or ``limiter``, a ready
:class:`throttlegate.Limiter`), the Limiter's options (``url``, ``timeout``,
``on_backend_error``, ``prefix``, ``clock``, ``key_secret``,
``tls_root_cert``, ``tls_client_cert``, ``deny_cache``), the client-address
rules (``trusted_proxies``, ``ipv6_prefix``, as :class:`throttlegate.ClientIp`)
and the middleware's own: ``attributes`` (a function of the request, or its
dotted path), ``cost`` (a number or such a function) and ``legacy_headers``.
An unknown key is an ``ImproperlyConfigured`` error naming it.

Every request is checked once: with the attributes ``ip`` (``REMOTE_ADDR``
and the forwarded headers per the core's client-address rules), ``method``
and ``path``, plus those of its view's :func:`ratelimit` decorator (the
middleware resolves the URL to find it); :func:`ratelimit_exempt` views are
not checked. Under ASGI the middleware runs async and awaits
:meth:`throttlegate.Limiter.check_async`, so a slow Redis never blocks the
event loop; under WSGI it calls :meth:`throttlegate.Limiter.check`. An
attributes function may be ``async`` (to ``await request.auser()``); a sync
one runs in the event loop, so it must not touch the database there.

A denial is a 429 with the rate-limit headers and the core's
``application/problem+json`` body; admitted responses get the headers too
(headers the view set itself win). The decision is ``request.ratelimit``.
With ``on_backend_error = "error"`` a backend failure is raised (Django
answers 500 unless a middleware handles it). A decorated view works without
the middleware too: the decorator then checks the request itself.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Mapping
from typing import Any, Callable, Optional, TypeVar, Union

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction
from django.conf import settings  # type: ignore[import-untyped]
from django.core.exceptions import ImproperlyConfigured  # type: ignore[import-untyped]
from django.core.signals import setting_changed  # type: ignore[import-untyped]
from django.http import HttpRequest, HttpResponse  # type: ignore[import-untyped]
from django.urls import Resolver404, resolve  # type: ignore[import-untyped]
from django.utils.decorators import sync_and_async_middleware  # type: ignore[import-untyped]
from django.utils.module_loading import import_string  # type: ignore[import-untyped]

from throttlegate._http import AttributeMap, denial, request_attributes
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
_OWN_OPTIONS = ("policy", "limiter", "trusted_proxies", "ipv6_prefix", "attributes", "cost", "legacy_headers")
_KNOWN = _OWN_OPTIONS + _LIMITER_OPTIONS
# Set on a view by the decorators: a _ViewLimit, or _EXEMPT.
_MARK = "_throttlegate"
_EXEMPT = "exempt"
# Set on a request once it has been checked, so a decorated view behind the
# middleware is not checked twice.
_CHECKED = "_throttlegate_checked"


class _ViewLimit:
    def __init__(self, attributes: Optional[Attributes], cost: Union[int, CostFn, None]) -> None:
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
        self.client_ip = ClientIp(raw.get("trusted_proxies"), raw.get("ipv6_prefix"))
        attributes = raw.get("attributes")
        self.attributes: Optional[AttributesFn] = import_string(attributes) if isinstance(attributes, str) else attributes
        cost = raw.get("cost", 1)
        self.cost: Union[int, CostFn] = import_string(cost) if isinstance(cost, str) else cost
        self.legacy_headers = bool(raw.get("legacy_headers", False))


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


def default_attributes(request: HttpRequest, client_ip: ClientIp) -> dict[str, Optional[str]]:
    """``ip``, ``method`` and ``path`` of a request (``ip`` is None when the
    peer is not an IP address, so rules keyed on it do not apply). Django
    joins repeated headers with commas, as the core reads them."""
    meta = request.META
    return request_attributes(
        client_ip,
        meta.get("REMOTE_ADDR"),
        meta.get("HTTP_FORWARDED"),
        meta.get("HTTP_X_FORWARDED_FOR"),
        request.method or "GET",
        request.path_info,
    )


def denied_response(decision: Decision, legacy: bool = False) -> HttpResponse:
    """The 429 answer: the core's problem+json body naming the rules, with the headers."""
    body, headers = denial(decision, legacy)
    return HttpResponse(body, status=429, headers=dict(headers))


def _add_headers(response: HttpResponse, decision: Decision, legacy: bool) -> HttpResponse:
    for name, value in decision.headers_with(legacy=legacy).items():
        if name not in response.headers:
            response.headers[name] = value
    return response


def _view_mark(request: HttpRequest) -> Any:
    try:
        match = resolve(request.path_info, getattr(request, "urlconf", None))
    except Resolver404:
        return None
    return getattr(match.func, _MARK, None)


def _parts(request: HttpRequest, config: _Config, view: Optional[_ViewLimit]) -> tuple[list[Attributes], Union[int, CostFn]]:
    """The attribute sources of a check, in order (later ones win), and its cost."""
    sources: list[Attributes] = [config.attributes or (lambda r: default_attributes(r, config.client_ip))]
    cost = config.cost
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
    sources, cost = _parts(request, config, view)
    decision = config.limiter.check(_attributes_sync(request, sources), _units(request, cost))
    request.ratelimit = decision
    setattr(request, _CHECKED, True)
    return decision


async def _check_async(request: HttpRequest, config: _Config, view: Optional[_ViewLimit]) -> Decision:
    sources, cost = _parts(request, config, view)
    decision = await config.limiter.check_async(await _attributes_async(request, sources), _units(request, cost))
    request.ratelimit = decision
    setattr(request, _CHECKED, True)
    return decision


@sync_and_async_middleware
class RateLimitMiddleware:
    """Checks every request (once, with its view's extra attributes) against
    the limiter of ``settings.THROTTLEGATE``; async under ASGI."""

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)
        _settings()  # a bad configuration fails at startup, not on the first request

    def __call__(self, request: HttpRequest) -> Any:
        if self.async_mode:
            return self._acall(request)
        config = _settings()
        mark = _view_mark(request)
        if mark == _EXEMPT:
            return self.get_response(request)
        decision = _check_sync(request, config, mark)
        if not decision.allowed:
            return denied_response(decision, config.legacy_headers)
        return _add_headers(self.get_response(request), decision, config.legacy_headers)

    async def _acall(self, request: HttpRequest) -> Any:
        config = _settings()
        mark = _view_mark(request)
        if mark == _EXEMPT:
            return await self.get_response(request)
        decision = await _check_async(request, config, mark)
        if not decision.allowed:
            return denied_response(decision, config.legacy_headers)
        return _add_headers(await self.get_response(request), decision, config.legacy_headers)


def ratelimit(attributes: Optional[Attributes] = None, *, cost: Union[int, CostFn, None] = None) -> Callable[[F], F]:
    """Check a view's requests with extra attributes (a mapping, or a
    function of the request, plain or ``async``, giving one) and an own
    ``cost``; the attributes are added to the default ones (``ip``,
    ``method``, ``path``), and win over them. Sync and async views alike."""
    spec = _ViewLimit(attributes, cost)

    def wrap(view: F) -> F:
        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def inner_async(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                if getattr(request, _CHECKED, False):
                    return await view(request, *args, **kwargs)
                config = _settings()
                decision = await _check_async(request, config, spec)
                if not decision.allowed:
                    return denied_response(decision, config.legacy_headers)
                return _add_headers(await view(request, *args, **kwargs), decision, config.legacy_headers)

            setattr(inner_async, _MARK, spec)
            return inner_async  # type: ignore[return-value]

        @functools.wraps(view)
        def inner(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            if getattr(request, _CHECKED, False):
                return view(request, *args, **kwargs)
            config = _settings()
            decision = _check_sync(request, config, spec)
            if not decision.allowed:
                return denied_response(decision, config.legacy_headers)
            return _add_headers(view(request, *args, **kwargs), decision, config.legacy_headers)

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
