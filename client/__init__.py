"""sparseserve: the Python SDK of the sparse tensor compute service.

>>> from sparseserve import Client, SparseTensor
>>> with Client("localhost:50051") as c:          # "http://localhost:8000" speaks REST
...     st = SparseTensor(indices=[[1, 2], [0, 0]], values=[2.0, 1.0], dense_shape=[3, 4])
...     c.reorder(st)
"""

from . import errors, linalg
from ._client import AsyncClient, Client
from ._malloc import keep_transfer_buffers
from ._pipeline import Pipeline, PipelineStep
from ._remote import RemoteTensor
from .core.tensor import HandleRef, OutputRef, SparseTensor
from .errors import (DeadlineExceededError, InternalError, InvalidArgumentError, InvalidArgumentTypeError,
                     NotFoundError, PermissionDeniedError, ResourceExhaustedError, SparseServeError,
                     UnauthenticatedError, UnavailableError, UnimplementedError)

from .core import __version__

__all__ = [
    "Client", "AsyncClient", "SparseTensor", "RemoteTensor", "HandleRef", "OutputRef", "Pipeline",
    "PipelineStep", "errors", "linalg", "keep_transfer_buffers", "__version__",
    "SparseServeError", "InvalidArgumentError", "InvalidArgumentTypeError", "NotFoundError", "ResourceExhaustedError",
    "UnauthenticatedError", "PermissionDeniedError", "UnimplementedError", "UnavailableError",
    "DeadlineExceededError", "InternalError",
]
