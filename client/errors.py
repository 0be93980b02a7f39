"""Mapping a failed exchange back to the :mod:`rmserve.errors` classes.

A non-200 reply is rebuilt by :func:`error_from_reply`: status + ``error.type`` → class, by
:func:`rmserve.errors.from_wire`, the same table the server maps from, with the
``Retry-After`` header read by :func:`parse_retry_after`. :func:`connection_reason` says in
words why a request got no reply at all (the transport error behind a
:class:`~rmserve.errors.ConnectionFailed`).

No torch or vllm here: this module must import on a machine without them.
"""

from __future__ import annotations

import errno
import math
import time
from email.utils import parsedate_to_datetime

import aiohttp

from rmserve import errors

__all__ = ["connection_reason", "error_from_reply", "parse_retry_after"]


def error_from_reply(status: int, body: bytes, *, retry_after: str | None = None) -> errors.RMServeError:
    """The :mod:`rmserve.errors` instance a non-200 reply stands for.

    The body is decoded as the :class:`~rmserve.schema.ErrorBody` record the server writes
    (``{"error": {"type", "message", "field"}}``) when it is one; the class is chosen by
    :func:`rmserve.errors.from_wire` (``error.type`` first, then the status: 429/503
    retryable, other 4xx client fault, else server fault). The ``Retry-After`` header, parsed
    to seconds by :func:`parse_retry_after`, becomes the error's ``retry_after_s`` (None
    without one).
    """
    return errors.from_wire(status, body, retry_after_s=parse_retry_after(retry_after))


def parse_retry_after(value: str | None, *, now_s: float | None = None) -> float | None:
    """``Retry-After`` in seconds: delta-seconds or an HTTP date (RFC 9110 §10.2.3).

    Returns None for a missing or unreadable header; a date in the past gives 0.
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now_s is None else now_s)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def connection_reason(exc: BaseException) -> str:
    """Why a request got no reply, in words: ``connection refused``, ``no reply within 5 s`` …

    ``exc`` is a :class:`~rmserve.errors.ConnectionFailed` (its chained transport error is
    read) or the transport error itself.
    """
    cause = exc.__cause__ if isinstance(exc, errors.ConnectionFailed) and exc.__cause__ is not None else exc
    if isinstance(cause, aiohttp.ClientConnectorError):
        os_error = cause.os_error
        if isinstance(os_error, ConnectionRefusedError) or getattr(os_error, "errno", None) == errno.ECONNREFUSED:
            return "connection refused"
        return os_error.strerror or str(os_error) or type(os_error).__name__
    if isinstance(cause, TimeoutError):
        return "no reply in time"
    if isinstance(cause, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    return str(exc) if isinstance(exc, errors.RMServeError) else f"{type(cause).__name__}: {cause}"
