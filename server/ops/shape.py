"""Shape ops: transpose, reshape, slice (tf.sparse.transpose, tf.sparse.reshape, tf.sparse.slice).

Every sparse layout is accepted (dense input is UNIMPLEMENTED). COO is the working form: a compressed input goes
through ``as_coo`` (its batch dimensions become leading sparse dimensions, its
dense dimensions stay dense) and the result is COO in row-major order, since a
compressed tensor has no entry order of its own. The exception is transpose
of a compressed tensor that keeps its batch dimensions in place: CSR of A is
CSC of A^T over the same arrays (BSR/BSC likewise, with each block
transposed), so the layout name changes and no index moves.

Hybrid tensors (TensorFlow has none): the dense dimensions are never mixed
with the sparse ones. transpose may permute the sparse dimensions among
themselves and the dense ones among themselves; reshape reshapes the sparse
dimensions and keeps the dense ones; slice slices both.

Everything a kernel relies on is checked here first: permutations are
permutations, old and new shapes hold the same number of positions and every
shape fits int64, slice boxes are clipped to the dense shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparseserve.core.tensor import BLOCK_LAYOUTS, SparseTensor
from sparseserve.core.validate import INT64_MAX, check_shape
from sparseserve.core.errors import InvalidArgumentError
from sparseserve.core.reasons import Reason
from sparseserve import kernels
from sparseserve.kernels import arrays as ka
from sparseserve.kernels import shape as shk
from sparseserve.kernels._sort import gather_rows

from ..argtypes import INT_LIST, SPARSE
from ..partition import Shuffle
from ..registry import REGISTRY, Arg, Output
from . import _gpu
from ._layouts import SPARSE_LAYOUTS, as_coo

SP_INPUT = Arg("sp_input", SPARSE, "The input sparse tensor (any sparse layout).", layouts=SPARSE_LAYOUTS)

_SWAPPED = {"csr": "csc", "csc": "csr", "bsr": "bsc", "bsc": "bsr"}


def _prod(dims) -> int:
    out = 1
    for d in dims:
        out *= int(d)
    return out


def _coo_sparse_ndim(t: SparseTensor) -> int:
    """Sparse dimensions of the tensor's COO form (a compressed tensor's batch dims count)."""
    return t.sparse_ndim + t.batch_ndim


def _coo_nnz(t: SparseTensor) -> int:
    """Entries of the tensor's COO form: a compressed tensor's blocks expand to their elements."""
    if t.layout == "coo":
        return t.nnz
    block = _prod(t.blocksize) if t.layout in BLOCK_LAYOUTS else 1
    return _prod(t.dense_shape[:t.batch_ndim]) * t.nnz * block


def _coo_bytes(t: SparseTensor, sparse_ndim: int, dense_dims) -> int:
    nnz = _coo_nnz(t)
    return nnz * (8 * sparse_ndim + _prod(dense_dims) * t.dtype.itemsize)


def _row_major(t: SparseTensor, source: SparseTensor) -> SparseTensor:
    """A COO result of a compressed ``source`` in row-major order (stable, duplicates kept);
    a COO source's results keep its entry order, as TensorFlow's do."""
    if source.layout == "coo":
        return t
    indices, values = kernels.reorder(t.indices, t.values, t.dense_shape)
    return SparseTensor(indices=indices, values=values, dense_shape=t.dense_shape, coalesced=False)


# -------------------------------------------------------------------- transpose
@dataclass
class _TransposePlan:
    perm: tuple[int, ...]
    sparse_ndim: int  # of the COO form
    out_shape: tuple[int, ...]


def _transpose_plan(sp_input: SparseTensor, perm: list[int] | None) -> _TransposePlan:
    rank = sp_input.ndim
    if perm is None:
        perm = list(range(rank - 1, -1, -1))
    if len(perm) != rank or sorted(perm) != list(range(rank)):
        raise InvalidArgumentError(
            f"perm = {list(perm)} is not a permutation of [0, {rank}), the dimensions of sp_input "
            f"(rank {rank})", reason=Reason.BAD_PERMUTATION)
    s = _coo_sparse_ndim(sp_input)
    if sorted(perm[:s]) != list(range(s)):
        raise InvalidArgumentError(
            f"perm = {list(perm)} moves a dense dimension of sp_input into the sparse ones: sp_input "
            f"has {s} sparse dimensions (dense_shape {list(sp_input.dense_shape)}), and perm[:{s}] "
            f"must be a permutation of [0, {s}); dense dimensions permute only among themselves",
            reason=Reason.PERM_MIXES_SPARSE_AND_DENSE)
    out_shape = tuple(sp_input.dense_shape[p] for p in perm)
    return _TransposePlan(tuple(perm), s, out_shape)


def _transpose_bytes(sp_input, perm=None, **_) -> int:
    plan = _transpose_plan(sp_input, perm)
    if _swaps_layout(sp_input, plan) is not None:
        return sp_input.values.nbytes
    return _coo_bytes(sp_input, plan.sparse_ndim, plan.out_shape[plan.sparse_ndim:])


def _swaps_layout(t: SparseTensor, plan: _TransposePlan) -> str | None:
    """The output layout when a compressed input transposes without moving an index (batch
    dims fixed, the two compressed dims swapped or kept), else None."""
    if t.layout == "coo":
        return None
    nb = t.batch_ndim
    head = plan.perm[:nb + 2]
    if head == (*range(nb), nb + 1, nb):
        return _SWAPPED[t.layout]
    if head == tuple(range(nb + 2)):
        return t.layout
    return None


def _permute_value_axes(values, lead: int, dense_perm, swap_block: bool, xp=np):
    """``values`` with their dense axes (after ``lead`` leading axes, which include any block
    axes) permuted by ``dense_perm`` and, for a block layout swap, the two block axes swapped
    (``xp``: numpy, or the GPU backend's array module)."""
    axes = list(range(lead))
    if swap_block:
        axes[-2], axes[-1] = axes[-1], axes[-2]
    axes += [lead + p for p in dense_perm]
    if axes == list(range(values.ndim)):
        return values
    return xp.ascontiguousarray(xp.transpose(values, axes))


def _transpose_compressed(t: SparseTensor, plan: _TransposePlan, layout: str) -> SparseTensor:
    nb, s = t.batch_ndim, plan.sparse_ndim
    blocked = t.layout in BLOCK_LAYOUTS
    swap = layout != t.layout
    lead = nb + 1 + (2 if blocked else 0)
    values = _permute_value_axes(t.values, lead, [p - s for p in plan.perm[s:]], swap and blocked)
    blocksize = None
    if blocked:
        blocksize = tuple(reversed(t.blocksize)) if swap else t.blocksize
    return SparseTensor(layout=layout, compressed_indices=t.compressed_indices,
                        plain_indices=t.plain_indices, values=values, dense_shape=plan.out_shape,
                        blocksize=blocksize, coalesced=t.coalesced)


@REGISTRY.op(
    "transpose",
    doc="""Permutes the dimensions of a sparse tensor (tf.sparse.transpose).
Dimension i of the output is dimension perm[i] of the input; perm defaults to the dimensions
reversed and must be a permutation of [0, rank) (INVALID_ARGUMENT otherwise). The output is
re-sorted row-major (stable: repeated indices keep their order). Hybrid tensors: perm permutes
the sparse dimensions among themselves and the dense ones among themselves; moving a dense
dimension into the sparse ones (or back) is INVALID_ARGUMENT, so the default reversal is
refused when it would. Layouts: COO in, COO out. A CSR/CSC/BSR/BSC input whose batch
dimensions stay in place comes back compressed over the same index arrays: in the other layout
when its two compressed dimensions are swapped (CSR of A is CSC of A^T; BSR blocks are
transposed into BSC ones), in its own when they are not. A permutation that moves a batch
dimension gives COO.""",
    args=[SP_INPUT,
          Arg("perm", INT_LIST, "The permutation of the dimensions (default: reversed).", default=None)],
    outputs=[Output("output", "sparse", "The transposed tensor, row-major (or compressed, see above).")],
    result_bytes=_transpose_bytes,
)
def transpose(sp_input: SparseTensor, perm: list[int] | None = None) -> SparseTensor:
    plan = _transpose_plan(sp_input, perm)
    layout = _swaps_layout(sp_input, plan)
    if layout is not None:
        return _transpose_compressed(sp_input, plan, layout)
    t = as_coo(sp_input)
    s = plan.sparse_ndim
    values = _permute_value_axes(t.values, 1, [p - s for p in plan.perm[s:]], False)
    indices, values = shk.transpose(t.indices, values, plan.perm[:s], plan.out_shape)
    return SparseTensor(indices=indices, values=values, dense_shape=plan.out_shape,
                        coalesced=sp_input.layout == "coo" and sp_input.coalesced)


# COO (any rank, hybrid too, every dtype): the index columns permuted and the entries re-sorted
# by a stable sort; compressed tensors whose batch dimensions stay in place: the CPU's relabelling
# (no index moves), value axes permuted on the device. Other compressed cases (a batch dimension
# moves) run on the CPU.
def _transpose_on_gpu(sp_input, perm=None, **_) -> str | None:
    if _gpu.refused(_transpose_plan, sp_input, perm):
        return "argument"
    if not _gpu.native(sp_input):
        return "dtype"
    if sp_input.layout != "coo" and _swaps_layout(sp_input, _transpose_plan(sp_input, perm)) is None:
        return "batched"
    return None


@REGISTRY.gpu("transpose", supports=_transpose_on_gpu)
@_gpu.quiet
def transpose_gpu(be, sp_input: SparseTensor, perm: list[int] | None = None) -> SparseTensor:
    xp = be.xp
    plan = _transpose_plan(sp_input, perm)
    s = plan.sparse_ndim
    dense_perm = [p - s for p in plan.perm[s:]]
    layout = _swaps_layout(sp_input, plan)
    if layout is not None:  # the CPU's _transpose_compressed over device arrays
        t = sp_input
        blocked = t.layout in BLOCK_LAYOUTS
        swap = layout != t.layout
        values = _permute_value_axes(t.values, t.batch_ndim + 1 + (2 if blocked else 0), dense_perm,
                                     swap and blocked, xp)
        blocksize = (tuple(reversed(t.blocksize)) if swap else t.blocksize) if blocked else None
        return _gpu.compressed(layout, plan.out_shape, t.compressed_indices, t.plain_indices, values,
                               coalesced=t.coalesced, blocksize=blocksize)
    values = _permute_value_axes(sp_input.values, 1, dense_perm, False, xp)
    indices = xp.ascontiguousarray(sp_input.indices[:, list(plan.perm[:s])])
    indices, values = ka.reorder(xp, indices, values, plan.out_shape[:s])
    return _gpu.coo(plan.out_shape, indices, values, coalesced=sp_input.coalesced)


# ---------------------------------------------------------------------- reshape
@dataclass
class _ReshapePlan:
    old_sparse: tuple[int, ...]
    new_sparse: tuple[int, ...]
    out_shape: tuple[int, ...]


def _check_shape_argument(shape: list[int]) -> int | None:
    """The position of the one -1 in ``shape`` (None without one); other negatives refused."""
    unknown = None
    for i, d in enumerate(shape):
        if d == -1:
            if unknown is not None:
                raise InvalidArgumentError(
                    f"shape = {shape} has -1 at shape[{unknown}] and shape[{i}]; at most one "
                    "dimension may be inferred", reason=Reason.MULTIPLE_INFERRED_DIMENSIONS)
            unknown = i
        elif d < -1:
            raise InvalidArgumentError(f"shape[{i}] = {d} is negative; only -1 (inferred) is allowed",
                                       reason=Reason.NEGATIVE_DIMENSION)
        elif d > INT64_MAX:
            raise InvalidArgumentError(f"shape[{i}] = {d} does not fit int64", reason=Reason.SHAPE_OVERFLOW)
    return unknown


def _reshape_plan(sp_input: SparseTensor, shape: list[int]) -> _ReshapePlan:
    shape = list(shape)
    unknown = _check_shape_argument(shape)
    old = tuple(sp_input.dense_shape)
    s = _coo_sparse_ndim(sp_input)
    dense = old[s:]
    k = len(dense)
    hybrid = f"[:{s}]" if k else ""
    if k and (len(shape) < k or tuple(shape[len(shape) - k:]) != dense):
        raise InvalidArgumentError(
            f"shape = {shape} must end with the dense dimensions {list(dense)} of the hybrid sp_input "
            f"(dense_shape {list(old)}): reshape reshapes only the sparse dimensions",
            reason=Reason.DENSE_DIMS_CHANGED)
    lead = shape[:len(shape) - k]
    if not lead:
        raise InvalidArgumentError(
            f"shape = {shape} leaves sp_input (dense_shape {list(old)}) no sparse dimension; a sparse "
            "tensor has at least one", reason=Reason.RANK_TOO_LOW)
    count = _prod(old[:s])
    known = _prod(d for d in lead if d != -1)
    if known > INT64_MAX:
        raise InvalidArgumentError(
            f"shape = {shape}: its dimensions multiply to {known}, more than int64 can count",
            reason=Reason.SHAPE_OVERFLOW)
    if unknown is not None:
        if known == 0:
            raise InvalidArgumentError(
                f"shape = {shape} cannot infer its -1: the other {'sparse ' if k else ''}dimensions "
                "multiply to 0, so any size would do",
                reason=Reason.CANNOT_INFER_DIMENSION)
        if count % known:
            raise InvalidArgumentError(
                f"sp_input.dense_shape{hybrid} = {list(old[:s])} holds {count} positions, not a "
                f"multiple of {known} as shape = {shape} needs", reason=Reason.SHAPE_SIZE_MISMATCH)
        lead[unknown] = count // known
    elif known != count:
        raise InvalidArgumentError(
            f"sp_input.dense_shape{hybrid} = {list(old[:s])} holds {count} positions but shape = "
            f"{shape} holds {known}; reshape keeps the number of elements", reason=Reason.SHAPE_SIZE_MISMATCH)
    out_shape = check_shape((*lead, *dense), "shape")
    return _ReshapePlan(old[:s], tuple(lead), out_shape)


def _reshape_bytes(sp_input, shape, **_) -> int:
    plan = _reshape_plan(sp_input, shape)
    return _coo_bytes(sp_input, len(plan.new_sparse), plan.out_shape[len(plan.new_sparse):])


@REGISTRY.op(
    "reshape",
    doc="""Reshapes a sparse tensor, as reshape does its dense equivalent (tf.sparse.reshape).
Each stored entry gets the index of the same row-major position in the new shape; entries
keep their order. One dimension of shape may be -1: it is inferred from the element count
(INVALID_ARGUMENT when the other dimensions multiply to 0). Two -1s, any other negative
dimension, a new shape with a different element count, or one that does not fit int64 are
INVALID_ARGUMENT. Hybrid tensors: shape ends with the input's dense dimensions, unchanged,
and only the sparse dimensions are reshaped (their position counts must match). Layouts: any
in, COO out; a compressed input's batch dimensions count as sparse dimensions, and its
output is in row-major order.""",
    args=[SP_INPUT,
          Arg("shape", INT_LIST, "The new shape; one dimension may be -1 (inferred).")],
    outputs=[Output("output", "sparse", "The reshaped tensor (COO), entries in input order.")],
    result_bytes=_reshape_bytes,
)
def reshape(sp_input: SparseTensor, shape: list[int]) -> SparseTensor:
    plan = _reshape_plan(sp_input, shape)
    t = as_coo(sp_input)
    indices = t.indices if plan.new_sparse == plan.old_sparse else \
        shk.reshape(t.indices, plan.old_sparse, plan.new_sparse)
    out = SparseTensor(indices=indices, values=t.values, dense_shape=plan.out_shape,
                       coalesced=t.coalesced)
    return _row_major(out, sp_input)


# ------------------------------------------------------------------------ slice
@dataclass
class _SlicePlan:
    lo: list[int]  # start, clipped to the dense shape
    hi: list[int]  # start + size, clipped to the dense shape

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(h - lo for lo, h in zip(self.lo, self.hi))


def _slice_plan(sp_input: SparseTensor, start: list[int], size: list[int]) -> _SlicePlan:
    rank = sp_input.ndim
    for name, arg in (("start", start), ("size", size)):
        if len(arg) != rank:
            raise InvalidArgumentError(f"{name} has {len(arg)} entries but sp_input has rank {rank}",
                                       reason=Reason.RANK_MISMATCH)
        for d, v in enumerate(arg):
            if v < 0:
                raise InvalidArgumentError(f"{name}[{d}] = {v} is negative", reason=Reason.NEGATIVE_SLICE)
    # Python ints: start + size cannot overflow, and the clipped bounds fit int64.
    lo = [min(b, dim) for b, dim in zip(start, sp_input.dense_shape)]
    hi = [min(b + n, dim) for b, n, dim in zip(start, size, sp_input.dense_shape)]
    return _SlicePlan(lo, hi)


def _slice_bytes(sp_input, start, size, **_) -> int:
    plan = _slice_plan(sp_input, start, size)
    s = _coo_sparse_ndim(sp_input)
    return _coo_bytes(sp_input, s, plan.out_shape[s:])  # at most every entry survives


@REGISTRY.op(
    "slice",
    doc="""Slices a sparse tensor (tf.sparse.slice): the entries with start <= index < start + size
on every dimension, their indices shifted by start, in input order (duplicates kept).
start and size have one entry per dimension and must not be negative (INVALID_ARGUMENT
otherwise). The box is clipped to the input: dimension d of the output is
max(min(start[d] + size[d], dense_shape[d]) - start[d], 0), so a box past the end is not an
error. Hybrid tensors: entries are selected on the sparse dimensions and the value blocks are
sliced on the dense ones. Layouts: any in, COO out; a compressed input's batch dimensions count
as sparse dimensions, and its output is in row-major order.""",
    args=[SP_INPUT,
          Arg("start", INT_LIST, "First index of the slice on each dimension."),
          Arg("size", INT_LIST, "Length of the slice on each dimension (clipped to the input).")],
    outputs=[Output("output", "sparse", "The slice (COO), entries in input order.")],
    result_bytes=_slice_bytes,
)
def slice_(sp_input: SparseTensor, start: list[int], size: list[int]) -> SparseTensor:
    plan = _slice_plan(sp_input, start, size)
    t = as_coo(sp_input)
    s = t.indices.shape[1]
    rows, indices = shk.slice_entries(t.indices, plan.lo[:s], plan.hi[:s])
    values = gather_rows(t.values, rows)
    dense_box = tuple(slice(lo, hi) for lo, hi in zip(plan.lo[s:], plan.hi[s:]))
    if any(b.start != 0 or b.stop != dim for b, dim in zip(dense_box, t.dense_shape[s:])):
        values = np.ascontiguousarray(values[(slice(None), *dense_box)])
    out = SparseTensor(indices=indices, values=values, dense_shape=plan.out_shape, coalesced=t.coalesced)
    return _row_major(out, sp_input)


# ----------------------------------------------------------- partitioned tensors
REGISTRY.partitioned("transpose", Shuffle(
    perm=lambda bound: list(_transpose_plan(bound["sp_input"], bound["perm"]).perm)))
