"""throttlegate.django, throttlegate.asgi and throttlegate.wsgi served by real
servers (uvicorn, werkzeug) in this process: the same state gives the same
header bytes as the Flask and FastAPI integrations, Django's decorators and
settings, Litestar and Falcon (WSGI and ASGI) as they are, and importing throttlegate without any
framework installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Callable

import django
import falcon
import falcon.asgi
import httpx
import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import override_settings
from django.urls import path
from fastapi import FastAPI
from flask import Flask
from litestar import Litestar, get
from starlette.requests import Request

import throttlegate
from test_integrations import uvicorn_server, werkzeug_server
from throttlegate import asgi, wsgi
from throttlegate.django import RateLimitMiddleware as _DjangoMiddleware  # noqa: F401 (import check)
from throttlegate.django import get_limiter, ratelimit, ratelimit_exempt
from throttlegate.fastapi import RateLimitMiddleware as FastAPIMiddleware
from throttlegate.flask import Throttle

POLICY = [
    {"name": "per-ip", "key": "ip:{ip}", "limit": 3, "window": "1m"},
    {"name": "bucket", "key": "b:{ip}", "algorithm": "token_bucket", "capacity": 5, "refill_rate": 0.5},
]
START_US = 1_700_000_000_000_000


def limiter() -> throttlegate.Limiter:
    return throttlegate.Limiter(POLICY, clock=throttlegate.ManualClock(START_US))


# ---- Django, configured once for this process -------------------------------------------------

def d_index(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


async def d_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


async def _tenant(request: HttpRequest) -> dict[str, str | None]:
    return {"tenant": request.headers.get("X-Tenant")}


@ratelimit(attributes=_tenant, cost=2)
async def d_tenant(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"remaining": request.ratelimit.remaining})


@ratelimit(attributes=lambda request: {"tenant": request.headers.get("X-Tenant")})
def d_tenant_sync(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"remaining": request.ratelimit.remaining})


@ratelimit_exempt
def d_free(request: HttpRequest) -> HttpResponse:
    return HttpResponse("free")


urlpatterns = [
    path("", d_index),
    path("async", d_async),
    path("tenant", d_tenant),
    path("tenant-sync", d_tenant_sync),
    path("free", d_free),
]

if not settings.configured:
    settings.configure(
        DEBUG=False,
        ALLOWED_HOSTS=["127.0.0.1"],
        ROOT_URLCONF=__name__,
        MIDDLEWARE=["throttlegate.django.RateLimitMiddleware"],
        THROTTLEGATE={"policy": POLICY},
        LOGGING_CONFIG=None,
    )
    django.setup()


def django_asgi() -> Any:
    from django.core.asgi import get_asgi_application

    return get_asgi_application()


def django_wsgi() -> Any:
    from django.core.wsgi import get_wsgi_application

    return get_wsgi_application()


@contextmanager
def django_server(kind: str, throttlegate_settings: dict[str, Any], middleware: bool = True) -> Iterator[str]:
    mw = ["throttlegate.django.RateLimitMiddleware"] if middleware else []
    with override_settings(THROTTLEGATE=throttlegate_settings, MIDDLEWARE=mw):
        if kind == "asgi":
            with uvicorn_server(django_asgi()) as base:
                yield base
        else:
            with werkzeug_server(django_wsgi()) as base:  # type: ignore[arg-type]
                yield base


# ---- The same state, the same bytes ------------------------------------------------------------

RATE_HEADERS = (b"ratelimit", b"x-ratelimit", b"retry-after")


def rate_headers(r: httpx.Response) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in r.headers.raw if k.lower().startswith(RATE_HEADERS)]


def drive(base: str, path: str = "/") -> list[tuple[int, list[tuple[bytes, bytes]], str, str]]:
    out = []
    with httpx.Client(base_url=base) as http:
        for _ in range(5):
            r = http.get(path)
            denied = r.status_code == 429
            body = r.text if denied else ""
            out.append((r.status_code, rate_headers(r), r.headers.get("content-type", "") if denied else "", body))
    return out


async def bare_asgi(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


def bare_wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


def flask_app() -> Flask:
    app = Flask(__name__)
    Throttle(app, limiter=limiter())
    app.add_url_rule("/", "index", lambda: "ok")
    return app


def fastapi_app() -> FastAPI:
    app = FastAPI()
    app.add_middleware(FastAPIMiddleware, limiter=limiter())
    app.add_api_route("/", lambda: "ok")
    return app


@get("/")
async def litestar_index() -> str:
    return "ok"


class FalconIndex:
    def on_get(self, req: Any, resp: Any) -> None:
        resp.text = "ok"

    async def on_get_async(self, req: Any, resp: Any) -> None:
        resp.text = "ok"


def falcon_wsgi() -> Any:
    app = falcon.App()
    app.add_route("/", FalconIndex())
    return app


def falcon_asgi() -> Any:
    app = falcon.asgi.App()
    app.add_route("/", FalconIndex(), suffix="async")
    return app


def test_every_integration_sends_the_same_headers_for_the_same_state() -> None:
    with werkzeug_server(flask_app()) as base:
        reference = drive(base)
    statuses = [status for status, _, _, _ in reference]
    assert statuses == [200, 200, 200, 429, 429]
    assert reference[0][1] == [
        (b"RateLimit-Limit", b"3"), (b"RateLimit-Remaining", b"2"), (b"RateLimit-Reset", b"60"),
        (b"RateLimit-Policy", b'"per-ip";q=3;w=60, "bucket";q=5;w=10'),
        (b"RateLimit", b'"per-ip";r=2;t=60, "bucket";r=4;t=2'),
    ]
    assert reference[3][2] == "application/problem+json"
    servers: dict[str, Callable[[], Any]] = {
        "wsgi": lambda: werkzeug_server(wsgi.RateLimitMiddleware(bare_wsgi, limiter=limiter())),  # type: ignore[arg-type]
        "asgi": lambda: uvicorn_server(asgi.RateLimitMiddleware(bare_asgi, limiter=limiter())),  # type: ignore[arg-type]
        "litestar": lambda: uvicorn_server(
            asgi.RateLimitMiddleware(Litestar([litestar_index]), limiter=limiter())),  # type: ignore[arg-type]
        "falcon-wsgi": lambda: werkzeug_server(wsgi.RateLimitMiddleware(falcon_wsgi(), limiter=limiter())),
        "falcon-asgi": lambda: uvicorn_server(asgi.RateLimitMiddleware(falcon_asgi(), limiter=limiter())),
        "fastapi": lambda: uvicorn_server(fastapi_app()),
        "django-asgi": lambda: django_server("asgi", {"limiter": limiter()}),
        "django-wsgi": lambda: django_server("wsgi", {"limiter": limiter()}),
    }
    for name, make in servers.items():
        with make() as base:
            got = drive(base)
        assert got == reference, name


# ---- Django ------------------------------------------------------------------------------------

TENANT_POLICY = [
    {"name": "per-ip", "key": "ip:{ip}", "limit": 10, "window": "1m"},
    {"name": "per-tenant", "key": "t:{tenant}", "limit": 3, "window": "1m"},
]


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
@pytest.mark.parametrize("middleware", [True, False], ids=["middleware", "decorator-alone"])
def test_django_decorator_adds_attributes_and_cost(kind: str, middleware: bool) -> None:
    config = {"limiter": throttlegate.Limiter(TENANT_POLICY, clock=throttlegate.ManualClock(START_US))}
    with django_server(kind, config, middleware) as base, httpx.Client(base_url=base) as http:
        # Async attributes and a cost of 2 (the async view), plain ones and
        # the default cost (the sync view): one check per request either way.
        r = http.get("/tenant", headers={"X-Tenant": "acme"})
        assert r.status_code == 200 and r.json() == {"remaining": 1}
        assert r.headers["RateLimit-Policy"] == '"per-ip";q=10;w=60, "per-tenant";q=3;w=60'
        r = http.get("/tenant-sync", headers={"X-Tenant": "acme"})
        assert r.status_code == 200 and r.json() == {"remaining": 0}
        r = http.get("/tenant-sync", headers={"X-Tenant": "acme"})
        assert r.status_code == 429 and r.json()["violated_rules"] == ["per-tenant"]
        # Exempt, and undecorated views without the middleware, are not checked.
        r = http.get("/free")
        assert r.status_code == 200 and "RateLimit-Limit" not in r.headers
        r = http.get("/async")
        assert r.status_code == 200
        assert ("RateLimit-Limit" in r.headers) == middleware


def test_django_settings_are_validated() -> None:
    for bad, message in [
        (None, "expected a dict"),
        ({"policy": POLICY, "colour": "red"}, "unknown key 'colour'"),
        ({"url": "redis://127.0.0.1:1"}, "expected a 'policy'"),
        ({"limiter": limiter(), "url": "redis://127.0.0.1:1"}, "not both ('url')"),
        ({"limiter": "mine"}, "expected a throttlegate.Limiter"),
    ]:
        with override_settings(THROTTLEGATE=bad), pytest.raises(ImproperlyConfigured, match="THROTTLEGATE: ") as e:
            get_limiter()
        assert message in str(e.value)
    # The core's own errors name the field.
    with override_settings(THROTTLEGATE={"policy": [{"name": "a", "key": "{k}", "limit": 0, "window": "1m"}]}):
        with pytest.raises(throttlegate.InvalidPolicyError, match="limit"):
            get_limiter()


def test_django_settings_file_path_options_and_trusted_proxies(tmp_path: Any) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rules]]\nname = "per-ip"\nkey = "ip:{ip}"\nlimit = 1\nwindow = "1m"\n')
    config = {"policy": str(rules), "prefix": "fp:", "legacy_headers": True, "trusted_proxies": ["127.0.0.1"],
              "deny_cache": True}
    with django_server("asgi", config) as base, httpx.Client(base_url=base) as http:
        r = http.get("/", headers={"X-Forwarded-For": "198.51.100.1"})
        assert r.status_code == 200 and r.headers["X-RateLimit-Limit"] == "1"
        assert http.get("/", headers={"X-Forwarded-For": "198.51.100.1"}).status_code == 429
        assert http.get("/", headers={"X-Forwarded-For": "198.51.100.2"}).status_code == 200
        assert get_limiter().keys({"ip": "198.51.100.1"}) == ["fp:per-ip:ip:198.51.100.1"]


# ---- Generic middleware options ----------------------------------------------------------------

def test_asgi_attributes_cost_state_and_passthrough() -> None:
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["state"]["ratelimit"].remaining)
        # The app's own RateLimit-Limit wins over the middleware's.
        await send({"type": "http.response.start", "status": 200, "headers": [(b"ratelimit-limit", b"mine")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def attributes(scope: Any) -> dict[str, str | None]:
        return {"ip": Request(scope).headers.get("x-client")}

    mw = asgi.RateLimitMiddleware(app, limiter=limiter(), attributes=attributes,  # type: ignore[arg-type]
                                  cost=lambda scope: 2, legacy_headers=True)
    with uvicorn_server(mw) as base, httpx.Client(base_url=base) as http:  # type: ignore[arg-type]
        r = http.get("/", headers={"x-client": "a"})
        assert r.status_code == 200 and r.headers["RateLimit-Limit"] == "mine"
        assert r.headers["X-RateLimit-Remaining"] == "1"
        assert http.get("/", headers={"x-client": "a"}).status_code == 429
        # No attribute a rule names: admitted without headers.
        r = http.get("/")
        assert r.status_code == 200 and "RateLimit-Policy" not in r.headers
    assert seen == [1, 0]


def test_wsgi_attributes_and_decision_in_environ() -> None:
    seen: list[int] = []

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        seen.append(environ[wsgi.DECISION_KEY].remaining)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    mw = wsgi.RateLimitMiddleware(app, limiter=limiter(), attributes=lambda env: {"ip": env.get("HTTP_X_CLIENT")},
                                  cost=3)
    with werkzeug_server(mw) as base, httpx.Client(base_url=base) as http:  # type: ignore[arg-type]
        assert http.get("/", headers={"x-client": "a"}).headers["RateLimit-Remaining"] == "0"
        r = http.get("/", headers={"x-client": "a"})
        assert r.status_code == 429 and r.headers["Content-Length"] == str(len(r.content))
    assert seen == [0]


def test_a_synchronous_integration_refuses_async_attributes() -> None:
    async def attributes(environ: Any) -> dict[str, str]:
        return {"ip": "203.0.113.9"}

    mw = wsgi.RateLimitMiddleware(lambda e, s: [b"ok"], limiter=limiter(), attributes=attributes)  # type: ignore[arg-type]
    environ = {"REMOTE_ADDR": "203.0.113.9", "REQUEST_METHOD": "GET", "PATH_INFO": "/"}
    with pytest.raises(throttlegate.InvalidArgumentTypeError, match="attributes: expected a function returning a mapping, got an async function"):
        mw(environ, lambda status, headers, exc_info=None: None)
    assert wsgi.DECISION_KEY not in environ, "nothing was checked"


def test_importing_throttlegate_needs_no_framework() -> None:
    script = textwrap.dedent(
        """
        import importlib.abc, sys
        BLOCKED = {"django", "flask", "werkzeug", "fastapi", "starlette", "falcon", "litestar", "asgiref"}
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None
        sys.meta_path.insert(0, Block())
        import throttlegate, throttlegate.asgi, throttlegate.wsgi
        limiter = throttlegate.Limiter([{"name": "a", "key": "ip:{ip}", "limit": 1, "window": "1m"}])
        out = []
        app = throttlegate.wsgi.RateLimitMiddleware(lambda e, s: s("200 OK", []) or [b"ok"], limiter=limiter)
        for _ in range(2):
            app({"REMOTE_ADDR": "203.0.113.7", "REQUEST_METHOD": "GET", "PATH_INFO": "/"},
                lambda status, headers, exc_info=None: out.append(status))
        assert out == ["200 OK", "429 Too Many Requests"], out
        for name in ("django", "flask", "fastapi"):
            try:
                __import__("throttlegate." + name)
            except ModuleNotFoundError as e:
                assert e.name.split(".")[0] in BLOCKED, e
            else:
                raise AssertionError(name)
        assert not any(m.split(".")[0] in BLOCKED for m in sys.modules)
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr
