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

Where the column never decreases (dim 0 of a coalesced tensor), each value's entries are one
run: ``sorted_column_ptr`` finds where every run starts in one read of the column, and an
index-major result is the selected runs copied whole (``selected_runs``, ``copy_runs``),
nothing else read. A CSR matrix's rows are such runs already: ``csr_rows`` copies them.

Inputs are validated by the caller (coordinates in range, index values in ``[0, size)``);
nothing here raises.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._parallel import N_CHUNKS, PARALLEL_LOCK, PARALLEL_MIN
from ._sort import from_row_words, frozen, row_words
from .linalg import prefetch

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


# The copies below move each selected run of entries whole: its index rows and its value rows
# (as words, any dtype) in one pass, reading ahead: the runs lie at random in arrays far larger
# than the caches, so the next runs' lines are prefetched while this one is copied. Measured on
# 100,000 runs of ~10 entries out of 10M (2 threads): 5.2 ms, against 21 ms for copying the
# index rows and then gathering the values by a source-entry list (6.9 ms without the
# prefetches, 5.7 with only a run's first two lines).
#
# Each pass is a sequential function over a range of runs (or of entries); its ``_par`` twin
# runs chunks of the range on the threads. The wrappers take the sequential one below
# PARALLEL_MIN: a parallel region costs ~0.2 ms to wake its threads, more than small work.
RUNS_AHEAD = 16
_CHECK_BLOCK = 256  # rows


@njit(nogil=True, cache=True)
def _copy_runs(indices, col, words, starts, out_start, i0, i1, out, out_words):
    """Copies run i (entries ``starts[i]`` onwards, ``out_start[i + 1] - out_start[i]`` of
    them) for i in [i0, i1) to ``out_start[i]`` of the outputs; column ``col`` (if >= 0) of
    the copied index rows becomes i. Each run moves as flat slices (a loop over a whole
    slice vectorizes: 5.5 ms against 8 for the same copy entry by entry)."""
    s = indices.shape[1]
    w = words.shape[1]
    flat = indices.reshape(-1)
    flat_words = words.reshape(-1)
    flat_out = out.reshape(-1)
    flat_out_words = out_words.reshape(-1)
    for i in range(i0, i1):
        if i + RUNS_AHEAD < i1:  # the lines of a run ahead, up to four (a run of ~10 entries)
            a = starts[i + RUNS_AHEAD]
            end = out_start[i + RUNS_AHEAD + 1] - out_start[i + RUNS_AHEAD] + a
            for p in range(a * s, min(end * s, a * s + 32), 8):
                prefetch(flat, p)
            prefetch(flat_words, a * w)
        o = out_start[i]
        a = starts[i]
        m = out_start[i + 1] - o
        src = flat[a * s:(a + m) * s]
        dst = flat_out[o * s:(o + m) * s]
        for k in range(src.size):
            dst[k] = src[k]
        if col >= 0:
            for k in range(col, dst.size, s):
                dst[k] = i
        src_words = flat_words[a * w:(a + m) * w]
        dst_words = flat_out_words[o * w:(o + m) * w]
        for k in range(src_words.size):
            dst_words[k] = src_words[k]


@njit(nogil=True, cache=True, parallel=True)
def _copy_runs_par(indices, col, words, starts, out_start, out, out_words, n_chunks):
    n = starts.size
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        _copy_runs(indices, col, words, starts, out_start, c * chunk, min(n, (c + 1) * chunk), out, out_words)


@njit(nogil=True, cache=True)
def _run_bounds(ptr, rows, i0, i1, starts, lengths):
    """Start and length of row ``rows[i]``'s run (``ptr[r]:ptr[r + 1]``) for i in [i0, i1)."""
    for i in range(i0, i1):
        if i + RUNS_AHEAD < i1:
            prefetch(ptr, rows[i + RUNS_AHEAD])
        r = rows[i]
        starts[i] = ptr[r]
        lengths[i + 1] = ptr[r + 1] - ptr[r]


@njit(nogil=True, cache=True, parallel=True)
def _run_bounds_par(ptr, rows, starts, lengths, n_chunks):
    n = rows.size
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        _run_bounds(ptr, rows, c * chunk, min(n, (c + 1) * chunk), starts, lengths)


@njit(nogil=True, cache=True)
def runs_work_kernel(starts, out_start, index_threads, index_chunk, entry_threads, entry_chunk):
    """(most entries copied by one chunk of positions, most by one chunk of entries) when the
    selected runs are split ``index_threads`` x ``index_chunk`` positions, or
    ``entry_threads`` x ``entry_chunk`` entries: the counts PyTorch's choice of order weighs."""
    n = starts.size
    index_max = 0
    for c in range(index_threads):
        lo, hi = min(n, c * index_chunk), min(n, (c + 1) * index_chunk)
        index_max = max(index_max, out_start[hi] - out_start[lo])
    entry_max = 0
    for c in range(entry_threads):
        lo, hi = c * entry_chunk, (c + 1) * entry_chunk
        total = 0
        for i in range(n):
            a = starts[i]
            b = a + out_start[i + 1] - out_start[i]
            total += max(0, min(b, hi) - max(a, lo))
        entry_max = max(entry_max, total)
    return index_max, entry_max


@njit(nogil=True, cache=True)
def _increasing_in_runs(plain, starts, out_start, i0, i1):
    for i in range(i0, i1):
        a = starts[i]
        for e in range(a + 1, a + out_start[i + 1] - out_start[i]):
            if plain[e] <= plain[e - 1]:
                return False
    return True


@njit(nogil=True, cache=True)
def _copy_rows_checked(plain, words, starts, out_start, i0, i1, out_plain, out_words):
    """``_copy_runs`` of CSR rows [i0, i1) (plain indices and value words), and whether every
    copied row's plain indices strictly increase. The rows are checked a block at a time, right
    after their copy read them (still in cache): 10.4 ms against 12.5 for a check after a whole
    chunk, 9.8 unchecked (100k rows of 10M entries)."""
    plain2d = plain.reshape(-1, 1)
    ordered = True
    for b in range(i0, i1, _CHECK_BLOCK):
        b1 = min(i1, b + _CHECK_BLOCK)
        _copy_runs(plain2d, -1, words, starts, out_start, b, b1, out_plain, out_words)
        if ordered:
            ordered = _increasing_in_runs(plain, starts, out_start, b, b1)
    return ordered


@njit(nogil=True, cache=True, parallel=True)
def _copy_rows_checked_par(plain, words, starts, out_start, out_plain, out_words, n_chunks):
    n = starts.size
    chunk = (n + n_chunks - 1) // n_chunks
    ordered = np.ones(n_chunks, np.bool_)
    for c in prange(n_chunks):
        ordered[c] = _copy_rows_checked(plain, words, starts, out_start, c * chunk, min(n, (c + 1) * chunk),
                                        out_plain, out_words)
    return ordered.all()


@njit(nogil=True, cache=True)
def _block_run_starts(column, prev, base, ptr, spare):
    """``ptr[v] = base + e`` where entry e of ``column`` starts a run of value v (a value other
    than its predecessor's, ``prev`` before the first); every other entry writes ``ptr[spare]``,
    so the loop has no branch. True if the column decreases anywhere. A loop over a whole
    sliced view: numba vectorizes it, where a loop over ``range(a, b)`` of the full array ran
    at a third of the speed."""
    decreases = False
    for e in range(column.size):
        v = column[e]
        decreases |= v < prev
        ptr[v if v != prev else spare] = base + e
        prev = v
    return decreases


@njit(nogil=True, cache=True)
def _run_starts(column, a, b, ptr, spare):
    """``_block_run_starts`` over entries [a, b) of the column a block at a time, stopping at the
    first block that decreases (a column out of order costs little)."""
    prev = column[a - 1] if a > 0 else -1
    for start in range(a, b, 4096):
        block = column[start:min(b, start + 4096)]
        if _block_run_starts(block, prev, start, ptr, spare):
            return True
        prev = block[block.size - 1]
    return False


@njit(nogil=True, cache=True, parallel=True)
def _run_starts_par(column, ptr, spare, n_chunks):
    n = column.size
    chunk = (n + n_chunks - 1) // n_chunks
    bad = np.zeros(n_chunks, np.bool_)
    for c in prange(n_chunks):
        a = c * chunk
        bad[c] = a < n and _run_starts(column, a, min(n, a + chunk), ptr, spare)
    return bad.any()


@njit(nogil=True, cache=True)
def _fill_absent(ptr, size, n):
    """Values with no entry start where the next one does; ``ptr[size]`` is n."""
    following = n
    ptr[size] = n
    for v in range(size - 1, -1, -1):
        if ptr[v] < 0:
            ptr[v] = following
        following = ptr[v]


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


def csr_rows(ptr: np.ndarray, plain: np.ndarray, values: np.ndarray, rows: np.ndarray):
    """(ptr int64, plain, values, rows strictly sorted) of the selected CSR rows."""
    starts, out_start = selected_runs(ptr, rows)
    words = frozen(row_words(values))
    total = int(out_start[-1])
    out_plain = np.empty((total, 1), plain.dtype)
    out_words = np.empty((total, words.shape[1]), words.dtype)
    plain, starts, out_start = frozen(plain), frozen(starts), frozen(out_start)
    n_chunks = _n_chunks(max(rows.size, total))
    if n_chunks == 1:
        ordered = _copy_rows_checked(plain, words, starts, out_start, 0, rows.size, out_plain, out_words)
    else:
        with PARALLEL_LOCK:
            ordered = _copy_rows_checked_par(plain, words, starts, out_start, out_plain, out_words, n_chunks)
    return out_start, out_plain.reshape(-1), from_row_words(out_words, values), bool(ordered)


def sorted_column_ptr(indices: np.ndarray, col: int, size: int) -> tuple[bool, np.ndarray]:
    """(ok, ptr): when column ``col`` never decreases, ``ptr[v]`` is the first entry whose
    coordinate is at least v (so the entries of value v are ``ptr[v]:ptr[v + 1]``, in order);
    ok is False when the column decreases anywhere (ptr is then meaningless, but every value
    in it is still in [0, nnz]). One read of the column, bandwidth-bound: 5.4 ms for 10M
    entries, where the numpy sum of that strided column takes 4.8."""
    column = frozen(np.ascontiguousarray(indices, dtype=np.int64))[:, col]
    n = column.size
    ptr = np.full(size + 2, -1, np.int64)  # slot size + 1 takes the stores of run interiors
    n_chunks = _n_chunks(n)
    if n_chunks == 1:
        ok = not (n and _run_starts(column, 0, n, ptr, size + 1))
    else:
        with PARALLEL_LOCK:
            ok = not _run_starts_par(column, ptr, size + 1, n_chunks)
    if not ok:
        ptr[:] = n
    _fill_absent(ptr, size, n)
    return ok, ptr[:size + 1]


def selected_runs(ptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, out_start): where the run ``ptr[r]:ptr[r + 1]`` of each of ``rows`` starts,
    and where it goes in a result that lists them in order (``out_start[-1]`` entries)."""
    ptr, rows = frozen(ptr), frozen(rows)
    n = rows.size
    starts, out_start = np.empty(n, np.int64), np.empty(n + 1, np.int64)
    n_chunks = _n_chunks(n)
    if n_chunks == 1:
        _run_bounds(ptr, rows, 0, n, starts, out_start)
    else:
        with PARALLEL_LOCK:
            _run_bounds_par(ptr, rows, starts, out_start, n_chunks)
    out_start[0] = 0
    np.cumsum(out_start, out=out_start)
    return starts, out_start


def runs_work(starts: np.ndarray, out_start: np.ndarray, index_split: tuple[int, int],
              entry_split: tuple[int, int]) -> tuple[int, int]:
    """``runs_work_kernel`` for (threads, chunk) splits of the positions and of the entries."""
    index_max, entry_max = runs_work_kernel(frozen(starts), frozen(out_start), *index_split, *entry_split)
    return int(index_max), int(entry_max)


def copy_runs(indices: np.ndarray, values: np.ndarray, col: int, starts: np.ndarray,
              out_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(indices, values) of an index-major result from the runs of ``selected_runs`` over a
    sorted column: for each position i, its run of entries in order, column ``col`` renumbered
    to i."""
    indices = frozen(np.ascontiguousarray(indices, dtype=np.int64))
    words = frozen(row_words(values))
    total = int(out_start[-1])
    out = np.empty((total, indices.shape[1]), np.int64)
    out_words = np.empty((total, words.shape[1]), words.dtype)
    starts, out_start = frozen(starts), frozen(out_start)
    n_chunks = _n_chunks(max(starts.size, total))
    if n_chunks == 1:
        _copy_runs(indices, col, words, starts, out_start, 0, starts.size, out, out_words)
    else:
        with PARALLEL_LOCK:
            _copy_runs_par(indices, col, words, starts, out_start, out, out_words, n_chunks)
    return out, from_row_words(out_words, values)


def first_out_of_range(index: np.ndarray, size: int) -> int:
    return int(first_out_of_range_kernel(frozen(np.ascontiguousarray(index, dtype=np.int64)), size))


# Values move as words of 1, 2, 4 or 8 bytes (row_words): one kernel signature each.
_WORD_SAMPLES = [np.zeros(3, np.float32), np.zeros(3, np.float64), np.zeros(3, np.int16), np.zeros(3, np.bool_)]


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
    # The sorted-column path, sequential (3 entries) and parallel (PARALLEL_MIN entries and rows).
    for n in (3, PARALLEL_MIN):  # one entry per row, every row selected
        rows = np.arange(n, dtype=np.int64)
        sorted_indices = frozen(np.stack([rows, np.zeros(n, np.int64)], axis=1))
        ok, ptr = sorted_column_ptr(sorted_indices, 0, n)
        starts, out_start = selected_runs(ptr, rows)
        runs_work(starts, out_start, (1, 2), (2, 2))
        for values in _WORD_SAMPLES:
            copy_runs(sorted_indices, np.zeros(n, values.dtype), 0, starts, out_start)
        for dtype in (np.int32, np.int64):
            for values in _WORD_SAMPLES[:2]:
                csr_rows(np.arange(n + 1, dtype=dtype), np.zeros(n, dtype), np.zeros(n, values.dtype), rows)
    first_out_of_range(np.array([0, -1], np.int64), 2)
