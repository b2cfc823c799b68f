"""COO kernels: reorder, coalesce, to_dense, from_dense.

Python wrappers reshape values to 2-D ``[nnz, inner]`` (hybrid tensors carry
their dense dimensions in ``inner``) so the numba signatures stay few; moving
values needs no arithmetic and is a gather; sums run in numba per dtype, with
float16 summed in float32 and bool combined with logical or. Inputs are
validated by the caller (``sparseserve._validate``); nothing here raises.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._parallel import N_CHUNKS, PARALLEL_LOCK
from ._sort import (delinearize_kernel, delinearize_parallel, first_disorder_kernel, gather_rows,
                    linearize, segment_starts_parallel, sorted_keys)


# The segment kernels split the runs into chunks that the threads take in turn.

@njit(nogil=True, cache=True, parallel=True)
def segment_sum_kernel(values, perm, starts, out, n_chunks):
    n, runs = perm.size, starts.size
    chunk = (runs + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for r in range(c * chunk, min(runs, (c + 1) * chunk)):
            end = starts[r + 1] if r + 1 < runs else n
            for j in range(values.shape[1]):
                acc = values[perm[starts[r]], j]
                for i in range(starts[r] + 1, end):
                    acc += values[perm[i], j]
                out[r, j] = acc


@njit(nogil=True, cache=True, parallel=True)
def segment_or_kernel(values, perm, starts, out, n_chunks):
    n, runs = perm.size, starts.size
    chunk = (runs + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for r in range(c * chunk, min(runs, (c + 1) * chunk)):
            end = starts[r + 1] if r + 1 < runs else n
            for j in range(values.shape[1]):
                acc = values[perm[starts[r]], j]
                for i in range(starts[r] + 1, end):
                    acc |= values[perm[i], j]
                out[r, j] = acc


@njit(nogil=True, cache=True, parallel=True)
def nonzero_rows_kernel(words, mask, n_chunks):
    """Rows holding any word with a bit set under ``mask``: counted per chunk, then filled."""
    n, width = words.shape
    chunk = (n + n_chunks - 1) // n_chunks
    counts = np.zeros(n_chunks + 1, np.int64)
    for c in prange(n_chunks):
        m = 0
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            for j in range(width):
                if words[i, j] & mask:
                    m += 1
                    break
        counts[c + 1] = m
    for c in range(n_chunks):
        counts[c + 1] += counts[c]
    out = np.empty(counts[n_chunks], np.int64)
    for c in prange(n_chunks):
        r = counts[c]
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            for j in range(width):
                if words[i, j] & mask:
                    out[r] = i
                    r += 1
                    break
    return out


@njit(nogil=True, cache=True, parallel=True)
def fill_scatter_kernel(out, fill, keys, rows, n_chunks):
    """out[:] = fill, then out[keys[i]] = rows[i] (keys unique): both passes split over threads."""
    n, width = out.shape
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            for j in range(width):
                out[i, j] = fill[j]
    m = keys.size
    chunk = (m + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for i in range(c * chunk, min(m, (c + 1) * chunk)):
            k = keys[i]
            for j in range(width):
                out[k, j] = rows[i, j]


def _words(a2d: np.ndarray) -> np.ndarray:
    """A C-contiguous 2-D array's rows as unsigned words of its element width (bits, no arithmetic)."""
    item = a2d.dtype.itemsize // (2 if a2d.dtype.kind == "c" else 1)
    return a2d.view(np.dtype(f"u{item}"))


def _zero_mask(dtype: np.dtype) -> np.unsignedinteger:
    """Bits that make a word nonzero: all of them, or all but the sign bit for floats (-0.0 is zero).
    Typed as the word itself, so the kernel compiles once per word width."""
    item = dtype.itemsize // (2 if dtype.kind == "c" else 1)
    full = (1 << (8 * item)) - 1
    return np.dtype(f"u{item}").type(full >> 1 if dtype.kind in "fc" else full)


def _values2d(values: np.ndarray, nnz: int) -> np.ndarray:
    inner = int(np.prod(values.shape[1:], dtype=np.int64))
    return np.ascontiguousarray(values).reshape(nnz, inner)


def _sorted(indices: np.ndarray, dense_shape) -> tuple[np.ndarray, np.ndarray]:
    return sorted_keys(indices, dense_shape[:indices.shape[1]])


def reorder(indices, values, dense_shape):
    """Row-major order, duplicates kept, stable (tf.sparse.reorder)."""
    perm, keys = _sorted(indices, dense_shape)
    # Keys and index rows are in one-to-one correspondence, so the sorted indices
    # come from the sorted keys sequentially instead of by a random gather.
    sparse_shape = np.asarray(dense_shape[:indices.shape[1]], np.int64)
    with PARALLEL_LOCK:
        out_indices = delinearize_parallel(keys, sparse_shape, N_CHUNKS)
    return out_indices, gather_rows(values, perm)


def _segment_sum(values2d: np.ndarray, perm: np.ndarray, starts: np.ndarray) -> np.ndarray:
    dtype = values2d.dtype
    if dtype == np.bool_:
        out = np.empty((starts.size, values2d.shape[1]), np.uint8)
        with PARALLEL_LOCK:
            segment_or_kernel(values2d.view(np.uint8), perm, starts, out, N_CHUNKS)
        return out.view(np.bool_)
    work = values2d.astype(np.float32) if dtype == np.float16 else values2d
    out = np.empty((starts.size, values2d.shape[1]), work.dtype)
    if starts.size:
        with PARALLEL_LOCK:
            segment_sum_kernel(work, perm, starts, out, N_CHUNKS)
    return out.astype(dtype, copy=False)


def coalesce(indices, values, dense_shape):
    """Sorted row-major, duplicates summed (torch's coalesce)."""
    nnz = indices.shape[0]
    perm, keys = _sorted(indices, dense_shape)
    sparse_shape = np.asarray(dense_shape[:indices.shape[1]], np.int64)
    with PARALLEL_LOCK:
        starts = segment_starts_parallel(keys, N_CHUNKS)
        # Unique indices from the sorted keys: sequential reads, unlike gathering rows of ``indices``.
        out_indices = delinearize_parallel(keys[starts], sparse_shape, N_CHUNKS)
    summed = _segment_sum(_values2d(values, nnz), perm, starts)
    return out_indices, summed.reshape((starts.size, *values.shape[1:]))


def first_disorder(indices, dense_shape) -> tuple[int, bool]:
    sparse_shape = np.asarray(dense_shape[:indices.shape[1]], dtype=np.int64)
    i, repeated = first_disorder_kernel(linearize(indices, sparse_shape))
    return int(i), bool(repeated)


def to_dense(indices, values, dense_shape, default_value, validate_indices: bool):
    """Dense array filled with default_value; entries scattered (summed when repeated)."""
    if not validate_indices:
        indices, values = coalesce(indices, values, dense_shape)
    sparse_ndim = indices.shape[1]
    sparse_shape = np.asarray(dense_shape[:sparse_ndim], dtype=np.int64)
    inner = int(np.prod(dense_shape[sparse_ndim:], dtype=np.int64))
    dense = np.empty(tuple(dense_shape), dtype=values.dtype)
    rows = dense.reshape(int(np.prod(sparse_shape)), inner)
    if rows.size == 0:
        return dense
    fill = np.full(inner, default_value, dtype=values.dtype)
    keys = linearize(indices, sparse_shape)
    values2d = _values2d(values, indices.shape[0])
    with PARALLEL_LOCK:
        fill_scatter_kernel(_words(rows), _words(fill.reshape(1, inner))[0], keys, _words(values2d),
                            N_CHUNKS)
    return dense


def from_dense(array, sparse_dim: int):
    """Coalesced COO of a dense array (torch's to_sparse(sparse_dim))."""
    lead = tuple(array.shape[:sparse_dim])
    n = int(np.prod(lead, dtype=np.int64))
    rows = np.ascontiguousarray(array).reshape(n, int(np.prod(array.shape[sparse_dim:], dtype=np.int64)))
    with PARALLEL_LOCK:
        rows_nz = nonzero_rows_kernel(_words(rows), _zero_mask(rows.dtype), N_CHUNKS)
        indices = delinearize_parallel(rows_nz, np.asarray(lead, dtype=np.int64), N_CHUNKS)
    values = gather_rows(rows, rows_nz).reshape((rows_nz.size, *array.shape[sparse_dim:]))
    return indices, values


def warm_up() -> None:
    """Every kernel of this module once per dtype (see ``sparseserve.kernels.warm_up``)."""
    from . import DTYPES

    indices = np.array([[1, 0], [0, 1], [1, 0]], dtype=np.int64)
    shape = (2, 2)
    for name in DTYPES:
        values = np.ones(3, dtype=name)
        reorder(indices, values, shape)
        coalesce(indices, values, shape)
        first_disorder(indices, shape)
        dense = to_dense(indices, values, shape, values[0], False)
        from_dense(dense, 2)
