"""Shared fixtures: a real redis-server on a free loopback port, started once
per session and killed at the end, and fresh key prefixes."""

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

    def __init__(self) -> None:
        exe = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.dir = tempfile.mkdtemp(prefix="throttlegate-redis-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, self.proc, "redis-server")
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
