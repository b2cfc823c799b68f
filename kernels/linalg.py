"""Linear-algebra kernels: SpMV/SpMM (gather and scatter forms), SpGEMM, SDDMM.

Every product is phrased over the CSR arrays ``(ptr, idx, vals)`` of some
matrix M: the *gather* form computes ``M @ X`` (one output row per CSR row, no
write conflicts), the *scatter* form computes ``M^T @ X`` (each stored entry
adds into the output row named by its column) without building the transpose.
A CSC matrix is the CSR of its transpose, so the op layer maps every
layout/adjoint pair onto one of the two forms.

Work is split into chunks of consecutive rows holding about the same number of
stored entries (``balanced_bounds``), so a few dense rows don't leave a thread
idle. Each product has a sequential worker over a row range (the path below
``PARALLEL_MIN`` entries, with no threading overhead) and a ``parallel=True``
driver running the worker over the chunks.

Signatures: values in the compute dtypes ``COMPUTE_DTYPES`` (the op layer casts
narrower integers and float16 up and the result back), indices int32 or int64
as they arrive: a 20M-entry int32 index array is read as is, never upcast.
Inputs are validated by the caller; nothing here raises.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import intrinsic

from ._parallel import PARALLEL_LOCK, PARALLEL_MIN
from ._sort import frozen

__all__ = ["COMPUTE_DTYPES", "spmv", "spmm", "spgemm", "sddmm", "balanced_bounds", "warm_up"]

COMPUTE_DTYPES = ("int64", "float32", "float64", "complex64", "complex128")
INDEX_DTYPES = ("int32", "int64")

# One chunk per thread for the scatter form (each chunk owns a private output) and for
# SpGEMM (each owns a bitmap and an accumulator of one output row's width); the gather
# form takes a few per thread, as chunk costs vary with the cache behaviour of x.
N_THREADS = max(1, numba.config.NUMBA_NUM_THREADS)
N_GATHER_CHUNKS = 4 * N_THREADS

# Indices cast to unsigned before use: numba then skips its negative-index wraparound
# test, which on a gather of int32 indices halved SpMV's speed. Validated input only.
U = np.uintp

# Gathers from x prefetch the entry this many positions ahead: x is random access (and
# larger than L2), the index stream tells where the next misses are. Into L2 only
# (locality 2, prefetcht1): a prefetch into L1 evicts lines still in use that far ahead.
# On a 2-core Zen 4, SpMV of 20M entries over a 16 MB x: 72 ms without, 34 ms at 64
# ahead into L1, 26 ms at 192 ahead into L2.
PREFETCH_AHEAD = 192
PREFETCH_SPMM_ROWS = 8  # a row of x is many lines: fewer rows ahead
PREFETCH_LOCALITY = 2


@intrinsic
def prefetch(typingctx, arr, i):
    """A read prefetch of ``arr[i]`` into L2 (1-D; llvm.prefetch, no effect on results or faults)."""
    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]])
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, PREFETCH_LOCALITY),
                          ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.void(arr, i), codegen


# Summation order may be reassociated (independent accumulators, vector loads), as every BLAS
# does; NaN and inf keep their IEEE meaning (no 'nnan'/'ninf'). Only where a result may depend on
# the CPU's vector width: the SpMV the solvers iterate with (spmv_rows) takes no flags, so that
# its row sums are the same bits on every machine (kernels/solvers.py).
FAST = {"reassoc", "contract", "nsz", "arcp"}


# ------------------------------------------------------------------ chunking
def balanced_bounds(ptr: np.ndarray, n_chunks: int) -> np.ndarray:
    """Row bounds [n_chunks + 1] splitting a CSR into runs of about nnz / n_chunks entries."""
    n_rows = ptr.size - 1
    nnz = int(ptr[-1]) if n_rows >= 0 and ptr.size else 0
    targets = (np.arange(n_chunks + 1, dtype=np.int64) * nnz) // max(n_chunks, 1)
    bounds = np.searchsorted(ptr, targets, side="left").astype(np.int64)
    bounds[0], bounds[-1] = 0, n_rows
    return np.minimum(np.maximum.accumulate(bounds), n_rows)


# ------------------------------------------------------------------ gather: y = M @ x
@njit(nogil=True, cache=True)
def spmv_rows(ptr, idx, vals, x, y, lo, hi):
    """Rows lo..hi of y = M @ x, each row summed left to right (no fastmath: the same bits on
    every CPU; bench/solvers.py measured it no slower, the loop being bound by x's gathers)."""
    end = U(ptr[hi]) if hi > lo else U(0)
    ahead = U(PREFETCH_AHEAD)
    for i in range(lo, hi):
        acc = y.dtype.type(0)
        for p in range(U(ptr[i]), U(ptr[i + 1])):
            if p + ahead < end:
                prefetch(x, U(idx[p + ahead]))
            acc += vals[p] * x[U(idx[p])]
        y[i] = acc


@njit(nogil=True, cache=True, parallel=True)
def spmv_par(ptr, idx, vals, x, y, bounds):
    for c in prange(bounds.size - 1):
        spmv_rows(ptr, idx, vals, x, y, bounds[c], bounds[c + 1])


@njit(nogil=True, cache=True)
def spmm_rows(ptr, idx, vals, x, y, lo, hi):
    k = x.shape[1]
    flat = x.reshape(-1)
    line = U(max(1, 64 // x.itemsize))  # elements per cache line
    end = U(ptr[hi]) if hi > lo else U(0)
    ahead = U(PREFETCH_SPMM_ROWS)
    for i in range(lo, hi):
        row = y[i]
        for j in range(k):
            row[j] = 0
        for p in range(U(ptr[i]), U(ptr[i + 1])):
            if p + ahead < end:
                start = U(idx[p + ahead]) * U(k)
                for e in range(start, start + U(k), line):
                    prefetch(flat, e)
            v = vals[p]
            src = x[U(idx[p])]
            for j in range(k):
                row[j] += v * src[j]


@njit(nogil=True, cache=True, parallel=True)
def spmm_par(ptr, idx, vals, x, y, bounds):
    for c in prange(bounds.size - 1):
        spmm_rows(ptr, idx, vals, x, y, bounds[c], bounds[c + 1])


# ------------------------------------------------------------------ scatter: y = M^T @ x
@njit(nogil=True, cache=True)
def scatter_rows(ptr, idx, vals, x, y, lo, hi):
    """y[idx[p], :] += vals[p] * x[i, :] over rows lo..hi; y is 2-D [n_cols, k] (k may be 1)."""
    k = x.shape[1]
    for i in range(lo, hi):
        src = x[i]
        for p in range(U(ptr[i]), U(ptr[i + 1])):
            v = vals[p]
            dst = y[U(idx[p])]
            for j in range(k):
                dst[j] += v * src[j]


@njit(nogil=True, cache=True)
def scatter_vec_rows(ptr, idx, vals, x, y, lo, hi):
    for i in range(lo, hi):
        xi = x[i]
        for p in range(U(ptr[i]), U(ptr[i + 1])):
            y[U(idx[p])] += vals[p] * xi


@njit(nogil=True, cache=True, parallel=True)
def scatter_par(ptr, idx, vals, x, private, bounds):
    """Each chunk scatters into its own ``private[c]`` (zeroed here); the sum over chunks is
    taken by the caller's reduce, so no two threads write one element."""
    for c in prange(bounds.size - 1):
        out = private[c]
        for r in range(out.shape[0]):
            for j in range(out.shape[1]):
                out[r, j] = 0
        scatter_rows(ptr, idx, vals, x, out, bounds[c], bounds[c + 1])


@njit(nogil=True, cache=True, parallel=True)
def reduce_private(private, y, n_chunks):
    """y = sum over c of private[c], split over output rows."""
    n = y.shape[0]
    step = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for r in range(c * step, min(n, (c + 1) * step)):
            for j in range(y.shape[1]):
                acc = private[0, r, j]
                for t in range(1, private.shape[0]):
                    acc += private[t, r, j]
                y[r, j] = acc


# ------------------------------------------------------------------ SpGEMM (Gustavson)
# Row i of A @ B sums rows a_idx[p] of B, which lie anywhere in B: their starts are
# prefetched this many entries of A ahead (B rows are short, so their misses otherwise
# serialize). Halved the numeric pass at 10 entries per row.
PREFETCH_B_ROWS = 4
ONE = np.uint64(1)


@njit(nogil=True, cache=True)
def _prefetch_b_row(a_idx, b_ptr, b_arr, p, a_end):
    """Prefetch the start of ``b_arr`` (B's indices or values) for the entry of A ahead."""
    if p + U(PREFETCH_B_ROWS) < a_end:
        prefetch(b_arr, U(b_ptr[U(a_idx[p + U(PREFETCH_B_ROWS)])]))


@njit(nogil=True, cache=True)
def spgemm_count_rows(a_ptr, a_idx, b_ptr, b_idx, marker, counts, lo, hi):
    """Symbolic pass: counts[i] = distinct columns of row i of A @ B. ``marker[col]`` holds the
    last row that saw col (rows only grow, so it never needs clearing)."""
    a_end = U(a_ptr[hi]) if hi > lo else U(0)
    for i in range(lo, hi):
        n = 0
        for p in range(U(a_ptr[i]), U(a_ptr[i + 1])):
            _prefetch_b_row(a_idx, b_ptr, b_idx, p, a_end)
            r = U(a_idx[p])
            for q in range(U(b_ptr[r]), U(b_ptr[r + U(1)])):
                col = U(b_idx[q])
                if marker[col] != i:
                    marker[col] = i
                    n += 1
        counts[i] = n


@njit(nogil=True, cache=True, parallel=True)
def spgemm_count_par(a_ptr, a_idx, b_ptr, b_idx, markers, counts, bounds):
    for c in prange(bounds.size - 1):
        spgemm_count_rows(a_ptr, a_idx, b_ptr, b_idx, markers[c], counts, bounds[c], bounds[c + 1])


@njit(nogil=True, cache=True)
def _merge_runs(cols, tmp, runs, n_runs, start, end):
    """Sorts cols[start:end], made of ``n_runs`` ascending runs starting at runs[0..n_runs)
    (each a subsequence of a sorted row of B), by merging pairs of runs level by level through
    ``tmp``: about log2(runs) passes over the row instead of a comparison sort."""
    runs[n_runs] = end
    src, dst = cols, tmp
    in_tmp = False
    while n_runs > 1:
        out_runs = 0
        for r in range(0, n_runs, 2):
            lo, mid = runs[r], runs[r + 1]
            hi = runs[r + 2] if r + 2 <= n_runs else mid
            i, j, o = lo, mid, lo
            while i < mid and j < hi:
                if src[j] < src[i]:
                    dst[o] = src[j]
                    j += 1
                else:
                    dst[o] = src[i]
                    i += 1
                o += 1
            while i < mid:
                dst[o] = src[i]
                i += 1
                o += 1
            while j < hi:
                dst[o] = src[j]
                j += 1
                o += 1
            runs[out_runs] = lo
            out_runs += 1
        runs[out_runs] = end
        n_runs = out_runs
        src, dst = dst, src
        in_tmp = not in_tmp
    if in_tmp:
        for o in range(start, end):
            cols[o] = tmp[o]


@njit(nogil=True, cache=True)
def spgemm_fill_rows(a_ptr, a_idx, a_vals, b_ptr, b_idx, b_vals, c_ptr, c_idx, c_vals, bitmap, summary, acc,
                     tmp, runs, lo, hi):
    """Numeric pass into the counted slots. Seen columns are bits of ``bitmap`` (one bit per
    column: it stays in L1 where a marker array would not), with ``summary`` one bit per
    bitmap word; values sum in the dense accumulator ``acc``. The row comes out in column
    order by walking the set bits, summary first, which costs about one word per 4,096
    columns; where the row is too short for that to pay, the columns (appended in
    first-seen order, one ascending run per entry of A's row) are merged instead. Both
    paths leave the bitmap and summary zeroed for the next row."""
    n_summary = summary.size
    a_end = U(a_ptr[hi]) if hi > lo else U(0)
    for i in range(lo, hi):
        start = c_ptr[i]
        n = start
        n_runs = 0
        for p in range(U(a_ptr[i]), U(a_ptr[i + 1])):
            _prefetch_b_row(a_idx, b_ptr, b_idx, p, a_end)
            _prefetch_b_row(a_idx, b_ptr, b_vals, p, a_end)
            r = U(a_idx[p])
            v = a_vals[p]
            first = n
            for q in range(U(b_ptr[r]), U(b_ptr[r + U(1)])):
                col = U(b_idx[q])
                w = col >> U(6)
                bit = ONE << np.uint64(col & U(63))
                word = bitmap[w]
                if word & bit:
                    acc[col] += v * b_vals[q]
                else:
                    bitmap[w] = word | bit
                    summary[w >> U(6)] |= ONE << np.uint64(w & U(63))
                    acc[col] = v * b_vals[q]
                    c_idx[n] = col
                    n += 1
            if n > first:
                runs[n_runs] = first
                n_runs += 1
        if n_summary <= 4 * (n - start):
            o = start
            for s in range(n_summary):
                sw = summary[s]
                if sw:
                    summary[s] = 0
                    while sw:
                        w = U(s) * U(64) + U(trailing_zeros(sw))
                        sw &= sw - ONE
                        word = bitmap[w]
                        bitmap[w] = 0
                        while word:
                            col = w * U(64) + U(trailing_zeros(word))
                            word &= word - ONE
                            c_idx[o] = col
                            c_vals[o] = acc[col]
                            o += 1
        else:
            if n_runs > 1:
                _merge_runs(c_idx, tmp, runs, n_runs, start, n)
            for s in range(start, n):
                col = U(c_idx[s])
                c_vals[s] = acc[col]
                w = col >> U(6)
                bitmap[w] = 0
                summary[w >> U(6)] = 0


@njit(nogil=True, cache=True, parallel=True)
def spgemm_fill_par(a_ptr, a_idx, a_vals, b_ptr, b_idx, b_vals, c_ptr, c_idx, c_vals, bitmaps, summaries, accs,
                    tmp, runs, bounds):
    for c in prange(bounds.size - 1):
        spgemm_fill_rows(a_ptr, a_idx, a_vals, b_ptr, b_idx, b_vals, c_ptr, c_idx, c_vals, bitmaps[c],
                         summaries[c], accs[c], tmp, runs[c], bounds[c], bounds[c + 1])


# ------------------------------------------------------------------ SDDMM
@njit(nogil=True, cache=True, fastmath=FAST)
def sddmm_entries(rows, cols, vals, m1, m2t, alpha, beta, use_input, out, lo, hi):
    """out[p] = alpha * <m1[rows[p]], m2t[cols[p]]> (+ beta * vals[p] when ``use_input``)."""
    d = m1.shape[1]
    for p in range(lo, hi):
        a = m1[U(rows[p])]
        b = m2t[U(cols[p])]
        acc = out.dtype.type(0)
        for j in range(d):
            acc += a[j] * b[j]
        acc = alpha * acc
        if use_input:
            acc += beta * vals[p]
        out[p] = acc


@njit(nogil=True, cache=True, parallel=True)
def sddmm_par(rows, cols, vals, m1, m2t, alpha, beta, use_input, out, n_chunks):
    n = out.size
    step = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        sddmm_entries(rows, cols, vals, m1, m2t, alpha, beta, use_input, out, c * step, min(n, (c + 1) * step))


# ------------------------------------------------------------------ wrappers
def _ro(*arrays):
    return tuple(frozen(np.ascontiguousarray(a)) for a in arrays)


def spmv(ptr, idx, vals, x, n_out: int, transpose: bool) -> np.ndarray:
    """``M @ x`` (gather) or ``M^T @ x`` (scatter, n_out = M's columns) for a 1-D x."""
    ptr, idx, vals, x = _ro(ptr, idx, vals, x)
    if not transpose:
        y = np.empty(n_out, vals.dtype)
        if vals.size < PARALLEL_MIN:
            spmv_rows(ptr, idx, vals, x, y, 0, n_out)
        else:
            with PARALLEL_LOCK:
                spmv_par(ptr, idx, vals, x, y, balanced_bounds(ptr, N_GATHER_CHUNKS))
        return y
    if vals.size < PARALLEL_MIN or N_THREADS == 1:
        y = np.zeros(n_out, vals.dtype)
        scatter_vec_rows(ptr, idx, vals, x, y, 0, ptr.size - 1)
        return y
    return spmm(ptr, idx, vals, frozen(x.reshape(-1, 1)), n_out, True).reshape(n_out)


def spmm(ptr, idx, vals, x, n_out: int, transpose: bool) -> np.ndarray:
    """``M @ X`` (gather) or ``M^T @ X`` (scatter) for a 2-D X [*, k]; returns [n_out, k]."""
    ptr, idx, vals, x = _ro(ptr, idx, vals, x)
    k = x.shape[1]
    n_rows = ptr.size - 1
    if not transpose:
        y = np.empty((n_out, k), vals.dtype)
        if vals.size < PARALLEL_MIN:
            spmm_rows(ptr, idx, vals, x, y, 0, n_rows)
        else:
            with PARALLEL_LOCK:
                spmm_par(ptr, idx, vals, x, y, balanced_bounds(ptr, N_GATHER_CHUNKS))
        return y
    if vals.size < PARALLEL_MIN or N_THREADS == 1:
        y = np.zeros((n_out, k), vals.dtype)
        scatter_rows(ptr, idx, vals, x, y, 0, n_rows)
        return y
    private = np.empty((N_THREADS, n_out, k), vals.dtype)
    y = np.empty((n_out, k), vals.dtype)
    with PARALLEL_LOCK:
        scatter_par(ptr, idx, vals, x, private, balanced_bounds(ptr, N_THREADS))
        reduce_private(private, y, N_THREADS * 4)
    return y


def scatter_pays(nnz: int, n_out: int, k: int, itemsize: int, index_itemsize: int) -> bool:
    """Whether the scatter form (private outputs per thread) moves fewer bytes than building
    the transpose (indices, values and a permutation) and gathering."""
    if nnz < PARALLEL_MIN or N_THREADS == 1:
        return True
    private = 2 * N_THREADS * n_out * k * itemsize
    transpose = nnz * (2 * index_itemsize + 2 * itemsize + 8)
    return private <= transpose


def spgemm_count(a_ptr, a_idx, b_ptr, b_idx, n_cols: int):
    """Row counts of A @ B (pass one), and the row bounds pass two must reuse."""
    a_ptr, a_idx, b_ptr, b_idx = _ro(a_ptr, a_idx, b_ptr, b_idx)
    n_rows = a_ptr.size - 1
    counts = np.empty(n_rows, np.int64)
    if a_idx.size < PARALLEL_MIN:
        bounds = np.array([0, n_rows], np.int64)
        spgemm_count_rows(a_ptr, a_idx, b_ptr, b_idx, np.full(n_cols, -1, np.int64), counts, 0, n_rows)
    else:
        bounds = balanced_bounds(a_ptr, N_THREADS)
        with PARALLEL_LOCK:
            spgemm_count_par(a_ptr, a_idx, b_ptr, b_idx, np.full((N_THREADS, n_cols), -1, np.int64),
                             counts, bounds)
    return counts, bounds


def spgemm_fill(a_ptr, a_idx, a_vals, b_ptr, b_idx, b_vals, c_ptr, c_idx, n_cols: int, bounds):
    """Pass two: fills ``c_idx`` (allocated by the caller from the counts) and returns values."""
    a_ptr, a_idx, a_vals, b_ptr, b_idx, b_vals, c_ptr = _ro(a_ptr, a_idx, a_vals, b_ptr, b_idx, b_vals, c_ptr)
    n_chunks = bounds.size - 1
    c_vals = np.empty(c_idx.size, a_vals.dtype)
    words = (n_cols + 63) // 64
    bitmaps = np.zeros((n_chunks, words), np.uint64)
    summaries = np.zeros((n_chunks, (words + 63) // 64), np.uint64)
    accs = np.empty((n_chunks, n_cols), a_vals.dtype)
    # The merge buffer shadows c_idx (rows are disjoint, so chunks share it); run starts
    # need one slot per entry of the longest row of A, plus the end.
    tmp = np.empty(c_idx.size, c_idx.dtype)
    longest = int(np.max(np.diff(a_ptr))) if a_ptr.size > 1 else 0
    runs = np.empty((n_chunks, longest + 2), np.int64)
    if n_chunks == 1:
        spgemm_fill_rows(a_ptr, a_idx, a_vals, b_ptr, b_idx, b_vals, c_ptr, c_idx, c_vals, bitmaps[0],
                         summaries[0], accs[0], tmp, runs[0], 0, a_ptr.size - 1)
    else:
        with PARALLEL_LOCK:
            spgemm_fill_par(a_ptr, a_idx, a_vals, b_ptr, b_idx, b_vals, c_ptr, c_idx, c_vals, bitmaps,
                            summaries, accs, tmp, runs, bounds)
    return c_vals


def spgemm(a_ptr, a_idx, a_vals, b_ptr, b_idx, b_vals, n_cols: int, index_dtype, max_nnz=None):
    """CSR (ptr, idx, vals) of A @ B, columns ascending in each row, no repeats; index arrays in
    ``index_dtype`` (int64 where int32 cannot hold them). ``max_nnz``: a callable given the
    counted nnz before anything of that size is allocated (it may raise)."""
    counts, bounds = spgemm_count(a_ptr, a_idx, b_ptr, b_idx, n_cols)
    c_ptr = np.zeros(counts.size + 1, np.int64)
    np.cumsum(counts, out=c_ptr[1:])
    nnz = int(c_ptr[-1])
    if max_nnz is not None:
        max_nnz(nnz)
    dtype = np.dtype(index_dtype)
    if dtype == np.int32 and max(nnz, n_cols) > np.iinfo(np.int32).max:
        dtype = np.dtype(np.int64)
    c_idx = np.empty(nnz, dtype)
    c_vals = spgemm_fill(a_ptr, a_idx, a_vals, b_ptr, b_idx, b_vals, c_ptr, c_idx, n_cols, bounds)
    return c_ptr.astype(dtype, copy=False), c_idx, c_vals


def sddmm(rows, cols, vals, m1, m2t, alpha, beta, use_input: bool) -> np.ndarray:
    """Per stored entry p: alpha * (m1 @ m2t.T)[rows[p], cols[p]] + beta * vals[p]."""
    rows, cols, vals, m1, m2t = _ro(rows, cols, vals, m1, m2t)
    out = np.empty(vals.size, vals.dtype)
    alpha, beta = vals.dtype.type(alpha), vals.dtype.type(beta)
    work = vals.size * max(m1.shape[1], 1)
    if work < PARALLEL_MIN:
        sddmm_entries(rows, cols, vals, m1, m2t, alpha, beta, use_input, out, 0, vals.size)
    else:
        with PARALLEL_LOCK:
            sddmm_par(rows, cols, vals, m1, m2t, alpha, beta, use_input, out, N_GATHER_CHUNKS)
    return out


def warm_up() -> None:
    """Compile (or load from the disk cache) every signature the ops use: each compute dtype
    with int32 and int64 indices, sequential and parallel paths."""
    for index in INDEX_DTYPES:
        for n in (3, PARALLEL_MIN + 1):  # a diagonal matrix: cheap even past PARALLEL_MIN
            ptr, idx = np.arange(n + 1, dtype=index), np.arange(n, dtype=index)
            cols = np.arange(n, dtype=np.int64)
            for name in COMPUTE_DTYPES:
                vals = np.ones(n, name)
                for transpose in (False, True):
                    spmv(ptr, idx, vals, np.ones(n, name), n, transpose)
                    spmm(ptr, idx, vals, np.ones((n, 2), name), n, transpose)
                spgemm(ptr, idx, vals, ptr, idx, vals, n, index)
                if index == "int64":
                    sddmm(cols, cols, vals, np.ones((n, 2), name), np.ones((n, 2), name), 1, 1, True)
