"""throttlegate: a distributed rate limiter.

Sliding-window log (exact, the default) and token bucket, each run atomically
in Redis as one script or in an embedded in-memory backend with identical
results. Every applicable rule of a policy is decided at once, all or nothing.

>>> import throttlegate
>>> limiter = throttlegate.Limiter([{"name": "per-ip", "key": "ip:{ip}", "limit": 2, "window": "1m"}])
>>> limiter.check({"ip": "203.0.113.7"}).allowed
True
"""

from __future__ import annotations

from throttlegate._errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    ClosedError,
    InternalError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidPolicyError,
    PolicyFileError,
    ThrottlegateError,
)
from throttlegate._native import (
    DEFAULT_PREFIX,
    MAX_KEY_LEN,
    METRIC_FAMILIES,
    METRICS_CONTENT_TYPE,
    OUTCOMES,
    REQUEST_MODEL,
    ClientIp,
    Decision,
    Limiter,
    ManualClock,
    Policy,
    RuleResult,
    __version__,
    parse_rate,
)

__all__ = [
    "DEFAULT_PREFIX",
    "MAX_KEY_LEN",
    "METRIC_FAMILIES",
    "METRICS_CONTENT_TYPE",
    "OUTCOMES",
    "REQUEST_MODEL",
    "BackendError",
    "BackendTimeoutError",
    "BackendUnavailableError",
    "ClientIp",
    "ClosedError",
    "Decision",
    "InternalError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "InvalidPolicyError",
    "Limiter",
    "ManualClock",
    "Policy",
    "PolicyFileError",
    "RuleResult",
    "ThrottlegateError",
    "__version__",
    "parse_rate",
]
