"""TLS to a real redis-server whose certificates come from a private CA made
here (trustme): the CA and client certificate options of `Limiter`, and the
errors when trust is missing or an option is malformed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme

import throttlegate as tg
from conftest import RedisServer, free_port, wait_for_port

RULES = [{"name": "per-ip", "key": "ip:{ip}", "limit": 3, "window": "1m"}]


@dataclass
class TlsRedis:
    """A redis-server with a plain port (for inspection) and a TLS port."""

    server: RedisServer
    tls_port: int
    ca: trustme.CA
    ca_path: Path

    def url(self, host: str = "127.0.0.1") -> str:
        return f"rediss://{host}:{self.tls_port}"

    def exists(self, key: str) -> bool:
        return self.server.command("EXISTS", key) == b":1\r\n"


def start_tls_redis(tmp: Path, ca: trustme.CA, require_client_cert: bool) -> TlsRedis:
    cert = ca.issue_cert("localhost", "127.0.0.1")
    ca_path, cert_path, key_path = tmp / "ca.pem", tmp / "cert.pem", tmp / "key.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    tls_port = free_port()
    server = RedisServer(
        "--tls-port", str(tls_port),
        "--tls-cert-file", str(cert_path),
        "--tls-key-file", str(key_path),
        "--tls-ca-cert-file", str(ca_path),
        "--tls-auth-clients", "yes" if require_client_cert else "no",
    )
    try:
        wait_for_port(tls_port, server.proc, "redis-server (TLS port)")
    except BaseException:
        server.stop()
        raise
    return TlsRedis(server, tls_port, ca, ca_path)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def tls_redis(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    r = start_tls_redis(tmp_path_factory.mktemp("tls"), ca, require_client_cert=False)
    try:
        yield r
    finally:
        r.server.stop()


@pytest.fixture(scope="module")
def mtls_redis(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    r = start_tls_redis(tmp_path_factory.mktemp("mtls"), ca, require_client_cert=True)
    try:
        yield r
    finally:
        r.server.stop()


def limiter(url: str, prefix: str, **tls: Any) -> tg.Limiter:
    return tg.Limiter(RULES, url=url, prefix=prefix, on_backend_error="error", timeout=5.0, **tls)


def assert_refused_over_tls(err: tg.ThrottlegateError) -> None:
    """An untrusted or unauthenticated peer is a backend failure reported by
    the core, never an internal error or an answer."""
    assert err.kind in {"backend", "backend_unavailable"}, f"{err.kind}: {err}"
    assert isinstance(err, (tg.BackendError, tg.BackendUnavailableError))


@pytest.mark.parametrize("form", ["bytes", "str path", "Path", "bytearray"])
def test_private_ca_is_trusted(tls_redis: TlsRedis, prefix: str, form: str) -> None:
    ca_cert: Any = {
        "bytes": tls_redis.ca.cert_pem.bytes(),
        "str path": str(tls_redis.ca_path),
        "Path": tls_redis.ca_path,
        "bytearray": bytearray(tls_redis.ca.cert_pem.bytes()),
    }[form]
    with limiter(tls_redis.url(), prefix, tls_root_cert=ca_cert) as l:
        attrs = {"ip": "192.0.2.1"}
        d = l.check(attrs)
        assert d.allowed and not d.degraded and d.remaining == 2
        # The count really lives on the server behind the TLS port.
        assert tls_redis.exists(l.keys(attrs)[0])
        assert l.peek(attrs).remaining == 1


def test_host_name_is_verified_against_the_certificate(tls_redis: TlsRedis, prefix: str) -> None:
    with limiter(tls_redis.url("localhost"), prefix, tls_root_cert=tls_redis.ca_path) as l:
        l.ping()


@pytest.mark.parametrize("ca_given", ["missing", "another CA"])
def test_untrusted_server_is_an_error_not_plain_text(tls_redis: TlsRedis, prefix: str, ca_given: str) -> None:
    tls: dict[str, Any] = {} if ca_given == "missing" else {"tls_root_cert": trustme.CA().cert_pem.bytes()}
    with limiter(tls_redis.url(), prefix, **tls) as l:
        attrs = {"ip": "192.0.2.2"}
        with pytest.raises(tg.ThrottlegateError) as info:
            l.check(attrs)
        assert_refused_over_tls(info.value)
        assert "certificate" in str(info.value), str(info.value)
        # Nothing reached the server in the clear.
        assert not tls_redis.exists(l.keys(attrs)[0])


def test_untrusted_server_with_on_backend_error_deny_is_a_degraded_denial(tls_redis: TlsRedis, prefix: str) -> None:
    with tg.Limiter(RULES, url=tls_redis.url(), prefix=prefix, on_backend_error="deny", timeout=5.0) as l:
        d = l.check({"ip": "192.0.2.3"})
        assert not d.allowed and d.degraded


def test_mutual_tls_with_a_client_certificate(mtls_redis: TlsRedis, prefix: str, tmp_path: Path) -> None:
    client = mtls_redis.ca.issue_cert("client.example")
    cert_path, key_path = tmp_path / "client.pem", tmp_path / "client.key"
    client.cert_chain_pems[0].write_to_path(str(cert_path))
    client.private_key_pem.write_to_path(str(key_path))
    pairs: list[tuple[Any, Any]] = [
        (client.cert_chain_pems[0].bytes(), client.private_key_pem.bytes()),
        (str(cert_path), key_path),
    ]
    for i, pair in enumerate(pairs):
        attrs = {"ip": f"192.0.2.{10 + i}"}
        with limiter(mtls_redis.url(), prefix, tls_root_cert=mtls_redis.ca_path, tls_client_cert=pair) as l:
            assert l.check(attrs).allowed
            assert mtls_redis.exists(l.keys(attrs)[0])


def test_mutual_tls_async(mtls_redis: TlsRedis, prefix: str) -> None:
    client = mtls_redis.ca.issue_cert("client.example")
    pair = (client.cert_chain_pems[0].bytes(), client.private_key_pem.bytes())

    async def main() -> tg.Decision:
        async with limiter(mtls_redis.url(), prefix, tls_root_cert=mtls_redis.ca_path, tls_client_cert=pair) as l:
            return await l.check_async({"ip": "192.0.2.20"})

    d = asyncio.run(main())
    assert d.allowed and d.remaining == 2


def test_mutual_tls_without_a_client_certificate_is_refused(mtls_redis: TlsRedis, prefix: str) -> None:
    with limiter(mtls_redis.url(), prefix, tls_root_cert=mtls_redis.ca_path) as l:
        attrs = {"ip": "192.0.2.30"}
        with pytest.raises(tg.ThrottlegateError) as info:
            l.check(attrs)
        assert_refused_over_tls(info.value)
        assert not mtls_redis.exists(l.keys(attrs)[0])


@pytest.mark.parametrize(
    ("tls", "error", "words"),
    [
        ({"tls_root_cert": 42}, tg.InvalidArgumentTypeError, ["tls_root_cert", "int"]),
        ({"tls_root_cert": "/nonexistent/ca.pem"}, tg.InvalidArgumentError, ["tls_root_cert", "/nonexistent/ca.pem"]),
        ({"tls_root_cert": "-----BEGIN CERTIFICATE-----\nMIIB\n"}, tg.InvalidArgumentError, ["tls_root_cert", "bytes"]),
        ({"tls_client_cert": b"cert and key"}, tg.InvalidArgumentTypeError, ["tls_client_cert", "pair", "bytes"]),
        ({"tls_client_cert": (b"only a certificate",)}, tg.InvalidArgumentTypeError, ["tls_client_cert", "pair", "1 items"]),
        ({"tls_client_cert": (b"-", 7)}, tg.InvalidArgumentTypeError, ["tls_client_cert: the key", "int"]),
        ({"tls_client_cert": ("/nonexistent/c.pem", b"-")}, tg.InvalidArgumentError, ["the certificate", "/nonexistent/c.pem"]),
    ],
)
def test_malformed_tls_options_are_refused_by_name(tls: dict[str, Any], error: type[Exception], words: list[str]) -> None:
    with pytest.raises(error) as info:
        tg.Limiter(RULES, url="rediss://127.0.0.1:1", **tls)
    for w in words:
        assert w in str(info.value), str(info.value)


def test_unreadable_client_key_is_an_invalid_argument(ca: trustme.CA) -> None:
    cert = ca.issue_cert("client.example").cert_chain_pems[0].bytes()
    with pytest.raises(tg.InvalidArgumentError) as info:
        tg.Limiter(RULES, url="rediss://127.0.0.1:1", tls_client_cert=(cert, b"not a key"))
    assert "key" in str(info.value), str(info.value)
