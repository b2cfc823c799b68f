"""COO kernels: reorder, coalesce, to_dense, from_dense.

Python wrappers reshape values to 2-D ``[nnz, inner]`` (hybrid tensors carry
their dense dimensions in ``inner``) so the numba signatures stay few; moving
values needs no arithmetic and is a gather; sums run in numba per dtype, with
float16 summed in float32 and bool combined with logical or. Inputs are
validated by the caller (``sparseserve.core.validate``); nothing here raises.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange
from numba.cpython.unsafe.numbers import trailing_zeros

from ._parallel import N_CHUNKS, PARALLEL_LOCK, PARALLEL_MIN
from ._sort import (argsort_stable, delinearize_kernel, delinearize_parallel, first_disorder_kernel, frozen,
                    gather_rows, linearize, packed_order, read_only_indices, segment_starts_kernel, sequential_order,
                    sorted_indices_kernel, split_packed, unique_runs)

# The value dtypes the kernels are compiled for at warm-up (docs/contract.md's list ("Tensors")).
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128")


# The segment kernels sum runs of sorted values, the runs split into chunks that the
# threads take in turn. Sum and
# or are two kernels, not one with a flag: numba types both branches for every dtype,
# and ``|`` does not exist for floats.

@njit(nogil=True, cache=True, parallel=True)
def segment_sum_kernel(values, starts, out, n_chunks):
    n, runs = values.shape[0], starts.size
    chunk = (runs + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for r in range(c * chunk, min(runs, (c + 1) * chunk)):
            end = starts[r + 1] if r + 1 < runs else n
            for j in range(values.shape[1]):
                acc = values[starts[r], j]
                for i in range(starts[r] + 1, end):
                    acc += values[i, j]
                out[r, j] = acc


@njit(nogil=True, cache=True, parallel=True)
def segment_or_kernel(values, starts, out, n_chunks):
    n, runs = values.shape[0], starts.size
    chunk = (runs + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for r in range(c * chunk, min(runs, (c + 1) * chunk)):
            end = starts[r + 1] if r + 1 < runs else n
            for j in range(values.shape[1]):
                acc = values[starts[r], j]
                for i in range(starts[r] + 1, end):
                    acc |= values[i, j]
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


# Large buffers are allocated by numpy in the wrappers, not inside kernels: numpy asks the
# kernel for huge pages (madvise), numba's allocator does not, and first-touch faults on
# 4 KiB pages cost a from_dense of 128 MB about a third of its time.

@njit(nogil=True, cache=True, parallel=True)
def compact_rows_scan_kernel(words, mask, row_len, local_cols, local_words, row_counts, counts):
    """First half of from_dense's one-read compaction, over a C-order array seen as rows of
    ``row_len`` words (the last dimension); chunks are runs of rows.

    Nonzero words and their columns go to chunk-local buffers, with a count per row and per
    chunk. ``counts`` has n_chunks + 1 slots and comes back as chunk offsets.
    """
    n_chunks = counts.size - 1
    n_rows = row_counts.size
    chunk = (n_rows + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        m = start = c * chunk * row_len
        for r in range(c * chunk, min(n_rows, (c + 1) * chunk)):
            before = m
            offset = r * row_len
            row = words[offset:offset + row_len]
            for j0 in range(0, row_len, 64):
                # A bitmap of the block's nonzero words, then one step per set bit: the work
                # follows the nonzeros, not the words. The fixed-length select loop is the
                # form the compiler vectorises (a count or shift of the comparison is not).
                block = row[j0:j0 + 64]
                bits = np.uint64(0)
                if block.size == 64:
                    for j in range(64):
                        bits |= (np.uint64(1) << np.uint64(j)) if block[j] & mask else np.uint64(0)
                else:
                    for j in range(block.size):
                        bits |= (np.uint64(1) << np.uint64(j)) if block[j] & mask else np.uint64(0)
                while bits:
                    j = trailing_zeros(bits)
                    local_cols[m] = j0 + j
                    local_words[m] = block[j]
                    m += 1
                    bits &= bits - np.uint64(1)
            row_counts[r] = m - before
        counts[c + 1] = m - start
    counts[0] = 0
    for c in range(n_chunks):
        counts[c + 1] += counts[c]


@njit(nogil=True, cache=True, parallel=True)
def compact_rows_copy_kernel(shape, local_cols, local_words, row_counts, counts, coords, out_words):
    """Second half: each chunk's run to its place, leading coordinates advanced row by row
    (no division per entry)."""
    n_chunks = counts.size - 1
    s = shape.size
    row_len = shape[s - 1]
    n_rows = row_counts.size
    chunk = (n_rows + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        first = c * chunk
        src = first * row_len
        dst = counts[c]
        lead = np.empty(s - 1, np.int64)
        k = first
        for j in range(s - 2, -1, -1):  # the chunk's first row, once
            lead[j] = k % shape[j]
            k //= shape[j]
        for r in range(first, min(n_rows, first + chunk)):
            for _ in range(row_counts[r]):
                for j in range(s - 1):
                    coords[dst, j] = lead[j]
                coords[dst, s - 1] = local_cols[src]
                out_words[dst] = local_words[src]
                dst += 1
                src += 1
            j = s - 2
            lead[j] += 1
            while lead[j] == shape[j] and j > 0:
                lead[j] = 0
                j -= 1
                lead[j] += 1


def _compact_rows(words: np.ndarray, mask, shape: np.ndarray):
    n = words.size
    local_cols, local_words = np.empty(n, np.int64), np.empty(n, words.dtype)
    row_counts = np.empty(n // shape[-1], np.int64)
    counts = np.zeros(N_CHUNKS + 1, np.int64)
    with PARALLEL_LOCK:
        compact_rows_scan_kernel(words, mask, shape[-1], local_cols, local_words, row_counts, counts)
        coords = np.empty((counts[-1], shape.size), np.int64)
        out_words = np.empty(counts[-1], words.dtype)
        compact_rows_copy_kernel(shape, frozen(local_cols), frozen(local_words), frozen(row_counts),
                                 frozen(counts), coords, out_words)
    return coords, out_words


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
        p = np.searchsorted(keys, lo)
        # Fill and scatter a cache-sized block at a time: the scatter then finds its lines
        # still in cache instead of reading the whole chunk back from memory.
        for b in range(lo, hi, 4096):
            end = min(hi, b + 4096)
            out[b:end] = fill
            while p < keys.size and keys[p] < end:
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


def reorder(indices, values, dense_shape):
    """Row-major order, duplicates kept, stable (tf.sparse.reorder)."""
    sparse_shape = np.asarray(dense_shape[:indices.shape[1]], np.int64)
    packed = packed_order(indices, sparse_shape, values)
    if packed is None:  # small, or keys too wide to pack with their positions
        perm, out_indices = sorted_indices_kernel(read_only_indices(indices), sparse_shape)
        return out_indices, gather_rows(values, perm)
    # Keys and index rows correspond one to one, so the sorted indices come from the
    # sorted words sequentially instead of by a random gather of index rows.
    words, pos_bits, moved = packed
    with PARALLEL_LOCK:
        out_indices = split_packed(words, pos_bits, sparse_shape)
    return out_indices, moved if moved is not None else gather_rows(values, words & ((1 << pos_bits) - 1))


def _segment_sum(sorted_values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Sums of the runs of ``sorted_values`` (2-D) starting at ``starts``."""
    dtype = sorted_values.dtype
    if sorted_values.shape[0] < PARALLEL_MIN:  # small: numpy's reduceat, no parallel region
        if not starts.size:
            return sorted_values[:0]
        if dtype == np.bool_:
            return np.logical_or.reduceat(sorted_values, starts, axis=0)
        work = sorted_values.astype(np.float32) if dtype == np.float16 else sorted_values
        return np.add.reduceat(work, starts, axis=0).astype(dtype, copy=False)
    values = frozen(sorted_values)
    if dtype == np.bool_:
        out = np.empty((starts.size, values.shape[1]), np.uint8)
        with PARALLEL_LOCK:
            segment_or_kernel(values.view(np.uint8), starts, out, N_CHUNKS)
        return out.view(np.bool_)
    work = frozen(values.astype(np.float32)) if dtype == np.float16 else values
    out = np.empty((starts.size, values.shape[1]), work.dtype)
    with PARALLEL_LOCK:
        segment_sum_kernel(work, starts, out, N_CHUNKS)
    return out.astype(dtype, copy=False)


def coalesce(indices, values, dense_shape):
    """Sorted row-major, duplicates summed (torch's coalesce)."""
    nnz = indices.shape[0]
    sparse_shape = np.asarray(dense_shape[:indices.shape[1]], np.int64)
    values2d = _values2d(values, nnz)
    packed = packed_order(indices, sparse_shape, values2d)
    if packed is None:  # small, or keys too wide to pack with their positions
        perm, keys = sequential_order(indices, sparse_shape)
        starts = segment_starts_kernel(keys)
        out_indices = delinearize_kernel(keys[starts], sparse_shape)
        sorted_values = gather_rows(values2d, perm)
    else:
        # Runs and their coordinates straight from the sorted words; values of 8 bytes
        # came through the sort with them, others are gathered by position once.
        words, pos_bits, sorted_values = packed
        starts, out_indices = unique_runs(words, pos_bits, sparse_shape)
        if sorted_values is None:
            sorted_values = gather_rows(values2d, words & ((1 << pos_bits) - 1))
    summed = _segment_sum(sorted_values, starts)
    return out_indices, summed.reshape((starts.size, *values.shape[1:]))


@njit(nogil=True, cache=True)
def indices_in_range_kernel(indices, limits):
    n, k = indices.shape
    for i in range(n):
        for j in range(k):
            if not 0 <= indices[i, j] < limits[j]:
                return False
    return True


@njit(nogil=True, cache=True, parallel=True)
def indices_in_range_par(flat, pattern, n_chunks):
    """``indices_in_range_kernel`` over the indices' values in a row, split into ``n_chunks``
    for the threads, and without a branch per value, so that it vectorizes: ``pattern`` is the
    limits as unsigned numbers repeated (a whole number of rows long), each block of values is
    compared with it unsigned (a negative index wraps to above any limit), and a chunk stops at
    its first block out of range. 2.5-4x the sequential loop's speed on a 1 GB upload."""
    width = pattern.size
    blocks = (flat.size + width - 1) // width
    per = (blocks + n_chunks - 1) // n_chunks
    bad = np.zeros(n_chunks, np.uint8)
    for c in prange(n_chunks):
        for b in range(c * per, min(blocks, (c + 1) * per)):
            base = b * width
            out = np.uint8(0)
            for t in range(min(width, flat.size - base)):
                out |= np.uint8(np.uint64(flat[base + t]) >= pattern[t])
            if out:
                bad[c] = 1
                break
    return bad.max() == 0


def indices_in_range(indices: np.ndarray, limits: np.ndarray) -> bool:
    """Whether every ``indices[i, j]`` of [nnz, k] int64 indices is in ``[0, limits[j])`` (k int64
    limits): validation's range check (``sparseserve.core.validate.InRange``), one pass, no
    temporaries. It runs before validation is done, so it checks the one thing its loops rely
    on (a limit per column); read-only contiguous indices and writable limits, as validation
    passes them, are the signature warmed up."""
    if limits.shape != indices.shape[1:]:
        raise ValueError(f"indices_in_range: {limits.shape} limits for indices of shape {indices.shape}")
    indices = read_only_indices(indices)
    if indices.shape[0] < PARALLEL_MIN or indices.shape[1] == 0:
        return bool(indices_in_range_kernel(indices, limits))
    k = indices.shape[1]
    # A negative limit admits nothing, as 0 does (unsigned, it would admit everything).
    pattern = np.tile(np.maximum(limits, 0).astype(np.uint64), max(1, 2048 // k))
    with PARALLEL_LOCK:
        return bool(indices_in_range_par(indices.reshape(-1), pattern, N_CHUNKS))


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
    if words.shape[1] == 1 and sparse_dim >= 2 and lead[-1] > 0:  # no dense dims: one read of the input
        indices, value_words = _compact_rows(words.reshape(-1), mask, np.asarray(lead, np.int64))
        return indices, value_words.view(rows.dtype).reshape((value_words.size, *array.shape[sparse_dim:]))
    with PARALLEL_LOCK:
        rows_nz = nonzero_rows_kernel(words, mask, N_CHUNKS)
        indices = delinearize_parallel(rows_nz, lead)
    values = gather_rows(rows, rows_nz).reshape((rows_nz.size, *array.shape[sparse_dim:]))
    return indices, values


def warm_up() -> None:
    """Every kernel of this module, on its small (sequential) and large (parallel) paths, once per
    dtype (see ``sparseserve.kernels.warm_up``), with read-only inputs as the server passes them."""
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
        indices_in_range(indices, np.array([side, side]))
        argsort_stable(indices[:, 0])  # fill_empty_rows' stable order by row
