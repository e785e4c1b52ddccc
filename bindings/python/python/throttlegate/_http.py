"""What every HTTP integration shares, with no framework imported: the 429
answer's parts and the default attributes from the peer, the forwarded
headers, the method and the path. The client address itself is the core's
(:class:`throttlegate.ClientIp`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional, Union

from throttlegate._native import ClientIp, Decision

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
