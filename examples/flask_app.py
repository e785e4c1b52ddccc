"""A Flask app rate-limited by throttlegate.

Run it:  python examples/flask_app.py --port 8000 [--url redis://127.0.0.1:6379/0]
Every request counts against `per-ip` (5 a minute); POST /login also against
`login` (2 per 15 minutes); /health and /metrics (the limiter's per-rule
metrics, for Prometheus) are exempt. POST /generate spends a tenant's daily
budget of 200 tokens instead: it checks at an estimate, does the work, and
settles at the real cost once it is known. Denials are 429 with the
RateLimit headers, Retry-After and an application/problem+json body.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Optional

from flask import Flask, jsonify, request

import throttlegate
from throttlegate.flask import Throttle

import _common  # examples/_common.py: the policy and the command line

# The most tokens a /generate call may use: what its check reserves.
ESTIMATE = 100


def create_app(
    url: Optional[str] = None,
    trusted_proxies: Sequence[str] = (),
    prefix: Optional[str] = None,
    on_backend_error: Optional[str] = None,
    timeout: Optional[float] = None,
) -> Flask:
    """The app, limited by a Limiter on `url` (None: the embedded backend)."""
    limiter = _common.limiter(url, prefix, on_backend_error, timeout)
    app = Flask(__name__)
    throttle = Throttle(app, limiter=limiter, client_ip=_common.client_ip(trusted_proxies))

    @app.get("/")
    def index():  # type: ignore[no-untyped-def]
        return jsonify(hello="world")

    @app.post("/login")
    def login():  # type: ignore[no-untyped-def]
        return jsonify(token="t_123")

    @app.post("/generate")
    @throttle.exempt
    def generate():  # type: ignore[no-untyped-def]
        # Costs known only after the response: check at the estimate (with a
        # call id, so the check can be settled), do the work, settle.
        tenant = request.headers.get("X-Tenant", "anonymous")
        d = limiter.check({"tenant": tenant}, ESTIMATE, call_id=uuid.uuid4().hex)
        if not d.allowed:
            headers = {**d.headers, "Content-Type": "application/problem+json"}
            return d.problem_json() or "", 429, headers
        prompt = (request.get_json(silent=True) or {}).get("prompt", "")
        used = 10 * len(str(prompt).split())  # the work's real cost, known only now
        settled = limiter.settle(d, used)
        return jsonify(estimated=ESTIMATE, used=used, settled=settled)

    @app.get("/health")
    @throttle.exempt
    def health():  # type: ignore[no-untyped-def]
        return "ok"

    @app.get("/metrics")
    @throttle.exempt
    def metrics():  # type: ignore[no-untyped-def]
        return limiter.metrics_text() or "", 200, {"Content-Type": throttlegate.METRICS_CONTENT_TYPE}

    return app


def main() -> None:
    args = _common.parse_args(__doc__)
    app = create_app(args.url, args.trusted_proxy, args.prefix, args.on_backend_error, args.timeout)
    app.run(host=args.host, port=args.port, threaded=True)


if __name__ == "__main__":
    main()
