"""What the Python web examples share: the policy they enforce and their
command line. Each example runs as a script (`python examples/NAME.py`), so
this folder is on `sys.path` and `import _common` finds this file.

Every request counts against `per-ip` (5 a minute); POST /login also against
`login` (2 per 15 minutes); the Flask example's /generate against `tokens`
(200 a day per tenant, settled after the work at the real cost).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any, Optional

import throttlegate

POLICY: dict[str, Any] = {
    "rules": [
        {"name": "per-ip", "key": "ip:{ip}", "limit": 5, "window": "1m"},
        {
            "name": "login",
            "key": "login:{ip}",
            "match": {"route": "/login", "method": ["POST"]},
            "limit": 2,
            "window": "15m",
        },
        # Tokens per tenant and day, for the Flask example's /generate (the
        # only caller with a tenant: the rule applies to no other request).
        {"name": "tokens", "key": "tokens:{tenant}", "algorithm": "quota", "limit": 200, "period": "day"},
    ]
}


def limiter(
    url: Optional[str] = None,
    prefix: Optional[str] = None,
    on_backend_error: Optional[str] = None,
    timeout: Optional[float] = None,
) -> throttlegate.Limiter:
    """A Limiter of POLICY on `url` (None: the embedded backend)."""
    return throttlegate.Limiter(POLICY, url, prefix=prefix, on_backend_error=on_backend_error,  # type: ignore[arg-type]
                                timeout=timeout)


def client_ip(trusted_proxies: Sequence[str] = ()) -> throttlegate.ClientIp:
    """The client address: the peer's, or what `trusted_proxies` forwarded."""
    return throttlegate.ClientIp(trusted_proxies=list(trusted_proxies))


def parse_args(doc: Optional[str]) -> argparse.Namespace:
    """The examples' options: where to listen, the Redis URL (default
    $THROTTLEGATE_URL; none: the embedded backend), the key prefix, the
    backend timeout and failure policy, and the trusted proxies."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--url", default=os.environ.get("THROTTLEGATE_URL"))
    parser.add_argument("--prefix", default=None)
    parser.add_argument("--timeout", type=float, default=None, help="seconds")
    parser.add_argument("--on-backend-error", choices=["allow", "deny", "error"], default=None)
    parser.add_argument("--trusted-proxy", action="append", default=[])
    return parser.parse_args()
