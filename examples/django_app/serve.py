"""Serve the Django example under uvicorn (ASGI) or gunicorn (WSGI).

Run it:  python examples/django_app/serve.py --server asgi --port 8000 [--url redis://127.0.0.1:6379/0]
Every request counts against `per-ip` (5 a minute); POST /login also against
`login` (2 per 15 minutes); GET /export also against `export-per-user` (2 an
hour per X-User); /health is exempt. Denials are 429 with the RateLimit
headers, Retry-After and an application/problem+json body.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=["asgi", "wsgi"], default="asgi")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--url", default=os.environ.get("THROTTLEGATE_URL"))
    parser.add_argument("--prefix", default=None)
    parser.add_argument("--timeout", type=float, default=0.1, help="seconds")
    parser.add_argument("--on-backend-error", choices=["allow", "deny", "error"], default="allow")
    parser.add_argument("--trusted-proxy", action="append", default=[])
    args = parser.parse_args()
    env = {
        "DJANGO_SETTINGS_MODULE": "django_app.settings",
        "THROTTLEGATE_URL": args.url or "",
        "THROTTLEGATE_PREFIX": args.prefix or "",
        "THROTTLEGATE_TIMEOUT": str(args.timeout),
        "THROTTLEGATE_ON_BACKEND_ERROR": args.on_backend_error,
        "THROTTLEGATE_TRUSTED_PROXIES": ",".join(args.trusted_proxy),
    }
    os.environ.update(env)
    sys.path.insert(0, str(HERE.parent))
    if args.server == "asgi":
        import uvicorn

        # proxy_headers=False: the peer address is the socket's, and only
        # throttlegate's trusted proxies may speak for a client.
        uvicorn.run("django_app.asgi:application", host=args.host, port=args.port, log_level="warning",
                    lifespan="off", proxy_headers=False)
    else:
        os.execv(sys.executable, [
            sys.executable, "-m", "gunicorn", "--chdir", str(HERE.parent), "--bind", f"{args.host}:{args.port}",
            "--workers", "1", "--threads", "4", "--log-level", "warning", "django_app.wsgi:application",
        ])


if __name__ == "__main__":
    main()
