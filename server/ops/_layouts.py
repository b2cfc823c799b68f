"""Moving tensors between layouts inside the server, for ops declared on several.

Op modules call these instead of converting by hand, so one place decides how
each layout pair is converted. The index work runs in
``sparseserve.kernels.compressed``; values move here as opaque rows (a gather
or a scatter), so every dtype takes the same path.

Every function takes a tensor validated against docs/contract.md ("Tensors") (any index
order, repeats allowed) and never hands a kernel an order it has not checked.
"""

from __future__ import annotations

import numpy as np

from sparseserve import kernels
from sparseserve.core.tensor import BLOCK_LAYOUTS, SparseTensor
from sparseserve.kernels import compressed as ck
from sparseserve.kernels import frozen, gather_rows

from ._sputils import index_dtype

__all__ = ["SPARSE_LAYOUTS", "as_coo", "as_csr", "convert_layout", "BatchNseError", "view_sparse_ndim",
           "view_nnz", "entry_indices", "entry_values", "with_entry_values", "first_noncanonical",
           "sort_segments", "like", "keep_entries", "coo_view"]

SPARSE_LAYOUTS = ("coo", "csr", "csc", "bsr", "bsc")
ROW_MAJOR = ("csr", "bsr")
TRANSPOSED = {"csr": "csc", "csc": "csr", "bsr": "bsc", "bsc": "bsr"}


class BatchNseError(ValueError):
    """The batches of a would-be compressed tensor hold different numbers of entries."""

    def __init__(self, counts: np.ndarray, what: str):
        first = int(np.argmax(counts != counts[0]))
        super().__init__(f"every batch of a compressed tensor holds the same number of {what}; "
                         f"batch 0 holds {int(counts[0])} but batch {first} holds {int(counts[first])}")


# ------------------------------------------------------------------ small helpers
def _block(t: SparseTensor) -> tuple[int, int]:
    if t.layout in BLOCK_LAYOUTS and t.blocksize is not None:
        return int(t.blocksize[0]), int(t.blocksize[1])
    return 1, 1


def _n_batch(t: SparseTensor) -> int:
    return int(np.prod(t.dense_shape[:t.batch_ndim], dtype=np.int64))


def _indices_2d(t: SparseTensor) -> tuple[np.ndarray, np.ndarray]:
    """Compressed and plain indices as [n_batch, n] (views)."""
    n_batch = _n_batch(t)
    ci = t.compressed_indices.reshape(n_batch, t.compressed_indices.shape[-1])
    return ci, t.plain_indices.reshape(n_batch, t.plain_indices.shape[-1])


def _dense_dims(t: SparseTensor) -> tuple[int, ...]:
    return tuple(t.dense_shape[len(t.dense_shape) - t.dense_ndim:])


def _coo(indices, values, shape, coalesced: bool) -> SparseTensor:
    return SparseTensor(indices=indices, values=values, dense_shape=shape, coalesced=coalesced)


def _compressed(layout, ci, pi, values, shape, batch, blocksize=None) -> SparseTensor:
    """A compressed tensor from flat pieces: [n_batch, *] indices and entry-major values."""
    batch = tuple(batch)
    nse = pi.shape[-1]
    return SparseTensor(layout=layout, compressed_indices=ci.reshape(*batch, ci.shape[-1]),
                        plain_indices=pi.reshape(*batch, nse),
                        values=values.reshape(*batch, nse, *values.shape[1:]), dense_shape=shape,
                        blocksize=blocksize)


def _batch_pointers(ptr: np.ndarray, n_batch: int, n_compressed: int, what: str) -> np.ndarray:
    """Per-batch compressed indices [n_batch, n_compressed + 1] from global pointers over
    (batch, compressed) keys; every batch must hold the same number of entries."""
    if n_batch == 1:
        return ptr.reshape(1, -1)
    starts = ptr[np.arange(n_batch + 1) * n_compressed]
    counts = np.diff(starts)
    if counts.size and np.any(counts != counts[0]):
        raise BatchNseError(counts, what)
    idx = np.arange(n_batch)[:, None] * n_compressed + np.arange(n_compressed + 1)[None, :]
    return ptr[idx] - starts[:-1, None]


# ------------------------------------------------------------------ compressed <-> compressed
def transpose_compressed(t: SparseTensor) -> SparseTensor:
    """CSR <-> CSC, BSR <-> BSC over the same blocks: a counting sort of the structure.
    Each output segment lists its plain indices in ascending order; index dtype kept."""
    nb = t.batch_ndim
    br, bc = _block(t)
    rows, cols = t.dense_shape[nb], t.dense_shape[nb + 1]
    n_plain = cols // bc if t.layout in ROW_MAJOR else rows // br
    ci, pi = _indices_2d(t)
    ci_out, pi_out, perm = ck.transpose(ci, pi, n_plain)
    entries = t.values.reshape(ci.shape[0] * pi.shape[1], *t.values.shape[nb + 1:])
    return _compressed(TRANSPOSED[t.layout], ci_out, pi_out, gather_rows(entries, perm), t.dense_shape,
                       t.dense_shape[:nb], t.blocksize)


def _row_major(t: SparseTensor) -> tuple[SparseTensor, bool]:
    """(t as CSR/BSR, whether a transposition was needed)."""
    return (t, False) if t.layout in ROW_MAJOR else (transpose_compressed(t), True)


# ------------------------------------------------------------------ -> COO
def _sorted_coo(t: SparseTensor) -> SparseTensor:
    """Compressed -> COO in row-major order (batch dims leading); coalesced when no segment
    repeats a plain index. Every element of a stored block is stored."""
    r, transposed = _row_major(t)
    nb = r.batch_ndim
    block = _block(r)
    ci, pi = _indices_2d(r)
    indices, src, unique = ck.expand(ci, pi, r.dense_shape[:nb], block)
    dense = _dense_dims(r)
    elements = r.values.reshape(src.size, *dense)
    if block == (1, 1) and not transposed:
        values = elements  # a CSR's entries expand in storage order: no gather
    else:
        values = gather_rows(elements, src)
    return _coo(indices, values, r.dense_shape, unique)


def as_coo(t: SparseTensor) -> SparseTensor:
    """Any sparse layout -> COO over the same dense_shape (batch dimensions of a compressed
    tensor become leading sparse dimensions; its dense dimensions stay dense)."""
    return t if t.layout == "coo" else _sorted_coo(t)


def _coalesced(t: SparseTensor) -> SparseTensor:
    """A COO tensor sorted row-major with unique indices (duplicates summed)."""
    indices, values = frozen(np.ascontiguousarray(t.indices)), frozen(np.ascontiguousarray(t.values))
    if indices.shape[0] > 1:
        position, _ = kernels.first_disorder(indices, t.dense_shape)
        if position >= 0:
            indices, values = kernels.coalesce(indices, values, t.dense_shape)
    return _coo(indices, values, t.dense_shape, True)


def coalesced_coo(t: SparseTensor) -> SparseTensor:
    """Any sparse layout -> COO, sorted row-major, repeated indices summed."""
    coo = as_coo(t)
    return coo if coo.coalesced and coo is not t else _coalesced(coo)


# ------------------------------------------------------------------ COO -> compressed
def _compress(coo: SparseTensor) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ptr, plain, indices, values) of a COO tensor (>= 2 sparse dims) sorted row-major
    with duplicates summed; the input's arrays are reused when already in that order."""
    shape = np.asarray(coo.dense_shape[:coo.indices.shape[1]], np.int64)
    indices, values = coo.indices, coo.values
    ptr, plain, flag = ck.compress_sorted(indices, shape, 1, with_plain=True)
    if flag != ck.STRICT:
        indices, values = kernels.coalesce(frozen(np.ascontiguousarray(indices)),
                                           frozen(np.ascontiguousarray(values)), coo.dense_shape)
        ptr, plain, _ = ck.compress_sorted(indices, shape, 1, with_plain=True)
    return ptr, plain, indices, values


def _to_csr(coo: SparseTensor, index) -> SparseTensor:
    s = coo.indices.shape[1]
    ptr, plain, _, values = _compress(coo)
    n_batch = int(np.prod(coo.dense_shape[:s - 2], dtype=np.int64))
    rows, cols = coo.dense_shape[s - 2], coo.dense_shape[s - 1]
    ci = _batch_pointers(ptr, n_batch, rows, "stored entries")
    dtype = index_dtype(index, plain.size, cols)
    plain = plain.reshape(n_batch, plain.size // n_batch if n_batch else 0)
    return _compressed("csr", ci.astype(dtype, copy=False), plain.astype(dtype, copy=False),
                       values, coo.dense_shape, coo.dense_shape[:s - 2])


def _to_bsr(coo: SparseTensor, blocksize, index) -> SparseTensor:
    """Coalesced COO -> BSR: a block is stored when any of its elements is; the others
    in it are zero."""
    s = coo.indices.shape[1]
    br, bc = (int(b) for b in blocksize)
    shape = np.asarray(coo.dense_shape[:s], np.int64)
    block_ptr, block_pi, dest = ck.blockify(coo.indices, shape, (br, bc))
    n_batch = int(np.prod(coo.dense_shape[:s - 2], dtype=np.int64))
    ci = _batch_pointers(block_ptr, n_batch, coo.dense_shape[s - 2] // br, "stored blocks")
    dense = tuple(coo.dense_shape[s:])
    inner = int(np.prod(dense, dtype=np.int64))
    n_blocks = block_pi.size
    values = ck.scatter_rows(coo.values.reshape(dest.size, inner), dest, n_blocks * br * bc)
    dtype = index_dtype(index, n_blocks, coo.dense_shape[s - 1] // bc)
    return _compressed("bsr", ci.astype(dtype, copy=False),
                       block_pi.reshape(n_batch, n_blocks // n_batch if n_batch else 0).astype(dtype, copy=False),
                       values.reshape(n_blocks, br, bc, *dense), coo.dense_shape, coo.dense_shape[:s - 2],
                       (br, bc))


def as_csr(t: SparseTensor) -> SparseTensor:
    """A tensor with exactly two sparse dimensions and no batch -> CSR with int64 indices,
    rows in order and columns ascending within each row (duplicates kept, not summed)."""
    if t.layout == "csr":
        return t
    if t.layout == "csc" and t.batch_ndim == 0:
        out = transpose_compressed(t)  # a stable counting sort: columns ascend within rows
        return SparseTensor(layout="csr", compressed_indices=out.compressed_indices.astype(np.int64),
                            plain_indices=out.plain_indices.astype(np.int64), values=out.values,
                            dense_shape=t.dense_shape)
    coo = as_coo(t)
    if coo.indices.shape[1] != 2:
        raise ValueError(f"as_csr needs two sparse dimensions, not {coo.indices.shape[1]}")
    shape = np.asarray(coo.dense_shape[:2], np.int64)
    indices, values = coo.indices, coo.values
    ptr, plain, flag = ck.compress_sorted(indices, shape, 1, with_plain=True)
    if flag != ck.STRICT:  # order the columns, keeping repeats (reorder is stable)
        indices, values = kernels.reorder(frozen(np.ascontiguousarray(indices)),
                                          frozen(np.ascontiguousarray(values)), coo.dense_shape)
        ptr, plain, _ = ck.compress_sorted(indices, shape, 1, with_plain=True)
    return SparseTensor(layout="csr", compressed_indices=ptr, plain_indices=plain, values=values,
                        dense_shape=coo.dense_shape)


# ------------------------------------------------------------------ dense dimensions
def _move_dense_dims(coo: SparseTensor, dense_dim: int) -> SparseTensor:
    """A coalesced COO with ``dense_dim`` trailing dense dimensions, the result coalesced.

    Fewer: every element of a stored value becomes a stored entry. More: entries that
    agree on the remaining sparse dimensions merge into one dense value (zeros where
    none was stored).
    """
    shape = coo.dense_shape
    s_old, s_new = coo.indices.shape[1], len(shape) - dense_dim
    if s_new == s_old:
        return coo
    nnz = coo.indices.shape[0]
    moved = tuple(shape[min(s_old, s_new):max(s_old, s_new)])
    m = int(np.prod(moved, dtype=np.int64))
    if s_new > s_old:
        tile = np.stack(np.unravel_index(np.arange(m), moved), axis=1) if m else np.zeros((0, len(moved)), np.int64)
        indices = np.concatenate([np.repeat(coo.indices, m, axis=0), np.tile(tile, (nnz, 1))], axis=1)
        values = np.ascontiguousarray(coo.values).reshape(nnz * m, *shape[s_new:])
        return _coo(indices.astype(np.int64, copy=False), values, shape, True)
    lead = coo.indices[:, :s_new]
    keys = np.ravel_multi_index(tuple(lead.T), shape[:s_new]) if nnz else np.zeros(0, np.int64)
    new_group = np.empty(nnz, bool)
    new_group[:1] = True
    np.not_equal(keys[1:], keys[:-1], out=new_group[1:])
    group = np.cumsum(new_group) - 1
    inner = int(np.prod(shape[s_old:], dtype=np.int64))
    within = np.ravel_multi_index(tuple(coo.indices[:, s_new:].T), moved) if nnz else np.zeros(0, np.int64)
    n_groups = int(new_group.sum())
    values = np.zeros((n_groups * m, inner), coo.values.dtype)
    values[group * m + within] = np.ascontiguousarray(coo.values).reshape(nnz, inner)
    return _coo(np.ascontiguousarray(lead[new_group]), values.reshape(n_groups, *shape[s_new:]), shape, True)


# ------------------------------------------------------------------ convert
def convert_layout(t: SparseTensor, layout: str, blocksize=None, dense_dim: int | None = None) -> SparseTensor:
    """``t`` in ``layout`` (arguments already checked by the op): COO output is coalesced
    unless a compressed input repeats a plain index in a segment; compressed outputs keep
    the input's compressed index dtype (int64 from COO, or where int32 cannot hold them)."""
    dense_now = t.dense_ndim
    dense_dim = dense_now if dense_dim is None else int(dense_dim)
    blocksize = tuple(int(b) for b in blocksize) if layout in BLOCK_LAYOUTS else None
    index = np.int64 if t.layout == "coo" else t.compressed_indices.dtype
    if dense_dim == dense_now and t.layout != "coo":
        same_blocks = blocksize is None or tuple(t.blocksize or ()) == blocksize
        if layout == t.layout and same_blocks:
            return t
        if layout == TRANSPOSED[t.layout] and same_blocks:
            return transpose_compressed(t)
        if layout == "coo":
            return as_coo(t)
    if dense_dim == dense_now and t.layout == "coo" and layout in ("csr", "csc"):
        csr = _to_csr(t, index)  # sums duplicates only when the input is not coalesced
        return csr if layout == "csr" else transpose_compressed(csr)
    coo = _move_dense_dims(coalesced_coo(t), dense_dim)
    if layout == "coo":
        return coo
    if layout in ("csr", "csc"):
        out = _to_csr(coo, index)
    else:
        out = _to_bsr(coo, blocksize, index)
    return out if layout in ROW_MAJOR else transpose_compressed(out)


# ------------------------------------------------------------------ ops on any layout
# Ops declared for every sparse layout use these. Value-only ops (with_values, map_values,
# mul/div by a dense operand, retain) work on the stored entries in storage order, so a
# compressed tensor keeps its structure; ops that move entries run on the COO view and
# convert back (``like``).
def coo_view(t: SparseTensor) -> SparseTensor:
    """``as_coo(t)`` with read-only arrays, as the wires' are (one numba signature per kernel)."""
    v = as_coo(t)
    if v is t:
        return t
    return SparseTensor(indices=frozen(v.indices), values=frozen(v.values), dense_shape=v.dense_shape,
                        coalesced=v.coalesced)


def view_sparse_ndim(t: SparseTensor) -> int:
    """Sparse dimensions of ``t``'s COO view (a compressed tensor's batch dims count)."""
    return t.sparse_ndim if t.layout == "coo" else t.batch_ndim + 2


def view_nnz(t: SparseTensor) -> int:
    """Entries of ``t``'s COO view: every element of a stored block is one."""
    if t.layout == "coo":
        return t.nnz
    br, bc = _block(t)
    return _n_batch(t) * t.nnz * br * bc


def _segments(t: SparseTensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(batch, segment, plain) int64 of each stored entry of a compressed tensor, in storage
    order. Validation guarantees each batch's compressed indices run from 0 to nse."""
    ci, pi = _indices_2d(t)
    n_batch, nse = pi.shape
    counts: np.ndarray = np.diff(ci.astype(np.int64, copy=False), axis=1)
    n_seg = counts.shape[1]
    segment = np.repeat(np.tile(np.arange(n_seg, dtype=np.int64), n_batch), counts.reshape(-1))
    batch = np.repeat(np.arange(n_batch, dtype=np.int64), nse)
    return batch, segment, pi.reshape(-1).astype(np.int64, copy=False)


def entry_indices(t: SparseTensor) -> np.ndarray:
    """int64 ``[view_nnz(t), view_sparse_ndim(t)]``: the full index of every stored element in
    the order of ``t.values`` (a COO tensor's own indices; for a compressed one batch, entry,
    then the element's place in its block)."""
    if t.layout == "coo":
        return t.indices
    nb = t.batch_ndim
    br, bc = _block(t)
    batch, segment, plain = _segments(t)
    major, minor = (segment, plain) if t.layout in ROW_MAJOR else (plain, segment)
    n = batch.size
    rows = (major[:, None, None] * br + np.arange(br)[None, :, None])
    cols = (minor[:, None, None] * bc + np.arange(bc)[None, None, :])
    out = np.empty((n, br, bc, nb + 2), np.int64)
    if nb:
        coords = np.unravel_index(batch, t.dense_shape[:nb])
        for j, c in enumerate(coords):
            out[..., j] = c[:, None, None]
    out[..., nb] = rows
    out[..., nb + 1] = cols
    return frozen(out.reshape(n * br * bc, nb + 2))


def entry_values(t: SparseTensor) -> np.ndarray:
    """``t.values`` as ``[view_nnz(t), *dense dims]``, in storage order (a view)."""
    if t.layout == "coo":
        return t.values
    return t.values.reshape(view_nnz(t), *_dense_dims(t))


def with_entry_values(t: SparseTensor, values: np.ndarray) -> SparseTensor:
    """``t``'s structure (indices, shape, blocksize, coalesced flag) with new values, given in
    ``t.values``'s shape or as ``[view_nnz(t), *dense dims]``."""
    if t.layout == "coo":
        return SparseTensor(indices=t.indices, values=values, dense_shape=t.dense_shape,
                            coalesced=t.coalesced)
    lead = t.values.shape[:t.values.ndim - t.dense_ndim]
    return SparseTensor(layout=t.layout, compressed_indices=t.compressed_indices,
                        plain_indices=t.plain_indices,
                        values=values.reshape(*lead, *values.shape[values.ndim - t.dense_ndim:]),
                        dense_shape=t.dense_shape, blocksize=t.blocksize, coalesced=t.coalesced)


def keep_entries(t: SparseTensor, keep: np.ndarray) -> SparseTensor:
    """A compressed tensor with only the stored entries (blocks) where ``keep`` ([*batch, nse]
    bool, storage order) is true, their order kept; layout, blocksize and index dtype kept.
    Raises ``BatchNseError`` when the batches would keep different numbers of entries."""
    n_batch, nse = _n_batch(t), t.nnz
    keep2 = np.asarray(keep, bool).reshape(n_batch, nse)
    kept = keep2.sum(axis=1)
    if kept.size > 1 and np.any(kept != kept[0]):
        raise BatchNseError(kept, "stored blocks" if t.layout in BLOCK_LAYOUTS else "stored entries")
    ci, pi = _indices_2d(t)
    n_seg = ci.shape[1] - 1
    batch, segment, _ = _segments(t)
    flat = keep2.reshape(-1)
    counts = np.bincount(batch[flat] * n_seg + segment[flat], minlength=n_batch * n_seg)
    ci_out = np.zeros((n_batch, n_seg + 1), ci.dtype)
    np.cumsum(counts.reshape(n_batch, n_seg), axis=1, out=ci_out[:, 1:])
    per_batch = int(kept[0]) if kept.size else 0
    pi_out = pi[keep2].reshape(n_batch, per_batch)
    values = t.values.reshape(n_batch * nse, *t.values.shape[t.batch_ndim + 1:])[flat]
    return _compressed(t.layout, ci_out, pi_out, values, t.dense_shape, t.dense_shape[:t.batch_ndim],
                       t.blocksize)


def first_noncanonical(t: SparseTensor) -> tuple[tuple[int, ...], bool] | None:
    """Where a compressed tensor is not canonical: the position in ``plain_indices`` of the
    first entry whose plain index does not exceed its predecessor's in the same segment, and
    whether it repeats it (else it is out of order). None when every segment strictly
    increases (sorted, unique: a coalesced tensor)."""
    if t.nnz < 2:
        return None
    batch, segment, plain = _segments(t)
    same = (segment[1:] == segment[:-1]) & (batch[1:] == batch[:-1])
    bad = same & (plain[1:] <= plain[:-1])
    if not bad.any():
        return None
    k = int(np.argmax(bad)) + 1
    position = tuple(int(i) for i in np.unravel_index(k, t.plain_indices.shape))
    return position, bool(plain[k] == plain[k - 1])


def sort_segments(t: SparseTensor) -> SparseTensor:
    """A compressed tensor with each segment's plain indices ascending, repeats kept in their
    order (two stable counting sorts); ``t`` itself when already so."""
    return transpose_compressed(transpose_compressed(t)) if _unsorted(t) else t


def _unsorted(t: SparseTensor) -> bool:
    batch, segment, plain = _segments(t)
    same = (segment[1:] == segment[:-1]) & (batch[1:] == batch[:-1])
    return bool((same & (plain[1:] < plain[:-1])).any())


def _cast_indices(t: SparseTensor, dtype) -> SparseTensor:
    dtype = index_dtype(dtype, t.nnz, *t.dense_shape[t.batch_ndim:t.batch_ndim + 2])
    if t.compressed_indices.dtype == dtype and t.plain_indices.dtype == dtype:
        return t
    return SparseTensor(layout=t.layout, compressed_indices=t.compressed_indices.astype(dtype),
                        plain_indices=t.plain_indices.astype(dtype), values=t.values,
                        dense_shape=t.dense_shape, blocksize=t.blocksize, coalesced=t.coalesced)


def like(coo: SparseTensor, t: SparseTensor) -> SparseTensor:
    """A COO result in the layout of the input ``t``: COO as it is; compressed with ``t``'s
    blocksize and index dtype (int64 where int32 cannot hold the result), as many leading
    batch dimensions as the result has sparse dimensions beyond two, and every dense dimension
    kept. Raises ``BatchNseError`` when its batches would hold different numbers of entries."""
    if t.layout == "coo":
        return coo
    out = convert_layout(coo, t.layout, t.blocksize)
    return _cast_indices(out, t.compressed_indices.dtype)
