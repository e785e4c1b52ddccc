"""A Falcon (WSGI) app rate-limited by throttlegate's generic WSGI middleware.

Run it:  python examples/falcon_app.py --port 8000 [--url redis://127.0.0.1:6379/0]
Every request counts against `per-ip` (5 a minute); POST /login also against
`login` (2 per 15 minutes). Denials are 429 with the RateLimit headers,
Retry-After and an application/problem+json body. The same middleware wraps
any WSGI app (Bottle, Pyramid, a bare callable). A generic WSGI app has no
router the middleware can ask, so the `route` option gives it Falcon's: the
URI template the app's own router finds for the path (the `login` rule
matches the route /login). Served here by the standard library's wsgiref,
one thread per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from socketserver import ThreadingMixIn
from typing import Any, Optional
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import falcon

from throttlegate.wsgi import DECISION_KEY, RateLimitMiddleware, WSGIApp, path_info

import _common  # examples/_common.py: the policy and the command line


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
    limiter = _common.limiter(url, prefix, on_backend_error, timeout)
    router = falcon.routing.CompiledRouter()
    app = falcon.App(router=router)
    app.add_route("/", Index())
    app.add_route("/login", Login())

    def route(environ: dict[str, Any]) -> Optional[str]:
        # Falcon's own matcher: (resource, methods, params, URI template), or None.
        found = router.find(path_info(environ))
        return str(found[3]) if found else None

    return RateLimitMiddleware(app, limiter=limiter, client_ip=_common.client_ip(trusted_proxies), route=route)


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def main() -> None:
    args = _common.parse_args(__doc__)
    app = create_app(args.url, args.trusted_proxy, args.prefix, args.on_backend_error, args.timeout)
    with make_server(args.host, args.port, app, server_class=_ThreadingServer, handler_class=_QuietHandler) as server:
        server.serve_forever()


if __name__ == "__main__":
    main()
