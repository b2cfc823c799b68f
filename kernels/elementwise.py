"""Element-wise kernels: sparse (op) dense on the stored entries, sparse + sparse, sparse + dense.

The dense operand of ``mul``/``div`` is never broadcast to the full shape: one
numba pass turns each entry's sparse index into a row of the dense operand
(dimensions of size 1 read row 0), the rows are gathered with
``gather_rows`` (bit moves over unsigned words, four signatures for every
dtype) and the arithmetic runs in numpy on ``[nnz, ...]`` arrays, which
broadcast over hybrid dense dimensions by themselves. Numpy's ufuncs handle
every dtype (float16 included) with no extra compiled signatures, and its
integer floor division is safe for ``INT_MIN // -1``, which a native division
is not.

Inputs are validated by the caller (``sparseserve.core.validate`` plus the op's own
shape checks); nothing here raises.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._parallel import N_CHUNKS, PARALLEL_LOCK, PARALLEL_MIN

from ._sort import gather_rows, linearize
from .coo import coalesce


@njit(nogil=True, cache=True)
def broadcast_keys_kernel(indices, shape):
    """Row-major keys of ``indices`` into an operand of sparse shape ``shape`` whose
    size-1 dimensions broadcast (they contribute index 0). One signature: int64 2-D, int64 1-D."""
    n, s = indices.shape
    keys = np.empty(n, np.int64)
    for i in range(n):
        k = 0
        for j in range(s):
            d = shape[j]
            k = k * d + (0 if d == 1 else indices[i, j])
        keys[i] = k
    return keys


@njit(nogil=True, cache=True, parallel=True)
def multiply_gather_kernel(indices, values, dense_flat, shape, n_chunks):
    """``values[i] * dense[broadcast index of entry i]`` in one parallel pass (no hybrid dims,
    one dtype throughout): the fast path of ``mul``."""
    n, s = indices.shape
    out = np.empty(n, values.dtype)
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            k = 0
            for j in range(s):
                d = shape[j]
                k = k * d + (0 if d == 1 else indices[i, j])
            out[i] = values[i] * dense_flat[k]
    return out


# dtypes the fused path compiles for: numba arithmetic, same wrap-around as numpy.
FUSED_MUL_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                    "float32", "float64", "complex64", "complex128")


def multiply_stored(indices: np.ndarray, values: np.ndarray, dense: np.ndarray, ndim: int):
    """The fused ``mul`` for large, non-hybrid, single-dtype inputs; None when it does not apply."""
    n, s = indices.shape
    if (n < PARALLEL_MIN or values.ndim != 1 or s != ndim or values.dtype != dense.dtype
            or values.dtype.name not in FUSED_MUL_DTYPES):
        return None
    shape = np.asarray(padded_shape(dense.shape, ndim), dtype=np.int64)
    from ._sort import frozen

    with PARALLEL_LOCK:
        return multiply_gather_kernel(frozen(np.ascontiguousarray(indices)), frozen(values),
                                      frozen(np.ascontiguousarray(dense).reshape(-1)), shape, N_CHUNKS)


def padded_shape(dense_shape_like, ndim: int) -> tuple[int, ...]:
    """A broadcastable shape with leading ones up to rank ``ndim``."""
    shape = tuple(int(d) for d in dense_shape_like)
    return (1,) * (ndim - len(shape)) + shape


def gather_operand(indices: np.ndarray, dense: np.ndarray, ndim: int) -> np.ndarray:
    """The dense operand at each stored entry: ``[nnz, *dense.shape[sparse_ndim:]]`` (after
    padding ``dense`` to rank ``ndim``). The caller has checked that ``dense`` broadcasts to the
    sparse tensor's shape, so every key is in range."""
    s = indices.shape[1]
    shape = padded_shape(dense.shape, ndim)
    lead, inner = shape[:s], shape[s:]
    rows = np.ascontiguousarray(dense).reshape((int(np.prod(lead, dtype=np.int64)), *inner))
    if indices.shape[0] == 0:
        return np.empty((0, *inner), dense.dtype)
    keys = broadcast_keys_kernel(np.ascontiguousarray(indices, dtype=np.int64),
                                 np.asarray(lead, dtype=np.int64))
    return gather_rows(rows, keys)


def multiply(values: np.ndarray, operand: np.ndarray, dtype: np.dtype) -> np.ndarray:
    with np.errstate(all="ignore"):
        if dtype == np.bool_:
            return np.logical_and(values, operand)
        return np.multiply(values, operand, dtype=dtype)


def first_zero(operand: np.ndarray, values_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Position (in the values' shape) of the first zero of ``operand`` broadcast to it, or None."""
    zero = np.broadcast_to(operand == 0, values_shape)
    if not zero.any():
        return None
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(zero)), values_shape))


def divide(values: np.ndarray, operand: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """IEEE true division for inexact ``dtype``; for integers the quotient truncated toward zero
    (C/TensorFlow, not numpy's floor), wrapping as numpy does for ``INT_MIN / -1``. The caller has
    ruled out zero integer divisors."""
    with np.errstate(all="ignore"):
        if dtype.kind in "fc":
            return np.true_divide(values, operand, dtype=dtype)
        a = values.astype(dtype, copy=False)
        b = operand.astype(dtype, copy=False)
        q = np.floor_divide(a, b)
        if dtype.kind == "i":
            fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
            q = q + fix.astype(dtype)
        return q


# Sides of a merged entry (``merge_kernel``).
A_ONLY, B_ONLY, BOTH = 0, 1, 2


@njit(nogil=True, cache=True)
def merge_kernel(a, b):
    """TensorFlow's SparseAdd merge of two COO index arrays as given (no sort, no coalesce):
    one pass comparing a[i] and b[j] row-major; the smaller is taken alone, equal ones are
    paired, and the leftovers of either follow. Returns (side, ia, ib) per output entry
    (-1 where that side has none). One signature: two read-only int64 2-D arrays."""
    na, nb = a.shape[0], b.shape[0]
    s = a.shape[1]
    side = np.empty(na + nb, np.int8)
    ia = np.full(na + nb, -1, np.int64)
    ib = np.full(na + nb, -1, np.int64)
    i = j = n = 0
    while i < na and j < nb:
        c = 0
        for k in range(s):
            if a[i, k] != b[j, k]:
                c = -1 if a[i, k] < b[j, k] else 1
                break
        if c < 0:
            side[n] = 0
            ia[n] = i
            i += 1
        elif c > 0:
            side[n] = 1
            ib[n] = j
            j += 1
        else:
            side[n] = 2
            ia[n] = i
            ib[n] = j
            i += 1
            j += 1
        n += 1
    while i < na:
        side[n] = 0
        ia[n] = i
        i += 1
        n += 1
    while j < nb:
        side[n] = 1
        ib[n] = j
        j += 1
        n += 1
    return side[:n], ia[:n], ib[:n]


def merge(a_indices: np.ndarray, b_indices: np.ndarray):
    """(side, ia, ib) of ``merge_kernel`` for two COO index arrays of one sparse rank."""
    from ._sort import frozen

    return merge_kernel(frozen(np.ascontiguousarray(a_indices, dtype=np.int64)),
                        frozen(np.ascontiguousarray(b_indices, dtype=np.int64)))


def add_dense(indices, values, dense_shape, dense: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``dense`` (same shape) plus the sparse tensor, duplicates summed, in ``dtype``."""
    out = np.array(dense, dtype=dtype, order="C", copy=True)
    nnz = indices.shape[0]
    if nnz == 0 or out.size == 0:
        return out
    u_indices, u_values = coalesce(indices, values.astype(dtype, copy=False), dense_shape)
    s = indices.shape[1]
    lead = np.asarray(dense_shape[:s], dtype=np.int64)
    rows = out.reshape(int(np.prod(lead)), -1)
    keys = linearize(u_indices, lead)
    with np.errstate(all="ignore"):
        if dtype == np.bool_:
            rows[keys] |= u_values.reshape(keys.size, -1)
        else:
            rows[keys] += u_values.reshape(keys.size, -1)  # keys are unique after coalescing
    return out


def warm_up() -> None:
    """Compile (or load from the disk cache) this module's signatures."""
    from ._sort import frozen

    indices = frozen(np.array([[1, 0], [0, 1]], dtype=np.int64))
    broadcast_keys_kernel(indices, np.array([2, 1], dtype=np.int64))
    gather_operand(indices, frozen(np.arange(4.0).reshape(2, 2)), 2)
    merge(indices, indices)
    big = frozen(np.zeros((PARALLEL_MIN, 2), np.int64))
    for name in FUSED_MUL_DTYPES:
        multiply_stored(big, frozen(np.ones(PARALLEL_MIN, name)), frozen(np.ones((2, 2), name)), 2)
