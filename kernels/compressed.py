"""Kernels of the compressed layouts (CSR, CSC, BSR, BSC): index work only.

Every kernel here computes indices and a permutation (``src``/``perm``) or a
destination (``dest``) for the values; the values themselves move in the
wrappers as opaque rows (``gather_rows`` / a numpy scatter), so nothing is
compiled per value dtype and hybrid and block values need no special case.
Compressed indices are int32 or int64 (the input's); COO indices are int64.

Inputs are validated by the caller (``sparseserve.core.validate``) and, where a
kernel needs an order, checked by a kernel flag first; nothing here raises,
and no write leaves its array whatever the input order.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._parallel import N_CHUNKS, PARALLEL_LOCK, PARALLEL_MIN
from ._sort import frozen

__all__ = ["compress_sorted", "transpose", "expand", "blockify", "scatter_rows", "warm_up"]

# Order flags of ``compress_sorted``: what the entries' order allows.
STRICT = 0  # full keys strictly increasing: sorted and unique (coalesced)
GROUPED = 1  # compressed keys non-decreasing: the pointers are right, entries may repeat
UNSORTED = 2  # compressed keys decrease somewhere: the pointers are garbage


# ------------------------------------------------------------- sorted COO -> pointers
# Inlined: as a call (tuple return, loads not hoisted) it made the pass six times slower.
@njit(nogil=True, cache=True, inline="always")
def _keys(indices, shape, block, i):
    """(compressed key, full row-major key) of entry i: the compressed key linearises the
    batch columns and row // block; the full key every column."""
    s = indices.shape[1]
    outer = 0
    for j in range(s - 2):
        outer = outer * shape[j] + indices[i, j]
    row = indices[i, s - 2]
    # No division for CSR (block 1): it would cost more than the rest of the pass.
    k = outer * shape[s - 2] + row if block == 1 else outer * (shape[s - 2] // block) + row // block
    full = (outer * shape[s - 2] + row) * shape[s - 1] + indices[i, s - 1]
    return k, full


@njit(nogil=True, cache=True)
def _compress_range(indices, shape, block, ptr, plain, lo, hi):
    """Pointers of entries [lo, hi): ``ptr[K]`` = first entry whose compressed key is >= K.

    Each entry writes the pointer slots between its predecessor's key and its own, so
    chunks write disjoint slots, and every slot stays below ``ptr.size`` whatever the
    order. Returns the order flag of the range (including the step from entry lo - 1).
    """
    s = indices.shape[1]
    prev_k, prev_full = -1, -1
    if lo > 0:
        prev_k, prev_full = _keys(indices, shape, block, lo - 1)
    flag = STRICT
    write_plain = plain.size > 0
    for i in range(lo, hi):
        k, full = _keys(indices, shape, block, i)
        if k < prev_k:
            flag = UNSORTED
        elif full <= prev_full and flag == STRICT:
            flag = GROUPED
        for kk in range(prev_k + 1, k + 1):
            ptr[kk] = i
        if write_plain:
            plain[i] = indices[i, s - 1]
        prev_k, prev_full = k, full
    return flag


@njit(nogil=True, cache=True)
def _compress_tail(indices, shape, block, ptr):
    n = indices.shape[0]
    last = -1
    if n > 0:
        last, _ = _keys(indices, shape, block, n - 1)
    for kk in range(last + 1, ptr.size):
        ptr[kk] = n


@njit(nogil=True, cache=True)
def compress_seq(indices, shape, block, ptr, plain):
    flag = _compress_range(indices, shape, block, ptr, plain, 0, indices.shape[0])
    _compress_tail(indices, shape, block, ptr)
    return flag


@njit(nogil=True, cache=True, parallel=True)
def compress_par(indices, shape, block, ptr, plain, n_chunks):
    n = indices.shape[0]
    chunk = (n + n_chunks - 1) // n_chunks
    flags = np.zeros(n_chunks, np.int64)
    for c in prange(n_chunks):
        lo = min(n, c * chunk)
        hi = min(n, lo + chunk)
        flags[c] = _compress_range(indices, shape, block, ptr, plain, lo, hi)
    _compress_tail(indices, shape, block, ptr)
    return flags.max()


def compress_sorted(indices: np.ndarray, shape: np.ndarray, block: int, with_plain: bool):
    """(ptr, plain, flag) of row-major COO ``indices`` [n, S >= 2] over sparse ``shape``.

    ``ptr`` has one slot per compressed key (batch dims, then row // block) plus one:
    ``ptr[K]`` is the first entry of key K. ``plain`` is the last column (int64) when asked.
    ``flag`` is STRICT, GROUPED or UNSORTED; with UNSORTED, ``ptr`` means nothing.
    """
    n = indices.shape[0]
    n_keys = int(np.prod(shape[:-2], dtype=np.int64)) * (int(shape[-2]) // block)
    ptr = np.empty(n_keys + 1, np.int64)
    plain = np.empty(n if with_plain else 0, np.int64)
    indices, shape = frozen(np.ascontiguousarray(indices)), frozen(np.ascontiguousarray(shape, np.int64))
    if n < PARALLEL_MIN:
        flag = compress_seq(indices, shape, np.int64(block), ptr, plain)
    else:
        with PARALLEL_LOCK:
            flag = compress_par(indices, shape, np.int64(block), ptr, plain, N_CHUNKS)
    return ptr, plain, int(flag)


# ------------------------------------------------------------- CSR <-> CSC transposition
@njit(nogil=True, cache=True)
def transpose_seq(ci, pi, n_plain, ci_out, pi_out, perm):
    """Every batch of a compressed structure transposed by a counting sort (stable: each
    output segment lists its new plain indices in ascending order).

    ci [nb, nc + 1], pi [nb, nse] -> ci_out [nb, n_plain + 1], pi_out [nb, nse] and
    ``perm`` [nb * nse]: output entry p of batch b is input entry perm[b * nse + p].
    """
    nb, nse = pi.shape
    nc = ci.shape[1] - 1
    nxt = np.empty(n_plain, np.int64)
    for b in range(nb):
        base = b * nse
        nxt[:] = 0
        for j in range(nse):
            nxt[pi[b, j]] += 1
        total = 0
        for c in range(n_plain):
            ci_out[b, c] = total
            total += nxt[c]
            nxt[c] = ci_out[b, c]
        ci_out[b, n_plain] = total
        for r in range(nc):
            for j in range(ci[b, r], ci[b, r + 1]):
                c = pi[b, j]
                p = nxt[c]
                nxt[c] = p + 1
                pi_out[b, p] = r
                perm[base + p] = base + j


@njit(nogil=True, cache=True, parallel=True)
def transpose_par(ci, pi, n_plain, bounds, counts, ci_out, pi_out, perm, base):
    """One batch (1-D arrays) transposed by chunks of compressed segments: per-chunk
    histograms, one prefix over (plain index, chunk), then each chunk scatters its own."""
    n_chunks = bounds.size - 1
    for t in prange(n_chunks):
        row = counts[t]
        row[:] = 0
        for j in range(ci[bounds[t]], ci[bounds[t + 1]]):
            row[pi[j]] += 1
    total = 0
    for c in range(n_plain):
        ci_out[c] = total
        for t in range(n_chunks):
            v = counts[t, c]
            counts[t, c] = total
            total += v
    ci_out[n_plain] = total
    for t in prange(n_chunks):
        row = counts[t]
        for r in range(bounds[t], bounds[t + 1]):
            for j in range(ci[r], ci[r + 1]):
                c = pi[j]
                p = row[c]
                row[c] = p + 1
                pi_out[p] = r
                perm[p] = base + j


def transpose(ci: np.ndarray, pi: np.ndarray, n_plain: int):
    """(ci_out, pi_out, perm) of batched compressed indices ci [nb, nc + 1], pi [nb, nse]
    (validated); index dtype kept, ``perm`` int64 over the flattened [nb * nse] entries."""
    nb, nse = pi.shape
    ci_out = np.empty((nb, n_plain + 1), ci.dtype)
    pi_out = np.empty((nb, nse), pi.dtype)
    perm = np.empty(nb * nse, np.int64)
    ci, pi = frozen(np.ascontiguousarray(ci)), frozen(np.ascontiguousarray(pi))
    # Per-chunk histograms cost n_chunks * n_plain words: never more than the entries.
    n_chunks = min(N_CHUNKS, nse // max(n_plain, 1))
    if nse < PARALLEL_MIN or n_chunks < 2:
        transpose_seq(ci, pi, np.int64(n_plain), ci_out, pi_out, perm)
        return ci_out, pi_out, perm
    counts = np.empty((n_chunks, n_plain), np.int64)
    for b in range(nb):
        targets = np.linspace(0, nse, n_chunks + 1).astype(np.int64)
        bounds = np.searchsorted(ci[b].astype(np.int64), targets, side="left").astype(np.int64)
        bounds[0], bounds[-1] = 0, ci.shape[1] - 1
        bounds = frozen(np.maximum.accumulate(bounds))
        with PARALLEL_LOCK:
            transpose_par(ci[b], pi[b], np.int64(n_plain), bounds, counts, ci_out[b], pi_out[b],
                          perm[b * nse:(b + 1) * nse], np.int64(b * nse))
    return ci_out, pi_out, perm


# ------------------------------------------------------------- compressed -> COO
@njit(nogil=True, cache=True)
def _expand_groups(ci, pi, br, bc, g_lo, g_hi, indices, src, col0):
    """Row-major COO of the block rows g in [g_lo, g_hi) (g = batch * nc + block row).

    Writes the row and column of every element (columns ``col0`` and ``col0 + 1``) and
    ``src``, its element in the values seen as [nb * nse * br * bc, inner]. Returns 1 if
    the plain indices of some segment do not strictly increase (the COO is then not
    coalesced), else 0.
    """
    nb, nse = pi.shape
    nc = ci.shape[1] - 1
    area = br * bc
    unsorted = 0
    for g in range(g_lo, g_hi):
        b = g // nc
        rb = g - b * nc
        s = np.int64(ci[b, rb])
        e = np.int64(ci[b, rb + 1])
        cnt = e - s
        base = (b * nse + s) * area
        for j in range(s + 1, e):
            if pi[b, j] <= pi[b, j - 1]:
                unsorted = 1
        for i in range(br):
            p = base + i * cnt * bc
            row = rb * br + i
            for j in range(s, e):
                colb = np.int64(pi[b, j]) * bc
                first = ((b * nse + j) * br + i) * bc
                for c in range(bc):
                    indices[p, col0] = row
                    indices[p, col0 + 1] = colb + c
                    src[p] = first + c
                    p += 1
    return unsorted


@njit(nogil=True, cache=True)
def expand_seq(ci, pi, br, bc, indices, src, col0):
    return _expand_groups(ci, pi, br, bc, 0, ci.shape[0] * (ci.shape[1] - 1), indices, src, col0)


@njit(nogil=True, cache=True, parallel=True)
def expand_par(ci, pi, br, bc, indices, src, col0, n_chunks):
    n_groups = ci.shape[0] * (ci.shape[1] - 1)
    chunk = (n_groups + n_chunks - 1) // n_chunks
    flags = np.zeros(n_chunks, np.int64)
    for c in prange(n_chunks):
        lo = min(n_groups, c * chunk)
        flags[c] = _expand_groups(ci, pi, br, bc, lo, min(n_groups, lo + chunk), indices, src, col0)
    return flags.max()


def expand(ci: np.ndarray, pi: np.ndarray, batch_shape, block=(1, 1)):
    """(indices [n, nbd + 2] int64, src int64 [n], unique) of a row-major compressed
    structure (CSR/BSR, batched): COO in row-major order, batch coordinates leading.
    ``unique`` is True when every segment's plain indices strictly increase (then the COO
    is sorted and unique)."""
    nb, nse = pi.shape
    br, bc = int(block[0]), int(block[1])
    nbd = len(batch_shape)
    n = nb * nse * br * bc
    indices = np.empty((n, nbd + 2), np.int64)
    src = np.empty(n, np.int64)
    ci, pi = frozen(np.ascontiguousarray(ci)), frozen(np.ascontiguousarray(pi))
    if n < PARALLEL_MIN:
        unsorted = expand_seq(ci, pi, np.int64(br), np.int64(bc), indices, src, np.int64(nbd))
    else:
        with PARALLEL_LOCK:
            unsorted = expand_par(ci, pi, np.int64(br), np.int64(bc), indices, src, np.int64(nbd), N_CHUNKS)
    if nbd and n:
        # Each batch's elements are one contiguous run: its coordinates repeat.
        coords = np.stack(np.unravel_index(np.arange(nb), tuple(batch_shape)), axis=1)
        indices[:, :nbd] = np.repeat(coords, nse * br * bc, axis=0)
    return indices, src, not unsorted


# ------------------------------------------------------------- COO -> blocks
@njit(nogil=True, cache=True)
def _block_cols(indices, ptr, bc, scratch, counts, g_lo, g_hi):
    """The distinct block columns of each block row g: sorted into ``scratch[ptr[g]:]``,
    their number into ``counts[g]``."""
    s_col = indices.shape[1] - 1
    for g in range(g_lo, g_hi):
        s, e = ptr[g], ptr[g + 1]
        for i in range(s, e):
            scratch[i] = indices[i, s_col] // bc
        part = scratch[s:e]
        part.sort()
        u = 0
        for i in range(e - s):
            if u == 0 or part[i] != part[u - 1]:
                part[u] = part[i]
                u += 1
        counts[g] = u


@njit(nogil=True, cache=True)
def _block_dest(indices, ptr, br, bc, scratch, block_ptr, block_pi, dest, g_lo, g_hi):
    """Block plain indices of block rows [g_lo, g_hi) and each element's destination
    element in the block values [n_blocks * br * bc]. Within a row the elements' block
    columns ascend, so one cursor per row walks the block row's sorted columns."""
    s_row = indices.shape[1] - 2
    for g in range(g_lo, g_hi):
        s = ptr[g]
        b0, b1 = block_ptr[g], block_ptr[g + 1]
        for k in range(b1 - b0):
            block_pi[b0 + k] = scratch[s + k]
        row = -1
        slot = b0
        for i in range(s, ptr[g + 1]):
            r, c = indices[i, s_row], indices[i, s_row + 1]
            if r != row:
                row = r
                slot = b0
            cb = c // bc
            while slot < b1 - 1 and block_pi[slot] < cb:
                slot += 1
            dest[i] = (slot * br + r % br) * bc + c % bc


@njit(nogil=True, cache=True)
def block_cols_seq(indices, ptr, bc, scratch, counts):
    _block_cols(indices, ptr, bc, scratch, counts, 0, counts.size)


@njit(nogil=True, cache=True, parallel=True)
def block_cols_par(indices, ptr, bc, scratch, counts, n_chunks):
    n_groups = counts.size
    chunk = (n_groups + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        lo = min(n_groups, c * chunk)
        _block_cols(indices, ptr, bc, scratch, counts, lo, min(n_groups, lo + chunk))


@njit(nogil=True, cache=True)
def block_dest_seq(indices, ptr, br, bc, scratch, block_ptr, block_pi, dest):
    _block_dest(indices, ptr, br, bc, scratch, block_ptr, block_pi, dest, 0, ptr.size - 1)


@njit(nogil=True, cache=True, parallel=True)
def block_dest_par(indices, ptr, br, bc, scratch, block_ptr, block_pi, dest, n_chunks):
    n_groups = ptr.size - 1
    chunk = (n_groups + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        lo = min(n_groups, c * chunk)
        _block_dest(indices, ptr, br, bc, scratch, block_ptr, block_pi, dest, lo, min(n_groups, lo + chunk))


def blockify(indices: np.ndarray, shape: np.ndarray, block):
    """(block_ptr, block_pi, dest) of coalesced (sorted, unique) COO ``indices`` [n, S >= 2]
    over sparse ``shape``, blocks ``block`` dividing the last two dimensions.

    ``block_ptr`` has a slot per (batch, block row) plus one, as ``compress_sorted``'s ptr
    but counting blocks; ``block_pi`` (int64) the block columns; element i of the input
    goes to element ``dest[i]`` of the block values [n_blocks * br * bc]. A block is
    stored when any of its elements is.
    """
    br, bc = int(block[0]), int(block[1])
    ptr, _, _ = compress_sorted(indices, shape, br, with_plain=False)
    indices, ptr = frozen(np.ascontiguousarray(indices)), frozen(ptr)
    n, n_groups = indices.shape[0], ptr.size - 1
    scratch = np.empty(n, np.int64)
    counts = np.empty(n_groups, np.int64)
    parallel = n >= PARALLEL_MIN
    if parallel:
        with PARALLEL_LOCK:
            block_cols_par(indices, ptr, np.int64(bc), scratch, counts, N_CHUNKS)
    else:
        block_cols_seq(indices, ptr, np.int64(bc), scratch, counts)
    block_ptr = np.zeros(n_groups + 1, np.int64)
    np.cumsum(counts, out=block_ptr[1:])
    block_pi = np.empty(int(block_ptr[-1]), np.int64)
    dest = np.empty(n, np.int64)
    args = (indices, ptr, np.int64(br), np.int64(bc), frozen(scratch), frozen(block_ptr), block_pi, dest)
    if parallel:
        with PARALLEL_LOCK:
            block_dest_par(*args, N_CHUNKS)
    else:
        block_dest_seq(*args)
    return block_ptr, block_pi, dest


# ------------------------------------------------------------- values into blocks
# ``out`` comes zeroed from np.zeros (calloc: fresh pages are zero already, so a fill pass
# would only add a write of the whole output).
@njit(nogil=True, cache=True)
def scatter_rows_seq(out, dest, rows):
    for i in range(dest.size):
        out[dest[i]] = rows[i]


@njit(nogil=True, cache=True, parallel=True)
def scatter_rows_par(out, dest, rows, n_chunks):
    # Destinations are distinct, so chunks never write the same row.
    m = dest.size
    chunk = (m + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for i in range(min(m, c * chunk), min(m, (c + 1) * chunk)):
            out[dest[i]] = rows[i]


def _word_rows(a2d: np.ndarray) -> np.ndarray:
    """Rows of a C-contiguous 2-D array as unsigned words of the element width: values
    move as bits, one kernel per width instead of per dtype."""
    item = a2d.dtype.itemsize // (2 if a2d.dtype.kind == "c" else 1)
    return a2d.view(np.dtype(f"u{item}"))


def scatter_rows(rows: np.ndarray, dest: np.ndarray, n_out: int) -> np.ndarray:
    """``out`` [n_out, *rows.shape[1:]] of zeros with ``out[dest] = rows``; ``dest``
    distinct and in range (computed by ``blockify``)."""
    inner = int(np.prod(rows.shape[1:], dtype=np.int64))
    out = np.zeros((n_out, *rows.shape[1:]), rows.dtype)
    if out.size == 0 or dest.size == 0:
        return out
    src = frozen(_word_rows(np.ascontiguousarray(rows).reshape(dest.size, inner)))
    words = _word_rows(out.reshape(n_out, inner))
    if words.shape[1] == 1:  # one word per row: the 1-D kernels vectorise better
        src, words = src.reshape(-1), words.reshape(-1)
    if n_out * inner < PARALLEL_MIN:
        scatter_rows_seq(words, frozen(dest), src)
    else:
        with PARALLEL_LOCK:
            scatter_rows_par(words, frozen(dest), src, N_CHUNKS)
    return out


# ------------------------------------------------------------- warm-up
def warm_up() -> None:
    """Every kernel on its sequential and parallel paths, index dtypes int32 and int64, with
    read-only inputs as the server passes them. Values never enter a kernel here, so one
    set of signatures serves every value dtype."""
    side = 512
    for nnz in (5, PARALLEL_MIN * 2):
        keys = np.unique(np.arange(nnz, dtype=np.int64) * 7919 % (side * side))
        for nbd in (0, 1):
            lead = [np.zeros(keys.size, np.int64)] * nbd
            coo = frozen(np.stack([*lead, keys // side, keys % side], axis=1))
            shape = np.asarray([1] * nbd + [side, side], np.int64)
            ptr, plain, _ = compress_sorted(coo, shape, 1, with_plain=True)
            _, block_pi, dest = blockify(coo, shape, (2, 4))
            for width in (1, 2, 4, 8):
                for inner in (1, 2):
                    rows = np.zeros((dest.size, inner), f"u{width}")
                    scatter_rows(rows, dest, block_pi.size * 8)
            n_batch = int(np.prod(shape[:nbd]))
            for dtype in (np.int32, np.int64):
                ci = frozen(ptr.reshape(n_batch, -1).astype(dtype))
                pi = frozen(plain.reshape(n_batch, -1).astype(dtype))
                ct, pt, _ = transpose(ci, pi, side)
                expand(frozen(ct), frozen(pt), tuple(shape[:nbd]))
