"""Kernels of the segment reductions (tf.sparse.segment_sum / segment_mean / segment_sqrt_n) and
of bincount (tf.sparse.bincount).

Segment reductions: one pass over the (index, segment id) pairs, which both checks and reduces.
Each entry's index is checked against the data's rows and its segment id against the previous
one (sorted) and the output's rows before anything is read or written, so the kernels are
memory-safe whatever they are given: a bad entry stops its chunk and comes back as
``position * 4 + kind`` (``BAD_INDEX``, ``UNSORTED``, ``BAD_SEGMENT``) for the op layer to
phrase. Every output row is written exactly once (a segment's first row copied, the others
added to it, then divided for mean / sqrt_n; rows no entry reaches set to 0), so the output is
allocated with ``np.empty`` and nothing passes over it twice. The parallel path cuts the entries
at segment boundaries (chunk c owns the output rows from its first segment to the next chunk's
first segment), so threads never share an output row.

Work dtypes: the output's; float16 is reduced in float32 (callers convert), integers wrap as
TensorFlow's do (each addition is stored back into the narrow type).

bincount: ``bincount_scan`` checks the values (the first negative one) and finds the largest
counted one; entries are then keyed ``batch * size + value`` and reduced either into a dense
accumulator (when ``n_batch * size`` is small next to the number of values) or, past that, in
the order of a stable sort of the keys; both add weights in input order per bin, as
TensorFlow's kernel does, so float sums agree bit for bit.
"""

from __future__ import annotations

import math

import llvmlite.ir as ir
import numpy as np
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ._parallel import N_CHUNKS, PARALLEL_LOCK, PARALLEL_MIN
from ._sort import frozen

SUM, MEAN, SQRT_N = 0, 1, 2
BAD_INDEX, UNSORTED, BAD_SEGMENT = 0, 1, 2
COUNT, WEIGHTS, BINARY = 0, 1, 2

# Indices and segment ids reach the kernels as int64 (int32 ones are widened: a copy costs less
# than the warm start and compile time of a second set of signatures).
WARM_DTYPES = ("float32", "float64", "int32", "int64")
WEIGHT_DTYPES = ("int32", "int64", "float32", "float64")


# Rows are prefetched this many entries ahead: with indices in random order each row is a
# cache (and TLB) miss, and the loop would otherwise wait for them one at a time. Measured on
# 10M x 16 float32 rows in random order: 2.3x faster at 8-16 ahead, slower again past 32.
PREFETCH_AHEAD = 12


@intrinsic
def _prefetch(typingctx, address):
    """LLVM's prefetch (read, keep in every cache level) of an integer address: a hint that
    never faults."""
    def codegen(context, builder, signature, args):
        byte_ptr = ir.PointerType(ir.IntType(8))
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]),
            # mangled by the pointer type, as llvmlite's declare_intrinsic does ("p0i8" or "p0")
            "llvm.prefetch." + byte_ptr.intrinsic_name)
        builder.call(fn, [builder.inttoptr(args[0], byte_ptr), ir.Constant(i32, 0), ir.Constant(i32, 3),
                          ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(types.uintp), codegen


@njit(nogil=True, cache=True, inline="always")
def _prefetch_row(data, x):
    """Row ``x`` of a C-contiguous 2-D array: its first cache line, and its last when it spans
    two (wider rows rely on the hardware prefetcher for the lines between)."""
    row_bytes = data.shape[1] * data.itemsize
    if row_bytes:
        start = data.ctypes.data + x * row_bytes
        _prefetch(start)
        if (start & 63) + row_bytes > 64:
            _prefetch(start + row_bytes - 1)


# ------------------------------------------------------------------ segment reductions
@njit(nogil=True, cache=True, inline="always")
def _finish(out, row, count, mode, scale):
    if mode == SUM or count == 1:
        return
    # TensorFlow's arithmetic: the sum times 1 / count (1 / sqrt(count)), each in the work dtype.
    if mode == MEAN:
        scale[0] = count
    else:
        scale[0] = math.sqrt(count)
    scale[0] = 1 / scale[0]
    d = scale[0]
    for j in range(out.shape[1]):
        out[row, j] = out[row, j] * d


@njit(nogil=True, cache=True, inline="always")
def _segment_chunk(data, indices, ids, out, mode, lo, hi, row_lo, row_hi, scale):
    """Entries [lo, hi) into output rows [row_lo, row_hi); -1, or ``position * 4 + kind`` of
    the first bad entry (nothing after it is touched)."""
    n_data, n_out, width = data.shape[0], out.shape[0], out.shape[1]
    row = row_lo - 1
    count = 0
    for i in range(lo, hi):
        if i + PREFETCH_AHEAD < hi:
            ahead = indices[i + PREFETCH_AHEAD]
            # Rows in order are the hardware prefetcher's job (prefetching them anyway cost a
            # quarter of the time with indices = arange).
            if ahead != indices[i + PREFETCH_AHEAD - 1] + 1 and ahead >= 0 and ahead < n_data:
                _prefetch_row(data, ahead)
        x = indices[i]
        s = ids[i]
        if x < 0 or x >= n_data:
            return i * 4 + BAD_INDEX
        if i > 0 and s < ids[i - 1]:
            return i * 4 + UNSORTED
        if s < 0 or s >= n_out:
            return i * 4 + BAD_SEGMENT
        if count > 0 and s == row:
            for j in range(width):
                out[s, j] += data[x, j]
            count += 1
        else:
            if count > 0:
                _finish(out, row, count, mode, scale)
            for r in range(max(row + 1, 0), s):
                for j in range(width):
                    out[r, j] = 0
            for j in range(width):
                out[s, j] = data[x, j]
            row = s
            count = 1
    if count > 0:
        _finish(out, row, count, mode, scale)
    for r in range(max(row + 1, 0), min(row_hi, n_out)):
        for j in range(width):
            out[r, j] = 0
    return -1


@njit(nogil=True, cache=True)
def segment_reduce_kernel(data, indices, ids, out, mode):
    scale = np.empty(1, out.dtype)
    return _segment_chunk(data, indices, ids, out, mode, 0, indices.size, 0, out.shape[0], scale)


@njit(nogil=True, cache=True, parallel=True)
def segment_reduce_parallel(data, indices, ids, out, mode, bounds, row_bounds, errors):
    for c in prange(bounds.size - 1):
        scale = np.empty(1, out.dtype)
        errors[c] = _segment_chunk(data, indices, ids, out, mode, bounds[c], bounds[c + 1],
                                   row_bounds[c], row_bounds[c + 1], scale)


def _chunks(ids: np.ndarray, n_out: int, n_chunks: int) -> tuple[np.ndarray, np.ndarray]:
    """(entry bounds, output row bounds) of ``n_chunks`` chunks cut where segments start. Unsorted
    ids give some monotone cut (the chunks then report the disorder)."""
    k = ids.size
    bounds = np.linspace(0, k, n_chunks + 1).astype(np.int64)
    inner = bounds[1:-1]
    inner = np.where(inner > 0, np.searchsorted(ids, ids[np.maximum(inner - 1, 0)], side="right"), 0)
    bounds[1:-1] = np.clip(inner, 0, k)
    bounds = np.maximum.accumulate(bounds)
    rows = np.empty(n_chunks + 1, np.int64)
    rows[0], rows[-1] = 0, n_out
    inner = bounds[1:-1]
    rows[1:-1] = np.where(inner < k, ids[np.minimum(inner, k - 1)].astype(np.int64), n_out)
    rows = np.maximum.accumulate(np.clip(rows, 0, n_out))
    return bounds, rows


def segment_reduce(data2d: np.ndarray, indices: np.ndarray, ids: np.ndarray, n_out: int,
                   mode: int) -> tuple[np.ndarray, int]:
    """(out [n_out, width] in data2d's dtype, error): error is -1, or ``position * 4 + kind`` of
    the first bad entry (the output is then garbage). ``data2d`` C-contiguous, any dtype numba
    adds (float16 converted by the caller); indices and ids int64."""
    out = np.empty((n_out, data2d.shape[1]), data2d.dtype)
    data2d, indices, ids = frozen(data2d), frozen(indices), frozen(ids)
    k = indices.size
    if k < PARALLEL_MIN:
        return out, int(segment_reduce_kernel(data2d, indices, ids, out, mode))
    bounds, rows = _chunks(ids, n_out, N_CHUNKS)
    errors = np.empty(N_CHUNKS, np.int64)
    with PARALLEL_LOCK:
        segment_reduce_parallel(data2d, indices, ids, out, mode, frozen(bounds), frozen(rows), errors)
    bad = errors[errors >= 0]
    return out, int(bad.min()) if bad.size else -1


# ------------------------------------------------------------------ bincount
@njit(nogil=True, cache=True)
def bincount_scan(values, maxlength):
    """(position of the first negative value or -1, largest value counted (0 if none), number
    of values counted): values at or above a non-negative ``maxlength`` are not counted."""
    top = 0
    kept = 0
    for i in range(values.size):
        v = values[i]
        if v < 0:
            return i, top, kept
        if maxlength < 0 or v < maxlength:
            kept += 1
            if v > top:
                top = v
    return -1, top, kept


@njit(nogil=True, cache=True, inline="always")
def _key(values, batch, row_len, size, i):
    b = batch[i] if batch.size else (i // row_len if row_len > 0 else 0)
    return b * size + values[i]


@njit(nogil=True, cache=True)
def bincount_dense_kernel(values, batch, row_len, size, maxlength, weights, mode, n_bins):
    """(keys, sums): the bins some value reached, ascending, and their counts (int64) / weight
    sums (weights' dtype) / ones (binary), added in input order."""
    acc = np.zeros(n_bins, weights.dtype)
    seen = np.zeros(n_bins, np.bool_)
    for i in range(values.size):
        v = values[i]
        if maxlength >= 0 and v >= maxlength:
            continue
        k = _key(values, batch, row_len, size, i)
        seen[k] = True
        if mode == WEIGHTS:
            acc[k] += weights[i]
        elif mode == BINARY:
            acc[k] = 1
        else:
            acc[k] += 1
    n = 0
    for k in range(n_bins):
        if seen[k]:
            n += 1
    keys = np.empty(n, np.int64)
    sums = np.empty(n, weights.dtype)
    n = 0
    for k in range(n_bins):
        if seen[k]:
            keys[n] = k
            sums[n] = acc[k]
            n += 1
    return keys, sums


@njit(nogil=True, cache=True)
def bincount_keys_kernel(values, batch, row_len, size, maxlength, n_kept):
    """(keys, positions) of the counted values, in input order."""
    keys = np.empty(n_kept, np.int64)
    where = np.empty(n_kept, np.int64)
    n = 0
    for i in range(values.size):
        v = values[i]
        if maxlength >= 0 and v >= maxlength:
            continue
        keys[n] = _key(values, batch, row_len, size, i)
        where[n] = i
        n += 1
    return keys, where


@njit(nogil=True, cache=True)
def bincount_runs_kernel(sorted_keys, positions, weights, mode):
    """(run keys, run sums) over keys sorted stably (ties in input order)."""
    n = sorted_keys.size
    runs = 0
    for i in range(n):
        if i == 0 or sorted_keys[i] != sorted_keys[i - 1]:
            runs += 1
    keys = np.empty(runs, np.int64)
    sums = np.zeros(runs, weights.dtype)
    r = -1
    for i in range(n):
        if i == 0 or sorted_keys[i] != sorted_keys[i - 1]:
            r += 1
            keys[r] = sorted_keys[i]
        if mode == WEIGHTS:
            sums[r] += weights[positions[i]]
        elif mode == BINARY:
            sums[r] = 1
        else:
            sums[r] += 1
    return keys, sums


def bincount_scan_values(values: np.ndarray, maxlength: int) -> tuple[int, int, int]:
    bad, top, kept = bincount_scan(frozen(values), maxlength)
    return int(bad), int(top), int(kept)


def bincount(values: np.ndarray, batch: np.ndarray | None, row_len: int, size: int, n_batch: int,
             maxlength: int, weights: np.ndarray | None, binary: bool, n_kept: int):
    """(keys ascending, sums) of the bins ``batch * size + value`` reached by counted values.
    ``values`` int64 (checked non-negative), ``batch`` int64 per value or None (then
    ``i // row_len`` when row_len > 0, else 0), ``weights`` one of WEIGHT_DTYPES or None (counts
    and binary output come back int64)."""
    values = frozen(values)
    batch = frozen(batch if batch is not None else np.empty(0, np.int64))
    mode = BINARY if binary else (WEIGHTS if weights is not None else COUNT)
    weights = frozen(weights if weights is not None else np.empty(0, np.int64))
    n_bins = n_batch * size
    if n_bins <= max(4 * values.size, 1 << 12):
        keys, sums = bincount_dense_kernel(values, batch, row_len, size, maxlength, weights, mode, n_bins)
        return keys, sums
    keys, where = bincount_keys_kernel(values, batch, row_len, size, maxlength, n_kept)
    order = np.argsort(keys, kind="stable")
    return bincount_runs_kernel(frozen(keys[order]), frozen(where[order]), weights, mode)


# ------------------------------------------------------------------ warm-up
def warm_up() -> None:
    """The segment kernels (sequential and parallel) for the common data dtypes, and the bincount
    kernels for every weight dtype, with read-only inputs as the server passes them."""
    for k in (5, PARALLEL_MIN):
        indices = np.arange(k, dtype=np.int64) % 7
        ids = np.arange(k, dtype=np.int64) // 3
        for name in WARM_DTYPES:
            segment_reduce(np.ones((7, 2), name), indices, ids, int(ids[-1]) + 1, SUM)
    values = np.arange(10, dtype=np.int64) % 4
    batch = np.arange(10, dtype=np.int64) // 5
    for name in WEIGHT_DTYPES:
        w = np.ones(10, name)
        for size in (4, 1 << 20):  # dense accumulator, sorted runs
            bincount(values, batch, 0, size, 2, -1, w, False, 10)
            bincount(values, None, 5, size, 2, -1, None, False, 10)
    bincount_scan_values(values, -1)
