"""The SDK's errors (docs/contract.md ("Errors")): one class per canonical code, each with the code, a
stable machine ``reason`` and the ``request_id`` the server logged the call under. Defined in
``sparseserve.core.errors``, which the server raises from too."""

from .core.errors import (REASON_METADATA_KEY, REQUEST_ID_METADATA_KEY, DeadlineExceededError, InternalError,
                          InvalidArgumentError, NotFoundError, PermissionDeniedError, ResourceExhaustedError,
                          SparseServeError, UnauthenticatedError, UnavailableError, UnimplementedError,
                          error_for_code, error_for_grpc_status)

__all__ = ["SparseServeError", "InvalidArgumentError", "NotFoundError", "ResourceExhaustedError",
           "UnauthenticatedError", "PermissionDeniedError", "UnimplementedError", "UnavailableError",
           "DeadlineExceededError", "InternalError", "REASON_METADATA_KEY", "REQUEST_ID_METADATA_KEY",
           "error_for_code", "error_for_grpc_status"]
