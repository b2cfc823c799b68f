"""Row-major keys and a stable radix argsort over them.

Sorting-heavy ops work on one int64 key per entry (the row-major linear
position over the sparse dimensions) instead of lexsorting index columns.
The caller has validated the indices, so every key is in ``[0, prod(shape))``
and fits int64.

Parallel kernels run under the threading layer ``_parallel`` picks (thread-safe,
since the server calls kernels from a thread pool).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import _parallel  # noqa: F401  (sets the threading layer before any parallel kernel)

MAX_RADIX_BITS = 12  # 4096 buckets: the count array (32 KiB) stays in L1


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


def gather_rows(a: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """``a[perm]`` along axis 0 for any dtype: rows move as opaque words, no arithmetic.

    ``np.take`` on a word view: twice as fast as a numba loop or fancy indexing here,
    and nothing to compile.
    """
    a = np.ascontiguousarray(a)
    n = a.shape[0]
    row_bytes = a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))
    if n == 0 or row_bytes == 0:
        return np.empty((perm.size, *a.shape[1:]), a.dtype)
    word = next(w for w in (8, 4, 2, 1) if row_bytes % w == 0)
    words = a.reshape(n, -1).view(np.dtype(f"u{word}")).reshape(n, row_bytes // word)
    out = np.take(words, perm, axis=0) if words.shape[1] > 1 else np.take(words[:, 0], perm)[:, None]
    return out.view(a.dtype).reshape((perm.size, *a.shape[1:]))


def frozen(a: np.ndarray) -> np.ndarray:
    """A read-only view. Numba compiles read-only and writable arrays as different signatures,
    so wrappers pass every array a kernel only reads as read-only, whether it came from a
    request (read-only) or was computed here (writable): one signature, warmed up once."""
    view = a.view()
    view.flags.writeable = False
    return view


def linearize(indices: np.ndarray, sparse_shape) -> np.ndarray:
    """Row-major int64 keys of validated COO indices."""
    return linearize_kernel(frozen(np.ascontiguousarray(indices, dtype=np.int64)),
                            np.asarray(sparse_shape, dtype=np.int64))


def argsort_stable(keys: np.ndarray) -> np.ndarray:
    """The stable sorting permutation of non-negative int64 keys."""
    return radix_argsort_kernel(frozen(np.ascontiguousarray(keys, dtype=np.int64)))[0]


def sorted_keys(indices: np.ndarray, sparse_shape,
                values: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(perm, keys[perm], values[perm] or None): the stable row-major order of validated COO
    indices.

    Packs key and position into one word when they fit (the fast, parallel path); values of
    one 8-byte word per entry then travel with the words through the sort, and come back
    sorted (otherwise None: gather them with ``perm``). Keys that don't fit sort as
    (key, position) pairs.
    """
    indices = frozen(np.ascontiguousarray(indices, dtype=np.int64))
    sparse_shape = np.asarray(sparse_shape, dtype=np.int64)
    n = indices.shape[0]
    key_bits = int(max(int(np.prod(sparse_shape, dtype=object)) - 1, 0)).bit_length()
    pos_bits = max(int(n - 1).bit_length(), 1)
    if n < _parallel.PARALLEL_MIN or key_bits + pos_bits > 63:
        perm, keys = radix_argsort_kernel(linearize_kernel(indices, sparse_shape))
        return perm, keys, None
    words = None
    if values is not None and values.dtype.itemsize * (values.size // max(n, 1)) == 8:
        words = np.ascontiguousarray(values).reshape(n, -1).view(np.uint64).reshape(n)
    with _parallel.PARALLEL_LOCK:
        packed = pack_keys_kernel(indices, sparse_shape, pos_bits, _parallel.N_CHUNKS)
        packed, moved = sort_packed(packed, pos_bits, pos_bits + key_bits, _parallel.N_CHUNKS, words)
        keys, perm = unpack_kernel(packed, pos_bits, _parallel.N_CHUNKS)
    sorted_values = None if moved is None else moved.view(values.dtype).reshape(values.shape)
    return perm, keys, sorted_values


# ---------------------------------------------------------------- parallel packed sort
# When key bits + position bits fit in 63, each entry becomes one int64 word
# (key << pos_bits | position). Sorting the words by their key bits alone moves
# 8 bytes per entry per pass instead of 16, and an LSD sort keeps equal keys in
# position order, so the sort is stable. Passes split the input into chunks with
# per-chunk histograms so both cores work.

@njit(nogil=True, cache=True, parallel=True)
def pack_keys_kernel(indices, shape, pos_bits, n_chunks):
    n, s = indices.shape
    packed = np.empty(n, np.int64)
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            k = 0
            for j in range(s):
                k = k * shape[j] + indices[i, j]
            packed[i] = (k << pos_bits) | i
    return packed


@njit(nogil=True, cache=True, parallel=True)
def _radix_pass(src, dst, payload_src, payload_dst, shift, width, n_chunks):
    """One stable counting-sort pass on bits [shift, shift + width); False if the digit is constant.

    A non-empty payload (one 8-byte word per entry: the values) moves with its word, so the
    caller needs no random gather afterwards.
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
    return True


@njit(nogil=True, cache=True)
def _is_sorted(a):
    for i in range(1, a.size):
        if a[i] < a[i - 1]:
            return False
    return True


def sort_packed(packed: np.ndarray, low_bit: int, high_bit: int, n_chunks: int,
                payload: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Sort int64 words by bits [low_bit, high_bit), stably, moving ``payload`` (uint64 words,
    one per entry) along; returns (words, payload). May reuse the input arrays."""
    if packed.size < 2 or _is_sorted(packed):
        return packed, payload
    bits = high_bit - low_bit
    passes = max(1, -(-bits // MAX_RADIX_BITS))
    width = -(-bits // passes)
    src, dst = packed, np.empty_like(packed)
    no_payload = np.empty(0, np.uint64)
    psrc = payload.copy() if payload is not None else no_payload
    pdst = np.empty_like(psrc)
    for p in range(passes):
        if _radix_pass(src, dst, psrc, pdst, low_bit + p * width, width, n_chunks):
            src, dst = dst, src
            psrc, pdst = pdst, psrc
    return src, (psrc if payload is not None else None)


@njit(nogil=True, cache=True, parallel=True)
def unpack_kernel(packed, pos_bits, n_chunks):
    """(keys, perm) of sorted packed words."""
    n = packed.size
    keys = np.empty(n, np.int64)
    perm = np.empty(n, np.int64)
    mask = (np.int64(1) << pos_bits) - 1
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            keys[i] = packed[i] >> pos_bits
            perm[i] = packed[i] & mask
    return keys, perm


@njit(nogil=True, cache=True, parallel=True)
def delinearize_parallel(keys, shape, n_chunks):
    n = keys.size
    s = shape.size
    out = np.empty((n, s), np.int64)
    chunk = (n + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        for i in range(c * chunk, min(n, (c + 1) * chunk)):
            k = keys[i]
            for j in range(s - 1, -1, -1):
                d = shape[j]
                q = k // d
                out[i, j] = k - q * d
                k = q
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
