"""Aggregating sparse @ dense products: torch.sparse.mm's ``reduce`` (mean, amax, amin).

Row i of the result reduces the products ``vals[p] * x[idx[p], :]`` over the stored entries p
of row i of a CSR matrix (explicit zeros and repeated columns are entries like any other):
their mean (the sum divided by the number of entries) or their column-wise maximum/minimum.
A row without entries is 0 for every reduce, as in PyTorch. A NaN product makes the maximum
and minimum NaN (PyTorch's rule, not ``fmax``'s).

This is the gather form of ``kernels/linalg.py``'s SpMM: one output row per CSR row (no write
conflicts), chunks of rows with about the same number of entries, and rows of ``x`` prefetched
a few entries ahead (the random reads of x are all the cost on a graph: a 1M-node, 10M-edge
mean over 64 float32 features reads 2.6 GB of x rows scattered over 256 MB).

Signatures: values and x float32 or float64 (the op layer computes float16 in float32),
``ptr`` int64, ``idx`` int32 or int64 as it arrives. Inputs are validated by the caller
(every column in range, ``ptr`` non-decreasing from 0); nothing here raises.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._parallel import PARALLEL_LOCK, PARALLEL_MIN
from ._sort import frozen
from .linalg import FAST, N_THREADS, U, balanced_bounds, prefetch

__all__ = ["REDUCES", "COMPUTE_DTYPES", "mm_reduce", "warm_up"]

# The reduce codes the kernel takes.
REDUCES = {"sum": 0, "mean": 1, "amax": 2, "amin": 3}
COMPUTE_DTYPES = ("float32", "float64")

# Rows of x prefetched this many entries ahead. A row of 64 float32 is four cache lines (five
# where numpy's 16-byte alignment makes it straddle one more): on the 2-core EPYC of
# bench/aggregate.py, 4 to 8 ahead ran best; 16 evicted lines still in use.
PREFETCH_ROWS = 6
# Chunks per thread: rows hold different numbers of entries and x's cache behaviour varies.
N_CHUNKS = 4 * N_THREADS


@njit(nogil=True, cache=True, fastmath=FAST)
def reduce_rows(ptr, idx, vals, x, y, lo, hi, mode):
    """Rows lo..hi of y [m, k]: mode 0 sum, 1 mean, 2 amax, 3 amin of vals[p] * x[idx[p]]."""
    k = x.shape[1]
    flat = x.reshape(-1)
    line = U(max(1, 64 // x.itemsize))  # elements per cache line
    end = U(ptr[hi]) if hi > lo else U(0)
    ahead = U(PREFETCH_ROWS)
    zero = y.dtype.type(0)
    for i in range(lo, hi):
        row = y[i]
        start, stop = U(ptr[i]), U(ptr[i + 1])
        if stop == start or mode <= 1:
            for j in range(k):
                row[j] = zero
        for p in range(start, stop):
            if p + ahead < end and k:
                first = U(idx[p + ahead]) * U(k)
                for e in range(first, first + U(k), line):
                    prefetch(flat, e)
                # numpy aligns to 16 bytes, not 64: a row's last line is one more line
                prefetch(flat, first + U(k) - U(1))
            v = vals[p]
            src = x[U(idx[p])]
            if mode <= 1:
                for j in range(k):
                    row[j] += v * src[j]
            elif p == start:
                for j in range(k):
                    row[j] = v * src[j]
            elif mode == 2:
                for j in range(k):
                    prod = v * src[j]
                    cur = row[j]
                    row[j] = prod if (prod > cur or prod != prod) else cur
            else:
                for j in range(k):
                    prod = v * src[j]
                    cur = row[j]
                    row[j] = prod if (prod < cur or prod != prod) else cur
        if mode == 1 and stop > start:
            count = y.dtype.type(stop - start)
            for j in range(k):
                row[j] /= count


@njit(nogil=True, cache=True, parallel=True)
def reduce_par(ptr, idx, vals, x, y, bounds, mode):
    for c in prange(bounds.size - 1):
        reduce_rows(ptr, idx, vals, x, y, bounds[c], bounds[c + 1], mode)


def mm_reduce(ptr, idx, vals, x, reduce: str) -> np.ndarray:
    """y [m, k] with y[i] the ``reduce`` of vals[p] * x[idx[p]] over row i's entries (m = ptr.size - 1).
    ``vals`` and ``x`` share one of COMPUTE_DTYPES."""
    ptr = frozen(np.ascontiguousarray(ptr, dtype=np.int64))
    idx, vals, x = (frozen(np.ascontiguousarray(a)) for a in (idx, vals, x))
    m = ptr.size - 1
    y = np.empty((m, x.shape[1]), vals.dtype)
    mode = REDUCES[reduce]
    if vals.size < PARALLEL_MIN or N_THREADS == 1:
        reduce_rows(ptr, idx, vals, x, y, 0, m, mode)
    else:
        with PARALLEL_LOCK:
            reduce_par(ptr, idx, vals, x, y, balanced_bounds(ptr, N_CHUNKS), mode)
    return y


def warm_up() -> None:
    """float32 and float64 with int32 and int64 column indices, sequential and parallel paths."""
    for index in ("int32", "int64"):
        for n in (3, PARALLEL_MIN + 1):  # a diagonal matrix: cheap even past PARALLEL_MIN
            ptr, idx = np.arange(n + 1, dtype=np.int64), np.arange(n, dtype=index)
            for name in COMPUTE_DTYPES:
                mm_reduce(ptr, idx, np.ones(n, name), np.ones((n, 2), name), "mean")
