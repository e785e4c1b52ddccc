"""Fixtures of the `throttlegate serve` suite: the server binary started on
free loopback ports (read back from its start log line), the Python suite's
real redis-server and Redis Cluster, and an outside RLS client
(xds-protos + grpcio)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2

REPO = Path(__file__).resolve().parents[2]

# The Python suite's Redis fixtures, reused as they are.
_spec = importlib.util.spec_from_file_location("tg_redis_fixtures", REPO / "bindings/python/tests/conftest.py")
assert _spec and _spec.loader
redis_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(redis_fixtures)
RedisServer = redis_fixtures.RedisServer
RedisCluster = redis_fixtures.RedisCluster
free_port = redis_fixtures.free_port


def binary() -> str:
    exe = os.environ.get("THROTTLEGATE_BIN") or str(REPO / "target/debug/throttlegate")
    if not Path(exe).exists():
        raise RuntimeError(f"{exe} not found: build it with `cargo build -p throttlegate-cli` (scripts/test-serve.sh does)")
    return exe


class Serve:
    """A `throttlegate serve` process owned by a test."""

    def __init__(self, rules: Path, *args: str, url: str | None = None, grpc_port: int = 0, http_port: int = 0) -> None:
        self.rules = rules
        cmd = [binary(), "serve", "--rules", str(rules), "--grpc", f"127.0.0.1:{grpc_port}", "--http", f"127.0.0.1:{http_port}", *args]
        if url:
            cmd += ["--url", url]
        env = {k: v for k, v in os.environ.items() if not k.startswith("THROTTLEGATE_")}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
        self.logs: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            start = self.wait_log("start", timeout=30)
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            raise
        self.grpc_port = int(start["grpc"].rsplit(":", 1)[1])
        self.http_port = int(start["http"].rsplit(":", 1)[1])
        self.http = f"http://127.0.0.1:{self.http_port}"
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.stub = rls_pb2_grpc.RateLimitServiceStub(self.channel)

    def _read(self) -> None:
        assert self.proc.stderr
        for line in self.proc.stderr:
            with self._cond:
                self.raw.append(line)
                try:
                    self.logs.append(json.loads(line))
                except ValueError:
                    pass
                self._cond.notify_all()

    def wait_log(self, event: str, timeout: float = 10.0, after: int = 0) -> dict[str, Any]:
        """The first log line of `event` among the lines from index `after` on."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for entry in self.logs[after:]:
                    if entry.get("event") == event:
                        return entry
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._cond.wait(0.2)):
                    raise AssertionError(f"no {event!r} log line; stderr: {''.join(self.raw)}")
                self._cond.wait(min(left, 0.2))

    def check(self, domain: str, *descriptors: list[tuple[str, str]] | dict[str, Any], hits: int = 0, **kw: Any) -> Any:
        return self.stub.ShouldRateLimit(request(domain, *descriptors, hits=hits), **kw)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def request(domain: str, *descriptors: list[tuple[str, str]] | dict[str, Any], hits: int = 0) -> Any:
    """A RateLimitRequest: each descriptor a list of (key, value), or a dict
    with `entries` and `hits_addend`."""
    req = rls_pb2.RateLimitRequest(domain=domain, hits_addend=hits)
    for d in descriptors:
        desc = req.descriptors.add()
        entries = d["entries"] if isinstance(d, dict) else d
        for k, v in entries:
            desc.entries.add(key=k, value=v)
        if isinstance(d, dict) and "hits_addend" in d:
            desc.hits_addend.value = d["hits_addend"]
    return req


OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT
_ = ratelimit_pb2


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Any]:
    server = RedisServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[Any]:
    cluster = RedisCluster(3)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    """Start servers: serve(yaml_text or path, *args, url=..., name="rules.yaml")."""
    started: list[Serve] = []

    def start(rules: str | Path, *args: str, url: str | None = None, name: str = "rules.yaml", **kw: Any) -> Serve:
        path = rules if isinstance(rules, Path) else tmp_path / name
        if not isinstance(rules, Path):
            path.write_text(rules)
        s = Serve(path, *args, url=url, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()
