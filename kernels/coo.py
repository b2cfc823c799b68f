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

from ._parallel import N_CHUNKS, PARALLEL_LOCK, PARALLEL_MIN
from ._sort import (delinearize_kernel, delinearize_parallel, first_disorder_kernel, frozen, gather_rows,
                    linearize, segment_starts_kernel, segment_starts_parallel, sorted_keys)


# The segment kernels split the runs into chunks that the threads take in turn. Sum and
# or are two kernels, not one with a flag: numba types both branches for every dtype,
# and ``|`` does not exist for floats.

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
    """Rows holding any word with a bit set under ``mask``.

    One pass over the (large) input marks rows in a byte mask and counts them
    per chunk; the fill pass then reads only the mask.
    """
    n, width = words.shape
    chunk = (n + n_chunks - 1) // n_chunks
    marks = np.empty(n, np.uint8)
    counts = np.zeros(n_chunks + 1, np.int64)
    for c in prange(n_chunks):
        m = 0
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            hit = 0
            for j in range(width):
                if words[i, j] & mask:
                    hit = 1
                    break
            marks[i] = hit
            m += hit
        counts[c + 1] = m
    for c in range(n_chunks):
        counts[c + 1] += counts[c]
    out = np.empty(counts[n_chunks], np.int64)
    for c in prange(n_chunks):
        r = counts[c]
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            if marks[i]:
                out[r] = i
                r += 1
    return out


@njit(nogil=True, cache=True, parallel=True)
def fill_merge_kernel(out, fill, keys, rows, n_chunks):
    """One streaming pass: out[k] = rows[i] where keys[i] == k, else fill. Keys sorted and unique."""
    n, width = out.shape
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        lo = c * chunk
        hi = min(n, lo + chunk)
        p = np.searchsorted(keys, lo)
        for k in range(lo, hi):
            if p < keys.size and keys[p] == k:
                for j in range(width):
                    out[k, j] = rows[p, j]
                p += 1
            else:
                for j in range(width):
                    out[k, j] = fill[j]


@njit(nogil=True, cache=True, parallel=True)
def fill_merge_1d_kernel(out, fill, keys, values, n_chunks):
    """``fill_merge_kernel`` for one word per row (no hybrid dims): a tight loop the compiler vectorises."""
    n = out.size
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        lo = c * chunk
        hi = min(n, lo + chunk)
        out[lo:hi] = fill
        p = np.searchsorted(keys, lo)
        while p < keys.size and keys[p] < hi:
            out[keys[p]] = values[p]
            p += 1


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


def _sorted(indices: np.ndarray, dense_shape, values: np.ndarray | None = None):
    return sorted_keys(indices, dense_shape[:indices.shape[1]], values)


def reorder(indices, values, dense_shape):
    """Row-major order, duplicates kept, stable (tf.sparse.reorder)."""
    perm, keys, moved = _sorted(indices, dense_shape, values)
    # Keys and index rows are in one-to-one correspondence, so the sorted indices
    # come from the sorted keys sequentially instead of by a random gather.
    sparse_shape = np.asarray(dense_shape[:indices.shape[1]], np.int64)
    out_values = gather_rows(values, perm) if moved is None else moved
    if keys.size < PARALLEL_MIN:
        return delinearize_kernel(keys, sparse_shape), out_values
    with PARALLEL_LOCK:
        out_indices = delinearize_parallel(keys, sparse_shape, N_CHUNKS)
    return out_indices, out_values


def _segment_sum(values2d: np.ndarray, perm: np.ndarray, starts: np.ndarray) -> np.ndarray:
    dtype = values2d.dtype
    if dtype == np.bool_ and perm.size < PARALLEL_MIN:
        return np.logical_or.reduceat(values2d[perm], starts, axis=0) if starts.size else values2d[:0]
    if dtype == np.bool_:
        out = np.empty((starts.size, values2d.shape[1]), np.uint8)
        with PARALLEL_LOCK:
            segment_or_kernel(frozen(values2d.view(np.uint8)), perm, starts, out, N_CHUNKS)
        return out.view(np.bool_)
    work = values2d.astype(np.float32) if dtype == np.float16 else values2d
    if perm.size < PARALLEL_MIN:  # small: numpy's reduceat, no parallel region
        summed = np.add.reduceat(work[perm], starts, axis=0) if starts.size else work[:0]
        return summed.astype(dtype, copy=False)
    out = np.empty((starts.size, values2d.shape[1]), work.dtype)
    if starts.size:
        with PARALLEL_LOCK:
            segment_sum_kernel(frozen(work), perm, starts, out, N_CHUNKS)
    return out.astype(dtype, copy=False)


def coalesce(indices, values, dense_shape):
    """Sorted row-major, duplicates summed (torch's coalesce)."""
    nnz = indices.shape[0]
    # Values are not carried through the sort here: moving them in every pass cost more
    # than the one random read per entry the segment sum does (measured, 10M entries).
    perm, keys, _ = _sorted(indices, dense_shape)
    sparse_shape = np.asarray(dense_shape[:indices.shape[1]], np.int64)
    # Unique indices from the sorted keys: sequential reads, unlike gathering rows of ``indices``.
    if nnz < PARALLEL_MIN:
        starts = segment_starts_kernel(keys)
        out_indices = delinearize_kernel(keys[starts], sparse_shape)
    else:
        with PARALLEL_LOCK:
            starts = segment_starts_parallel(keys, N_CHUNKS)
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
    # Validated (validate_indices) or coalesced above: the keys are sorted and unique,
    # so the dense output is written in one sequential pass.
    keys = linearize(indices, sparse_shape)
    values2d = _values2d(values, indices.shape[0])
    if rows.size < PARALLEL_MIN:  # small: numpy fill and scatter, no parallel region
        rows[...] = fill
        rows[keys] = values2d
        return dense
    out_words, fill_words, value_words = _words(rows), _words(fill.reshape(1, inner))[0], _words(values2d)
    with PARALLEL_LOCK:
        if out_words.shape[1] == 1:
            fill_merge_1d_kernel(out_words.reshape(-1), fill_words[0], keys, frozen(value_words.reshape(-1)),
                                 N_CHUNKS)
        else:
            fill_merge_kernel(out_words, frozen(fill_words), keys, frozen(value_words), N_CHUNKS)
    return dense


def from_dense(array, sparse_dim: int):
    """Coalesced COO of a dense array (torch's to_sparse(sparse_dim))."""
    lead = tuple(array.shape[:sparse_dim])
    n = int(np.prod(lead, dtype=np.int64))
    rows = np.ascontiguousarray(array).reshape(n, int(np.prod(array.shape[sparse_dim:], dtype=np.int64)))
    words, mask = frozen(_words(rows)), _zero_mask(rows.dtype)
    if words.size < PARALLEL_MIN:  # small: numpy, no parallel region
        rows_nz = np.flatnonzero(np.any(words & mask, axis=1)) if n else np.zeros(0, np.int64)
        indices = delinearize_kernel(rows_nz.astype(np.int64), np.asarray(lead, dtype=np.int64))
        return indices, gather_rows(rows, rows_nz).reshape((rows_nz.size, *array.shape[sparse_dim:]))
    with PARALLEL_LOCK:
        rows_nz = nonzero_rows_kernel(words, mask, N_CHUNKS)
        indices = delinearize_parallel(rows_nz, np.asarray(lead, dtype=np.int64), N_CHUNKS)
    values = gather_rows(rows, rows_nz).reshape((rows_nz.size, *array.shape[sparse_dim:]))
    return indices, values


def warm_up() -> None:
    """Every kernel of this module, on its small (sequential) and large (parallel) paths, once per
    dtype (see ``sparseserve.kernels.warm_up``), with read-only inputs as the server passes them."""
    from . import DTYPES

    side = 512  # 512 x 512 = 4 x PARALLEL_MIN: the dense round trip takes the parallel path too
    for nnz in (3, PARALLEL_MIN):
        rows = np.arange(nnz, dtype=np.int64) * 7919 % (side * side)
        indices = frozen(np.stack([rows // side, rows % side], axis=1))
        indices = frozen(np.concatenate([indices, indices[:1]]))  # a duplicate
        for name in DTYPES:
            for dense_dims in ((), (2,)):
                values = frozen(np.ones((indices.shape[0], *dense_dims), dtype=name))
                full = (side, side, *dense_dims)
                reorder(indices, values, full)
                ci, cv = coalesce(indices, values, full)
                first_disorder(indices, full)
                dense = to_dense(indices, values, full, values.reshape(-1)[0], False)
                to_dense(frozen(ci), frozen(cv), full, values.reshape(-1)[0], True)
                from_dense(frozen(dense), 2)
