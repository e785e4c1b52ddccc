"""examples/flask_app.py and examples/fastapi_app.py, each run as a script
behind its real server (werkzeug, uvicorn) on loopback, driven by a real
HTTP client."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Optional

import httpx
import pytest
import requests

from conftest import REPO, RedisServer, free_port, wait_for_port


@contextmanager
def serve(script: str, url: Optional[str], prefix: str, trusted_proxy: bool) -> Iterator[str]:
    port = free_port()
    args = [sys.executable, str(REPO / "examples" / script), "--port", str(port), "--prefix", prefix]
    if url:
        args += ["--url", url]
    if trusted_proxy:
        args += ["--trusted-proxy", "127.0.0.1"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_port(port, proc, script)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()
        if proc.stderr:
            proc.stderr.close()


def check_denial(status: int, headers: httpx.Headers | requests.structures.CaseInsensitiveDict[str], body: str,
                 rule: str) -> None:
    assert status == 429
    assert int(headers["Retry-After"]) >= 1
    assert headers["RateLimit-Remaining"] == "0"
    assert f'"{rule}"' in headers["RateLimit-Policy"]
    assert headers["Content-Type"].startswith("application/problem+json")
    problem = json.loads(body)
    assert problem["status"] == 429 and problem["violated_rules"] == [rule]


@pytest.mark.parametrize("mode", ["embedded", "redis-behind-proxy"])
def test_flask_example(mode: str, prefix: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("redis_server").url if mode != "embedded" else None
    proxied = mode != "embedded"
    with serve("flask_app.py", url, prefix, proxied) as base, requests.Session() as http:
        # Forwarded headers count only through a trusted proxy: without one,
        # this header is a spoof and every request is the socket's address.
        client = {"X-Forwarded-For": "198.51.100.7"}
        for _ in range(3):
            assert http.get(f"{base}/health", headers=client).status_code == 200
        assert "RateLimit-Limit" not in http.get(f"{base}/health", headers=client).headers
        for _ in range(2):
            r = http.post(f"{base}/login", headers=client)
            assert r.status_code == 200
        r = http.post(f"{base}/login", headers=client)
        check_denial(r.status_code, r.headers, r.text, "login")
        for remaining in (2, 1, 0):
            r = http.get(f"{base}/", headers=client)
            assert r.status_code == 200 and r.json() == {"hello": "world"}
            assert r.headers["RateLimit-Limit"] == "5"
            assert r.headers["RateLimit-Remaining"] == str(remaining)
        r = http.get(f"{base}/", headers=client)
        check_denial(r.status_code, r.headers, r.text, "per-ip")
        other = http.get(f"{base}/", headers={"X-Forwarded-For": "198.51.100.8"})
        if proxied:
            assert other.status_code == 200 and other.headers["RateLimit-Remaining"] == "4"
        else:
            assert other.status_code == 429
        check_metrics(http.get(f"{base}/metrics"), denied_by="per-ip")
        check_generate(lambda prompt: http.post(f"{base}/generate", json={"prompt": prompt}, headers={"X-Tenant": "t1"}))


def check_generate(post) -> None:  # type: ignore[no-untyped-def]
    """/generate checks at an estimate of 100 tokens and settles at the real cost after the work."""
    r = post("one two three")
    assert r.status_code == 200 and r.json() == {"estimated": 100, "used": 30, "settled": 1}
    r = post("w " * 15)  # 150: 50 more than the estimate, taken after the response
    assert r.status_code == 200 and r.json() == {"estimated": 100, "used": 150, "settled": 1}
    r = post("hello")  # 20 of 200 left: the estimate of 100 does not fit
    assert r.status_code == 429 and r.headers["RateLimit-Remaining"] == "20"
    assert r.json()["violated_rules"] == ["tokens"]


def check_metrics(r: httpx.Response | requests.Response, denied_by: str) -> None:
    """/metrics serves the limiter's metrics, unlimited, for Prometheus."""
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("application/openmetrics-text")
    assert "RateLimit-Limit" not in r.headers
    assert f'throttlegate_decisions_total{{rule="{denied_by}",outcome="denied"}} ' in r.text
    assert "198.51.100" not in r.text
    assert r.text.endswith("# EOF\n")


@pytest.mark.parametrize("mode", ["embedded", "redis-behind-proxy"])
def test_fastapi_example(mode: str, prefix: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("redis_server").url if mode != "embedded" else None
    proxied = mode != "embedded"
    with serve("fastapi_app.py", url, prefix, proxied) as base, httpx.Client(base_url=base) as http:
        a = {"X-Forwarded-For": "198.51.100.7"}
        # The README's login rule (a route) applies: the third POST /login is denied.
        for _ in range(2):
            assert http.post("/login", headers=a).status_code == 200
        r = http.post("/login", headers=a)
        check_denial(r.status_code, r.headers, r.text, "login")
        # The denial consumed nothing: 3 of per-ip's 5 are left.
        for remaining in (2, 1, 0):
            r = http.get("/", headers=a)
            assert r.status_code == 200 and r.json() == {"hello": "world"}
            assert r.headers["RateLimit-Remaining"] == str(remaining)
        r = http.get("/", headers=a)
        check_denial(r.status_code, r.headers, r.text, "per-ip")
        for _ in range(2):
            check_metrics(http.get("/metrics", headers=a), denied_by="per-ip")
        check_generate(lambda prompt: http.post("/generate", json={"prompt": prompt}, headers={"X-Tenant": "t1"}))
        if not proxied:
            return
        b = {"X-Forwarded-For": "198.51.100.8", "X-API-Key": "k_1"}
        for remaining in (2, 1, 0):
            r = http.get("/items", headers=b)
            assert r.status_code == 200 and r.json() == {"remaining": remaining}
            assert r.headers["RateLimit-Limit"] == "3"
        r = http.get("/items", headers=b)
        check_denial(r.status_code, r.headers, r.text, "per-key")
        assert r.headers["Retry-After"] == "1"
        # The route limit written on /login (3 an hour) is checked with the
        # file's rules: c's third login is denied by `login` (2 per 15 min).
        c = {"X-Forwarded-For": "198.51.100.9"}
        for _ in range(2):
            r = http.post("/login", headers=c)
            assert r.status_code == 200 and '"route.' in r.headers["RateLimit-Policy"]
        check_denial_any(http.post("/login", headers=c), "login")


def check_denial_any(r: httpx.Response, rule: str) -> None:
    """A denial naming ``rule`` among the rules it violated."""
    assert r.status_code == 429 and r.headers["Content-Type"].startswith("application/problem+json")
    assert rule in r.json()["violated_rules"]
