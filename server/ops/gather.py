"""Gather ops after PyTorch: index_select (torch.index_select), sparse_mask (Tensor.sparse_mask)
and multiply (torch.mul with sparse operands).

PyTorch's answers are the reference, structure included: which entries, in which order, and
the coalesced flag. Where PyTorch has no kernel (index_select of CSR) the answer is PyTorch's
COO answer converted to CSR, as PyTorch converts it.

Each op's ``check`` makes its refusals from metadata (shapes, dtypes, layouts, ``dim``) before
any kernel, on every device; the kernels raise only what the entries decide: a value of
index_select's ``index`` out of range (the CPU kernel names it; the GPU kernel falls back),
batches a CSR result would leave unequal.
"""

from __future__ import annotations

import math
import threading
import weakref

import numpy as np

from sparseserve import kernels
from sparseserve.core.tensor import SparseTensor
from sparseserve.core.errors import InvalidArgumentError, UnimplementedError
from sparseserve.core.reasons import Reason
from sparseserve.kernels import elementwise as ek
from sparseserve.kernels import gather as gk
from sparseserve.kernels import gather_rows

from ..argtypes import DENSE, SPARSE, TENSOR, axis_of
from ..device import Fallback
from ..registry import REGISTRY, Arg, Output, Plan
from . import _gpu
from ._layouts import BatchNseError, as_coo, coalesced_coo, like, view_sparse_ndim
from ._sputils import index_dtype, layout_of, prod, shape_of, torch_result_type

# PyTorch picks the entry order of a sparse index_select from the sizes and from its thread
# count (at::get_num_threads()); the order followed here is the one it gives with this many.
TORCH_THREADS = 2
_GRAIN = 32768  # at::internal::GRAIN_SIZE
_BRUTE_FORCE = 2 << 14  # index_select_sparse_cpu's BRUTE_FORCE_SIZE_LIMIT

# Above this many result bytes estimated from the index alone, the result is counted exactly
# (one pass over the entries) before it is held to --max-result-bytes.
_EXACT_COUNT_BYTES = 64 << 20


def _coalesced(t: SparseTensor) -> bool:
    """PyTorch's is_coalesced(): the flag, and always true below two entries."""
    return bool(t.coalesced) or t.nnz < 2


def _in_layout_of(coo: SparseTensor, t: SparseTensor) -> SparseTensor:
    """A COO result in the layout of the input ``t`` (``like``: CSR as PyTorch's to_sparse_csr
    makes it, rows sorted and repeated entries summed, with ``t``'s index dtype where it holds
    the result)."""
    try:
        return like(coo, t)
    except BatchNseError as exc:  # where the entries fall decides it: the kernel's to say
        raise InvalidArgumentError(f"the result cannot be a batched CSR tensor: {exc}",
                                   reason=Reason.BATCH_NSE_MISMATCH) from None


# ------------------------------------------------------------------ index_select
def check_index_select(input: SparseTensor, dim: int, index: np.ndarray) -> Plan:
    """index is 1-D and integer (int32 or int64; an empty one of any dtype, as an empty JSON list
    decodes as float64); dim, an axis of input, is non-negative already. Its values are the
    kernels' to check (``_positions``)."""
    if index.ndim != 1:
        raise InvalidArgumentError(f"index has shape {shape_of(index)}; it must be 1-D",
                                   reason=Reason.INDICES_RANK)
    if index.dtype.kind not in "iu" and index.size:
        raise InvalidArgumentError(f"index has dtype {index.dtype}; it must be an integer type "
                                   "(int32 or int64)", reason=Reason.INDEX_DTYPE)
    shape = shape_of(input)
    shape[dim] = int(index.shape[0])
    return Plan(dtype=input.dtype, layout=input.layout, shape=tuple(shape))


def _positions(index: np.ndarray, size: int, dim: int) -> np.ndarray:
    """A checked ``index`` as non-negative int64 positions along a dimension of ``size``; a
    value outside ``[-size, size)`` (negative values count from the end, as in PyTorch) is
    INVALID_ARGUMENT naming it."""
    if index.dtype.kind not in "iu":  # empty (the check)
        return np.zeros(0, np.int64)
    if index.dtype.kind == "u":
        too_big = np.flatnonzero(index >= np.uint64(size)) if index.size else np.zeros(0, np.int64)
        if too_big.size:
            bad = int(too_big[0])
            raise _out_of_range(bad, int(index[bad]), size, dim)
        return index.astype(np.int64)
    index = np.ascontiguousarray(index, dtype=np.int64)
    bad = gk.first_out_of_range(index, size)
    if bad >= 0:
        raise _out_of_range(bad, int(index[bad]), size, dim)
    if index.size and index.min() < 0:
        index = np.where(index < 0, index + size, index)
    return index


def _out_of_range(position: int, value: int, size: int, dim: int) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"index[{position}] = {value} is out of range for input.dense_shape[{dim}] = {size}; index "
        f"values must be in [{-size}, {size})", reason=Reason.INDEX_OUT_OF_RANGE)


def _split(n: int) -> tuple[int, int]:
    """(threads, chunk length) of PyTorch's parallel loops over n items."""
    threads = max(1, min((n + _GRAIN - 1) // _GRAIN, TORCH_THREADS))
    return threads, (n + threads - 1) // threads


def _index_major(nnz: int, n_index: int, size: int, coalesced: bool, dim: int, copy_work) -> bool:
    """Whether PyTorch's index_select_sparse_cpu lists its result index-major (for each position of
    index in order, the matching entries in entry order) rather than entry-major (for each
    matching entry in order, the positions of index holding its coordinate): the choice of its
    brute-force, binary-search or counting algorithm and the loop order each one picks.
    ``copy_work(threads_index, chunk_index, threads_nnz, chunk_nnz)`` gives the counting
    algorithm's two largest per-thread copy counts."""
    if nnz <= _BRUTE_FORCE and n_index <= _BRUTE_FORCE and nnz * n_index <= _BRUTE_FORCE:
        return nnz >= n_index
    t_nnz, c_nnz = _split(nnz)
    t_index, c_index = _split(n_index)
    if nnz <= size:
        if nnz // t_nnz <= n_index // t_index:
            return True
        return bool(coalesced and dim == 0 and n_index * math.log2(nnz) / t_index
                    <= (nnz // t_nnz + n_index) * math.log2(n_index))
    index_max, dim_max = copy_work(t_index, c_index, t_nnz, c_nnz)
    return index_max * n_index // t_index <= dim_max * nnz // t_nnz


def _max_chunk_sum(weights: np.ndarray, chunk_of: np.ndarray, n_chunks: int) -> int:
    if weights.size == 0:
        return 0
    return int(np.bincount(chunk_of, weights=weights, minlength=n_chunks).max())


# The run pointer of a sorted column (the CSR row pointer, for dim 0 of a coalesced matrix),
# kept with the tensor it came from while that tensor lives: a held tensor (a handle, a
# bound argument) selected from again skips the pass over its whole column, about half of a
# cold call (5 of 12 ms for 100,000 rows of 10M entries). Only for read-only tensors (as
# every bound one is) and pointers under an eighth of the tensor's bytes. A kept pointer is
# never unsafe, even were the arrays to change under it: it only ever names entries in
# [0, nnz], in order.
_RUN_POINTERS: "weakref.WeakKeyDictionary[SparseTensor, dict[int, np.ndarray]]" = weakref.WeakKeyDictionary()
_RUN_POINTERS_LOCK = threading.Lock()


def _sorted_column_ptr(t: SparseTensor, dim: int, size: int) -> np.ndarray | None:
    """The run pointer of column ``dim`` (kept, or computed and kept), or None when the column
    decreases somewhere."""
    with _RUN_POINTERS_LOCK:
        kept = _RUN_POINTERS.get(t, {}).get(dim)
    if kept is not None:
        return kept
    ok, ptr = gk.sorted_column_ptr(t.indices, dim, size)
    if not ok:
        return None
    if ptr.nbytes * 8 <= t.nbytes and not any(a.flags.writeable for a in t.arrays()):
        ptr.flags.writeable = False
        with _RUN_POINTERS_LOCK:
            _RUN_POINTERS.setdefault(t, {})[dim] = ptr
    return ptr


def _index_select_coo(t: SparseTensor, dim: int, index: np.ndarray) -> SparseTensor:
    s = t.sparse_ndim
    shape = list(t.dense_shape)
    shape[dim] = int(index.size)
    if dim >= s:
        values = np.take(t.values, index, axis=dim - s + 1)
        return SparseTensor(indices=t.indices, values=values, dense_shape=shape, coalesced=t.nnz < 2)
    size = int(t.dense_shape[dim])
    if index.size == 0 or t.nnz == 0:
        return SparseTensor(indices=np.zeros((0, s), np.int64),
                            values=np.zeros((0, *t.values.shape[1:]), t.dtype), dense_shape=shape,
                            coalesced=True)
    work = t.nnz + int(index.size)
    if size <= max(gk.TABLE_MAX, 4 * work):
        # A column that never decreases (dim 0 of a coalesced tensor): each value's entries are
        # one run, found through a pointer array, and no entry outside the selected runs is read
        # again. The check stops near the first disorder, so other columns cost little.
        ptr = _sorted_column_ptr(t, dim, size)
        if ptr is not None:
            starts, out_start = gk.selected_runs(ptr, index)

            def run_work(t_index, c_index, t_nnz, c_nnz):
                return gk.runs_work(starts, out_start, (t_index, c_index), (t_nnz, c_nnz))

            if _index_major(t.nnz, int(index.size), size, _coalesced(t), dim, run_work):
                indices, values = gk.copy_runs(t.indices, t.values, dim, starts, out_start)
                return SparseTensor(indices=indices, values=values, dense_shape=shape,
                                    coalesced=values.shape[0] < 2)
    groups = gk.Groups(index, size, work)
    entries, grp = gk.match(t.indices, dim, groups)

    def copy_work(t_index, c_index, t_nnz, c_nnz):
        matches_per_group = np.bincount(grp, minlength=groups.n)
        per_position = matches_per_group[groups.pos_group]
        positions = np.arange(index.size) // c_index
        per_entry = groups.sizes[grp]
        return (_max_chunk_sum(per_position, positions, t_index),
                _max_chunk_sum(per_entry, entries // c_nnz, t_nnz))

    index_major = _index_major(t.nnz, int(index.size), size, _coalesced(t), dim, copy_work)
    indices, src = gk.build(t.indices, dim, entries, grp, groups, index_major)
    values = gather_rows(t.values, src)
    return SparseTensor(indices=indices, values=values, dense_shape=shape, coalesced=src.size < 2)


def _index_select_csr(t: SparseTensor, dim: int, index: np.ndarray) -> SparseTensor:
    if t.batch_ndim == 0 and dim == 0:
        ptr, plain, values, ordered = gk.csr_rows(t.compressed_indices, t.plain_indices, t.values, index)
        if ordered:  # each row already as to_sparse_csr leaves it: copied as it is
            dtype = index_dtype(t.compressed_indices.dtype, plain.size)
            shape = list(t.dense_shape)
            shape[0] = int(index.size)
            return SparseTensor(layout="csr", compressed_indices=ptr.astype(dtype, copy=False),
                                plain_indices=plain.astype(dtype, copy=False),
                                values=values, dense_shape=shape)
    return _in_layout_of(_index_select_coo(as_coo(t), dim, index), t)


def _index_select_bytes(input, dim, index, **_) -> int:
    try:
        index = _positions(index, int(input.dense_shape[dim]), dim)
    except InvalidArgumentError:
        return 0  # a value out of range: the kernel names it
    itemsize = input.dtype.itemsize
    shape = list(input.dense_shape)
    n = int(index.size)
    if input.layout == "csr":
        inner = prod(shape[input.batch_ndim + 2:])
        if input.batch_ndim == 0 and dim == 0:
            ptr = input.compressed_indices.astype(np.int64)
            nnz = int((ptr[index + 1] - ptr[index]).sum())
            return nnz * (inner * itemsize + 8) + 8 * (n + 1)
        s, nnz = input.batch_ndim + 2, input.nnz * prod(shape[:input.batch_ndim])
    else:
        s, nnz = input.sparse_ndim, input.nnz
        inner = prod(shape[s:])
    if dim >= s:
        return nnz * (8 * s + prod(shape[s:dim] + [n] + shape[dim + 1:]) * itemsize)
    entry = 8 * s + inner * itemsize
    if n == 0 or nnz == 0:
        return 0
    most = int(np.unique(index, return_counts=True)[1].max())
    bound = nnz * most * entry
    if bound <= _EXACT_COUNT_BYTES or input.layout != "coo":
        return bound
    groups = gk.Groups(index, int(shape[dim]), nnz + n)
    return gk.count_selected(input.indices, dim, groups) * entry


@REGISTRY.op(
    "index_select",
    doc="""Selects slices of input along dim at the positions in index (torch.index_select).
Dimension dim of the result has len(index) positions; position i holds slice index[i] of input.
index is a 1-D integer tensor (int32 or int64); values may repeat and may be negative (counting
from the end, in [-size, size)); anything else is INVALID_ARGUMENT. dim may be negative.
COO (hybrid too): dim a dense dimension selects inside the values and keeps the indices; dim a
sparse dimension keeps the entries whose coordinate is in index, once per position holding it,
renumbered to that position, in PyTorch's order: index-major (for each position of index, the
matching entries in input order) or entry-major (for each matching entry in input order, the
positions holding its coordinate, ascending), whichever PyTorch's index_select_sparse_cpu picks
for these sizes (it chooses between brute force, binary search and counting; see TORCH_THREADS).
Repeated input entries stay repeated, and the result is flagged coalesced only when it has fewer
than two entries (as PyTorch flags it).
CSR (PyTorch has none): the COO answer converted to CSR as PyTorch's to_sparse_csr converts it
(rows sorted, repeated entries summed); the index dtype is kept where it holds the result.""",
    args=[Arg("input", SPARSE, "The sparse tensor (COO or CSR).", layouts=("coo", "csr")),
          Arg("dim", axis_of("input"), "The dimension to select along (negative counts from the end)."),
          Arg("index", DENSE, "1-D integer positions along dim.", layouts=("dense",))],
    outputs=[Output("output", "sparse", "The selected slices, same layout as input.")],
    check=check_index_select,
    result_bytes=_index_select_bytes,
)
def index_select(input: SparseTensor, dim: int, index: np.ndarray) -> SparseTensor:
    index = _positions(index, int(input.dense_shape[dim]), dim)
    if input.layout == "csr":
        return _index_select_csr(input, dim, index)
    return _index_select_coo(input, dim, index)


# index_select on the GPU (COO, every dtype CuPy holds): the entries matching index found by a
# binary search of their coordinate among index's sorted values, then listed in PyTorch's order
# by stable sorts and repeats; the same order rule as the CPU. CSR runs on the CPU, as does an
# index holding a value out of range (the CPU kernel names it).
def _expand_ranges(xp, starts, counts):
    """``concatenate([arange(s, s + c) for s, c in zip(starts, counts)])`` without a loop."""
    total = int(counts.sum()) if counts.size else 0
    if total == 0:
        return xp.zeros(0, xp.int64)
    offsets = xp.cumsum(counts) - counts
    owner = xp.repeat(xp.arange(counts.size), counts)
    return starts[owner] + (xp.arange(total) - offsets[owner])


@REGISTRY.gpu("index_select", layouts={"input": ("coo",)})
@_gpu.quiet
def index_select_gpu(be, input: SparseTensor, dim: int, index) -> SparseTensor:
    xp = be.xp
    size = int(input.dense_shape[dim])
    index = xp.asarray(index)
    if index.size and (int(index.min()) < -size or int(index.max()) >= size):
        raise Fallback("index_out_of_range")  # before the cast: a huge uint64 would wrap into range
    index = index.astype(xp.int64)
    index = xp.where(index < 0, index + size, index)
    s = input.sparse_ndim
    shape = list(input.dense_shape)
    n = int(index.shape[0])
    shape[dim] = n
    if dim >= s:
        values = xp.take(input.values, index, axis=dim - s + 1)
        return _gpu.coo(shape, input.indices, values, coalesced=input.nnz < 2)
    nnz = input.nnz
    if n == 0 or nnz == 0:
        return _gpu.coo(shape, xp.zeros((0, s), xp.int64), xp.zeros((0, *input.values.shape[1:]), input.dtype),
                        coalesced=True)
    col = input.indices[:, dim]
    order = xp.argsort(index, kind="stable")
    sorted_index = index[order]
    lo = xp.searchsorted(sorted_index, col, side="left")
    per_entry = xp.searchsorted(sorted_index, col, side="right") - lo  # positions holding its coordinate
    entries = xp.flatnonzero(per_entry > 0)
    entry_cols = col[entries]
    by_value = entries[xp.argsort(entry_cols, kind="stable")]  # matches grouped by coordinate, input order
    sorted_cols = col[by_value]
    first = xp.searchsorted(sorted_cols, index, side="left")
    per_position = xp.searchsorted(sorted_cols, index, side="right") - first  # matches of each position

    def copy_work(t_index, c_index, t_nnz, c_nnz):
        pos_chunk = xp.arange(n) // c_index
        index_max = int(xp.bincount(pos_chunk, weights=per_position, minlength=t_index).max())
        dim_max = int(xp.bincount(entries // c_nnz, weights=per_entry[entries], minlength=t_nnz).max()) \
            if entries.size else 0
        return index_max, dim_max

    if _index_major(nnz, n, size, _coalesced(input), dim, copy_work):
        src = by_value[_expand_ranges(xp, first, per_position)]
        out_dim = xp.repeat(xp.arange(n), per_position)
    else:
        counts = per_entry[entries]
        src = xp.repeat(entries, counts)
        out_dim = order[_expand_ranges(xp, lo[entries], counts)]
    indices = input.indices[src]
    indices[:, dim] = out_dim
    values = input.values[src]
    return _gpu.coo(shape, indices, values, coalesced=int(src.shape[0]) < 2)


# ------------------------------------------------------------------ sparse_mask
def check_sparse_mask(input: np.ndarray, mask: SparseTensor) -> Plan:
    if shape_of(input) != shape_of(mask):
        raise InvalidArgumentError(
            f"input has shape {shape_of(input)} and mask has dense_shape {shape_of(mask)}; "
            "sparse_mask needs equal shapes (no broadcasting)", reason=Reason.SHAPE_MISMATCH)
    return Plan(dtype=input.dtype, layout=mask.layout, shape=mask.dense_shape)


def _sparse_mask_bytes(input, mask, **_) -> int:
    return mask.nbytes - mask.values.nbytes + mask.values.size * input.dtype.itemsize


@REGISTRY.op(
    "sparse_mask",
    doc="""The values of a dense tensor at the entries of a sparse mask (Tensor.sparse_mask).
input and mask must have the same shape. The result has mask's layout and structure (COO: its
indices in their order, repeats kept, its coalesced flag; CSR: its compressed and plain indices;
hybrid masks: whole dense blocks of input) and input's dtype; mask's values are ignored.""",
    args=[Arg("input", DENSE, "The dense tensor to read.", layouts=("dense",)),
          Arg("mask", SPARSE, "The sparse tensor whose entries are read (COO or CSR).",
              layouts=("coo", "csr"))],
    outputs=[Output("output", "sparse", "mask's structure with input's values.")],
    check=check_sparse_mask,
    result_bytes=_sparse_mask_bytes,
)
def sparse_mask(input: np.ndarray, mask: SparseTensor) -> SparseTensor:
    if mask.layout == "coo":
        values = ek.gather_operand(mask.indices, input, input.ndim)
        return SparseTensor(indices=mask.indices, values=values, dense_shape=mask.dense_shape,
                            coalesced=mask.coalesced or mask.nnz < 2)
    coo = as_coo(mask)  # a CSR's entries expand in storage order
    values = ek.gather_operand(coo.indices, input, input.ndim).reshape(
        *mask.values.shape[:mask.batch_ndim + 1], *values_dense_shape(mask))
    return SparseTensor(layout="csr", compressed_indices=mask.compressed_indices,
                        plain_indices=mask.plain_indices, values=values, dense_shape=mask.dense_shape)


def values_dense_shape(t: SparseTensor) -> tuple[int, ...]:
    return tuple(t.dense_shape[len(t.dense_shape) - t.dense_ndim:])


# ------------------------------------------------------------------ multiply
def _times(x: np.ndarray, y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    with np.errstate(all="ignore"):
        x, y = np.asarray(x).astype(dtype, copy=False), np.asarray(y).astype(dtype, copy=False)
        if dtype == np.bool_:
            return np.logical_and(x, y)
        return np.multiply(x, y)


def _broadcast(a_shape, b_shape) -> tuple[int, ...]:
    """The shape two (checked) shapes broadcast to."""
    return tuple(int(d) for d in np.broadcast_shapes(tuple(a_shape), tuple(b_shape)))


def _check_broadcast(a_shape, b_shape, a_name: str, b_name: str) -> tuple[int, ...]:
    try:
        return _broadcast(a_shape, b_shape)
    except ValueError:
        raise InvalidArgumentError(f"{a_name} has shape {list(a_shape)} and {b_name} has shape "
                                   f"{list(b_shape)}, which do not broadcast", reason=Reason.SHAPE_MISMATCH) from None


def _check_sparse_pair(a: SparseTensor, b: SparseTensor) -> tuple[int, ...]:
    """sparse * sparse (a CSR as its COO form): equal ranks, sparse dimensions and sparse shapes,
    dense dimensions that broadcast; the result's shape."""
    s_a, s_b = view_sparse_ndim(a), view_sparse_ndim(b)
    same_structure = a.ndim == b.ndim and s_a == s_b and list(a.dense_shape[:s_a]) == list(b.dense_shape[:s_b])
    if not same_structure:
        raise InvalidArgumentError(
            f"a (dense_shape {list(a.dense_shape)}, {s_a} sparse dimensions) and b (dense_shape "
            f"{list(b.dense_shape)}, {s_b} sparse dimensions): sparse * sparse needs equal "
            "ranks, equal sparse dimensions, and broadcasts only over dense dimensions",
            reason=Reason.SHAPE_MISMATCH)
    return _check_broadcast(a.dense_shape, b.dense_shape, "a", "b")


def _check_sparse_dense(s: SparseTensor, d: np.ndarray) -> tuple[int, ...]:
    """sparse * dense in either order: the dense broadcasts against the whole shape (a COO
    operand's shape may grow; a CSR operand's may not); the result's shape."""
    if s.layout != "csr":
        return _check_broadcast(d.shape, s.dense_shape, "the dense operand", "the sparse operand")
    shape = _check_broadcast(d.shape, s.dense_shape, "the dense operand", "the CSR operand")
    if list(shape) != list(s.dense_shape):
        raise InvalidArgumentError(
            f"the dense operand's shape {shape_of(d)} would enlarge the CSR operand's dense_shape "
            f"{list(s.dense_shape)}; CSR * dense broadcasts only the dense side", reason=Reason.SHAPE_MISMATCH)
    return shape


def _coalesce(t: SparseTensor) -> SparseTensor:
    return t if _coalesced(t) else coalesced_coo(t)


def _empty(shape, sparse_dim: int, dtype) -> SparseTensor:
    return SparseTensor(indices=np.zeros((0, sparse_dim), np.int64),
                        values=np.zeros((0, *shape[sparse_dim:]), dtype), dense_shape=list(shape),
                        coalesced=True)


def _mul_dense_coo(d: np.ndarray, s: SparseTensor, dtype: np.dtype) -> SparseTensor:
    """PyTorch's intersection_binary_op_sparse_dense_out: the sparse operand's entries times the
    dense operand broadcast; a dense of higher rank adds leading sparse dimensions."""
    res_shape = _broadcast(d.shape, s.dense_shape)
    dense_dim = s.dense_ndim
    if s.nnz == 0 or prod(s.dense_shape) == 0 or d.size == 0:
        return _empty(res_shape, len(res_shape) - dense_dim, dtype)
    d_dim, s_dim = d.ndim, s.ndim
    if d_dim > s_dim:
        s = _coalesce(s)
    sparse_dim = s.sparse_ndim
    if d_dim <= dense_dim:
        return SparseTensor(indices=s.indices, values=_times(d, s.values, dtype), dense_shape=res_shape,
                            coalesced=_coalesced(s))
    n_sparse_d = d_dim - dense_dim  # dimensions of d over sparse dimensions of s
    d_expanded = np.broadcast_to(d, res_shape[len(res_shape) - d_dim:])
    s_start = max(0, s_dim - d_dim)
    n_inter = min(sparse_dim, n_sparse_d)
    lead = d_dim - s_dim if d_dim > s_dim else 0
    key = (slice(None),) * lead + tuple(s.indices[:, s_start + i] for i in range(n_inter))
    d_filtered = d_expanded[key]  # [*batch, nnz, *dense]
    values = _times(d_filtered, s.values, dtype)
    if s_dim >= d_dim:
        return SparseTensor(indices=s.indices, values=values, dense_shape=res_shape,
                            coalesced=_coalesced(s))
    batch = d.shape[:lead]
    n_batch = prod(batch)
    nnz = s.nnz
    batch_idx = np.stack(np.unravel_index(np.arange(n_batch), batch), axis=1) if n_batch else \
        np.zeros((0, lead), np.int64)
    indices = np.concatenate([np.repeat(batch_idx, nnz, axis=0).astype(np.int64),
                              np.tile(s.indices, (n_batch, 1))], axis=1)
    values = values.reshape(n_batch * nnz, *values.shape[lead + 1:])
    return SparseTensor(indices=indices, values=values, dense_shape=res_shape, coalesced=True)


def _keys(indices: np.ndarray, shape) -> np.ndarray:
    return kernels.linearize(np.ascontiguousarray(indices), np.asarray(shape, np.int64))


def _mul_merge(a: SparseTensor, b: SparseTensor, dtype: np.dtype) -> SparseTensor:
    """Both coalesced, equal shapes: the entries present in both, sorted (mul_out_sparse_cpu)."""
    s = b.sparse_ndim
    shape = list(b.dense_shape[:s])
    _, ia, ib = np.intersect1d(_keys(a.indices, shape), _keys(b.indices, shape), assume_unique=True,
                               return_indices=True)
    values = _times(gather_rows(a.values, ia), gather_rows(b.values, ib), dtype)
    return SparseTensor(indices=b.indices[ib], values=values, dense_shape=b.dense_shape, coalesced=True)


def _mul_intersection(x: SparseTensor, y: SparseTensor, dtype: np.dtype) -> SparseTensor:
    """PyTorch's sparse_binary_op_intersection: every entry of one operand (the source) times the
    sum of the other's entries at its index (zero where it has none)."""
    if _coalesced(x) != _coalesced(y):
        pc, source = (x, y) if _coalesced(x) else (y, x)
    else:
        larger, source = (x, y) if x.nnz >= y.nnz else (y, x)
        cells = prod(larger.dense_shape[:larger.sparse_ndim])
        if cells and larger.nnz // cells > 50:
            larger = _coalesce(larger)
        pc = larger
    shape = _broadcast(x.dense_shape, y.dense_shape)
    s = source.sparse_ndim
    pc_keys = _keys(pc.indices, shape[:s])
    order = np.argsort(pc_keys, kind="stable")
    sorted_keys = pc_keys[order]
    pc_values = gather_rows(pc.values, order).astype(dtype, copy=False)
    if sorted_keys.size:
        first = np.ones(sorted_keys.size, bool)
        np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=first[1:])
        starts = np.flatnonzero(first)
        uniq = sorted_keys[starts]
        if dtype == np.bool_:
            sums = np.logical_or.reduceat(pc_values, starts, axis=0)
        else:
            with np.errstate(all="ignore"):
                sums = np.add.reduceat(pc_values, starts, axis=0)
    else:
        uniq = sorted_keys
        sums = pc_values
    src_keys = _keys(source.indices, shape[:s])
    at = np.searchsorted(uniq, src_keys)
    found = np.zeros(src_keys.size, bool)
    inside = at < uniq.size
    found[inside] = uniq[at[inside]] == src_keys[inside]
    matched = np.zeros((src_keys.size, *sums.shape[1:]), dtype)
    matched[found] = sums[at[found]]
    values = _times(source.values, matched, dtype)
    return SparseTensor(indices=source.indices, values=values, dense_shape=shape,
                        coalesced=_coalesced(source))


def _mul_coo_coo(a: SparseTensor, b: SparseTensor, dtype: np.dtype) -> SparseTensor:
    shape = _broadcast(a.dense_shape, b.dense_shape)
    if a.nnz == 0 or b.nnz == 0:
        # torch answers an empty operand with an empty product (and crashes where dense dimensions
        # broadcast against an empty one: 2.13's setStorage error); the same answer here.
        return _empty(shape, a.sparse_ndim, dtype)
    if list(a.dense_shape) == list(b.dense_shape) and _coalesced(a) and _coalesced(b):
        return _mul_merge(a, b, dtype)
    return _mul_intersection(a, b, dtype)


def _mul_csr_dense(c: SparseTensor, d: np.ndarray, dtype: np.dtype) -> SparseTensor:
    """CSR times dense: the CSR's structure, its values times the dense at each entry (a 0-dim
    dense scales every value; any other broadcasts to the CSR's shape: the check)."""
    if d.ndim == 0:
        values = _times(c.values, d, dtype)
    else:
        coo = as_coo(c)  # a CSR's entries expand in storage order
        operand = ek.gather_operand(coo.indices, d, c.ndim)
        values = _times(coo.values, operand, dtype).reshape(c.values.shape)
    return SparseTensor(layout="csr", compressed_indices=c.compressed_indices, plain_indices=c.plain_indices,
                        values=values, dense_shape=c.dense_shape)


def check_multiply(a, b) -> Plan:
    """At least one operand sparse, shapes that multiply (``_check_sparse_pair``,
    ``_check_sparse_dense``); the result dtype (torch's promotion, the kernels' ``dtype``)."""
    a_sparse, b_sparse = isinstance(a, SparseTensor), isinstance(b, SparseTensor)
    if not a_sparse and not b_sparse:
        raise UnimplementedError("multiply needs at least one sparse operand; for dense * dense use a "
                                 "dense library", reason=Reason.UNSUPPORTED_LAYOUT)
    if a_sparse and b_sparse:
        shape = _check_sparse_pair(a, b)
    else:
        shape = _check_sparse_dense(*((a, b) if a_sparse else (b, a)))
    dtype = torch_result_type(a, b)
    layout = "csr" if "csr" in (layout_of(a), layout_of(b)) else "coo"
    return Plan(args={"dtype": dtype}, dtype=dtype, layout=layout, shape=shape)


def _multiply_bytes(a, b, dtype: np.dtype, **_) -> int:
    sparse = [t for t in (a, b) if isinstance(t, SparseTensor)]
    dense = [t for t in (a, b) if not isinstance(t, SparseTensor)]
    shape = _broadcast(shape_of(a), shape_of(b))
    nnz = max(t.nnz * prod(t.dense_shape[:t.batch_ndim]) if t.layout != "coo" else t.nnz for t in sparse)
    if dense and len(shape) > sparse[0].ndim:
        nnz *= prod(shape[:len(shape) - sparse[0].ndim])
    s = len(shape) - sparse[0].dense_ndim
    return nnz * (8 * s + prod(shape[s:]) * dtype.itemsize)


@REGISTRY.op(
    "multiply",
    doc="""The element-wise product of two tensors, at least one sparse (torch.mul), in either order.
dtype: torch's type promotion (float16 * int64 is float16; a 0-dim dense operand counts as a
scalar: int32 * 0-dim float64 is float64 but float32 * 0-dim float64 is float32).
COO * dense (either order): the sparse operand's indices (order and repeats kept) with its values
times the dense broadcast against the whole shape (numpy rules; implicit zeros stay implicit
even against inf/nan). A dense of higher rank than the sparse adds leading sparse dimensions:
the sparse operand is coalesced and repeated for each of them (coalesced result).
COO * COO: equal ranks, sparse dimensions and sparse shapes (dense dimensions broadcast). Both
coalesced and equal shapes: the intersection, coalesced. Otherwise PyTorch's intersection
kernel: every entry of one operand (the uncoalesced one when only one is, else the one with
fewer entries) times the sum of the other's entries at its index, zero where it has none (an
explicit zero is kept), in that operand's order.
CSR operands: CSR * dense keeps the CSR's structure (the dense broadcasts to its shape); CSR *
CSR and CSR * COO (either order) are the COO product of the coalesced operands converted to CSR.""",
    args=[Arg("a", TENSOR, "First operand (COO, CSR or dense).", layouts=("coo", "csr", "dense")),
          Arg("b", TENSOR, "Second operand (COO, CSR or dense).", layouts=("coo", "csr", "dense"))],
    outputs=[Output("output", "sparse", "The product: CSR when an operand is CSR, else COO.")],
    check=check_multiply,
    result_bytes=_multiply_bytes,
)
def multiply(a, b, dtype: np.dtype):
    a_sparse, b_sparse = isinstance(a, SparseTensor), isinstance(b, SparseTensor)
    if a_sparse and b_sparse:
        if a.layout == "coo" and b.layout == "coo":
            return _mul_coo_coo(a, b, dtype)
        csr = a if a.layout == "csr" else b  # its index dtype, where it holds the product
        return _in_layout_of(_mul_coo_coo(coalesced_coo(a), coalesced_coo(b), dtype), csr)
    s, d = (a, b) if a_sparse else (b, a)
    if s.layout == "csr":
        return _mul_csr_dense(s, d, dtype)
    return _mul_dense_coo(d, s, dtype)
