"""Reduction kernels: reduce_sum / reduce_max over axes, softmax along a sparse axis, and
the union merge behind maximum / minimum.

A reduction works on one int64 output key per entry (its kept sparse coordinates,
linearized by ``_sort.linearize``). A dense result is a scatter of the entries' value rows
into ``[prod(kept sparse shape), inner]`` rows: sequential below ``PARALLEL_MIN`` entries;
above it each thread scatters into a private copy of the output that a second parallel pass
combines, when those copies are small next to the input, and otherwise the entries are
sorted by key and reduced per run. A sparse result always sorts and reduces runs.

Arithmetic runs in a few work dtypes so the compiled signatures stay few: integer sums in
int64 (wrap-around addition is the same modulo 2**n whatever the width, so casting back
gives the narrow type's result), integer maxima in int64 (uint64 in uint64), float16 in
float32. Callers validate the indices; nothing here raises.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from ._parallel import N_CHUNKS, PARALLEL_LOCK, PARALLEL_MIN
from ._sort import (delinearize_kernel, delinearize_parallel, frozen, gather_rows, linearize,
                    segment_starts_kernel, segment_starts_parallel, sorted_keys)
from .coo import coalesce, segment_sum_kernel

SUM, MAX = "sum", "max"

# The work dtypes the kernels are compiled for (see the module doc).
SUM_WORK_DTYPES = ("int64", "float32", "float64", "complex64", "complex128")
MAX_WORK_DTYPES = ("int64", "uint64", "float32", "float64")
SOFTMAX_WORK_DTYPES = ("float32", "float64")


def work_dtype(op: str, dtype: np.dtype) -> np.dtype:
    """The dtype ``op`` accumulates ``dtype`` values in (the result is cast back)."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return np.dtype(np.float32)
    if dtype.kind in "iu":
        return np.dtype(np.uint64 if op == MAX and dtype == np.uint64 else np.int64)
    return dtype


# ------------------------------------------------------------------ scatter (dense results)
# Max keeps NaN once it has one (``v != v``), as numpy's maximum does. Rows no entry reaches
# stay 0: TensorFlow's value for a group without stored values.

@njit(nogil=True, cache=True)
def scatter_sum_kernel(keys, values, out):
    for i in range(keys.size):
        k = keys[i]
        for j in range(values.shape[1]):
            out[k, j] += values[i, j]


@njit(nogil=True, cache=True)
def scatter_max_kernel(keys, values, out, seen):
    for i in range(keys.size):
        k = keys[i]
        if seen[k]:
            for j in range(values.shape[1]):
                v = values[i, j]
                if v > out[k, j] or v != v:
                    out[k, j] = v
        else:
            seen[k] = 1
            for j in range(values.shape[1]):
                out[k, j] = values[i, j]


@njit(nogil=True, cache=True, parallel=True)
def scatter_sum_parallel(keys, values, private, out):
    """Each part sums its slice of the entries into ``private[part]`` (zeroed), then row
    ranges of ``out`` add the parts up."""
    n_parts, n = private.shape[0], keys.size
    chunk = (n + n_parts - 1) // n_parts
    for c in prange(n_parts):
        part = private[c]
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            k = keys[i]
            for j in range(values.shape[1]):
                part[k, j] += values[i, j]
    rows = out.shape[0]
    row_chunk = (rows + n_parts - 1) // n_parts
    for c in prange(n_parts):
        for r in range(c * row_chunk, min(rows, (c + 1) * row_chunk)):
            for j in range(out.shape[1]):
                acc = private[0, r, j]
                for p in range(1, n_parts):
                    acc += private[p, r, j]
                out[r, j] = acc


@njit(nogil=True, cache=True, parallel=True)
def scatter_max_parallel(keys, values, private, seen, out):
    """``scatter_max_kernel`` with a private output and seen-mask per part, then combined."""
    n_parts, n = private.shape[0], keys.size
    chunk = (n + n_parts - 1) // n_parts
    for c in prange(n_parts):
        part, part_seen = private[c], seen[c]
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            k = keys[i]
            if part_seen[k]:
                for j in range(values.shape[1]):
                    v = values[i, j]
                    if v > part[k, j] or v != v:
                        part[k, j] = v
            else:
                part_seen[k] = 1
                for j in range(values.shape[1]):
                    part[k, j] = values[i, j]
    rows = out.shape[0]
    row_chunk = (rows + n_parts - 1) // n_parts
    for c in prange(n_parts):
        for r in range(c * row_chunk, min(rows, (c + 1) * row_chunk)):
            found = False
            for p in range(n_parts):
                if not seen[p, r]:
                    continue
                for j in range(out.shape[1]):
                    v = private[p, r, j]
                    if not found or v > out[r, j] or v != v:
                        out[r, j] = v
                found = True


# ------------------------------------------------------------------ runs (sorted entries)
@njit(nogil=True, cache=True, parallel=True)
def segment_max_parallel(values, starts, out, n_chunks):
    n, runs = values.shape[0], starts.size
    chunk = (runs + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for r in range(c * chunk, min(runs, (c + 1) * chunk)):
            end = starts[r + 1] if r + 1 < runs else n
            for j in range(values.shape[1]):
                acc = values[starts[r], j]
                for i in range(starts[r] + 1, end):
                    v = values[i, j]
                    if v > acc or v != v:
                        acc = v
                out[r, j] = acc


def _segment_reduce(sorted_values: np.ndarray, starts: np.ndarray, op: str) -> np.ndarray:
    if not starts.size:
        return sorted_values[:0].copy()
    if sorted_values.shape[0] < PARALLEL_MIN:  # numpy's reduceat: no parallel region, no compile
        ufunc = np.add if op == SUM else np.maximum
        return ufunc.reduceat(sorted_values, starts, axis=0)
    out = np.empty((starts.size, sorted_values.shape[1]), sorted_values.dtype)
    kernel = segment_sum_kernel if op == SUM else segment_max_parallel
    with PARALLEL_LOCK:
        kernel(frozen(sorted_values), frozen(starts), out, N_CHUNKS)
    return out


def _runs(kept_indices: np.ndarray, kept_shape: np.ndarray):
    """(perm, starts, run keys): the entries' stable order by output key and where its runs of
    equal keys start. No kept dimension: one run holding every entry."""
    n = kept_indices.shape[0]
    if kept_indices.shape[1] == 0:
        return np.arange(n), np.zeros(min(n, 1), np.int64), np.zeros(min(n, 1), np.int64)
    perm, keys, _ = sorted_keys(kept_indices, kept_shape)
    if n < PARALLEL_MIN:
        starts = segment_starts_kernel(keys)
    else:
        with PARALLEL_LOCK:
            starts = segment_starts_parallel(frozen(keys), N_CHUNKS)
    return perm, starts, keys[starts]


def delinearize(keys: np.ndarray, shape: np.ndarray) -> np.ndarray:
    if keys.size < PARALLEL_MIN:
        return delinearize_kernel(frozen(keys), shape)
    with PARALLEL_LOCK:
        return delinearize_parallel(frozen(keys), shape)


def _grouped(kept_indices, kept_shape, values2d, op):
    """(run keys, reduced rows): the entries reduced per output key, keys ascending."""
    perm, starts, run_keys = _runs(kept_indices, kept_shape)
    sorted_values = np.ascontiguousarray(gather_rows(values2d, perm))
    return run_keys, _segment_reduce(sorted_values, starts, op)


def _n_parts() -> int:
    return max(1, numba.get_num_threads())


def reduce_to_dense(kept_indices: np.ndarray, kept_shape, values2d: np.ndarray, op: str) -> np.ndarray:
    """``[prod(kept_shape), inner]`` rows of ``values2d`` (a work dtype) reduced by ``op`` per
    kept-index key; rows no entry reaches are 0."""
    kept_shape = np.asarray(kept_shape, dtype=np.int64)
    rows = int(np.prod(kept_shape, dtype=np.int64))
    n, inner = values2d.shape
    out = np.zeros((rows, inner), values2d.dtype)
    if n == 0 or out.size == 0:
        return out
    if not kept_shape.size and op == SUM:
        # Everything into one row: a plain sum, without a key per entry (for 16 M entries the
        # zero keys alone were 128 MB to write and read: 5x the time of the sum).
        out[0] = values2d.sum(axis=0, dtype=values2d.dtype)
        return out
    values2d = frozen(np.ascontiguousarray(values2d))
    if n >= PARALLEL_MIN and _n_parts() * rows > n:
        # Private copies would outweigh the input: sort the entries instead, and the
        # scatter of one row per key touches each output row once.
        run_keys, reduced = _grouped(kept_indices, kept_shape, values2d, op)
        out[run_keys] = reduced
        return out
    keys = frozen(linearize(kept_indices, kept_shape) if kept_shape.size else np.zeros(n, np.int64))
    if n < PARALLEL_MIN:
        if op == SUM:
            scatter_sum_kernel(keys, values2d, out)
        else:
            scatter_max_kernel(keys, values2d, out, np.zeros(rows, np.uint8))
        return out
    parts = _n_parts()
    private = np.zeros((parts, rows, inner), values2d.dtype)
    with PARALLEL_LOCK:
        if op == SUM:
            scatter_sum_parallel(keys, values2d, private, out)
        else:
            scatter_max_parallel(keys, values2d, private, np.zeros((parts, rows), np.uint8), out)
    return out


def reduce_to_sparse(kept_indices: np.ndarray, kept_shape, values2d: np.ndarray, op: str):
    """(coordinates ``[groups, len(kept_shape)]`` ascending row-major, reduced rows): one group
    per distinct kept index among the entries."""
    kept_shape = np.asarray(kept_shape, dtype=np.int64)
    values2d = frozen(np.ascontiguousarray(values2d))
    run_keys, reduced = _grouped(kept_indices, kept_shape, values2d, op)
    if not kept_shape.size:
        return np.zeros((run_keys.size, 0), np.int64), reduced
    return delinearize(run_keys, kept_shape), reduced


# ------------------------------------------------------------------ softmax
@njit(nogil=True, cache=True)
def _softmax_run(values, lo, hi, out, log):
    """Softmax (or log-softmax) of ``values[lo:hi]`` down each column: the max subtracted
    first, the sum in float64. A run that is all -inf gives NaN, as torch's does."""
    for j in range(values.shape[1]):
        m = values[lo, j]
        for i in range(lo + 1, hi):
            v = values[i, j]
            if v > m or v != v:
                m = v
        total = 0.0
        for i in range(lo, hi):
            e = np.exp(values[i, j] - m)
            total += e
            if not log:
                out[i, j] = e
        if log:
            shift = np.log(total)
            for i in range(lo, hi):
                out[i, j] = values[i, j] - m - shift
        else:
            for i in range(lo, hi):
                out[i, j] = out[i, j] / total


@njit(nogil=True, cache=True)
def softmax_runs_kernel(values, starts, out, log):
    n, runs = values.shape[0], starts.size
    for r in range(runs):
        _softmax_run(values, starts[r], starts[r + 1] if r + 1 < runs else n, out, log)


@njit(nogil=True, cache=True, parallel=True)
def softmax_runs_parallel(values, starts, out, log, n_chunks):
    n, runs = values.shape[0], starts.size
    chunk = (runs + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for r in range(c * chunk, min(runs, (c + 1) * chunk)):
            _softmax_run(values, starts[r], starts[r + 1] if r + 1 < runs else n, out, log)


def softmax_lines(line_indices: np.ndarray, line_shape, values2d: np.ndarray, log: bool) -> np.ndarray:
    """Softmax of ``values2d`` (float32/float64, unique entries) over the entries that share
    their ``line_indices`` (the sparse coordinates other than the softmax axis), each column
    on its own; returned in the entries' order."""
    n = values2d.shape[0]
    if n == 0 or values2d.shape[1] == 0:
        return np.array(values2d, copy=True)
    perm, starts, _ = _runs(line_indices, np.asarray(line_shape, dtype=np.int64))
    sorted_values = frozen(np.ascontiguousarray(gather_rows(np.ascontiguousarray(values2d), perm)))
    done = np.empty_like(sorted_values)
    if n < PARALLEL_MIN:
        softmax_runs_kernel(sorted_values, frozen(starts), done, log)
    else:
        with PARALLEL_LOCK:
            softmax_runs_parallel(sorted_values, frozen(starts), done, log, N_CHUNKS)
    out = np.empty_like(done)
    out[perm] = done
    return out


def softmax_dense_axis(values: np.ndarray, axis: int, log: bool) -> np.ndarray:
    """Softmax along a dense (values) axis, where every element is stored: plain numpy."""
    if values.size == 0:
        return np.array(values, copy=True)
    with np.errstate(all="ignore"):
        m = np.max(values, axis=axis, keepdims=True)
        shifted = values - m
        e = np.exp(shifted)
        total = np.sum(e, axis=axis, keepdims=True)
        return shifted - np.log(total) if log else e / total


# ------------------------------------------------------------------ union (maximum, minimum)
@njit(nogil=True, cache=True)
def _union_count(a, b, alo, ahi, blo, bhi):
    i, j, m = alo, blo, 0
    while i < ahi and j < bhi:
        if a[i] < b[j]:
            i += 1
        elif b[j] < a[i]:
            j += 1
        else:
            i += 1
            j += 1
        m += 1
    return m + (ahi - i) + (bhi - j)


@njit(nogil=True, cache=True)
def _union_fill(a, b, alo, ahi, blo, bhi, pos, keys, ia, ib):
    """Merge sorted unique ``a[alo:ahi]`` and ``b[blo:bhi]`` into ``keys[pos:]``, with each
    key's position in a and in b (-1 where it is absent)."""
    i, j = alo, blo
    while i < ahi or j < bhi:
        if j >= bhi or (i < ahi and a[i] < b[j]):
            keys[pos] = a[i]
            ia[pos] = i
            ib[pos] = -1
            i += 1
        elif i >= ahi or b[j] < a[i]:
            keys[pos] = b[j]
            ia[pos] = -1
            ib[pos] = j
            j += 1
        else:
            keys[pos] = a[i]
            ia[pos] = i
            ib[pos] = j
            i += 1
            j += 1
        pos += 1


@njit(nogil=True, cache=True)
def union_kernel(a, b):
    m = _union_count(a, b, 0, a.size, 0, b.size)
    keys, ia, ib = np.empty(m, np.int64), np.empty(m, np.int64), np.empty(m, np.int64)
    _union_fill(a, b, 0, a.size, 0, b.size, 0, keys, ia, ib)
    return keys, ia, ib


@njit(nogil=True, cache=True, parallel=True)
def union_count_parallel(a, b, a_bounds, b_bounds, counts):
    for c in prange(a_bounds.size - 1):
        counts[c + 1] = _union_count(a, b, a_bounds[c], a_bounds[c + 1], b_bounds[c], b_bounds[c + 1])


@njit(nogil=True, cache=True, parallel=True)
def union_fill_parallel(a, b, a_bounds, b_bounds, offsets, keys, ia, ib):
    for c in prange(a_bounds.size - 1):
        _union_fill(a, b, a_bounds[c], a_bounds[c + 1], b_bounds[c], b_bounds[c + 1], offsets[c],
                    keys, ia, ib)


def union(a_keys: np.ndarray, b_keys: np.ndarray):
    """(keys, ia, ib): the sorted union of two sorted unique key arrays and where each key sits
    in either (-1: absent). In parallel, a is cut into chunks and b at the same keys."""
    a_keys, b_keys = frozen(a_keys), frozen(b_keys)
    if a_keys.size + b_keys.size < PARALLEL_MIN or a_keys.size < N_CHUNKS:
        return union_kernel(a_keys, b_keys)
    a_bounds = np.linspace(0, a_keys.size, N_CHUNKS + 1).astype(np.int64)
    b_bounds = np.searchsorted(b_keys, a_keys[np.minimum(a_bounds, a_keys.size - 1)]).astype(np.int64)
    b_bounds[0], b_bounds[-1] = 0, b_keys.size
    counts = np.zeros(N_CHUNKS + 1, np.int64)
    with PARALLEL_LOCK:
        union_count_parallel(a_keys, b_keys, frozen(a_bounds), frozen(b_bounds), counts)
        offsets = np.cumsum(counts)
        keys = np.empty(offsets[-1], np.int64)
        ia, ib = np.empty_like(keys), np.empty_like(keys)
        union_fill_parallel(a_keys, b_keys, frozen(a_bounds), frozen(b_bounds), frozen(offsets), keys, ia, ib)
    return keys, ia, ib


def _spread(values: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Rows of ``values`` at the union positions that hold them, zeros elsewhere."""
    out = np.zeros((where.size, *values.shape[1:]), values.dtype)
    present = where >= 0
    out[present] = gather_rows(values, where[present])
    return out


def elementwise_extreme(a_indices, a_values, b_indices, b_values, dense_shape, take_max: bool):
    """(indices, values) of tf.sparse.maximum / minimum: both operands coalesced (duplicates
    summed), the union of their entries, an operand's missing entry counting as 0."""
    ai, av = coalesce(a_indices, a_values, dense_shape)
    bi, bv = coalesce(b_indices, b_values, dense_shape)
    shape = np.asarray(dense_shape[:ai.shape[1]], dtype=np.int64)
    keys, ia, ib = union(linearize(ai, shape), linearize(bi, shape))
    with np.errstate(all="ignore"):
        fn = np.maximum if take_max else np.minimum
        values = fn(_spread(av, ia), _spread(bv, ib))
    return delinearize(keys, shape), values


# ------------------------------------------------------------------ warm-up
def warm_up() -> None:
    """Compile (or load from the disk cache) every signature the reduce ops use, on the small
    and large paths, with the read-only inputs the wrappers pass."""
    side = 512
    for n in (5, 2 * PARALLEL_MIN):
        flat = np.arange(n, dtype=np.int64) * 7919 % (side * side)
        indices = np.stack([flat // side, flat % side], axis=1)
        for op, dtypes in ((SUM, SUM_WORK_DTYPES), (MAX, MAX_WORK_DTYPES)):
            for name in dtypes:
                values = np.ones((n, 2), name)
                reduce_to_dense(indices[:, :1], [side], values, op)  # few rows: private copies
                reduce_to_dense(indices, [side, side], values, op)   # many rows: sorted runs
                reduce_to_dense(indices[:, :0], [], values, op)
                reduce_to_sparse(indices[:, :1], [side], values, op)
                reduce_to_sparse(indices[:, :0], [], values, op)
        for name in SOFTMAX_WORK_DTYPES:
            softmax_lines(indices[:, :1], [side], np.ones((n, 2), name), False)
            softmax_lines(indices[:, :1], [side], np.ones((n, 2), name), True)
        keys = np.unique(flat)
        union(keys, keys[::2] + 1)
        delinearize(keys, np.array([side, side], np.int64))
