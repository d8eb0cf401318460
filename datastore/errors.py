"""The one place where exceptions become gRPC status codes.

Handlers and interceptors raise the exceptions below (or let a `DatastoreError` through);
`run_mapped` turns them into a status with a message that names the offending field. A caller's
mistake is never INTERNAL: INTERNAL is only for what nobody anticipated, and it is logged with
its traceback (the caller gets a short message, not the traceback).
"""
from __future__ import annotations

import logging
from typing import Callable, TypeVar

import grpc

from datastore.format import DatastoreError

log = logging.getLogger("draftstore.server")
R = TypeVar("R")


class ServiceError(Exception):
    """Base of the errors a handler raises on purpose; `code` is their status."""

    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(ServiceError, ValueError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class TokenizerMismatch(ServiceError):
    """The caller's tokenizer fingerprint differs from the datastore's."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class FailedPrecondition(ServiceError):
    """The request needs something this server is not configured for (e.g. the live tier)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Unauthenticated(ServiceError):
    code = grpc.StatusCode.UNAUTHENTICATED


class Overloaded(ServiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlinePassed(ServiceError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotReady(ServiceError):
    """The store is still being opened and verified (health says NOT_SERVING meanwhile)."""

    code = grpc.StatusCode.UNAVAILABLE


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """(status code, details) for an exception raised while serving a call."""
    if isinstance(exc, ServiceError):
        return exc.code, str(exc)
    if isinstance(exc, DatastoreError):
        return grpc.StatusCode.DATA_LOSS, f"datastore unusable: {exc}"
    return grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__}); see the server log"


def run_mapped(
    fn: Callable[[], R],
    context: grpc.ServicerContext,
    method: str,
    on_status: Callable[[grpc.StatusCode], None] | None = None,
) -> R:
    """fn() with any exception turned into `context.abort(code, details)`; on_status(code) sees
    the outcome (OK included) before the call returns or aborts."""
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - this is the mapping point
        code, details = status_for(exc)
        if code is grpc.StatusCode.INTERNAL:
            log.exception("%s failed unexpectedly", method)
        if on_status is not None:
            on_status(code)
        context.abort(code, details)  # raises; never returns
        raise  # pragma: no cover - abort always raises
    if on_status is not None:
        on_status(grpc.StatusCode.OK)
    return result


def check_deadline(context: grpc.ServicerContext, what: str) -> None:
    """Raise DeadlinePassed when the caller's deadline is over (stop the work, nobody waits)."""
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise DeadlinePassed(f"deadline exceeded {what}")
