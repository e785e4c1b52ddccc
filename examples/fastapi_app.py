"""A FastAPI app rate-limited by throttlegate, without blocking the event loop.

Run it:  python examples/fastapi_app.py --port 8000 [--url redis://127.0.0.1:6379/0]
The middleware counts every request against `per-ip` (5 a minute); POST
/login also against `login` (2 per 15 minutes, a rule matching the route)
and its own route limit (`RateLimit("3/hour")`), in the same check; /items
also depends on `per-key` (a token bucket of 3, refilled at 1 a second) keyed
on the X-API-Key header. Denials are 429 with the RateLimit headers. /metrics
serves the limiter's per-rule metrics, for Prometheus, unlimited. POST
/generate spends a tenant's daily budget of 200 tokens: it checks at an
estimate, does the work, and settles at the real cost once it is known.
"""

from __future__ import annotations

import argparse
import os
import uuid
from collections.abc import Sequence
from typing import Optional

import uvicorn
from fastapi import Depends, FastAPI, Response
from fastapi.responses import JSONResponse
from starlette.requests import Request

import throttlegate
from throttlegate.fastapi import RateLimit, RateLimitMiddleware, default_attributes

POLICY = {
    "rules": [
        {"name": "per-ip", "key": "ip:{ip}", "limit": 5, "window": "1m"},
        {"name": "login", "key": "login:{ip}", "match": {"route": "/login", "method": ["POST"]}, "limit": 2,
         "window": "15m"},
        {"name": "per-key", "key": "key:{api_key}", "algorithm": "token_bucket", "capacity": 3, "refill_rate": 1},
        # Tokens per tenant and day, for /generate (the only caller with a tenant).
        {"name": "tokens", "key": "tokens:{tenant}", "algorithm": "quota", "limit": 200, "period": "day"},
    ]
}

# The most tokens a /generate call may use: what its check reserves.
ESTIMATE = 100


def api_key(request: Request) -> dict[str, Optional[str]]:
    """The API key, added to /items's check: `per-key` applies there too."""
    return {"api_key": request.headers.get("x-api-key")}


def create_app(url: Optional[str] = None, trusted_proxies: Sequence[str] = (), prefix: Optional[str] = None) -> FastAPI:
    """The app, limited by a Limiter on `url` (None: the embedded backend)."""
    limiter = throttlegate.Limiter(POLICY, url=url, prefix=prefix)
    app = FastAPI()
    client_ip = throttlegate.ClientIp(trusted_proxies=list(trusted_proxies))
    # /metrics (the limiter's per-rule metrics, for Prometheus) and /generate
    # (checked by itself) have no attributes, so no rule applies to them;
    # every other request gets the request model (ip, method, route, path, host).
    def attributes(request: Request) -> dict[str, str]:
        return {} if request.url.path in ("/metrics", "/generate") else default_attributes(request, limiter, client_ip)

    app.add_middleware(RateLimitMiddleware, limiter=limiter, client_ip=client_ip, attributes=attributes)
    per_key = RateLimit(attributes=api_key)

    @app.get("/")
    async def index() -> dict[str, str]:
        return {"hello": "world"}

    @app.post("/login", dependencies=[Depends(RateLimit("3/hour"))])
    async def login() -> dict[str, str]:
        return {"token": "t_123"}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(limiter.metrics_text() or "", media_type=throttlegate.METRICS_CONTENT_TYPE)

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        # Costs known only after the response: check at the estimate (with a
        # call id, so the check can be settled), do the work, settle.
        tenant = request.headers.get("x-tenant", "anonymous")
        d = await limiter.check_async({"tenant": tenant}, ESTIMATE, call_id=uuid.uuid4().hex)
        if not d.allowed:
            return Response(d.problem_json() or "", status_code=429, headers=d.headers,
                            media_type="application/problem+json")
        body = await request.json()
        used = 10 * len(str(body.get("prompt", "")).split())  # the work's real cost, known only now
        settled = await limiter.settle_async(d, used)
        return JSONResponse({"estimated": ESTIMATE, "used": used, "settled": settled})

    @app.get("/items")
    async def items(decision: throttlegate.Decision = Depends(per_key)) -> dict[str, int]:
        return {"remaining": decision.remaining}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--url", default=os.environ.get("THROTTLEGATE_URL"))
    parser.add_argument("--prefix", default=None)
    parser.add_argument("--trusted-proxy", action="append", default=[])
    args = parser.parse_args()
    # proxy_headers=False: only throttlegate's trusted proxies may speak for a client.
    uvicorn.run(create_app(args.url, args.trusted_proxy, args.prefix), host=args.host, port=args.port,
                log_level="warning", proxy_headers=False)


if __name__ == "__main__":
    main()
