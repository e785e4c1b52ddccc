"""throttlegate.flask and throttlegate.fastapi options, served by werkzeug and
uvicorn on loopback in this process and called over HTTP."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from fastapi import Depends, FastAPI
from flask import Flask
from starlette.requests import Request
from werkzeug.serving import make_server

import throttlegate
from conftest import free_port
from throttlegate.fastapi import RateLimit, RateLimitMiddleware
from throttlegate.flask import Throttle


@contextmanager
def werkzeug_server(app: Flask) -> Iterator[str]:
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join()


@contextmanager
def uvicorn_server(app: FastAPI) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join()


def test_flask_decorator_attributes_cost_and_legacy_headers() -> None:
    limiter = throttlegate.Limiter([{"name": "per-user", "key": "user:{user}", "limit": 5, "window": "1m"}])
    app = Flask(__name__)
    throttle = Throttle(app, limiter=limiter, every_request=False, legacy_headers=True)

    @app.get("/free")
    def free() -> str:
        return "free"

    @app.get("/costly")
    @throttle.limit(attributes=lambda req: {"user": req.args.get("user")}, cost=lambda req: int(req.args["cost"]))
    def costly() -> str:
        return "done"

    with werkzeug_server(app) as base, httpx.Client(base_url=base) as http:
        for _ in range(3):
            r = http.get("/free")
            assert r.status_code == 200 and "RateLimit" not in r.headers
        r = http.get("/costly", params={"user": "u1", "cost": 3})
        assert r.status_code == 200 and r.text == "done"
        assert r.headers["RateLimit-Remaining"] == "2" and r.headers["X-RateLimit-Remaining"] == "2"
        r = http.get("/costly", params={"user": "u1", "cost": 3})
        assert r.status_code == 429 and r.headers["X-RateLimit-Limit"] == "5"
        assert http.get("/costly", params={"user": "u2", "cost": 3}).status_code == 200
        # No user: the rule does not apply, nothing to limit or report.
        r = http.get("/costly", params={"cost": 1})
        assert r.status_code == 200 and "RateLimit-Limit" not in r.headers


def test_flask_ipv6_clients_grouped_by_prefix() -> None:
    limiter = throttlegate.Limiter([{"name": "per-ip", "key": "ip:{ip}", "limit": 2, "window": "1m"}])
    app = Flask(__name__)
    seen: list[str] = []

    @app.get("/")
    def index() -> str:
        return "ok"

    def attrs(req):  # type: ignore[no-untyped-def]
        ip = throttlegate.ClientIp(["127.0.0.1"]).client_ip(req.remote_addr, None, req.headers.get("X-Forwarded-For"))
        seen.append(ip)
        return {"ip": ip}

    Throttle(app, limiter=limiter, attributes=attrs)
    with werkzeug_server(app) as base, httpx.Client(base_url=base) as http:
        for host in ("2001:db8:1:2::1", "2001:db8:1:2::ffff"):
            assert http.get("/", headers={"X-Forwarded-For": host}).status_code == 200
        assert http.get("/", headers={"X-Forwarded-For": "2001:db8:1:2::77"}).status_code == 429
        assert http.get("/", headers={"X-Forwarded-For": "2001:db8:1:3::1"}).status_code == 200
    assert seen[0] == "2001:db8:1:2::/64"


def test_fastapi_middleware_async_attributes_and_dependency_defaults() -> None:
    limiter = throttlegate.Limiter([
        {"name": "per-tenant", "key": "t:{tenant}", "limit": 2, "window": "1m"},
        {"name": "per-ip", "key": "ip:{ip}", "match": {"path": "/dep"}, "limit": 1, "window": "1m"},
    ])

    async def tenant(request: Request) -> dict[str, str | None]:
        return {"tenant": request.headers.get("x-tenant")}

    app = FastAPI()
    app.add_middleware(RateLimitMiddleware, limiter=limiter, attributes=tenant, legacy_headers=True)
    per_ip = RateLimit(limiter)

    @app.get("/")
    async def index() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/dep")
    async def dep(decision: throttlegate.Decision = Depends(per_ip)) -> dict[str, str | None]:
        return {"rule": decision.rule}

    with uvicorn_server(app) as base, httpx.Client(base_url=base) as http:
        assert http.get("/").headers.get("RateLimit-Limit") is None
        for remaining in ("1", "0"):
            r = http.get("/", headers={"x-tenant": "acme"})
            assert r.status_code == 200 and r.headers["X-RateLimit-Remaining"] == remaining
        r = http.get("/", headers={"x-tenant": "acme"})
        assert r.status_code == 429 and r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["violated_rules"] == ["per-tenant"]
        r = http.get("/dep")
        assert r.status_code == 200 and r.json() == {"rule": "per-ip"}
        assert r.headers["RateLimit-Policy"] == '"per-ip";q=1;w=60'
        r = http.get("/dep")
        # The same answer as the middleware's: problem+json, not {"detail": ...}.
        assert r.status_code == 429 and r.headers["content-type"] == "application/problem+json"
        assert r.json()["violated_rules"] == ["per-ip"]
        assert r.headers["Retry-After"] == "60"
