"""The one error model of both wires (docs/contract.md, "Errors").

The server raises these classes; each wire maps them to its status in one
place (the tables below), and the SDK maps a status back to the same class,
so a caller catches ``InvalidArgumentError`` whichever wire it speaks. Callers
key on ``code`` and ``reason``, never on the message text.

Each class is also the Python exception numpy and scipy raise for the same fault, so code
written for them catches ours: an ``InvalidArgumentError`` is a ``ValueError``, and one whose
reason is about an argument's type or the call's signature (``TYPE_REASONS``) is an
``InvalidArgumentTypeError``, a ``TypeError`` too; an ``UnimplementedError`` is a
``NotImplementedError``. The class follows from code and reason alone, so it is the same
whether the error was raised in this process or rebuilt from either wire.
"""

from __future__ import annotations

import grpc

from .reasons import Reason

__all__ = [
    "SparseServeError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "TYPE_REASONS",
    "NotFoundError",
    "ResourceExhaustedError",
    "UnauthenticatedError",
    "PermissionDeniedError",
    "UnimplementedError",
    "UnavailableError",
    "DeadlineExceededError",
    "InternalError",
    "ERROR_CLASSES",
    "error_for_code",
    "error_for_grpc_status",
]


class SparseServeError(Exception):
    """Base of every error the service reports.

    ``code`` is the canonical code name (``"INVALID_ARGUMENT"``), ``reason`` a
    stable machine-readable word for the broken rule (a ``Reason`` of
    ``sparseserve.core.reasons`` where the service raises it, kept as a plain
    ``str``), ``message`` the human text that names the argument and the rule.
    """

    code = "UNKNOWN"
    http_status = 500
    grpc_status = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, *, reason: str | None = None, request_id: str | None = None):
        super().__init__(message)
        self.message = message
        self.reason = str(reason) if reason else self.code
        self.request_id = request_id

    def __str__(self) -> str:
        return f"{self.code} [{self.reason}]: {self.message}"

    def __reduce__(self):
        # Pickled with its reason (and any per-instance status): Dask workers raise these.
        return (type(self), (self.message,), self.__dict__)

    def to_json(self) -> dict:
        body = {"code": self.code, "reason": self.reason, "message": self.message}
        if self.request_id:
            body["request_id"] = self.request_id
        return {"error": body}


# The reasons Python itself answers with TypeError: an argument of the wrong type, a required
# argument missing, a keyword the call does not take.
TYPE_REASONS = frozenset({Reason.BAD_ARGUMENT_TYPE, Reason.MISSING_ARGUMENT, Reason.UNKNOWN_ARGUMENT})


class InvalidArgumentError(SparseServeError, ValueError):
    """A tensor breaks an invariant or an argument is out of range."""

    code, http_status, grpc_status = "INVALID_ARGUMENT", 400, grpc.StatusCode.INVALID_ARGUMENT

    def __new__(cls, message: str = "", *, reason: str | None = None, request_id: str | None = None):
        # Made with a type reason, it is the TypeError one: every raise and every wire agrees.
        if cls is InvalidArgumentError and reason in TYPE_REASONS:
            cls = InvalidArgumentTypeError
        return super().__new__(cls, message)


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """An ``InvalidArgumentError`` that is also a ``TypeError``: its reason is one of ``TYPE_REASONS``
    (``InvalidArgumentError(message, reason=...)`` makes one for them)."""


class NotFoundError(SparseServeError):
    """Unknown op or handle."""

    code, http_status, grpc_status = "NOT_FOUND", 404, grpc.StatusCode.NOT_FOUND


class ResourceExhaustedError(SparseServeError):
    """A request, result or the store is over its limit."""

    code, http_status, grpc_status = "RESOURCE_EXHAUSTED", 413, grpc.StatusCode.RESOURCE_EXHAUSTED


class UnauthenticatedError(SparseServeError):
    """Missing or wrong bearer token."""

    code, http_status, grpc_status = "UNAUTHENTICATED", 401, grpc.StatusCode.UNAUTHENTICATED


class PermissionDeniedError(SparseServeError):
    """A handle that belongs to another tenant."""

    code, http_status, grpc_status = "PERMISSION_DENIED", 403, grpc.StatusCode.PERMISSION_DENIED


class UnimplementedError(SparseServeError, NotImplementedError):
    """A layout or dtype the op does not support."""

    code, http_status, grpc_status = "UNIMPLEMENTED", 501, grpc.StatusCode.UNIMPLEMENTED


class UnavailableError(SparseServeError):
    """The server is overloaded, not ready, or shutting down."""

    code, http_status, grpc_status = "UNAVAILABLE", 503, grpc.StatusCode.UNAVAILABLE


class DeadlineExceededError(SparseServeError):
    """The caller's deadline passed."""

    code, http_status, grpc_status = "DEADLINE_EXCEEDED", 504, grpc.StatusCode.DEADLINE_EXCEEDED


class InternalError(SparseServeError):
    """A bug in the service: never the answer to bad input."""

    code, http_status, grpc_status = "INTERNAL", 500, grpc.StatusCode.INTERNAL


# Every class of the model, in the order the docs list them.
ERROR_CLASSES = (
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    UnauthenticatedError,
    PermissionDeniedError,
    UnimplementedError,
    UnavailableError,
    DeadlineExceededError,
    InternalError,
)
_BY_CODE = {cls.code: cls for cls in ERROR_CLASSES}
_BY_GRPC = {cls.grpc_status: cls for cls in ERROR_CLASSES}

# The trailing-metadata key that carries the reason on gRPC.
REASON_METADATA_KEY = "sparseserve-reason"
# ... and the request id (REST: the JSON error body and the x-request-id header).
REQUEST_ID_METADATA_KEY = "sparseserve-request-id"


def error_for_code(code: str, message: str, reason: str | None = None,
                   request_id: str | None = None) -> SparseServeError:
    """The error for a canonical code name; unknown codes become ``SparseServeError``."""
    cls = _BY_CODE.get(code)
    if cls is None:
        err = SparseServeError(message, reason=reason, request_id=request_id)
        err.code = code
        return err
    return cls(message, reason=reason, request_id=request_id)


def error_for_grpc_status(status: grpc.StatusCode, message: str, reason: str | None = None,
                          request_id: str | None = None) -> SparseServeError:
    """The error for a gRPC status (used by the SDK on the gRPC wire)."""
    cls = _BY_GRPC.get(status)
    if cls is None:
        # CANCELLED, UNKNOWN, ... : keep the code name so callers can still see it.
        return error_for_code(status.name, message, reason, request_id)
    return cls(message, reason=reason, request_id=request_id)
