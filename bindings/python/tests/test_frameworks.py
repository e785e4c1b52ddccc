"""examples/django_app (under uvicorn and gunicorn), examples/starlette_app.py
(throttlegate.asgi) and examples/falcon_app.py (throttlegate.wsgi), each run
as a script behind its real server on loopback and driven over HTTP: limits,
denials, spoofed forwarded headers, a Redis that is down, and (async Django) a
slow Redis that does not hold up other requests."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Optional

import httpx
import pytest

from conftest import REPO, RedisServer, free_port, wait_for_port

EXAMPLES = REPO / "examples"
# (script, extra arguments): every one has the same per-ip and login rules
# as examples/flask_app.py.
APPS = {
    "django-asgi": ("django_app/serve.py", ["--server", "asgi"]),
    "django-wsgi": ("django_app/serve.py", ["--server", "wsgi"]),
    "starlette": ("starlette_app.py", []),
    "falcon": ("falcon_app.py", []),
}


@contextmanager
def serve(app: str, *, url: Optional[str] = None, prefix: Optional[str] = None, trusted_proxy: bool = False,
          on_backend_error: Optional[str] = None, timeout: Optional[float] = None) -> Iterator[str]:
    script, extra = APPS[app]
    port = free_port()
    args = [sys.executable, str(EXAMPLES / script), "--port", str(port), *extra]
    if url:
        args += ["--url", url]
    if prefix:
        args += ["--prefix", prefix]
    if trusted_proxy:
        args += ["--trusted-proxy", "127.0.0.1"]
    if on_backend_error:
        args += ["--on-backend-error", on_backend_error]
    if timeout is not None:
        args += ["--timeout", str(timeout)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_port(port, proc, app)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


def answers_ping(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.settimeout(0.3)
        s.sendall(b"PING\r\n")
        try:
            return s.recv(64).startswith(b"+PONG")
        except TimeoutError:
            return False


def check_denial(r: httpx.Response, rule: str) -> None:
    assert r.status_code == 429
    assert int(r.headers["Retry-After"]) >= 1
    assert r.headers["RateLimit-Remaining"] == "0"
    assert f'"{rule}"' in r.headers["RateLimit-Policy"]
    assert r.headers["Content-Type"] == "application/problem+json"
    problem = json.loads(r.text)
    assert problem["status"] == 429 and problem["violated_rules"] == [rule]


@pytest.mark.parametrize("app", list(APPS))
@pytest.mark.parametrize("mode", ["embedded", "redis-behind-proxy"])
def test_example_limits_clients(app: str, mode: str, prefix: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("redis_server").url if mode != "embedded" else None
    proxied = mode != "embedded"
    with serve(app, url=url, prefix=prefix, trusted_proxy=proxied) as base, httpx.Client(base_url=base) as http:
        # Without a trusted proxy this header is a spoof: every request is
        # the socket's address, whatever it claims.
        client = {"X-Forwarded-For": "198.51.100.7"}
        for _ in range(2):
            assert http.post("/login", headers=client).status_code == 200
        check_denial(http.post("/login", headers=client), "login")
        for remaining in (2, 1, 0):
            r = http.get("/", headers=client)
            assert r.status_code == 200 and r.json() == {"hello": "world", "remaining": remaining}
            assert r.headers["RateLimit-Limit"] == "5"
            assert r.headers["RateLimit-Remaining"] == str(remaining)
            assert r.headers["RateLimit-Policy"] == '"per-ip";q=5;w=60'
            assert "Retry-After" not in r.headers
        check_denial(http.get("/", headers=client), "per-ip")
        other = http.get("/", headers={"X-Forwarded-For": "198.51.100.8"})
        if proxied:
            assert other.status_code == 200 and other.headers["RateLimit-Remaining"] == "4"
        else:
            check_denial(other, "per-ip")


@pytest.mark.parametrize("server", ["asgi", "wsgi"])
def test_django_example_decorators(server: str, prefix: str, redis_server: RedisServer) -> None:
    with serve(f"django-{server}", url=redis_server.url, prefix=prefix, trusted_proxy=True) as base, \
            httpx.Client(base_url=base) as http:
        # Exempt: never checked, no headers.
        for _ in range(7):
            r = http.get("/health")
            assert r.status_code == 200 and "RateLimit-Limit" not in r.headers
        # The decorator's user id: each user has 2 exports, checked in the
        # same call as per-ip (the middleware checks once).
        for remaining in (1, 0):
            r = http.get("/export", headers={"X-User": "u1", "X-Forwarded-For": "198.51.100.20"})
            assert r.status_code == 200 and r.headers["RateLimit-Remaining"] == str(remaining)
            assert r.headers["RateLimit-Policy"] == '"per-ip";q=5;w=60, "export-per-user";q=2;w=3600'
        check_denial(http.get("/export", headers={"X-User": "u1", "X-Forwarded-For": "198.51.100.21"}),
                     "export-per-user")
        # Denied, so nothing was counted: the client still has 3 of its 5.
        r = http.get("/report", headers={"X-Forwarded-For": "198.51.100.20"})
        assert r.status_code == 200 and r.json() == {"report": "ready"}
        assert r.headers["RateLimit-Remaining"] == "2"
        assert http.get("/export", headers={"X-User": "u2", "X-Forwarded-For": "198.51.100.22"}).status_code == 200


@pytest.mark.parametrize("app", list(APPS))
def test_example_with_redis_down(app: str) -> None:
    # Nothing listens on this port: every check fails at once.
    down = f"redis://127.0.0.1:{free_port()}/0"
    with serve(app, url=down, on_backend_error="allow") as base, httpx.Client(base_url=base) as http:
        for _ in range(7):
            r = http.get("/")
            assert r.status_code == 200
            # Degraded: no count is claimed that Redis never gave.
            assert "RateLimit-Remaining" not in r.headers and "RateLimit" not in r.headers
    with serve(app, url=down, on_backend_error="deny") as base, httpx.Client(base_url=base) as http:
        r = http.get("/")
        assert r.status_code == 429 and r.headers["Retry-After"] == "1"
        assert r.headers["Content-Type"] == "application/problem+json"
        assert r.json()["degraded"] is True and "RateLimit-Remaining" not in r.headers
    with serve(app, url=down, on_backend_error="error") as base, httpx.Client(base_url=base) as http:
        assert http.get("/").status_code == 500


class WatchingProxy:
    """A TCP relay in front of a redis-server that tells when the app has
    sent a command through it (to know a check is waiting on Redis)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.sent = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_app: bool) -> None:
        try:
            while data := src.recv(65536):
                if from_app:
                    self.sent.set()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


def test_async_django_serves_others_while_redis_is_slow(prefix: str) -> None:
    redis = RedisServer("--enable-debug-command", "yes")
    proxy = WatchingProxy(redis.port)
    try:
        url = f"redis://127.0.0.1:{proxy.port}/0"
        with serve("django-asgi", url=url, prefix=prefix, timeout=10) as base, \
                httpx.Client(base_url=base, timeout=30) as http:
            assert http.get("/").status_code == 200  # connected
            sleeping = threading.Thread(target=redis.command, args=("DEBUG", "SLEEP", "3"))
            sleeping.start()
            slow: list[httpx.Response] = []

            def wait_on_redis() -> None:
                with httpx.Client(base_url=base, timeout=30) as other:
                    slow.append(other.get("/"))

            waiting = threading.Thread(target=wait_on_redis)
            try:
                # The server is asleep once a PING goes unanswered for a while.
                while answers_ping(redis.port):
                    assert sleeping.is_alive(), "DEBUG SLEEP returned before a PING went unanswered"
                proxy.sent.clear()
                waiting.start()
                # Once its check has gone to Redis, the first request waits on
                # it; this one needs no Redis and is served meanwhile by the
                # same event loop.
                assert proxy.sent.wait(10), "the check never reached Redis"
                r = http.get("/health")
                assert r.status_code == 200 and r.json() == {"ok": True}
                # Served while Redis still sleeps: nothing waited for it.
                assert sleeping.is_alive() and not answers_ping(redis.port), "/health waited for Redis"
                assert not slow, "the checked request should still wait on Redis"
            finally:
                sleeping.join()
                if waiting.ident is not None:
                    waiting.join()
            assert slow and slow[0].status_code == 200 and slow[0].headers["RateLimit-Remaining"] == "3"
    finally:
        proxy.close()
        redis.stop()
