"""The edge where users meet throttlegate, in every Python framework served by
its real server (werkzeug, uvicorn) on loopback, driven over raw sockets:

- the request model (tests/http/request-model.json): the attributes each
  integration gives a check, read back from the keys a real Redis holds;
- no bypass (tests/http/bypass.json): every spelling of a protected route,
  HEAD for a GET route, and a mounted sub-application's prefix; the handler
  never runs more often than the limit;
- route limits in each framework's idiom, stacked with a file rule, checked
  once and all-or-nothing;
- one answer shape: every denial's status, headers and body, byte for byte;
- on_denied and on_error everywhere;
- the start-up lint warnings."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
import types
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable, Optional
from urllib.parse import unquote

import httpx
import pytest
from django.http import HttpRequest, HttpResponse
from django.test import override_settings
from django.urls import include, path
from fastapi import Depends, FastAPI
from flask import Blueprint, Flask
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route

import throttlegate
from conftest import REPO, RedisServer
from test_frameworks_inprocess import django_asgi, django_wsgi  # configures Django for this process
from test_integrations import uvicorn_server, werkzeug_server
from throttlegate import asgi, wsgi
from throttlegate.django import ratelimit
from throttlegate.fastapi import RateLimit
from throttlegate.fastapi import RateLimitMiddleware as FastAPIMiddleware
from throttlegate.flask import Throttle

MODEL = json.loads((REPO / "tests" / "http" / "request-model.json").read_text())
BYPASS = json.loads((REPO / "tests" / "http" / "bypass.json").read_text())
START_US = 1_700_000_000_000_000
FRAMEWORKS = ["flask", "fastapi", "starlette", "django-asgi", "django-wsgi"]


# ---- A raw HTTP client: the target goes on the wire as written -------------------------------------

def send(base: str, method: str, target: str, headers: Optional[dict[str, str]] = None) -> tuple[int, bytes]:
    """One request over a fresh connection; the status and the raw response."""
    host, port = base.removeprefix("http://").split(":")
    given = {k.lower(): v for k, v in (headers or {}).items()}
    lines = [f"{method} {target} HTTP/1.1", f"Host: {given.pop('host', f'{host}:{port}')}", "Connection: close",
             "Content-Length: 0"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items() if k.lower() != "host"]
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    return status, data


# ---- Servers: each framework's app, made from one description ----------------------------------------

Handler = Callable[[str], None]


def django_urlconf(name: str, patterns: list[Any]) -> str:
    """A URLconf module made at run time (Django imports it by name)."""
    module = types.ModuleType(name)
    module.urlpatterns = patterns  # type: ignore[attr-defined]
    sys.modules[name] = module
    return name


@contextmanager
def django_server(kind: str, urlconf: str, config: dict[str, Any]) -> Iterator[str]:
    with override_settings(THROTTLEGATE=config, MIDDLEWARE=["throttlegate.django.RateLimitMiddleware"],
                           ROOT_URLCONF=urlconf, ALLOWED_HOSTS=["*"]):
        if kind == "asgi":
            with uvicorn_server(django_asgi()) as base:
                yield base
        else:
            with werkzeug_server(django_wsgi()) as base:  # type: ignore[arg-type]
                yield base


def model_server(framework: str, limiter: throttlegate.Limiter) -> Any:
    """A server of the request-model table's routes, each answering "ok"."""
    routes = MODEL["routes"]
    if framework == "flask":
        app = Flask(__name__)
        Throttle(app, limiter=limiter)
        for i, r in enumerate(routes):
            app.add_url_rule(r["flask"], f"r{i}", lambda **_: "ok", methods=r["methods"])
        return werkzeug_server(app)
    if framework in ("fastapi", "starlette"):
        async def ok(request: Request) -> Response:
            return PlainTextResponse("ok")

        if framework == "fastapi":
            fast = FastAPI()
            fast.add_middleware(FastAPIMiddleware, limiter=limiter)
            for r in routes:
                fast.add_api_route(r["starlette"], lambda: "ok", methods=r["methods"])
            return uvicorn_server(fast)
        star = Starlette(routes=[Route(r["starlette"], ok, methods=r["methods"]) for r in routes],
                         middleware=[Middleware(asgi.RateLimitMiddleware, limiter=limiter)])
        return uvicorn_server(star)  # type: ignore[arg-type]
    kind = framework.split("-")[1]

    def view(request: HttpRequest, **_: Any) -> HttpResponse:
        return HttpResponse("ok")

    urlconf = django_urlconf("tg_model_urls", [path(r["django"], view) for r in routes])
    return django_server(kind, urlconf, {"limiter": limiter})


# ---- The request model ----------------------------------------------------------------------------

def model_policy() -> dict[str, Any]:
    """The table's policy plus one rule per attribute, so the keys in Redis
    show each attribute's value."""
    policy = json.loads(json.dumps(MODEL["policy"]))
    for name in ("method", "route", "path", "host"):
        policy["rules"].append({"name": f"a-{name}", "key": f"{name}:{{{name}}}", "limit": 1000, "window": "1m"})
    return policy


def redis_keys(redis: RedisServer, prefix: str) -> list[str]:
    reply = redis.command("KEYS", prefix + "*").decode("latin-1").split("\r\n")
    return [line for line in reply if line.startswith(prefix)]


def seen_attributes(redis: RedisServer, prefix: str) -> dict[str, str]:
    """The attributes the keys under ``prefix`` were made from (then deleted)."""
    seen: dict[str, str] = {}
    keys = redis_keys(redis, prefix)
    for key in keys:
        rule, rest = key[len(prefix):].split(":", 1)
        attr, value = rest.split(":", 1)
        seen[{"ip": "ip", "key": "api_key"}.get(attr, attr)] = unquote(value)
        redis.command("DEL", key)
    return seen


@pytest.mark.parametrize("framework", [*FRAMEWORKS, "asgi", "wsgi"])
def test_every_framework_gives_the_request_model(framework: str, redis_server: RedisServer, prefix: str) -> None:
    limiter = throttlegate.Limiter(model_policy(), redis_server.url, prefix=prefix)
    if framework == "asgi":
        # A generic ASGI app has no router: no route unless the route option says.
        server = uvicorn_server(asgi.RateLimitMiddleware(_bare_asgi, limiter=limiter))  # type: ignore[arg-type]
    elif framework == "wsgi":
        server = werkzeug_server(wsgi.RateLimitMiddleware(_bare_wsgi, limiter=limiter))  # type: ignore[arg-type]
    else:
        server = model_server(framework, limiter)
    with server as base:
        for case in MODEL["cases"]:
            request = case["request"]
            status, raw = send(base, request["method"], request["target"], request.get("headers"))
            assert status != 0, (case["name"], raw)
            expect = {k: v for k, v in case["expect"].items() if v is not None}
            expect["ip"] = "127.0.0.1"
            if framework in ("asgi", "wsgi"):
                expect.pop("route", None)
            if "host" not in expect:
                expect["host"] = "127.0.0.1"
            assert seen_attributes(redis_server, prefix) == expect, (framework, case["name"])


async def _bare_asgi(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _bare_wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


def test_generic_middlewares_take_a_route_function(redis_server: RedisServer, prefix: str) -> None:
    limiter = throttlegate.Limiter(model_policy(), redis_server.url, prefix=prefix)

    def route_of(path: str) -> Optional[str]:
        return "/users/<int:id>" if path.startswith("/users/") else None

    servers = [
        uvicorn_server(asgi.RateLimitMiddleware(_bare_asgi, limiter=limiter,  # type: ignore[arg-type]
                                                route=lambda scope: route_of(scope["path"]))),
        werkzeug_server(wsgi.RateLimitMiddleware(_bare_wsgi, limiter=limiter,  # type: ignore[arg-type]
                                                 route=lambda environ: route_of(environ["PATH_INFO"]))),
    ]
    for server in servers:
        with server as base:
            send(base, "GET", "/users/7")
            assert seen_attributes(redis_server, prefix)["route"] == "/users/{id}"
            send(base, "GET", "/elsewhere")
            assert "route" not in seen_attributes(redis_server, prefix)


# ---- No bypass --------------------------------------------------------------------------------------

def bypass_policy() -> dict[str, Any]:
    """bypass.json's policy, the same rule for the mounted copy and for a GET route."""
    policy = json.loads(json.dumps(BYPASS["policy"]))
    login = policy["rules"][0]
    mounted = {**login, "name": "login-api", "key": "login-api:{ip}",
               "match": {**login["match"], "route": BYPASS["mounted"]["prefix"] + "/login"}}
    report = {**login, "name": "report", "key": "report:{ip}", "match": {"route": "/report", "method": ["GET"]}}
    policy["rules"] += [mounted, report]
    return policy


def bypass_server(framework: str, limiter: throttlegate.Limiter, ran: Counter[str]) -> Any:
    """POST /login, POST {prefix}/login (a mounted sub-application) and GET
    /report, each limited by a file rule and (where the framework has one)
    by a route limit in its idiom; ``ran`` counts the handlers' runs."""
    rate = BYPASS["protected"]["rate"]
    prefix = BYPASS["mounted"]["prefix"]
    if framework == "flask":
        app = Flask(__name__)
        throttle = Throttle(app, limiter=limiter)
        api = Blueprint("api", __name__, url_prefix=prefix)

        @app.post("/login")
        @throttle.limit(rate)
        def login() -> str:
            ran["login"] += 1
            return "ok"

        @api.post("/login")
        @throttle.limit(rate)
        def api_login() -> str:
            ran["api"] += 1
            return "ok"

        @app.get("/report")
        @throttle.limit(rate)
        def report() -> str:
            ran["report"] += 1
            return "ok"

        app.register_blueprint(api)
        return werkzeug_server(app)
    if framework == "fastapi":
        app_ = FastAPI()
        app_.add_middleware(FastAPIMiddleware, limiter=limiter)
        sub = FastAPI()

        @app_.post("/login", dependencies=[Depends(RateLimit(rate))])
        async def f_login() -> str:
            ran["login"] += 1
            return "ok"

        @sub.post("/login", dependencies=[Depends(RateLimit(rate))])
        async def f_api_login() -> str:
            ran["api"] += 1
            return "ok"

        @app_.get("/report", dependencies=[Depends(RateLimit(rate))])
        async def f_report() -> str:
            ran["report"] += 1
            return "ok"

        app_.mount(prefix, sub)
        return uvicorn_server(app_)
    if framework == "starlette":
        def counting(name: str) -> Callable[[Request], Any]:
            async def endpoint(request: Request) -> Response:
                ran[name] += 1
                return PlainTextResponse("ok")
            return endpoint

        star = Starlette(
            routes=[Route("/login", counting("login"), methods=["POST"]),
                    Route("/report", counting("report"), methods=["GET"]),
                    Mount(prefix, routes=[Route("/login", counting("api"), methods=["POST"])])],
            middleware=[Middleware(asgi.RateLimitMiddleware, limiter=limiter)],
        )
        return uvicorn_server(star)  # type: ignore[arg-type]
    kind = framework.split("-")[1]

    def counted(name: str, methods: list[str]) -> Callable[..., HttpResponse]:
        @ratelimit(rate, methods=methods)
        def view(request: HttpRequest) -> HttpResponse:
            ran[name] += 1
            return HttpResponse("ok")
        return view

    urlconf = django_urlconf(f"tg_bypass_urls_{kind}", [
        path("login", counted("login", ["POST"])),
        path("report", counted("report", ["GET"])),
        path(prefix.strip("/") + "/", include([path("login", counted("api", ["POST"]))])),
    ])
    return django_server(kind, urlconf, {"limiter": limiter})


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_no_spelling_bypasses_a_route_limit(framework: str) -> None:
    limiter = throttlegate.Limiter(bypass_policy(), clock=throttlegate.ManualClock(START_US))
    ran: Counter[str] = Counter()
    limit, prefix = BYPASS["limit"], BYPASS["mounted"]["prefix"]
    with bypass_server(framework, limiter, ran) as base:
        for _ in range(BYPASS["rounds"]):
            for spelling in BYPASS["spellings"]:
                send(base, spelling["method"], spelling["target"])
                send(base, spelling["method"], prefix + spelling["target"])
            for _ in range(limit):
                send(base, "GET", "/report")
                send(base, "HEAD", "/report")
        # The plain spellings were served, and are denied now.
        assert send(base, "POST", "/login")[0] == 429
        assert send(base, "POST", prefix + "/login")[0] == 429
        assert send(base, "GET", "/report")[0] == 429
    # Never more than the limit (FastAPI answers HEAD for a GET route with a
    # 405 that still counts, so its GET handler may run fewer times).
    assert set(ran) == {"login", "api", "report"} and all(1 <= n <= limit for n in ran.values()), (framework, ran)


# ---- Route limits in each framework's idiom, stacked with a file rule ---------------------------------

STACKED = [{"name": "per-ip", "key": "ip:{ip}", "limit": 5, "window": "1m"}]


def idiom_server(framework: str, limiter: throttlegate.Limiter, **options: Any) -> Any:
    """GET / (the file rule only) and POST /login (also "2/minute" in the idiom)."""
    if framework.startswith("flask"):
        app = Flask(__name__)
        throttle = Throttle(app, limiter=limiter, every_request=framework != "flask-decorated-only", **options)
        app.add_url_rule("/", "index", lambda: "ok")

        @app.post("/login")
        @throttle.limit("2/minute", key="{ip}")
        def login() -> str:
            return "ok"

        return werkzeug_server(app)
    if framework.startswith("fastapi"):
        fast = FastAPI()
        if framework == "fastapi-dependency-only":
            dep = RateLimit("2/minute", limiter=limiter, **options)
        else:
            fast.add_middleware(FastAPIMiddleware, limiter=limiter, **options)
            dep = RateLimit("2/minute")
        fast.add_api_route("/", lambda: "ok")
        fast.add_api_route("/login", lambda: "ok", methods=["POST"], dependencies=[Depends(dep)])
        return uvicorn_server(fast)
    kind = framework.split("-")[1]

    @ratelimit("2/minute", methods=["POST"])
    def d_login(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    urlconf = django_urlconf(f"tg_idiom_urls_{kind}", [path("", lambda r: HttpResponse("ok")), path("login", d_login)])
    return django_server(kind, urlconf, {"limiter": limiter, **options})


@pytest.mark.parametrize("framework", ["flask", "flask-decorated-only", "fastapi", "fastapi-dependency-only",
                                       "django-asgi", "django-wsgi"])
def test_a_route_limit_is_checked_once_with_the_file_rules(framework: str) -> None:
    limiter = throttlegate.Limiter(STACKED, clock=throttlegate.ManualClock(START_US))
    with idiom_server(framework, limiter) as base, httpx.Client(base_url=base) as http:
        for remaining in ("1", "0"):
            r = http.post("/login")
            assert r.status_code == 200, r.text
            # Both rules in one check, each request counted once.
            assert r.headers["RateLimit-Policy"].startswith('"per-ip";q=5;w=60, "route.')
            assert r.headers["RateLimit-Remaining"] == remaining
        r = http.post("/login")
        assert r.status_code == 429 and r.json()["violated_rules"][0].startswith("route.")
        if framework in ("flask-decorated-only", "fastapi-dependency-only"):
            return
        # The denied request consumed nothing from per-ip: 3 of 5 left.
        for remaining in ("2", "1", "0"):
            r = http.get("/")
            assert r.status_code == 200 and r.headers["RateLimit-Remaining"] == remaining
        r = http.get("/")
        assert r.status_code == 429 and r.json()["violated_rules"] == ["per-ip"]
    # The other way round: a login denied by per-ip takes nothing from the route limit.
    limiter = throttlegate.Limiter(STACKED, clock=throttlegate.ManualClock(START_US))
    with idiom_server(framework, limiter) as base, httpx.Client(base_url=base) as http:
        for _ in range(4):
            assert http.get("/").status_code == 200
        r = http.post("/login")
        assert r.status_code == 200 and r.headers["RateLimit"].endswith(";r=1;t=60")
        r = http.post("/login")
        assert r.status_code == 429 and r.json()["violated_rules"] == ["per-ip"]
        route_rule = r.headers["RateLimit"].split(", ")[1]
        assert route_rule.startswith('"route.') and route_rule.endswith(";r=1;t=60"), r.headers["RateLimit"]


def test_flask_keeps_the_attributes_and_cost_form_and_checks_once() -> None:
    limiter = throttlegate.Limiter(
        [*STACKED, {"name": "per-user", "key": "user:{user}", "limit": 4, "window": "1m"}],
        clock=throttlegate.ManualClock(START_US),
    )
    app = Flask(__name__)
    throttle = Throttle(app, limiter=limiter)  # every_request=True

    @app.get("/me")
    @throttle.limit(attributes=lambda req: {"user": req.args.get("user")}, cost=2)
    def me() -> str:
        return "ok"

    with werkzeug_server(app) as base, httpx.Client(base_url=base) as http:
        r = http.get("/me", params={"user": "u1"})
        # One check of cost 2 with per-ip and per-user: 3 and 2 left (not 1 and 0).
        assert r.status_code == 200 and r.headers["RateLimit"] == '"per-ip";r=3;t=60, "per-user";r=2;t=60'


# ---- One answer shape --------------------------------------------------------------------------------

RATE_HEADERS = (b"ratelimit", b"x-ratelimit", b"retry-after", b"content-type", b"content-length")


def denial_of(base: str, method: str, target: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    with httpx.Client(base_url=base) as http:
        for _ in range(3):
            r = http.request(method, target)
        assert r.status_code == 429
        headers = sorted((k.lower(), v) for k, v in r.headers.raw if k.lower().startswith(RATE_HEADERS))
        return r.status_code, headers, r.content


def test_every_denial_has_the_same_bytes() -> None:
    def limiter() -> throttlegate.Limiter:
        return throttlegate.Limiter(
            [{"name": "per-ip", "key": "ip:{ip}", "limit": 2, "window": "1m"}], clock=throttlegate.ManualClock(START_US)
        )

    def flask_decorator() -> Any:
        app = Flask(__name__)
        throttle = Throttle(app, limiter=limiter(), every_request=False)
        app.add_url_rule("/", "index", throttle.limit(lambda: "ok"))
        return werkzeug_server(app)

    def fastapi_app(middleware: bool) -> Any:
        fast = FastAPI()
        lim = limiter()
        if middleware:
            fast.add_middleware(FastAPIMiddleware, limiter=lim)
            fast.add_api_route("/", lambda: "ok")
        else:
            fast.add_api_route("/", lambda: "ok", dependencies=[Depends(RateLimit(lim))])
        return uvicorn_server(fast)

    def flask_mw() -> Any:
        app = Flask(__name__)
        Throttle(app, limiter=limiter())
        app.add_url_rule("/", "index", lambda: "ok")
        return werkzeug_server(app)

    @ratelimit()
    def decorated(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    urlconf = django_urlconf("tg_shape_urls", [path("", decorated)])

    @contextmanager
    def django_alone(kind: str) -> Iterator[str]:
        with override_settings(THROTTLEGATE={"limiter": limiter()}, MIDDLEWARE=[], ROOT_URLCONF=urlconf):
            with (uvicorn_server(django_asgi()) if kind == "asgi" else werkzeug_server(django_wsgi())) as base:
                yield base

    servers: dict[str, Callable[[], Any]] = {
        "flask-middleware": flask_mw,
        "flask-decorator": flask_decorator,
        "fastapi-middleware": lambda: fastapi_app(True),
        "fastapi-dependency": lambda: fastapi_app(False),
        "starlette": lambda: uvicorn_server(Starlette(  # type: ignore[arg-type]
            routes=[Route("/", lambda r: PlainTextResponse("ok"))],
            middleware=[Middleware(asgi.RateLimitMiddleware, limiter=limiter())])),
        "asgi": lambda: uvicorn_server(asgi.RateLimitMiddleware(_bare_asgi, limiter=limiter())),  # type: ignore[arg-type]
        "wsgi": lambda: werkzeug_server(wsgi.RateLimitMiddleware(_bare_wsgi, limiter=limiter())),  # type: ignore[arg-type]
        "django-middleware": lambda: django_server("asgi", urlconf, {"limiter": limiter()}),
        "django-decorator-asgi": lambda: django_alone("asgi"),
        "django-decorator-wsgi": lambda: django_alone("wsgi"),
    }
    answers = {}
    for name, make in servers.items():
        with make() as base:
            answers[name] = denial_of(base, "GET", "/")
    reference = answers["flask-middleware"]
    assert reference[1][0][0] == b"content-length" and (b"content-type", b"application/problem+json") in reference[1]
    assert json.loads(reference[2])["violated_rules"] == ["per-ip"]
    for name, answer in answers.items():
        assert answer == reference, name


# ---- on_denied and on_error everywhere ---------------------------------------------------------------

def test_every_integration_takes_on_denied_and_on_error() -> None:
    down = "redis://127.0.0.1:1/0"
    policy = [{"name": "per-ip", "key": "ip:{ip}", "limit": 1, "window": "1m"}]

    def flask_hooks(lim: throttlegate.Limiter) -> Any:
        from flask import Response as FlaskResponse

        app = Flask(__name__)
        Throttle(app, limiter=lim, on_denied=lambda req, d: FlaskResponse("slow down", status=429),
                 on_error=lambda req, e: FlaskResponse(type(e).__name__, status=503))
        app.add_url_rule("/", "index", lambda: "ok")
        return werkzeug_server(app)

    def fastapi_hooks(lim: throttlegate.Limiter) -> Any:
        fast = FastAPI()
        fast.add_middleware(FastAPIMiddleware, limiter=lim,
                            on_denied=lambda req, d: PlainTextResponse("slow down", status_code=429),
                            on_error=lambda req, e: PlainTextResponse(type(e).__name__, status_code=503))
        fast.add_api_route("/", lambda: "ok")
        return uvicorn_server(fast)

    def asgi_hooks(lim: throttlegate.Limiter) -> Any:
        return uvicorn_server(asgi.RateLimitMiddleware(  # type: ignore[arg-type]
            _bare_asgi, limiter=lim, on_denied=lambda scope, d: PlainTextResponse("slow down", status_code=429),
            on_error=lambda scope, e: PlainTextResponse(type(e).__name__, status_code=503)))

    def wsgi_hooks(lim: throttlegate.Limiter) -> Any:
        from werkzeug.wrappers import Response as WerkzeugResponse

        return werkzeug_server(wsgi.RateLimitMiddleware(  # type: ignore[arg-type]
            _bare_wsgi, limiter=lim, on_denied=lambda environ, d: WerkzeugResponse("slow down", status=429),
            on_error=lambda environ, e: WerkzeugResponse(type(e).__name__, status=503)))

    urlconf = django_urlconf("tg_hooks_urls", [path("", lambda r: HttpResponse("ok"))])

    def django_hooks(kind: str) -> Callable[[throttlegate.Limiter], Any]:
        return lambda lim: django_server(kind, urlconf, {
            "limiter": lim,
            "on_denied": lambda req, d: HttpResponse("slow down", status=429),
            "on_error": lambda req, e: HttpResponse(type(e).__name__, status=503),
        })

    for name, make in [("flask", flask_hooks), ("fastapi", fastapi_hooks), ("asgi", asgi_hooks),
                       ("wsgi", wsgi_hooks), ("django-asgi", django_hooks("asgi")),
                       ("django-wsgi", django_hooks("wsgi"))]:
        with make(throttlegate.Limiter(policy)) as base, httpx.Client(base_url=base) as http:
            assert http.get("/").status_code == 200
            r = http.get("/")
            assert (r.status_code, r.text) == (429, "slow down"), name
        broken = throttlegate.Limiter(policy, down, on_backend_error="error", timeout=1)
        with make(broken) as base, httpx.Client(base_url=base) as http:
            r = http.get("/")
            assert (r.status_code, r.text) == (503, "BackendUnavailableError"), name


# ---- Lint warnings at start-up -------------------------------------------------------------------------

LINTED = [
    {"name": "per-ip", "key": "ip:{ip}", "limit": 5, "window": "1m"},
    {"name": "per-user", "key": "user:{user}", "limit": 5, "window": "1m"},
    {"name": "login", "key": "login:{ip}", "match": {"route": "/login"}, "limit": 5, "window": "1m"},
]


@pytest.mark.parametrize("framework", ["flask", "fastapi", "starlette", "asgi", "wsgi", "django-asgi", "django-wsgi"])
def test_startup_warns_of_attributes_never_provided(framework: str, caplog: pytest.LogCaptureFixture) -> None:
    def run(**options: Any) -> list[str]:
        caplog.clear()
        limiter = throttlegate.Limiter(LINTED)
        with caplog.at_level(logging.WARNING, logger="throttlegate"):
            if framework in ("flask", "fastapi", "starlette"):
                server = model_server(framework, limiter) if not options else _with_options(framework, limiter, options)
            elif framework == "asgi":
                server = uvicorn_server(asgi.RateLimitMiddleware(_bare_asgi, limiter=limiter, **options))  # type: ignore[arg-type]
            elif framework == "wsgi":
                server = werkzeug_server(wsgi.RateLimitMiddleware(_bare_wsgi, limiter=limiter, **options))  # type: ignore[arg-type]
            else:
                urlconf = django_urlconf("tg_lint_urls", [path("", lambda r: HttpResponse("ok"))])
                server = django_server(framework.split("-")[1], urlconf, {"limiter": limiter, **options})
            with server as base:
                send(base, "GET", "/")
                send(base, "GET", "/")
        return [r.getMessage() for r in caplog.records if r.name == "throttlegate"]

    warned = run()
    # One warning per rule, once: per-user always, login where no route is given.
    assert len([m for m in warned if "per-user" in m]) == 1, warned
    assert len([m for m in warned if "login" in m]) == (1 if framework in ("asgi", "wsgi") else 0), warned
    assert not [m for m in warned if "per-ip" in m], warned
    # The user's own attributes: no warnings.
    assert run(attributes=lambda request: {"ip": "203.0.113.1"}) == []


def _with_options(framework: str, limiter: throttlegate.Limiter, options: dict[str, Any]) -> Any:
    if framework == "flask":
        app = Flask(__name__)
        Throttle(app, limiter=limiter, **options)
        app.add_url_rule("/", "index", lambda: "ok")
        return werkzeug_server(app)
    if framework == "fastapi":
        fast = FastAPI()
        fast.add_middleware(FastAPIMiddleware, limiter=limiter, **options)
        fast.add_api_route("/", lambda: "ok")
        return uvicorn_server(fast)
    star = Starlette(routes=[Route("/", lambda r: PlainTextResponse("ok"))],
                     middleware=[Middleware(asgi.RateLimitMiddleware, limiter=limiter, **options)])
    return uvicorn_server(star)  # type: ignore[arg-type]


# ---- Bad input: typed errors naming what is wrong ----------------------------------------------------

def test_route_limits_and_the_request_model_refuse_bad_input() -> None:
    limiter = throttlegate.Limiter(STACKED)
    bad: list[tuple[Callable[[], Any], type[Exception], str]] = [
        (lambda: limiter.add_route_limit("5/fortnight", "/login"), throttlegate.InvalidArgumentError,
         'rate "5/fortnight": unknown unit "fortnight"'),
        (lambda: limiter.add_route_limit("5/minute", "/login", methods=["GET /"]), throttlegate.InvalidArgumentError,
         '"GET /" is not an HTTP method'),
        (lambda: limiter.add_route_limit("5/minute", "/login", methods="POST"), throttlegate.InvalidArgumentTypeError,
         "methods: expected a list of str, got a str"),
        (lambda: limiter.add_route_limit("5/minute", "/login", name="per-ip"), throttlegate.InvalidArgumentError,
         '"per-ip" is used by another rule'),
        (lambda: limiter.request_attributes(method="GET", path="/", headers=[("x-api-key",)]),
         throttlegate.InvalidArgumentTypeError, "headers: expected (name, value) pairs, got a tuple of 1 items"),
        (lambda: limiter.request_attributes(method=1, path="/"), throttlegate.InvalidArgumentTypeError,  # type: ignore[arg-type]
         "method: expected str, got int"),
        (lambda: throttlegate.parse_rate("5 per fortnight"), throttlegate.InvalidArgumentError, "unknown unit"),
        # Each idiom validates its rate where it is written.
        (lambda: Throttle(Flask(__name__), limiter=limiter).limit("5/fortnight"), throttlegate.InvalidArgumentError,
         "fortnight"),
        (lambda: RateLimit("five/minute"), throttlegate.InvalidArgumentError, "five/minute"),
        (lambda: ratelimit("5/fortnight"), throttlegate.InvalidArgumentError, "fortnight"),
        (lambda: asgi.RateLimitMiddleware(_bare_asgi, limiter="redis://"), throttlegate.InvalidArgumentTypeError,  # type: ignore[arg-type]
         "limiter: expected a throttlegate.Limiter, got str"),
        (lambda: wsgi.RateLimitMiddleware(_bare_wsgi, limiter=limiter, on_denied="429"),  # type: ignore[arg-type]
         throttlegate.InvalidArgumentTypeError, "on_denied: expected a function, got str"),
        # A route limit with neither the middleware nor a limiter of its own.
        (lambda: asyncio.run(RateLimit("5/minute")(Request({"type": "http", "headers": []}), Response()).__anext__()),
         throttlegate.InvalidArgumentError, "RateLimit: no limiter: add throttlegate.fastapi.RateLimitMiddleware"),
    ]
    for call, kind, message in bad:
        with pytest.raises(kind) as e:
            call()
        assert message in str(e.value)
    # Nothing was added by the refused limits.
    assert limiter.policy.rule_names == ["per-ip"]


def test_fastapi_dependency_on_another_limiter_checks_by_itself() -> None:
    outer = throttlegate.Limiter(STACKED, clock=throttlegate.ManualClock(START_US))
    own = throttlegate.Limiter([{"name": "all", "key": "all", "limit": 100, "window": "1m"}],
                               clock=throttlegate.ManualClock(START_US))
    fast = FastAPI()
    fast.add_middleware(FastAPIMiddleware, limiter=outer)
    fast.add_api_route("/login", lambda: "ok", methods=["POST"],
                       dependencies=[Depends(RateLimit("1/minute", limiter=own, name="login-own"))])
    with uvicorn_server(fast) as base, httpx.Client(base_url=base) as http:
        r = http.post("/login")
        assert r.status_code == 200 and own.policy.rule_names == ["all", "login-own"]
        r = http.post("/login")
        # Answered by the middleware with the shared 429 of the dependency's decision.
        assert r.status_code == 429 and r.headers["content-type"] == "application/problem+json"
        assert r.json()["violated_rules"] == ["login-own"]
        # The middleware's own check counted both requests.
        assert http.get("/").headers["RateLimit-Remaining"] == "2"
