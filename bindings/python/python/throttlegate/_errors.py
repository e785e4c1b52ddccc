"""The exception hierarchy: one base class, one subclass per error kind.

Each class also derives from the closest built-in exception, so code that
catches ``ValueError`` or ``ConnectionError`` keeps working.
"""

from __future__ import annotations

import builtins
from typing import ClassVar

__all__ = [
    "ThrottlegateError",
    "InvalidPolicyError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "PolicyFileError",
    "BackendUnavailableError",
    "BackendTimeoutError",
    "BackendError",
    "ClosedError",
    "InternalError",
]


class ThrottlegateError(Exception):
    """Base class of every error raised by throttlegate.

    ``kind`` is the core's stable error id (``"invalid_policy"``, ...) and
    ``code`` its stable number (the C API's result code).
    """

    kind: ClassVar[str] = "internal"
    code: ClassVar[int] = 8
    #: True when the same call may succeed later (connection lost, timeout).
    temporary: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidPolicyError(ThrottlegateError, ValueError):
    """A policy (dicts, a file or text) is malformed; the message names the field."""

    kind = "invalid_policy"
    code = 1


class InvalidArgumentError(ThrottlegateError, ValueError):
    """An argument of a call is invalid (cost, attributes, URL, option)."""

    kind = "invalid_argument"
    code = 2


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument has the wrong Python type."""


class PolicyFileError(ThrottlegateError, OSError):
    """A file could not be read."""

    kind = "io"
    code = 3


class BackendUnavailableError(ThrottlegateError, ConnectionError):
    """The backend could not be reached or the connection was lost."""

    kind = "backend_unavailable"
    code = 4


class BackendTimeoutError(ThrottlegateError, builtins.TimeoutError):
    """The call did not complete within the configured timeout."""

    kind = "timeout"
    code = 5


class BackendError(ThrottlegateError):
    """The backend answered with an error (out of memory, permission, script error)."""

    kind = "backend"
    code = 6


class ClosedError(ThrottlegateError):
    """The limiter was closed."""

    kind = "closed"
    code = 7


class InternalError(ThrottlegateError):
    """A bug in throttlegate (for example a caught panic). Please report it."""

    kind = "internal"
    code = 8


# Looked up by the extension module to raise the class of a core error kind.
_BY_KIND: dict[str, type[ThrottlegateError]] = {
    cls.kind: cls
    for cls in (
        InvalidPolicyError,
        InvalidArgumentError,
        PolicyFileError,
        BackendUnavailableError,
        BackendTimeoutError,
        BackendError,
        ClosedError,
        InternalError,
    )
}
_BY_KIND["invalid_argument:type"] = InvalidArgumentTypeError
