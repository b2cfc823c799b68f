"""Kernels of the structure ops: select (indexing), to_indicator, and the helpers
sparse_to_dense, concat and fill_empty_rows share with ``kernels.coo``.

Inputs are validated by the op declarations (``server/ops/structure.py``):
every index is in range and every key fits int64 before anything here runs.
Kernels are sequential (no ``parallel=True``) and count before they allocate.
Signatures: ``select_kernel`` and ``indicator_kernel`` have one each (int64
indices and ids, a uint8 output); values move with ``_sort.gather_rows``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._sort import gather_rows


@njit(nogil=True, cache=True)
def select_kernel(indices, start, step, length, keep):
    """Entries whose index lies on every dimension's progression ``start + step * k``,
    ``0 <= k < length``: (their positions, their new indices over the kept dimensions).

    An int index is ``start = i, step = 1, length = 1, keep = False``; an untouched
    dimension is ``start = 0, step = 1, length = dim, keep = True``.
    """
    nnz, s = indices.shape
    nkeep = 0
    for d in range(s):
        if keep[d]:
            nkeep += 1
    mask = np.zeros(nnz, np.bool_)
    count = 0
    for i in range(nnz):
        ok = True
        for d in range(s):
            off = indices[i, d] - start[d]
            if off < 0 or off % step[d] != 0 or off // step[d] >= length[d]:
                ok = False
                break
        if ok:
            mask[i] = True
            count += 1
    rows = np.empty(count, np.int64)
    out = np.empty((count, nkeep), np.int64)
    c = 0
    for i in range(nnz):
        if mask[i]:
            rows[c] = i
            e = 0
            for d in range(s):
                if keep[d]:
                    out[c, e] = (indices[i, d] - start[d]) // step[d]
                    e += 1
            c += 1
    return rows, out


@njit(nogil=True, cache=True)
def indicator_kernel(indices, ids, shape, vocab, out):
    """out[key(index without its last coordinate) * vocab + id] = 1 for every stored element.

    ``indices`` [nnz, s], ``ids`` [nnz, inner] (the value blocks of a hybrid tensor,
    flattened over ``shape[s:]``), ``shape`` the full dense shape, ``out`` flat uint8.
    """
    nnz, s = indices.shape
    ndim = shape.size
    inner = ids.shape[1]
    coord = np.empty(ndim, np.int64)
    for i in range(nnz):
        for d in range(s):
            coord[d] = indices[i, d]
        for j in range(inner):
            r = j
            for d in range(ndim - 1, s - 1, -1):
                coord[d] = r % shape[d]
                r //= shape[d]
            k = 0
            for d in range(ndim - 1):
                k = k * shape[d] + coord[d]
            out[k * vocab + ids[i, j]] = 1


def select(indices: np.ndarray, start, step, length, keep):
    """(positions, new indices) of the entries ``select_kernel`` keeps."""
    return select_kernel(np.ascontiguousarray(indices, dtype=np.int64),
                         np.asarray(start, np.int64), np.asarray(step, np.int64),
                         np.asarray(length, np.int64), np.asarray(keep, np.bool_))


def to_indicator(indices: np.ndarray, ids: np.ndarray, dense_shape, vocab_size: int) -> np.ndarray:
    """Dense bool ``dense_shape[:-1] + [vocab_size]``; ``ids`` int64 ``[nnz, *dense_shape[s:]]``,
    every id already checked to lie in ``[0, vocab_size)``."""
    out_shape = (*dense_shape[:-1], vocab_size)
    out = np.zeros(int(np.prod(out_shape, dtype=np.int64)), np.uint8)
    nnz = indices.shape[0]
    inner = int(np.prod(dense_shape[indices.shape[1]:], dtype=np.int64))
    if nnz and inner:
        indicator_kernel(np.ascontiguousarray(indices, dtype=np.int64),
                         np.ascontiguousarray(ids, dtype=np.int64).reshape(nnz, inner),
                         np.asarray(dense_shape, np.int64), np.int64(vocab_size), out)
    return out.view(np.bool_).reshape(out_shape)


def take_rows(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``values[rows]`` along axis 0, for any dtype."""
    return gather_rows(values, np.ascontiguousarray(rows, dtype=np.int64))


def warm_up() -> None:
    """Compile (or load from the disk cache) this module's signatures."""
    from ._sort import frozen

    idx = frozen(np.array([[1, 0], [0, 1], [1, 1]], dtype=np.int64))
    select(idx, [1, 0], [1, 1], [1, 2], [False, True])
    to_indicator(idx, frozen(np.array([0, 1, 2], np.int64)), (2, 2), 3)
