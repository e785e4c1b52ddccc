"""What every HTTP integration shares, with no framework imported: its
options and their resolution per request (:class:`HttpOptions`), the 429
answer's parts and the default attributes from the peer, the forwarded
headers, the method and the path. The client address itself is the core's
(:class:`throttlegate.ClientIp`)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Mapping
from typing import Callable, Generic, Optional, TypeVar, Union

from throttlegate._errors import InvalidArgumentTypeError
from throttlegate._native import ClientIp, Decision, Limiter

#: Request attributes as the integrations pass them to a check.
AttributeMap = Mapping[str, Union[str, int, None]]

#: The media type of a denial's body.
PROBLEM_JSON = "application/problem+json"


def request_attributes(
    client_ip: ClientIp,
    peer: Optional[str],
    forwarded: Optional[str],
    x_forwarded_for: Optional[str],
    method: str,
    path: str,
) -> dict[str, Optional[str]]:
    """``ip``, ``method`` and ``path``; ``ip`` is None when the peer is not
    an IP address (a Unix socket), so rules keyed on it do not apply."""
    ip = client_ip.client_ip(peer, forwarded, x_forwarded_for) if peer else None
    return {"ip": ip, "method": method, "path": path}


def denial(decision: Decision, legacy: bool) -> tuple[bytes, list[tuple[str, str]]]:
    """The body and headers of the 429 answer to a denied decision: the
    core's problem+json body, its content type and length, and the
    rate-limit headers."""
    body = (decision.problem_json() or "").encode()
    headers = [("Content-Type", PROBLEM_JSON), ("Content-Length", str(len(body)))]
    headers += list(decision.headers_with(legacy=legacy).items())
    return body, headers


def merge_headers(present: list[tuple[str, str]], extra: Mapping[str, str]) -> list[tuple[str, str]]:
    """``present`` plus those of ``extra`` not already set (a route's own
    rate-limit headers are more specific than a middleware's)."""
    names = {name.lower() for name, _ in present}
    return present + [(name, value) for name, value in extra.items() if name.lower() not in names]


#: What an integration hands the user's ``attributes`` and ``cost`` functions:
#: an ASGI scope, a WSGI environ, a Starlette or Flask ``Request``.
Req = TypeVar("Req")


class HttpOptions(Generic[Req]):
    """The options every HTTP integration takes, resolved for one request.

    ``limiter`` decides; ``attributes`` (a function of the request, plain or,
    for the asyncio integrations, ``async``) chooses the attributes, else the
    integration's defaults (``ip`` per ``client_ip``, ``method``, ``path``);
    ``cost`` is a number or a function of the request; ``legacy_headers``
    adds the ``X-RateLimit-*`` headers.
    """

    def __init__(
        self,
        limiter: Limiter,
        attributes: Optional[Callable[[Req], Union[AttributeMap, Awaitable[AttributeMap]]]] = None,
        client_ip: Optional[ClientIp] = None,
        cost: Union[int, Callable[[Req], int]] = 1,
        legacy_headers: bool = False,
    ) -> None:
        self.limiter = limiter
        self.attributes = attributes
        self.client_ip = client_ip if client_ip is not None else ClientIp()
        self.cost = cost
        self.legacy_headers = legacy_headers

    def attributes_of(self, request: Req, defaults: Callable[[ClientIp], AttributeMap]) -> AttributeMap:
        """``attributes(request)``, else ``defaults(client_ip)`` (synchronous
        integrations: an ``async`` function is refused)."""
        if self.attributes is None:
            return defaults(self.client_ip)
        got = self.attributes(request)
        if inspect.isawaitable(got):
            if inspect.iscoroutine(got):
                got.close()
            raise InvalidArgumentTypeError("attributes: expected a function returning a mapping, got an async function")
        return got

    async def attributes_of_async(self, request: Req, defaults: Callable[[ClientIp], AttributeMap]) -> AttributeMap:
        """``attributes(request)`` (awaited when ``async``), else ``defaults(client_ip)``."""
        if self.attributes is None:
            return defaults(self.client_ip)
        got = self.attributes(request)
        return await got if inspect.isawaitable(got) else got

    def cost_of(self, request: Req) -> int:
        """The units ``request`` costs: ``cost(request)`` or the number."""
        return self.cost(request) if callable(self.cost) else self.cost
