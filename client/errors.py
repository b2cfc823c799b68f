"""The SDK's errors (docs/contract.md ("Errors")): one class per canonical code, each with the code, a
stable machine ``reason`` and the ``request_id`` the server logged the call under. Defined in
``sparseserve.core.errors``, which the server raises from too. Each is also the Python exception
numpy and scipy raise for the same fault: ``InvalidArgumentError`` a ``ValueError``
(``InvalidArgumentTypeError``, for the reasons in ``TYPE_REASONS``, a ``TypeError`` too),
``UnimplementedError`` a ``NotImplementedError``."""

from .core.errors import (REASON_METADATA_KEY, REQUEST_ID_METADATA_KEY, TYPE_REASONS, DeadlineExceededError,
                          InternalError, InvalidArgumentError, InvalidArgumentTypeError, NotFoundError,
                          PermissionDeniedError, ResourceExhaustedError, SparseServeError, UnauthenticatedError,
                          UnavailableError, UnimplementedError, error_for_code, error_for_grpc_status)

__all__ = ["SparseServeError", "InvalidArgumentError", "InvalidArgumentTypeError", "NotFoundError",
           "ResourceExhaustedError", "UnauthenticatedError", "PermissionDeniedError", "UnimplementedError",
           "UnavailableError", "DeadlineExceededError", "InternalError", "REASON_METADATA_KEY",
           "REQUEST_ID_METADATA_KEY", "TYPE_REASONS", "error_for_code", "error_for_grpc_status"]
