"""A Starlette app rate-limited by throttlegate's generic ASGI middleware.

Run it:  python examples/starlette_app.py --port 8000 [--url redis://127.0.0.1:6379/0]
Every request counts against `per-ip` (5 a minute); POST /login also against
`login` (2 per 15 minutes). Denials are 429 with the RateLimit headers,
Retry-After and an application/problem+json body. The same middleware wraps
any ASGI app (Litestar, falcon.asgi.App, a bare callable).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from throttlegate.asgi import RateLimitMiddleware

import _common  # examples/_common.py: the policy and the command line


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
    limiter = _common.limiter(url, prefix, on_backend_error, timeout)
    return Starlette(
        routes=[Route("/", index), Route("/login", login, methods=["POST"])],
        middleware=[Middleware(RateLimitMiddleware, limiter=limiter, client_ip=_common.client_ip(trusted_proxies))],
    )


def main() -> None:
    args = _common.parse_args(__doc__)
    app = create_app(args.url, args.trusted_proxy, args.prefix, args.on_backend_error, args.timeout)
    # proxy_headers=False: only throttlegate's trusted proxies may speak for a client.
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", proxy_headers=False)


if __name__ == "__main__":
    main()
