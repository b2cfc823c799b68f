"""Kernels of the shape ops: transpose, reshape, slice.

Inputs are validated by the op declarations (``server/ops/shape.py``): every
index is in range, every permutation is one, and every key over the old and
new sparse shapes fits int64 before anything here runs. Nothing here raises.

- transpose permutes the index columns (one pass) and re-sorts with
  ``coo.reorder`` (the stable radix sort of ``_sort``), so no second sort exists.
- reshape turns each index into its row-major key over the old sparse shape
  and splits it over the new one in the same pass (``_sort.split_key``), so
  the entries keep their order and no key array is materialised.
- slice counts the entries inside the box, then fills their shifted indices.

Each has a sequential kernel for small inputs and a chunked ``prange`` kernel
above ``PARALLEL_MIN`` entries. Signatures are few: int64 indices (read-only
C arrays, as the wrappers always pass them), int64 shape vectors; values move
with ``_sort.gather_rows``, which compiles nothing.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._parallel import N_CHUNKS, PARALLEL_LOCK, PARALLEL_MIN
from ._sort import frozen, key_divisors, split_key
from .coo import reorder

__all__ = ["transpose", "reshape", "slice_entries", "warm_up"]


def _indices(a: np.ndarray) -> np.ndarray:
    """The one array kind the kernels are compiled for: read-only C-contiguous int64."""
    return frozen(np.ascontiguousarray(a, dtype=np.int64))


# -------------------------------------------------------------------- transpose
@njit(nogil=True, cache=True)
def permute_columns_kernel(indices, perm, out):
    n, s = indices.shape
    for i in range(n):
        for j in range(s):
            out[i, j] = indices[i, perm[j]]


@njit(nogil=True, cache=True, parallel=True)
def permute_columns_parallel(indices, perm, out, n_chunks):
    n, s = indices.shape
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            for j in range(s):
                out[i, j] = indices[i, perm[j]]


def permute_columns(indices: np.ndarray, perm) -> np.ndarray:
    """``indices[:, perm]``: column j of the result is column perm[j] of the input."""
    indices = _indices(indices)
    perm = np.asarray(perm, np.int64)
    out = np.empty(indices.shape, np.int64)
    if indices.shape[0] < PARALLEL_MIN:
        permute_columns_kernel(indices, perm, out)
    else:
        with PARALLEL_LOCK:
            permute_columns_parallel(indices, perm, out, N_CHUNKS)
    return out


def transpose(indices: np.ndarray, values: np.ndarray, sparse_perm, out_shape):
    """(indices, values) of a COO tensor whose sparse dims are permuted by ``sparse_perm``,
    re-sorted row-major over ``out_shape`` (stable: repeated indices keep their order).
    ``values`` already carry any permutation of the dense dims."""
    permuted = permute_columns(indices, sparse_perm)
    return reorder(permuted, values, tuple(out_shape))


# ---------------------------------------------------------------------- reshape
@njit(nogil=True, cache=True)
def reshape_kernel(indices, old_shape, new_shape, inv, out):
    n, s = indices.shape
    for i in range(n):
        k = 0
        for j in range(s):
            k = k * old_shape[j] + indices[i, j]
        split_key(k, new_shape, inv, out, i)


@njit(nogil=True, cache=True, parallel=True)
def reshape_parallel(indices, old_shape, new_shape, inv, out, n_chunks):
    n, s = indices.shape
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            k = 0
            for j in range(s):
                k = k * old_shape[j] + indices[i, j]
            split_key(k, new_shape, inv, out, i)


def reshape(indices: np.ndarray, old_sparse_shape, new_sparse_shape) -> np.ndarray:
    """Indices over ``new_sparse_shape`` of the same row-major positions (the caller checked
    that both shapes hold the same number of positions and that it fits int64)."""
    indices = _indices(indices)
    old = np.asarray(old_sparse_shape, np.int64)
    new = np.asarray(new_sparse_shape, np.int64)
    out = np.empty((indices.shape[0], new.size), np.int64)
    inv = key_divisors(new)
    if indices.shape[0] < PARALLEL_MIN:
        reshape_kernel(indices, old, new, inv, out)
    else:
        with PARALLEL_LOCK:
            reshape_parallel(indices, old, new, inv, out, N_CHUNKS)
    return out


# ------------------------------------------------------------------------ slice
@njit(nogil=True, cache=True)
def _inside(indices, i, lo, hi):
    for j in range(lo.size):
        v = indices[i, j]
        if v < lo[j] or v >= hi[j]:
            return False
    return True


@njit(nogil=True, cache=True)
def slice_kernel(indices, lo, hi):
    """(positions, shifted indices) of the entries with lo <= index < hi, in input order."""
    n, s = indices.shape
    count = 0
    for i in range(n):
        if _inside(indices, i, lo, hi):
            count += 1
    rows = np.empty(count, np.int64)
    out = np.empty((count, s), np.int64)
    r = 0
    for i in range(n):
        if _inside(indices, i, lo, hi):
            rows[r] = i
            for j in range(s):
                out[r, j] = indices[i, j] - lo[j]
            r += 1
    return rows, out


@njit(nogil=True, cache=True, parallel=True)
def slice_count_parallel(indices, lo, hi, counts):
    """Entries inside the box per chunk; ``counts`` (n_chunks + 1 slots) comes back as offsets."""
    n = indices.shape[0]
    n_chunks = counts.size - 1
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        m = 0
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            if _inside(indices, i, lo, hi):
                m += 1
        counts[c + 1] = m
    counts[0] = 0
    for c in range(n_chunks):
        counts[c + 1] += counts[c]


@njit(nogil=True, cache=True, parallel=True)
def slice_fill_parallel(indices, lo, hi, counts, rows, out):
    n, s = indices.shape
    n_chunks = counts.size - 1
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        r = counts[c]
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            if _inside(indices, i, lo, hi):
                rows[r] = i
                for j in range(s):
                    out[r, j] = indices[i, j] - lo[j]
                r += 1


def slice_entries(indices: np.ndarray, lo, hi) -> tuple[np.ndarray, np.ndarray]:
    """(positions, indices - lo) of the entries inside [lo, hi) on every sparse dim, in order.
    ``lo`` and ``hi`` are already clipped to the dense shape."""
    indices = _indices(indices)
    lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
    if indices.shape[0] < PARALLEL_MIN:
        return slice_kernel(indices, lo, hi)
    counts = np.zeros(N_CHUNKS + 1, np.int64)
    with PARALLEL_LOCK:
        slice_count_parallel(indices, lo, hi, counts)
        rows = np.empty(counts[-1], np.int64)
        out = np.empty((counts[-1], indices.shape[1]), np.int64)
        slice_fill_parallel(indices, lo, hi, frozen(counts), rows, out)
    return rows, out


def warm_up() -> None:
    """Compile (or load from the disk cache) this module's kernels on both paths; the sort
    that transpose reuses is warmed by ``kernels.coo``."""
    for n in (3, PARALLEL_MIN):
        keys = np.arange(n, dtype=np.int64) * 7919 % (512 * 512)
        indices = frozen(np.stack([keys // 512, keys % 512], axis=1))
        values = frozen(np.ones(n, np.float64))
        transpose(indices, values, [1, 0], (512, 512))
        reshape(indices, (512, 512), (64, 64, 64))
        slice_entries(indices, [1, 2], [300, 400])
