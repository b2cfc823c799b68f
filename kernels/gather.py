"""Kernels of ``index_select`` (torch.index_select on sparse tensors) and ``sparse_mask``.

index_select over a sparse dimension is an intersection of the entries' coordinates along
that dimension with ``index``. The index values (few) are grouped: ``groups`` lists the
positions of ``index`` sorted by value (stable), one group per distinct value. An entry
belongs to the group of its coordinate, found in a table over the dimension (a bitmap in
front of it keeps the misses in cache) or, for a dimension too long for a table, by a binary
search over the distinct values. Two parallel passes over the entries count and then list the
matches in entry order; everything after works on the matches only.

Two output orders, as PyTorch produces them (the op module picks one):

- index-major: for each position of ``index`` in order, the matching entries in entry order;
- entry-major: for each matching entry in order, the positions of ``index`` holding its
  coordinate, ascending.

A CSR matrix's rows are contiguous: ``csr_rows`` copies the selected rows directly.

Inputs are validated by the caller (coordinates in range, index values in ``[0, size)``);
nothing here raises.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._parallel import N_CHUNKS, PARALLEL_LOCK, PARALLEL_MIN
from ._sort import frozen

# Dimensions up to this long (or up to a few times the work) get a direct lookup table.
TABLE_MAX = 1 << 26


# ------------------------------------------------------------------ lookup of an entry's group
@njit(nogil=True, cache=True, inline="always")
def _group_of(v, bitmap, table, uniq, use_table):
    if use_table:
        if (bitmap[v >> 3] >> (v & 7)) & 1:
            return table[v]
        return -1
    lo, hi = 0, uniq.size
    while lo < hi:
        mid = (lo + hi) >> 1
        if uniq[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    if lo < uniq.size and uniq[lo] == v:
        return lo
    return -1


@njit(nogil=True, cache=True, parallel=True)
def match_entries_kernel(indices, col, bitmap, table, uniq, use_table, n_chunks):
    """(entries, groups): the entries whose coordinate ``indices[:, col]`` is one of the index
    values, in entry order, and each one's group."""
    n = indices.shape[0]
    chunk = (n + n_chunks - 1) // n_chunks
    counts = np.zeros(n_chunks + 1, np.int64)
    for c in prange(n_chunks):
        k = 0
        for e in range(c * chunk, min(n, (c + 1) * chunk)):
            if _group_of(indices[e, col], bitmap, table, uniq, use_table) >= 0:
                k += 1
        counts[c + 1] = k
    for c in range(n_chunks):
        counts[c + 1] += counts[c]
    m = counts[n_chunks]
    entries = np.empty(m, np.int64)
    groups = np.empty(m, np.int64)
    for c in prange(n_chunks):
        k = counts[c]
        for e in range(c * chunk, min(n, (c + 1) * chunk)):
            g = _group_of(indices[e, col], bitmap, table, uniq, use_table)
            if g >= 0:
                entries[k] = e
                groups[k] = g
                k += 1
    return entries, groups


@njit(nogil=True, cache=True)
def match_count_kernel(indices, col, bitmap, table, uniq, use_table, group_sizes):
    """Entries of the result: each entry counts once per position of index holding its coordinate."""
    total = 0
    for e in range(indices.shape[0]):
        g = _group_of(indices[e, col], bitmap, table, uniq, use_table)
        if g >= 0:
            total += group_sizes[g]
    return total


# ------------------------------------------------------------------ building the result
@njit(nogil=True, cache=True, parallel=True)
def index_major_kernel(indices, col, entries, groups, pos_group, n_groups, n_chunks):
    """Index-major result: (result indices with column ``col`` renumbered, source entry of
    each result entry)."""
    m = entries.size
    starts = np.zeros(n_groups + 1, np.int64)
    for k in range(m):
        starts[groups[k] + 1] += 1
    for g in range(n_groups):
        starts[g + 1] += starts[g]
    bucket = np.empty(m, np.int64)
    fill = starts[:-1].copy()
    for k in range(m):  # stable: entry order within a group
        g = groups[k]
        bucket[fill[g]] = entries[k]
        fill[g] += 1
    n_pos = pos_group.size
    out_start = np.zeros(n_pos + 1, np.int64)
    for i in range(n_pos):
        g = pos_group[i]
        out_start[i + 1] = out_start[i] + starts[g + 1] - starts[g]
    total = out_start[n_pos]
    s = indices.shape[1]
    out = np.empty((total, s), np.int64)
    src = np.empty(total, np.int64)
    chunk = (n_pos + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for i in range(c * chunk, min(n_pos, (c + 1) * chunk)):
            g = pos_group[i]
            o = out_start[i]
            for b in range(starts[g], starts[g + 1]):
                e = bucket[b]
                src[o] = e
                for j in range(s):
                    out[o, j] = indices[e, j]
                out[o, col] = i
                o += 1
    return out, src


@njit(nogil=True, cache=True, parallel=True)
def entry_major_kernel(indices, col, entries, groups, group_starts, positions, n_chunks):
    """Entry-major result: for each matching entry, one result entry per position of index
    holding its coordinate (ascending)."""
    m = entries.size
    out_start = np.zeros(m + 1, np.int64)
    for k in range(m):
        g = groups[k]
        out_start[k + 1] = out_start[k] + group_starts[g + 1] - group_starts[g]
    total = out_start[m]
    s = indices.shape[1]
    out = np.empty((total, s), np.int64)
    src = np.empty(total, np.int64)
    chunk = (m + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for k in range(c * chunk, min(m, (c + 1) * chunk)):
            e = entries[k]
            g = groups[k]
            o = out_start[k]
            for p in range(group_starts[g], group_starts[g + 1]):
                src[o] = e
                for j in range(s):
                    out[o, j] = indices[e, j]
                out[o, col] = positions[p]
                o += 1
    return out, src


@njit(nogil=True, cache=True, parallel=True)
def csr_rows_kernel(ptr, plain, rows, n_chunks):
    """Rows ``rows`` of a CSR matrix: (ptr, plain indices, source entry of each), and whether
    every selected row's plain indices are strictly increasing (else the caller sorts)."""
    n = rows.size
    out_ptr = np.empty(n + 1, np.int64)
    out_ptr[0] = 0
    for i in range(n):
        r = rows[i]
        out_ptr[i + 1] = out_ptr[i] + (ptr[r + 1] - ptr[r])
    total = out_ptr[n]
    out_plain = np.empty(total, plain.dtype)
    src = np.empty(total, np.int64)
    bad = np.zeros(n_chunks, np.bool_)
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            r = rows[i]
            a = ptr[r]
            o = out_ptr[i]
            for e in range(a, ptr[r + 1]):
                p = plain[e]
                if e > a and p <= plain[e - 1]:
                    bad[c] = True
                out_plain[o] = p
                src[o] = e
                o += 1
    return out_ptr, out_plain, src, not bad.any()


@njit(nogil=True, cache=True, parallel=True)
def sorted_column_ptr_kernel(indices, col, size, n_chunks):
    """(ok, ptr): when column ``col`` never decreases, ``ptr[v]`` is the first entry whose
    coordinate is at least v (so the entries of value v are ``ptr[v]:ptr[v + 1]``, in order);
    ok is False as soon as a chunk finds the column out of order (ptr is then meaningless)."""
    n = indices.shape[0]
    ptr = np.empty(size + 1, np.int64)
    bad = np.zeros(n_chunks, np.bool_)
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        a = c * chunk
        b = min(n, a + chunk)
        if a >= b:
            continue
        prev = indices[a - 1, col] if a > 0 else -1
        for e in range(a, b):
            v = indices[e, col]
            if v < prev:
                bad[c] = True
                break
            for u in range(prev + 1, v + 1):
                ptr[u] = e
            prev = v
    last = indices[n - 1, col] if n else -1
    for u in range(last + 1, size + 1):
        ptr[u] = n
    return not bad.any(), ptr


@njit(nogil=True, cache=True, parallel=True)
def sorted_rows_kernel(indices, col, ptr, index, n_chunks):
    """Index-major result over a column sorted as ``sorted_column_ptr_kernel`` found it: for
    each position i of index, the entries of value index[i] in order, renumbered to i."""
    n_pos = index.size
    out_start = np.empty(n_pos + 1, np.int64)
    out_start[0] = 0
    for i in range(n_pos):
        v = index[i]
        out_start[i + 1] = out_start[i] + ptr[v + 1] - ptr[v]
    total = out_start[n_pos]
    s = indices.shape[1]
    out = np.empty((total, s), np.int64)
    src = np.empty(total, np.int64)
    chunk = (n_pos + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for i in range(c * chunk, min(n_pos, (c + 1) * chunk)):
            v = index[i]
            o = out_start[i]
            for e in range(ptr[v], ptr[v + 1]):
                src[o] = e
                for j in range(s):
                    out[o, j] = indices[e, j]
                out[o, col] = i
                o += 1
    return out, src


@njit(nogil=True, cache=True)
def first_out_of_range_kernel(index, size):
    """Position of the first value of index outside ``[-size, size)``, or -1."""
    for i in range(index.size):
        v = index[i]
        if v < -size or v >= size:
            return i
    return -1


# ------------------------------------------------------------------ wrappers
@njit(nogil=True, cache=True)
def set_bits_kernel(bitmap, values):
    for i in range(values.size):
        v = values[i]
        bitmap[v >> 3] |= np.uint8(1 << (v & 7))


class Groups:
    """The distinct values of a (non-negative) index and where they sit: group g holds the
    positions ``positions[starts[g]:starts[g + 1]]`` (ascending) of value ``uniq[g]``;
    ``pos_group[i]`` is the group of position i."""

    def __init__(self, index: np.ndarray, size: int, work: int):
        index = np.ascontiguousarray(index, dtype=np.int64)
        order = np.argsort(index, kind="stable")
        sorted_vals = index[order]
        first = np.ones(sorted_vals.size, bool)
        if sorted_vals.size:
            np.not_equal(sorted_vals[1:], sorted_vals[:-1], out=first[1:])
        starts = np.flatnonzero(first)
        self.n = int(starts.size)
        self.uniq = np.ascontiguousarray(sorted_vals[starts])
        self.starts = np.append(starts, sorted_vals.size).astype(np.int64)
        self.sizes = np.diff(self.starts)
        self.positions = order.astype(np.int64, copy=False)
        self.pos_group = np.empty(index.size, np.int64)
        self.pos_group[order] = np.cumsum(first) - 1
        self.use_table = size <= max(TABLE_MAX, 4 * work)
        if self.use_table:
            self.table = np.empty(max(size, 1), np.int64)  # read only where the bitmap is set
            self.table[self.uniq] = np.arange(self.n)
            self.bitmap = np.zeros((max(size, 1) + 7) // 8, np.uint8)
            set_bits_kernel(self.bitmap, self.uniq)
        else:
            self.table = np.zeros(1, np.int64)
            self.bitmap = np.zeros(1, np.uint8)

    def lookup_args(self):
        return self.bitmap, self.table, self.uniq, self.use_table


def _n_chunks(n: int) -> int:
    return N_CHUNKS if n >= PARALLEL_MIN else 1


def count_selected(indices: np.ndarray, col: int, groups: Groups) -> int:
    """Exact number of entries index_select produces (for the result-size check)."""
    return int(match_count_kernel(frozen(np.ascontiguousarray(indices)), col, *groups.lookup_args(),
                                  groups.sizes))


def match(indices: np.ndarray, col: int, groups: Groups):
    """(entries, groups): the entries whose coordinate in column ``col`` is an index value,
    in entry order, and the group of each."""
    indices = frozen(np.ascontiguousarray(indices, dtype=np.int64))
    with PARALLEL_LOCK:
        return match_entries_kernel(indices, col, *groups.lookup_args(), _n_chunks(indices.shape[0]))


def build(indices: np.ndarray, col: int, entries: np.ndarray, grp: np.ndarray, groups: Groups,
          index_major: bool):
    """(result indices, source entry of each result entry) from ``match``'s answer, in the
    index-major or the entry-major order."""
    indices = frozen(np.ascontiguousarray(indices, dtype=np.int64))
    with PARALLEL_LOCK:
        if index_major:
            return index_major_kernel(indices, col, entries, grp, groups.pos_group, groups.n,
                                      _n_chunks(max(entries.size, groups.pos_group.size)))
        return entry_major_kernel(indices, col, entries, grp, groups.starts, groups.positions,
                                  _n_chunks(entries.size))


def csr_rows(ptr: np.ndarray, plain: np.ndarray, rows: np.ndarray):
    """(ptr int64, plain, source entries, rows strictly sorted) of the selected CSR rows."""
    with PARALLEL_LOCK:
        return csr_rows_kernel(frozen(ptr), frozen(plain), frozen(rows), _n_chunks(max(rows.size, plain.size // 8)))


def sorted_column_ptr(indices: np.ndarray, col: int, size: int):
    """(ok, ptr) of ``sorted_column_ptr_kernel``."""
    indices = frozen(np.ascontiguousarray(indices, dtype=np.int64))
    with PARALLEL_LOCK:
        return sorted_column_ptr_kernel(indices, col, size, _n_chunks(indices.shape[0]))


def sorted_rows(indices: np.ndarray, col: int, ptr: np.ndarray, index: np.ndarray):
    indices = frozen(np.ascontiguousarray(indices, dtype=np.int64))
    with PARALLEL_LOCK:
        return sorted_rows_kernel(indices, col, frozen(ptr), frozen(index), _n_chunks(max(index.size, indices.shape[0] // 16)))


def first_out_of_range(index: np.ndarray, size: int) -> int:
    return int(first_out_of_range_kernel(frozen(np.ascontiguousarray(index, dtype=np.int64)), size))


def warm_up() -> None:
    """Compile (or load) the kernels for int64 indices; values move as opaque rows."""
    indices = frozen(np.array([[0, 1], [1, 0], [0, 1]], np.int64))
    for size in (2,):
        g = Groups(np.array([1, 0, 1], np.int64), size, 3)
        for col, use_table in ((0, True), (1, False)):
            g.use_table = use_table
            entries, grp = match(indices, col, g)
            build(indices, col, entries, grp, g, True)
            build(indices, col, entries, grp, g, False)
            count_selected(indices, col, g)
        ok, ptr = sorted_column_ptr(indices, 0, size)
        sorted_rows(indices, 0, ptr, np.array([1, 0], np.int64))
    for dtype in (np.int32, np.int64):
        csr_rows(np.array([0, 1, 2], dtype), np.array([1, 0], dtype), np.array([1, 0], np.int64))
    first_out_of_range(np.array([0, -1], np.int64), 2)
