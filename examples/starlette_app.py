"""A Starlette app rate-limited by throttlegate's generic ASGI middleware.

Run it:  python examples/starlette_app.py --port 8000 [--url redis://127.0.0.1:6379/0]
Every request counts against `per-ip` (5 a minute); POST /login also against
`login` (2 per 15 minutes). Denials are 429 with the RateLimit headers,
Retry-After and an application/problem+json body. The same middleware wraps
any ASGI app (Litestar, falcon.asgi.App, a bare callable).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Optional

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import throttlegate
from throttlegate.asgi import RateLimitMiddleware

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


async def index(request: Request) -> JSONResponse:
    return JSONResponse({"hello": "world", "remaining": request.state.ratelimit.remaining})


async def login(request: Request) -> JSONResponse:
    return JSONResponse({"token": "t_123"})


def create_app(
    url: Optional[str] = None,
    trusted_proxies: Sequence[str] = (),
    prefix: Optional[str] = None,
    on_backend_error: Optional[str] = None,
    timeout: Optional[float] = None,
) -> Starlette:
    """The app, limited by a Limiter on `url` (None: the embedded backend)."""
    limiter = throttlegate.Limiter(POLICY, url, prefix=prefix, on_backend_error=on_backend_error,  # type: ignore[arg-type]
                                   timeout=timeout)
    client_ip = throttlegate.ClientIp(trusted_proxies=list(trusted_proxies))
    return Starlette(
        routes=[Route("/", index), Route("/login", login, methods=["POST"])],
        middleware=[Middleware(RateLimitMiddleware, limiter=limiter, client_ip=client_ip)],
    )


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
    # proxy_headers=False: only throttlegate's trusted proxies may speak for a client.
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", proxy_headers=False)


if __name__ == "__main__":
    main()
