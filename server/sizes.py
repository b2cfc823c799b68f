"""What a call's tensors weigh: the bytes of a tensor and of a call's arguments, and the size
under which a call's work runs on the event loop rather than in the kernel pool."""

from __future__ import annotations

from typing import Any

import numpy as np

from sparseserve.core.tensor import SparseTensor

from .device import is_device_array

__all__ = ["INLINE_BYTES", "tensor_nbytes", "arguments_nbytes"]

# Work on less than this many bytes runs on the event loop (see ``Service.run``).
INLINE_BYTES = 64 << 10


def tensor_nbytes(t: Any) -> int:
    """Bytes of a tensor's arrays: host memory, or device memory for a GPU worker's."""
    nbytes = getattr(t, "nbytes", None)  # SparseTensor, numpy and CuPy arrays
    return int(nbytes) if nbytes is not None else int(np.asarray(t).nbytes)


def arguments_nbytes(values) -> int:
    """Bytes of the tensors among argument values (lists of tensors included)."""
    total = 0
    for v in values:
        if isinstance(v, list):
            total += arguments_nbytes(v)
        elif isinstance(v, (SparseTensor, np.ndarray)) or is_device_array(v):
            total += tensor_nbytes(v)
    return total
