"""Every Python integration gives back the concurrency slot a request holds
when its response is finished: after a normal response, after the handler
raised, and when the client disconnects in the middle of a streamed
response. Each framework is served by its real server (werkzeug, uvicorn)
on loopback and checks against a real Redis (and the embedded backend) with one slot per client
(``limit = 1``) and a lease far longer than the test: a next request is
admitted only because the integration released the slot."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, Callable

import pytest
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.urls import path
from fastapi import Depends, FastAPI
from flask import Flask, Response
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route

import throttlegate
from conftest import RedisServer
from test_frameworks_http import django_server, django_urlconf
from test_integrations import uvicorn_server, werkzeug_server
from throttlegate import asgi, wsgi
from throttlegate.fastapi import RateLimit
from throttlegate.fastapi import RateLimitMiddleware as FastAPIMiddleware
from throttlegate.flask import Throttle

# One slot per client address; a lease no test outlives.
POLICY = [{"name": "one-at-a-time", "key": "busy:{ip}", "algorithm": "concurrency", "limit": 1, "lease": "10m"}]
FRAMEWORKS = ["flask", "fastapi", "fastapi-dependency", "starlette", "asgi", "wsgi", "django-asgi", "django-wsgi"]
# How long a released slot may take to be seen free (the release runs as the response ends).
SETTLE_S = 10.0


class Boom(Exception):
    """What the failing handler raises."""


def chunks_until_gone() -> Iterator[bytes]:
    """A stream's body: one chunk every 20 ms until the server finds the client gone."""
    for _ in range(3000):
        yield b"chunk\n"
        time.sleep(0.02)


async def chunks_until_gone_async() -> AsyncIterator[bytes]:
    for _ in range(3000):
        yield b"chunk\n"
        await asyncio.sleep(0.02)


def server_for(framework: str, limiter: throttlegate.Limiter) -> Any:
    """A server with ``/ok``, ``/boom`` (raises) and ``/stream`` (streams until the client goes)."""
    if framework == "flask":
        app = Flask(__name__)
        Throttle(app, limiter=limiter)

        @app.get("/ok")
        def ok() -> str:
            return "ok"

        @app.get("/boom")
        def boom() -> str:
            raise Boom("boom")

        @app.get("/stream")
        def stream() -> Response:
            return Response(chunks_until_gone(), mimetype="text/plain")

        return werkzeug_server(app)
    if framework == "fastapi-dependency":
        # The route's own RateLimit dependency checks (no middleware).
        fast = FastAPI(dependencies=[Depends(RateLimit(limiter=limiter))])

        @fast.get("/ok")
        async def ok_route() -> PlainTextResponse:
            return PlainTextResponse("ok")

        @fast.get("/boom")
        async def boom_route() -> PlainTextResponse:
            raise Boom("boom")

        @fast.get("/stream")
        async def stream_route() -> StreamingResponse:
            return StreamingResponse(chunks_until_gone_async(), media_type="text/plain")

        return uvicorn_server(fast)
    if framework in ("fastapi", "starlette", "asgi"):
        async def ok(request: Request) -> PlainTextResponse:
            return PlainTextResponse("ok")

        async def boom(request: Request) -> PlainTextResponse:
            raise Boom("boom")

        async def stream(request: Request) -> StreamingResponse:
            return StreamingResponse(chunks_until_gone_async(), media_type="text/plain")

        routes = [Route("/ok", ok), Route("/boom", boom), Route("/stream", stream)]
        if framework == "fastapi":
            fast = FastAPI(routes=routes)
            fast.add_middleware(FastAPIMiddleware, limiter=limiter)
            return uvicorn_server(fast)
        if framework == "starlette":
            return uvicorn_server(Starlette(routes=routes,  # type: ignore[arg-type]
                                            middleware=[Middleware(asgi.RateLimitMiddleware, limiter=limiter)]))
        # The generic middleware around the bare app (no Starlette error middleware outside it).
        return uvicorn_server(asgi.RateLimitMiddleware(Starlette(routes=routes), limiter=limiter))  # type: ignore[arg-type]
    if framework == "wsgi":
        def bare(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            target = environ["PATH_INFO"]
            if target == "/boom":
                raise Boom("boom")
            start_response("200 OK", [("Content-Type", "text/plain")])
            return chunks_until_gone() if target == "/stream" else [b"ok"]

        return werkzeug_server(wsgi.RateLimitMiddleware(bare, limiter=limiter))  # type: ignore[arg-type]
    kind = framework.split("-")[1]

    def ok_view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    def boom_view(request: HttpRequest) -> HttpResponse:
        raise Boom("boom")

    def stream_view(request: HttpRequest) -> StreamingHttpResponse:
        return StreamingHttpResponse(chunks_until_gone_async() if kind == "asgi" else chunks_until_gone())

    urlconf = django_urlconf(f"tg_release_urls_{kind}",
                             [path("ok", ok_view), path("boom", boom_view), path("stream", stream_view)])
    return django_server(kind, urlconf, {"limiter": limiter})


def get(base: str, target: str) -> int:
    """The status of one GET over a fresh connection (0 when the server dropped it)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0


def open_stream(base: str) -> tuple[socket.socket, bytes]:
    """A connection asking for ``/stream``, and its response read up to the
    first chunk (or the whole head of a refusal)."""
    host, port = base.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall(f"GET /stream HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head or (head.startswith(b"HTTP/1.1 200") and b"chunk" not in head):
        got = s.recv(65536)
        assert got, head
        head += got
    return s, head


def once_admitted(base: str, target: str) -> int:
    """The status of ``target`` once it is not refused for the slot (429), tried
    for SETTLE_S: the previous response's slot may still be on its way back (a
    server closes a response after the client has it). 429 if always refused."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        status = get(base, target)
        if status != 429 or time.monotonic() > deadline:
            return status
        time.sleep(0.02)


def admitted_again(base: str) -> bool:
    """Whether ``/ok`` is admitted within SETTLE_S (each refused try holds nothing)."""
    status = once_admitted(base, "/ok")
    assert status in (200, 429), status
    return status == 200


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_slot_is_released_after_a_response_an_error_and_a_disconnect(
    framework: str, backend_url: str | None, prefix: str
) -> None:
    limiter = throttlegate.Limiter(POLICY, backend_url, prefix=prefix)
    with server_for(framework, limiter) as base:
        # A normal response.
        assert get(base, "/ok") == 200
        assert admitted_again(base), f"{framework}: the slot of a normal response was not released"

        # The handler raised: the framework's 500 (or the server's, when nothing catches it).
        assert once_admitted(base, "/boom") in (0, 500)
        assert admitted_again(base), f"{framework}: the slot of a failed request was not released"

        # A streamed response the client abandons: the slot is held while it
        # streams (a second request is refused), and given back when the
        # server finds the client gone.
        deadline = time.monotonic() + SETTLE_S
        while True:
            s, head = open_stream(base)
            if not head.startswith(b"HTTP/1.1 429") or time.monotonic() > deadline:
                break
            s.close()  # the last /ok's slot is still on its way back
            time.sleep(0.02)
        with s:
            assert head.startswith(b"HTTP/1.1 200"), head
            assert get(base, "/ok") == 429, f"{framework}: the slot was not held while streaming"
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        assert admitted_again(base), f"{framework}: the slot of an abandoned stream was not released"
    limiter.close()


def test_rate_rules_alone_hold_no_lease(redis_server: RedisServer, prefix: str) -> None:
    limiter = throttlegate.Limiter([{"name": "per-ip", "key": "ip:{ip}", "limit": 5, "window": "1m"}],
                                   redis_server.url, prefix=prefix)
    d = limiter.check({"ip": "203.0.113.7"})
    assert d.allowed and d.lease_id is None
    # Nothing to release: no round trip, nothing released.
    assert limiter.release(d) == 0


def test_a_failed_release_is_not_raised_into_the_server(prefix: str) -> None:
    # The lease of a closed limiter cannot be released: the response is answered all the same.
    limiter = throttlegate.Limiter(POLICY, prefix=prefix)
    app = Flask(__name__)
    Throttle(app, limiter=limiter)
    done = threading.Event()

    @app.get("/ok")
    def ok() -> str:
        limiter.close()
        done.set()
        return "ok"

    with werkzeug_server(app) as base:
        assert get(base, "/ok") == 200
    assert done.is_set()
