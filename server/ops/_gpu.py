"""Helpers shared by the ops' GPU kernels (``Registry.gpu``): building device results, and the
device's limits the kernels' declarations name.

Which calls a GPU kernel takes is declared beside it (layouts, dtypes, matrices, and a
``declines`` function for what else the device cannot do); the op's ``check`` has made every
refusal before dispatch, the same on every device, so nothing here repeats a rule of an op.
A kernel that meets what only the entries reveal (a zero divisor, an index out of range)
raises ``Fallback`` and the CPU kernel, which names the entry, answers.
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from sparseserve.core.tensor import SparseTensor

from ..device import DeviceTensor

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
