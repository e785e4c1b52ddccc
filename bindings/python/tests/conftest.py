"""Shared fixtures: a real redis-server on a free loopback port and a real
local Redis Cluster, each started once per session (the cluster only when a
test asks for it) and killed at the end, and fresh key prefixes."""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout} s")


class RedisServer:
    """A redis-server process owned by the test session."""

    def __init__(self, *extra: str) -> None:
        # $THROTTLEGATE_REDIS_SERVER: another Redis-compatible server (the Valkey pass).
        exe = os.environ.get("THROTTLEGATE_REDIS_SERVER") or shutil.which("redis-server") or "/usr/bin/redis-server"
        self.dir = tempfile.mkdtemp(prefix="throttlegate-redis-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir, *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_port(self.port, self.proc, "redis-server")
        except BaseException:
            self.stop()
            raise
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def command(self, *args: str) -> bytes:
        """Send one command in RESP and return the raw reply (for test setup only)."""
        payload = f"*{len(args)}\r\n".encode() + b"".join(
            f"${len(a.encode())}\r\n".encode() + a.encode() + b"\r\n" for a in args
        )
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(payload)
            return s.recv(65536)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisSentinel:
    """One redis-sentinel (Debian's package) monitoring `primary` as service
    "tg" (quorum 1), on a free loopback port; `url` is its Sentinel URL."""

    def __init__(self, primary: RedisServer) -> None:
        exe = shutil.which("redis-sentinel") or "/usr/bin/redis-sentinel"
        self.dir = tempfile.mkdtemp(prefix="throttlegate-sentinel-")
        self.port = free_port()
        conf = Path(self.dir) / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\n"
            f"sentinel monitor tg 127.0.0.1 {primary.port} 1\n"
        )
        self.proc = subprocess.Popen([exe, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_port(self.port, self.proc, "redis-sentinel")
        except BaseException:
            self.stop()
            raise
        self.url = f"redis+sentinel://127.0.0.1:{self.port}/tg"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisCluster:
    """A local Redis Cluster owned by the test session: `primaries` primaries
    with one replica each, made by `redis-cli --cluster create`."""

    def __init__(self, primaries: int = 3) -> None:
        self.nodes: list[RedisServer] = []
        try:
            for _ in range(primaries * 2):
                self.nodes.append(self._node())
            addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
            cli = os.environ.get("THROTTLEGATE_REDIS_CLI") or shutil.which("redis-cli") or "/usr/bin/redis-cli"
            subprocess.run(
                [cli, "--cluster", "create", *addrs, "--cluster-replicas", "1", "--cluster-yes"],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60,
            )
            self._wait_ok(timeout=30.0)
        except BaseException:
            self.stop()
            raise
        self.url = "redis+cluster://" + ",".join(addrs)

    @staticmethod
    def _node() -> RedisServer:
        # Two ports per node, each free only when it was picked: another
        # process on this shared machine may take one first, so retry.
        attempts = 3
        while True:
            try:
                return RedisServer(
                    "--cluster-enabled", "yes",
                    # The default bus port (port + 10000) may be taken or,
                    # above 55535, not exist.
                    "--cluster-port", str(free_port()),
                    "--cluster-node-timeout", "1000",
                    "--cluster-replica-validity-factor", "0",
                    "--repl-diskless-sync-delay", "0",
                )
            except RuntimeError:
                attempts -= 1
                if attempts == 0:
                    raise

    def _wait_ok(self, timeout: float) -> None:
        """Until every node serves all 16384 slots, the cluster refuses some keys."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                infos = [n.command("CLUSTER", "INFO") for n in self.nodes]
            except OSError:
                infos = []
            if infos and all(b"cluster_state:ok" in i and b"cluster_slots_ok:16384" in i for i in infos):
                return
            time.sleep(0.1)
        raise RuntimeError(f"the Redis Cluster was not ok within {timeout} s")

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    cluster = RedisCluster(3)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    try:
        yield server
    finally:
        server.stop()


_counter = itertools.count()


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses."""
    return f"t{os.getpid()}-{next(_counter)}-{uuid.uuid4().hex[:8]}:"


@pytest.fixture(params=["memory", "redis"])
def backend_url(request: pytest.FixtureRequest) -> str | None:
    """Each test using it runs against the embedded backend and a real Redis."""
    if request.param == "memory":
        return None
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url
