"""Helpers shared by the ops' GPU kernels (``Registry.gpu``): building device results and the
checks their ``supports`` functions share.

A ``supports`` function reads metadata only. Its rule for bad arguments: whatever the CPU
kernel would refuse (a shape mismatch, an unsupported dtype, an invalid axis ...) gets a reason
here, so the call falls back and the CPU kernel raises its usual error with its usual message;
a GPU kernel never has to phrase an error itself. Reasons are short metric labels:
``dtype``, ``layout``, ``batched``, ``hybrid``, ``size``, ``argument`` (the CPU kernel refuses
the arguments), ``shape`` (operands that do not fit together).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from sparseserve.core.tensor import SparseTensor
from sparseserve.core.errors import SparseServeError

from ..device import DeviceTensor

INT32_MAX = int(np.iinfo(np.int32).max)
# dtypes CuPy's sparse matrices (cuSPARSE) multiply; bool is refused by matmul itself.
CUSPARSE_DTYPES = ("float32", "float64", "complex64", "complex128")


def quiet(fn: Callable) -> Callable:
    """A GPU kernel with numpy's floating-point warnings off, as the CPU kernels have them (IEEE
    results, wrapping integers). CuPy never warns; this matters for the numpy stand-in."""
    @functools.wraps(fn)
    def kernel(*args, **kwargs):
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return kernel


def refused(check: Callable[..., Any], *args, **kwargs) -> bool:
    """Whether the op's own argument check raises for these arguments (the CPU kernel then
    raises it for the caller)."""
    try:
        check(*args, **kwargs)
    except (SparseServeError, ValueError, TypeError, OverflowError):
        return True
    return False


def is_sparse(value) -> bool:
    return isinstance(value, SparseTensor)


def native(*arrays_or_tensors) -> bool:
    """Every dtype in native byte order (CuPy holds no other)."""
    return all(np.dtype(t.dtype).isnative for t in arrays_or_tensors)


def plain_matrix(t: SparseTensor) -> str | None:
    """None for a 2-D COO, CSR or CSC matrix without batch or dense dimensions, else why not."""
    if t.layout in ("bsr", "bsc"):
        return "layout"
    if t.batch_ndim:
        return "batched"
    if t.dense_ndim:
        return "hybrid"
    if t.ndim != 2:
        return "batched" if t.ndim > 2 else "argument"
    return None


def coo(dense_shape, indices, values, *, coalesced: bool) -> DeviceTensor:
    return DeviceTensor.of("coo", dense_shape, values=values, indices=indices, coalesced=coalesced)


def compressed(layout: str, dense_shape, ptr, plain, values, *, coalesced: bool = False,
               blocksize=None) -> DeviceTensor:
    return DeviceTensor.of(layout, dense_shape, values=values, compressed_indices=ptr, plain_indices=plain,
                           blocksize=blocksize, coalesced=coalesced)


def same_structure(t: SparseTensor, values) -> DeviceTensor:
    """A COO tensor with ``t``'s indices, shape and coalesced flag and new values."""
    return coo(t.dense_shape, t.indices, values, coalesced=t.coalesced)


def coo_entries(xp, t: SparseTensor):
    """(rows, cols, values) of a 2-D COO/CSR/CSC tensor's stored entries, in storage order,
    int64 indices."""
    from sparseserve.kernels import arrays as ka

    if t.layout == "coo":
        return t.indices[:, 0], t.indices[:, 1], t.values
    major = ka.expand_pointers(xp, t.compressed_indices, t.nnz)
    minor = t.plain_indices.astype(xp.int64)
    return (major, minor, t.values) if t.layout == "csr" else (minor, major, t.values)
