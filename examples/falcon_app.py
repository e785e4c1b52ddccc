"""A Falcon (WSGI) app rate-limited by throttlegate's generic WSGI middleware.

Run it:  python examples/falcon_app.py --port 8000 [--url redis://127.0.0.1:6379/0]
Every request counts against `per-ip` (5 a minute); POST /login also against
`login` (2 per 15 minutes). Denials are 429 with the RateLimit headers,
Retry-After and an application/problem+json body. The same middleware wraps
any WSGI app (Bottle, Pyramid, a bare callable); served here by the standard
library's wsgiref, one thread per request.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from socketserver import ThreadingMixIn
from typing import Optional
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import falcon

import throttlegate
from throttlegate.wsgi import DECISION_KEY, RateLimitMiddleware, WSGIApp

POLICY = {
    "rules": [
        {"name": "per-ip", "key": "ip:{ip}", "limit": 5, "window": "1m"},
        {
            "name": "login",
            "key": "login:{ip}",
            "match": {"path": "/login", "method": ["POST"]},
            "limit": 2,
            "window": "15m",
        },
    ]
}


class Index:
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = {"hello": "world", "remaining": req.env[DECISION_KEY].remaining}


class Login:
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = {"token": "t_123"}


def create_app(
    url: Optional[str] = None,
    trusted_proxies: Sequence[str] = (),
    prefix: Optional[str] = None,
    on_backend_error: Optional[str] = None,
    timeout: Optional[float] = None,
) -> WSGIApp:
    """The app, limited by a Limiter on `url` (None: the embedded backend)."""
    limiter = throttlegate.Limiter(POLICY, url, prefix=prefix, on_backend_error=on_backend_error,  # type: ignore[arg-type]
                                   timeout=timeout)
    app = falcon.App()
    app.add_route("/", Index())
    app.add_route("/login", Login())
    client_ip = throttlegate.ClientIp(trusted_proxies=list(trusted_proxies))
    return RateLimitMiddleware(app, limiter=limiter, client_ip=client_ip)


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--url", default=os.environ.get("THROTTLEGATE_URL"))
    parser.add_argument("--prefix", default=None)
    parser.add_argument("--timeout", type=float, default=None, help="seconds")
    parser.add_argument("--on-backend-error", choices=["allow", "deny", "error"], default=None)
    parser.add_argument("--trusted-proxy", action="append", default=[])
    args = parser.parse_args()
    app = create_app(args.url, args.trusted_proxy, args.prefix, args.on_backend_error, args.timeout)
    with make_server(args.host, args.port, app, server_class=_ThreadingServer, handler_class=_QuietHandler) as server:
        server.serve_forever()


if __name__ == "__main__":
    main()
