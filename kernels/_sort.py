"""Row-major keys and a stable radix argsort over them.

Sorting-heavy ops work on one int64 key per entry (the row-major linear
position over the sparse dimensions) instead of lexsorting index columns.
The caller has validated the indices, so every key is in ``[0, prod(shape))``
and fits int64.

Parallel kernels run under the threading layer ``_parallel`` picks (thread-safe,
since the server calls kernels from a thread pool).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from . import _parallel  # sets the threading layer before any parallel kernel

MAX_RADIX_BITS = 12  # 4096 buckets: the count array (32 KiB) stays in L1
BUCKET_RADIX_BITS = 11  # digits of the in-cache passes over one bucket


@njit(nogil=True, cache=True)
def linearize_kernel(indices, shape):
    n, s = indices.shape
    keys = np.empty(n, np.int64)
    for i in range(n):
        k = 0
        for j in range(s):
            k = k * shape[j] + indices[i, j]
        keys[i] = k
    return keys


@njit(nogil=True, cache=True)
def delinearize_kernel(keys, shape):
    n = keys.size
    s = shape.size
    out = np.empty((n, s), np.int64)
    for i in range(n):
        k = keys[i]
        for j in range(s - 1, -1, -1):
            d = shape[j]
            out[i, j] = k % d
            k //= d
    return out


@njit(nogil=True, cache=True)
def radix_argsort_kernel(keys):
    """(perm, keys[perm]): a stable LSD radix sort of non-negative int64 keys."""
    n = keys.size
    perm = np.arange(n)
    if n < 2:
        return perm, keys.copy()
    in_order = True
    kmax = keys[0]
    for i in range(1, n):
        if keys[i] < keys[i - 1]:
            in_order = False
        if keys[i] > kmax:
            kmax = keys[i]
    if in_order:  # already sorted: the common case for coalesced input
        return perm, keys.copy()
    # Fewest passes for the key width, digits spread evenly over them
    # (a 100,000 x 100,000 matrix has 34-bit keys: 3 passes of 12 bits).
    bits = 0
    while (kmax >> bits) > 0:
        bits += 1
    passes = (bits + MAX_RADIX_BITS - 1) // MAX_RADIX_BITS
    width = (bits + passes - 1) // passes
    radix = 1 << width
    mask = radix - 1
    cur_keys = keys.copy()
    tmp_keys = np.empty(n, np.int64)
    tmp_perm = np.empty(n, np.int64)
    count = np.empty(radix, np.int64)
    shift = 0
    while shift < bits:
        count[:] = 0
        for i in range(n):
            count[(cur_keys[i] >> shift) & mask] += 1
        if count.max() == n:  # this digit is the same everywhere: nothing to move
            shift += width
            continue
        total = 0
        for d in range(radix):
            c = count[d]
            count[d] = total
            total += c
        for i in range(n):
            d = (cur_keys[i] >> shift) & mask
            pos = count[d]
            count[d] = pos + 1
            tmp_keys[pos] = cur_keys[i]
            tmp_perm[pos] = perm[i]
        cur_keys, tmp_keys = tmp_keys, cur_keys
        perm, tmp_perm = tmp_perm, perm
        shift += width
    return perm, cur_keys


@njit(nogil=True, cache=True)
def first_disorder_kernel(keys):
    """(i, repeated) for the first key not above its predecessor; (-1, False) when strictly increasing."""
    for i in range(1, keys.size):
        if keys[i] <= keys[i - 1]:
            return i, keys[i] == keys[i - 1]
    return -1, False


@njit(nogil=True, cache=True)
def segment_starts_kernel(sorted_keys):
    """Start offsets of the runs of equal keys (counted, then filled)."""
    n = sorted_keys.size
    runs = 1 if n else 0
    for i in range(1, n):
        if sorted_keys[i] != sorted_keys[i - 1]:
            runs += 1
    starts = np.empty(runs, np.int64)
    r = 0
    for i in range(n):
        if i == 0 or sorted_keys[i] != sorted_keys[i - 1]:
            starts[r] = i
            r += 1
    return starts


def row_words(a: np.ndarray) -> np.ndarray:
    """The rows (along axis 0) of ``a``, any dtype and trailing shape, as a C-contiguous
    [n, k] array of unsigned words, the widest that divides a row: kernels move rows as
    opaque words, one signature per word width rather than per dtype."""
    a = np.ascontiguousarray(a)
    n, inner = a.shape[0], int(np.prod(a.shape[1:], dtype=np.int64))
    row_bytes = a.dtype.itemsize * inner
    if row_bytes == 0:
        return np.zeros((n, 0), np.uint8)
    word = next(w for w in (8, 4, 2, 1) if row_bytes % w == 0)
    return a.reshape(n, inner).view(np.dtype(f"u{word}")).reshape(n, row_bytes // word)


def from_row_words(words: np.ndarray, like: np.ndarray) -> np.ndarray:
    """Rows made by moving ``row_words(like)``, as ``like``'s dtype and trailing shape."""
    return words.view(like.dtype).reshape((words.shape[0], *like.shape[1:]))


def gather_rows(a: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """``a[perm]`` along axis 0 for any dtype: rows move as opaque words, no arithmetic.

    ``np.take`` on a word view: twice as fast as a numba loop or fancy indexing here,
    and nothing to compile.
    """
    if 0 < a.shape[0] < _parallel.PARALLEL_MIN:  # small: the word view's set-up is most of the work
        return a.take(perm, axis=0)
    if a.shape[0] == 0 or a.nbytes == 0:
        return np.empty((perm.size, *a.shape[1:]), a.dtype)
    words = row_words(a)
    out = np.take(words, perm, axis=0) if words.shape[1] > 1 else np.take(words[:, 0], perm)[:, None]
    return from_row_words(out, a)


def frozen(a: np.ndarray) -> np.ndarray:
    """A read-only view. Numba compiles read-only and writable arrays as different signatures,
    so wrappers pass every array a kernel only reads as read-only, whether it came from a
    request (read-only) or was computed here (writable): one signature, warmed up once."""
    view = a.view()
    view.flags.writeable = False
    return view


def linearize(indices: np.ndarray, sparse_shape) -> np.ndarray:
    """Row-major int64 keys of validated COO indices."""
    indices = frozen(np.ascontiguousarray(indices, dtype=np.int64))
    sparse_shape = np.asarray(sparse_shape, dtype=np.int64)
    if indices.shape[0] < _parallel.PARALLEL_MIN:
        return linearize_kernel(indices, sparse_shape)
    keys = np.empty(indices.shape[0], np.int64)
    with _parallel.PARALLEL_LOCK:
        linearize_parallel(indices, sparse_shape, keys, _parallel.N_CHUNKS)
    return keys


def argsort_stable(keys: np.ndarray) -> np.ndarray:
    """The stable sorting permutation of non-negative int64 keys."""
    return radix_argsort_kernel(frozen(np.ascontiguousarray(keys, dtype=np.int64)))[0]


def packed_order(indices: np.ndarray, sparse_shape, values: np.ndarray | None = None):
    """The stable row-major order of validated COO indices as sorted packed words
    (key << pos_bits | position): (words, pos_bits, sorted values or None) — or None when
    the input is small or key and position don't fit one word (callers then take
    ``sorted_keys``'s sequential path).

    Values of one 8-byte word per entry travel with the words through the sort and come
    back sorted; others come back None (gather them by position).
    """
    n = indices.shape[0]
    if n < _parallel.PARALLEL_MIN:
        return None
    key_bits = max(math.prod(int(d) for d in sparse_shape) - 1, 0).bit_length()
    pos_bits = max(int(n - 1).bit_length(), 1)
    if key_bits + pos_bits > 63:
        return None
    indices = frozen(np.ascontiguousarray(indices, dtype=np.int64))
    words = None
    if values is not None and values.dtype.itemsize * (values.size // max(n, 1)) == 8:
        words = np.ascontiguousarray(values).reshape(n, -1).view(np.uint64).reshape(n)
    packed = np.empty(n, np.int64)
    with _parallel.PARALLEL_LOCK:
        pack_keys_kernel(indices, np.asarray(sparse_shape, dtype=np.int64), pos_bits, packed,
                         _parallel.N_CHUNKS)
        packed, moved = sort_packed(packed, pos_bits, pos_bits + key_bits, _parallel.N_CHUNKS, words)
    sorted_values = None if moved is None else moved.view(values.dtype).reshape(values.shape)
    return packed, pos_bits, sorted_values


@njit(nogil=True, cache=True)
def linear_argsort_kernel(indices, shape):
    """``radix_argsort_kernel(linearize_kernel(indices, shape))``: one call where a small input's
    time is mostly the calls."""
    return radix_argsort_kernel(linearize_kernel(indices, shape))


@njit(nogil=True, cache=True)
def sorted_indices_kernel(indices, shape):
    """(perm, indices[perm]): ``linear_argsort_kernel`` and ``delinearize_kernel`` in one call."""
    perm, keys = linear_argsort_kernel(indices, shape)
    return perm, delinearize_kernel(keys, shape)


def read_only_indices(indices: np.ndarray) -> np.ndarray:
    """C-contiguous read-only int64 indices, the one signature the kernels are warmed up with:
    decoded indices as they are, others as a (contiguous) read-only view."""
    if indices.dtype == np.int64 and indices.flags.c_contiguous and not indices.flags.writeable:
        return indices
    return frozen(np.ascontiguousarray(indices, dtype=np.int64))


def sequential_order(indices: np.ndarray, sparse_shape: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(perm, keys[perm]): the stable row-major order of validated COO indices by a sequential
    radix sort of (key, position) pairs, for small inputs and keys too wide to pack."""
    return linear_argsort_kernel(read_only_indices(indices), sparse_shape)


def sorted_keys(indices: np.ndarray, sparse_shape,
                values: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(perm, keys[perm], values[perm] or None): the stable row-major order of validated COO
    indices (``packed_order`` unpacked, or ``sequential_order``)."""
    sparse_shape = np.asarray(sparse_shape, dtype=np.int64)
    packed = packed_order(indices, sparse_shape, values)
    if packed is None:
        return (*sequential_order(indices, sparse_shape), None)
    words, pos_bits, sorted_values = packed
    keys, perm = np.empty(words.size, np.int64), np.empty(words.size, np.int64)
    with _parallel.PARALLEL_LOCK:
        unpack_kernel(words, pos_bits, keys, perm, _parallel.N_CHUNKS)
    return perm, keys, sorted_values


def key_divisors(sparse_shape) -> np.ndarray:
    """``1 / shape`` for ``split_key``'s float quotients when every key is below 2**50 (exact
    after one correction); empty otherwise, and integer division is used."""
    shape = np.asarray(sparse_shape, dtype=np.int64)
    if int(np.prod(shape, dtype=object)) > 1 << 50 or not shape.all():
        return np.empty(0, np.float64)
    return 1.0 / shape.astype(np.float64)


@njit(nogil=True, cache=True)
def split_key(k, shape, inv, out, r):
    """Row-major coordinates of key ``k`` into ``out[r]``. With ``inv`` the quotient comes
    from a float multiply and a correction of at most one: a 64-bit division costs about
    ten times as much, and splitting keys was a fifth of coalesce's time."""
    for j in range(shape.size - 1, -1, -1):
        d = shape[j]
        if inv.size:
            q = np.int64(k * inv[j])
            rem = k - q * d
            if rem < 0:
                q -= 1
                rem += d
            elif rem >= d:
                q += 1
                rem -= d
        else:
            q = k // d
            rem = k - q * d
        out[r, j] = rem
        k = q


@njit(nogil=True, cache=True, parallel=True)
def run_counts_kernel(words, pos_bits, counts):
    """Runs of equal keys in sorted packed words, per chunk (``counts`` has n_chunks + 1
    slots and comes back as the chunks' offsets)."""
    n = words.size
    n_chunks = counts.size - 1
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        m = 0
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            if i == 0 or (words[i] >> pos_bits) != (words[i - 1] >> pos_bits):
                m += 1
        counts[c + 1] = m
    counts[0] = 0
    for c in range(n_chunks):
        counts[c + 1] += counts[c]


@njit(nogil=True, cache=True, parallel=True)
def run_starts_kernel(words, pos_bits, shape, inv, counts, starts, coords):
    """Where each run of equal keys starts, and its key split into coordinates."""
    n = words.size
    n_chunks = counts.size - 1
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        r = counts[c]
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            k = words[i] >> pos_bits
            if i == 0 or k != (words[i - 1] >> pos_bits):
                starts[r] = i
                split_key(k, shape, inv, coords, r)
                r += 1


def unique_runs(words: np.ndarray, pos_bits: int, sparse_shape) -> tuple[np.ndarray, np.ndarray]:
    """(starts, coordinates) of the runs of equal keys in sorted packed words."""
    shape = np.asarray(sparse_shape, dtype=np.int64)
    counts = np.zeros(_parallel.N_CHUNKS + 1, np.int64)
    with _parallel.PARALLEL_LOCK:
        run_counts_kernel(words, pos_bits, counts)
        starts = np.empty(counts[-1], np.int64)
        coords = np.empty((counts[-1], shape.size), np.int64)
        run_starts_kernel(words, pos_bits, shape, key_divisors(shape), frozen(counts), starts, coords)
    return starts, coords


# ---------------------------------------------------------------- parallel packed sort
# When key bits + position bits fit in 63, each entry becomes one int64 word
# (key << pos_bits | position). Sorting the words by their key bits alone moves
# 8 bytes per entry per pass instead of 16, and an LSD sort keeps equal keys in
# position order, so the sort is stable. Passes split the input into chunks with
# per-chunk histograms so both cores work.

@njit(nogil=True, cache=True, parallel=True)
def pack_keys_kernel(indices, shape, pos_bits, packed, n_chunks):
    n, s = indices.shape
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            k = 0
            for j in range(s):
                k = k * shape[j] + indices[i, j]
            packed[i] = (k << pos_bits) | i


@njit(nogil=True, cache=True, parallel=True)
def linearize_parallel(indices, shape, keys, n_chunks):
    n, s = indices.shape
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            k = 0
            for j in range(s):
                k = k * shape[j] + indices[i, j]
            keys[i] = k


@njit(nogil=True, cache=True, parallel=True)
def _radix_pass(src, dst, payload_src, payload_dst, shift, width, n_chunks, bounds):
    """One stable counting-sort pass on bits [shift, shift + width); False if the digit is constant.

    A non-empty payload (one 8-byte word per entry: the values) moves with its word, so the
    caller needs no random gather afterwards. ``bounds`` (2 ** width + 1 slots) receives
    where each digit's bucket starts in ``dst``.
    """
    n = src.size
    carry = payload_src.size == n
    radix = 1 << width
    mask = radix - 1
    chunk = (n + n_chunks - 1) // n_chunks
    hist = np.zeros((n_chunks, radix), np.int64)
    for c in prange(n_chunks):
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            hist[c, (src[i] >> shift) & mask] += 1
    total = 0
    for d in range(radix):
        bounds[d] = total
        column = 0
        for c in range(n_chunks):
            column += hist[c, d]
        if column == n:
            return False
        for c in range(n_chunks):
            count = hist[c, d]
            hist[c, d] = total
            total += count
    for c in prange(n_chunks):
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            d = (src[i] >> shift) & mask
            pos = hist[c, d]
            dst[pos] = src[i]
            if carry:
                payload_dst[pos] = payload_src[i]
            hist[c, d] = pos + 1
    bounds[radix] = n
    return True


@njit(nogil=True, cache=True)
def _is_sorted(a):
    for i in range(1, a.size):
        if a[i] < a[i - 1]:
            return False
    return True


@njit(nogil=True, cache=True, parallel=True)
def _bucket_lsd(words, tmp, payload, payload_tmp, bounds, low_bit, bits, n_groups):
    """Sort each bucket ``words[bounds[b]:bounds[b + 1]]`` by bits [low_bit, low_bit + bits),
    stably, moving the payload (when it has one word per entry) along.

    Buckets are a few thousand entries, so every pass runs in the core's cache; ``tmp`` and
    ``payload_tmp`` are scratch of the same length as ``words``.
    """
    carry = payload.size == words.size
    n_buckets = bounds.size - 1
    passes = max(1, (bits + BUCKET_RADIX_BITS - 1) // BUCKET_RADIX_BITS)
    width = (bits + passes - 1) // passes
    mask = (np.int64(1) << width) - 1
    per_group = (n_buckets + n_groups - 1) // n_groups
    for g in prange(n_groups):
        count = np.empty(np.int64(1) << width, np.int64)
        for b in range(g * per_group, min(n_buckets, (g + 1) * per_group)):
            lo, hi = bounds[b], bounds[b + 1]
            if hi - lo < 2:
                continue
            if hi - lo <= 32:  # insertion sort: stable, and cheaper than clearing the counts
                for i in range(lo + 1, hi):
                    w = words[i]
                    pw = payload[i] if carry else np.uint64(0)
                    key = w >> low_bit
                    j = i - 1
                    while j >= lo and (words[j] >> low_bit) > key:
                        words[j + 1] = words[j]
                        if carry:
                            payload[j + 1] = payload[j]
                        j -= 1
                    words[j + 1] = w
                    if carry:
                        payload[j + 1] = pw
                continue
            src, dst, psrc, pdst = words, tmp, payload, payload_tmp
            moved = False
            for p in range(passes):
                shift = low_bit + p * width
                count[:] = 0
                for i in range(lo, hi):
                    count[(src[i] >> shift) & mask] += 1
                if count.max() == hi - lo:  # the digit is the same throughout: nothing moves
                    continue
                total = lo
                for d in range(count.size):
                    c = count[d]
                    count[d] = total
                    total += c
                for i in range(lo, hi):
                    d = (src[i] >> shift) & mask
                    pos = count[d]
                    count[d] = pos + 1
                    dst[pos] = src[i]
                    if carry:
                        pdst[pos] = psrc[i]
                src, dst, psrc, pdst = dst, src, pdst, psrc
                moved = not moved
            if moved:  # the result sits in the scratch half: bring it back
                words[lo:hi] = tmp[lo:hi]
                if carry:
                    payload[lo:hi] = payload_tmp[lo:hi]


def sort_packed(packed: np.ndarray, low_bit: int, high_bit: int, n_chunks: int,
                payload: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Sort int64 words by bits [low_bit, high_bit), stably, moving ``payload`` (uint64 words,
    one per entry) along; returns (words, payload). May reuse the input arrays.

    Most significant digit first: one parallel pass scatters the words into buckets by
    their top bits (the only pass that moves data through main memory), then each bucket
    is sorted on the remaining bits in cache. An LSD sort over main memory took three
    full passes for 34-bit keys and twice the time.
    """
    if packed.size < 2 or _is_sorted(packed):
        return packed, payload
    bits = high_bit - low_bit
    # Buckets of a few thousand entries fit a core's L2 cache with their payload.
    top = min(bits, MAX_RADIX_BITS, max(1, int(packed.size // 2048).bit_length()))
    no_payload = np.empty(0, np.uint64)
    psrc = payload.copy() if payload is not None else no_payload
    dst, pdst = np.empty_like(packed), np.empty_like(psrc)
    bounds = np.empty((1 << top) + 1, np.int64)
    if _radix_pass(packed, dst, psrc, pdst, high_bit - top, top, n_chunks, bounds):
        packed, dst, psrc, pdst = dst, packed, pdst, psrc
    else:  # one digit everywhere: a single bucket
        bounds[:] = packed.size
        bounds[0] = 0
    if bits > top:
        _bucket_lsd(packed, dst, psrc, pdst, bounds, low_bit, bits - top, n_chunks)
    return packed, (psrc if payload is not None else None)


@njit(nogil=True, cache=True, parallel=True)
def unpack_kernel(packed, pos_bits, keys, perm, n_chunks):
    """Keys and positions of sorted packed words."""
    n = packed.size
    mask = (np.int64(1) << pos_bits) - 1
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            keys[i] = packed[i] >> pos_bits
            perm[i] = packed[i] & mask


@njit(nogil=True, cache=True, parallel=True)
def delinearize_parallel_kernel(keys, shape, inv, out, n_chunks):
    n = keys.size
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            split_key(keys[i], shape, inv, out, i)


@njit(nogil=True, cache=True, parallel=True)
def split_packed_kernel(words, pos_bits, shape, inv, out, n_chunks):
    n = words.size
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            split_key(words[i] >> pos_bits, shape, inv, out, i)


def split_packed(words: np.ndarray, pos_bits: int, sparse_shape) -> np.ndarray:
    """Coordinates of the keys of packed words, in parallel (callers hold ``PARALLEL_LOCK``)."""
    shape = np.asarray(sparse_shape, dtype=np.int64)
    out = np.empty((words.size, shape.size), np.int64)
    split_packed_kernel(frozen(words), pos_bits, shape, key_divisors(shape), out, _parallel.N_CHUNKS)
    return out


def delinearize_parallel(keys: np.ndarray, sparse_shape) -> np.ndarray:
    """Coordinates of row-major keys, in parallel (callers hold ``PARALLEL_LOCK``)."""
    shape = np.asarray(sparse_shape, dtype=np.int64)
    out = np.empty((keys.size, shape.size), np.int64)
    delinearize_parallel_kernel(frozen(keys), shape, key_divisors(shape), out, _parallel.N_CHUNKS)
    return out


@njit(nogil=True, cache=True, parallel=True)
def segment_starts_parallel(sorted_keys, n_chunks):
    """Start offsets of the runs of equal keys: per-chunk counts, then a parallel fill."""
    n = sorted_keys.size
    chunk = (n + n_chunks - 1) // n_chunks
    counts = np.zeros(n_chunks + 1, np.int64)
    for c in prange(n_chunks):
        m = 0
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            if i == 0 or sorted_keys[i] != sorted_keys[i - 1]:
                m += 1
        counts[c + 1] = m
    for c in range(n_chunks):
        counts[c + 1] += counts[c]
    starts = np.empty(counts[n_chunks], np.int64)
    for c in prange(n_chunks):
        r = counts[c]
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            if i == 0 or sorted_keys[i] != sorted_keys[i - 1]:
                starts[r] = i
                r += 1
    return starts
