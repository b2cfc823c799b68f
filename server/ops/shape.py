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

Each op's ``check`` makes every refusal from metadata before any kernel runs:
permutations are permutations (the default reversal resolved there), new
shapes hold as many positions as the old ones (the -1 inferred there) and fit
int64, slice sizes are not negative and the slice's shape fits int64. No
kernel here raises.
"""

from __future__ import annotations

import numpy as np

from sparseserve.core.tensor import BLOCK_LAYOUTS, SparseTensor
from sparseserve.core.validate import EMPTY_SHAPE_MAX, INT64_MAX, check_shape
from sparseserve.core.errors import InvalidArgumentError
from sparseserve.core.reasons import Reason
from sparseserve import kernels
from sparseserve.kernels import arrays as ka
from sparseserve.kernels import shape as shk
from sparseserve.kernels import gather_rows

from ..argtypes import INT_LIST, SPARSE
from ..partition import Shuffle
from ..registry import REGISTRY, Arg, Output, Plan
from . import _gpu
from ._sputils import prod
from ._layouts import SPARSE_LAYOUTS, as_coo, view_nnz, view_sparse_ndim

SP_INPUT = Arg("sp_input", SPARSE, "The input sparse tensor (any sparse layout).", layouts=SPARSE_LAYOUTS)

_SWAPPED = {"csr": "csc", "csc": "csr", "bsr": "bsc", "bsc": "bsr"}


def _coo_bytes(t: SparseTensor, sparse_ndim: int, dense_dims) -> int:
    """Bytes of ``t``'s entries in COO form with ``sparse_ndim`` index columns and value blocks
    of ``dense_dims``."""
    return view_nnz(t) * (8 * sparse_ndim + prod(dense_dims) * t.dtype.itemsize)


def _row_major(t: SparseTensor, source: SparseTensor) -> SparseTensor:
    """A COO result of a compressed ``source`` in row-major order (stable, duplicates kept);
    a COO source's results keep its entry order, as TensorFlow's do."""
    if source.layout == "coo":
        return t
    indices, values = kernels.reorder(t.indices, t.values, t.dense_shape)
    return SparseTensor(indices=indices, values=values, dense_shape=t.dense_shape, coalesced=False)


# -------------------------------------------------------------------- transpose
def _resolved_perm(sp_input: SparseTensor, perm: list[int] | None) -> list[int]:
    """perm as given, or the default: the dimensions reversed."""
    return list(range(sp_input.ndim - 1, -1, -1)) if perm is None else list(perm)


def _swaps_layout(t: SparseTensor, perm: list[int]) -> str | None:
    """The output layout when a compressed input transposes without moving an index (batch
    dims fixed, the two compressed dims swapped or kept), else None."""
    if t.layout == "coo":
        return None
    nb = t.batch_ndim
    head = tuple(perm[:nb + 2])
    if head == (*range(nb), nb + 1, nb):
        return _SWAPPED[t.layout]
    if head == tuple(range(nb + 2)):
        return t.layout
    return None


def check_transpose(sp_input: SparseTensor, perm: list[int] | None = None) -> Plan:
    """perm (the reversal when None) permutes the dimensions, sparse among sparse and dense among
    dense; the kernels take the whole permutation."""
    rank = sp_input.ndim
    perm = _resolved_perm(sp_input, perm)
    if len(perm) != rank or sorted(perm) != list(range(rank)):
        raise InvalidArgumentError(
            f"perm = {perm} is not a permutation of [0, {rank}), the dimensions of sp_input "
            f"(rank {rank})", reason=Reason.BAD_PERMUTATION)
    s = view_sparse_ndim(sp_input)
    if sorted(perm[:s]) != list(range(s)):
        raise InvalidArgumentError(
            f"perm = {perm} moves a dense dimension of sp_input into the sparse ones: sp_input "
            f"has {s} sparse dimensions (dense_shape {list(sp_input.dense_shape)}), and perm[:{s}] "
            f"must be a permutation of [0, {s}); dense dimensions permute only among themselves",
            reason=Reason.PERM_MIXES_SPARSE_AND_DENSE)
    return Plan(args={"perm": perm}, dtype=sp_input.dtype, layout=_swaps_layout(sp_input, perm) or "coo",
                shape=_permuted(sp_input.dense_shape, perm))


def _permuted(shape, perm: list[int]) -> tuple[int, ...]:
    return tuple(int(shape[p]) for p in perm)


def _transpose_bytes(sp_input, perm=None, **_) -> int:
    perm = _resolved_perm(sp_input, perm)
    if _swaps_layout(sp_input, perm) is not None:
        return sp_input.values.nbytes
    s = view_sparse_ndim(sp_input)
    return _coo_bytes(sp_input, s, sp_input.dense_shape[s:])  # dense dims permute among themselves


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


def _dense_perm(t: SparseTensor, perm: list[int]) -> list[int]:
    """perm's permutation of the dense dimensions, counted from the first of them."""
    s = view_sparse_ndim(t)
    return [p - s for p in perm[s:]]


def _transpose_compressed(t: SparseTensor, perm: list[int], layout: str) -> SparseTensor:
    blocked = t.layout in BLOCK_LAYOUTS
    swap = layout != t.layout
    lead = t.batch_ndim + 1 + (2 if blocked else 0)
    values = _permute_value_axes(t.values, lead, _dense_perm(t, perm), swap and blocked)
    blocksize = None
    if blocked:
        blocksize = tuple(reversed(t.blocksize)) if swap else t.blocksize
    return SparseTensor(layout=layout, compressed_indices=t.compressed_indices,
                        plain_indices=t.plain_indices, values=values, dense_shape=_permuted(t.dense_shape, perm),
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
    check=check_transpose,
    result_bytes=_transpose_bytes,
)
def transpose(sp_input: SparseTensor, perm: list[int]) -> SparseTensor:
    layout = _swaps_layout(sp_input, perm)
    if layout is not None:
        return _transpose_compressed(sp_input, perm, layout)
    t = as_coo(sp_input)
    s = view_sparse_ndim(sp_input)
    out_shape = _permuted(sp_input.dense_shape, perm)
    values = _permute_value_axes(t.values, 1, _dense_perm(sp_input, perm), False)
    indices, values = shk.transpose(t.indices, values, perm[:s], out_shape)
    return SparseTensor(indices=indices, values=values, dense_shape=out_shape,
                        coalesced=sp_input.layout == "coo" and sp_input.coalesced)


# COO (any rank, hybrid too, every dtype): the index columns permuted and the entries re-sorted
# by a stable sort; compressed tensors whose batch dimensions stay in place: the CPU's relabelling
# (no index moves), value axes permuted on the device. A compressed tensor whose batch dimension
# moves needs its COO form re-sorted: that runs on the CPU ("batched").
def _transpose_declines(plan: Plan) -> str | None:
    """A compressed tensor whose batch dimensions move."""
    t, perm = plan.args["sp_input"], plan.args["perm"]
    return "batched" if t.layout != "coo" and _swaps_layout(t, perm) is None else None


@REGISTRY.gpu("transpose", layouts={"sp_input": SPARSE_LAYOUTS}, declines=_transpose_declines)
@_gpu.quiet
def transpose_gpu(be, sp_input: SparseTensor, perm: list[int]) -> SparseTensor:
    xp = be.xp
    s = view_sparse_ndim(sp_input)
    out_shape = _permuted(sp_input.dense_shape, perm)
    dense_perm = _dense_perm(sp_input, perm)
    layout = _swaps_layout(sp_input, perm)
    if layout is not None:  # the CPU's _transpose_compressed over device arrays
        t = sp_input
        blocked = t.layout in BLOCK_LAYOUTS
        swap = layout != t.layout
        values = _permute_value_axes(t.values, t.batch_ndim + 1 + (2 if blocked else 0), dense_perm,
                                     swap and blocked, xp)
        blocksize = (tuple(reversed(t.blocksize)) if swap else t.blocksize) if blocked else None
        return _gpu.compressed(layout, out_shape, t.compressed_indices, t.plain_indices, values,
                               coalesced=t.coalesced, blocksize=blocksize)
    values = _permute_value_axes(sp_input.values, 1, dense_perm, False, xp)
    indices = xp.ascontiguousarray(sp_input.indices[:, list(perm[:s])])
    indices, values = ka.reorder(xp, indices, values, out_shape[:s])
    return _gpu.coo(out_shape, indices, values, coalesced=sp_input.coalesced)


# ---------------------------------------------------------------------- reshape
def _inferred_position(shape: list[int]) -> int | None:
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


def check_reshape(sp_input: SparseTensor, shape: list[int]) -> Plan:
    """The new shape holds the sparse dimensions' positions and ends with the dense dimensions;
    the kernels take it with its -1 inferred."""
    shape = list(shape)
    unknown = _inferred_position(shape)
    old = tuple(sp_input.dense_shape)
    s = view_sparse_ndim(sp_input)
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
    count = prod(old[:s])
    known = prod(d for d in lead if d != -1)
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
    return Plan(args={"shape": list(out_shape)}, dtype=sp_input.dtype, layout="coo", shape=out_shape)


def _reshape_bytes(sp_input, shape, **_) -> int:
    dense = sp_input.dense_shape[view_sparse_ndim(sp_input):]
    return _coo_bytes(sp_input, len(shape) - len(dense), dense)


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
    check=check_reshape,
    result_bytes=_reshape_bytes,
)
def reshape(sp_input: SparseTensor, shape: list[int]) -> SparseTensor:
    t = as_coo(sp_input)
    s = view_sparse_ndim(sp_input)
    old_sparse = tuple(t.dense_shape[:s])
    new_sparse = tuple(shape[:len(shape) - (t.ndim - s)])
    indices = t.indices if new_sparse == old_sparse else shk.reshape(t.indices, old_sparse, new_sparse)
    out = SparseTensor(indices=indices, values=t.values, dense_shape=shape, coalesced=t.coalesced)
    return _row_major(out, sp_input)


# ------------------------------------------------------------------------ slice
def _slice_box(dense_shape, start: list[int], size: list[int]) -> tuple[list[int], list[int]]:
    """(lo, hi): start and start + size, each clipped at the end of its dimension only (Python
    ints: no overflow). A negative start stays: entries are shifted up by it, as TensorFlow's
    kernel shifts them; dimension d of the slice is hi[d] - lo[d]."""
    lo = [min(b, int(dim)) for b, dim in zip(start, dense_shape)]
    hi = [min(b + n, int(dim)) for b, n, dim in zip(start, size, dense_shape)]
    return lo, hi


def check_slice(sp_input: SparseTensor, start: list[int], size: list[int]) -> Plan:
    """start and size have one entry per dimension, no size is negative, and the slice's shape
    (which a negative start can make larger than the input's) fits int64."""
    rank = sp_input.ndim
    for name, arg in (("start", start), ("size", size)):
        if len(arg) != rank:
            raise InvalidArgumentError(f"{name} has {len(arg)} entries but sp_input has rank {rank}",
                                       reason=Reason.RANK_MISMATCH)
    for d, n in enumerate(size):
        if n < 0:
            raise InvalidArgumentError(f"size[{d}] = {n} is negative; a slice's size must be non-negative "
                                       "(its start may be negative)", reason=Reason.NEGATIVE_SLICE)
    lo, hi = _slice_box(sp_input.dense_shape, start, size)
    shape = check_shape([h - b for b, h in zip(lo, hi)], "the slice's dense_shape")
    s = view_sparse_ndim(sp_input)
    # Row-major keys run over the sparse dimensions, and the value blocks are arrays numpy must
    # describe (validate's rule for empty shapes): both count even when a dimension of 0 makes
    # the whole product 0.
    check_shape(shape[:s], f"the slice's dense_shape[:{s}]")
    if prod(d for d in shape[s:] if d) > EMPTY_SHAPE_MAX:
        raise InvalidArgumentError(
            f"the slice's dense_shape = {list(shape)} gives value blocks {list(shape[s:])}, past what an "
            "array can describe", reason=Reason.SHAPE_OVERFLOW)
    return Plan(dtype=sp_input.dtype, layout="coo", shape=shape)


def _slice_bytes(sp_input, start, size, **_) -> int:
    lo, hi = _slice_box(sp_input.dense_shape, start, size)
    s = view_sparse_ndim(sp_input)
    return _coo_bytes(sp_input, s, [h - b for b, h in zip(lo[s:], hi[s:])])  # at most every entry survives


def _slice_blocks(values: np.ndarray, dims, lo: list[int], hi: list[int]) -> np.ndarray:
    """``values``' dense axes (of sizes ``dims``) cut to [lo, hi): the part inside the input,
    behind zeros where lo is negative."""
    if all(b == 0 and h == d for b, h, d in zip(lo, hi, dims)):
        return values
    inside = tuple(slice(max(b, 0), max(h, 0)) for b, h in zip(lo, hi))
    if all(b >= 0 for b in lo):
        return np.ascontiguousarray(values[(slice(None), *inside)])
    out = np.zeros((values.shape[0], *(h - b for b, h in zip(lo, hi))), values.dtype)
    shifted = tuple(slice(max(b, 0) - b, max(h, 0) - b) for b, h in zip(lo, hi))
    out[(slice(None), *shifted)] = values[(slice(None), *inside)]
    return out


@REGISTRY.op(
    "slice",
    doc="""Slices a sparse tensor (tf.sparse.slice): the entries with start <= index < start + size
on every dimension, their indices shifted by start, in input order (duplicates kept).
start and size have one entry per dimension; a size must not be negative (INVALID_ARGUMENT
otherwise), a start may be, as in TensorFlow's kernel: the entries are shifted by it all the
same (start = [0, -1] moves the entry at [0, 0] to [0, 1]). The box is clipped at the end of
each dimension only: dimension d of the output is max(min(start[d] + size[d], dense_shape[d]) -
start[d], 0), so a box past the end is not an error and one before the start of a dimension
keeps its size (a slice's shape that does not fit int64 is INVALID_ARGUMENT). Hybrid tensors:
entries are selected on the sparse dimensions and the value blocks are sliced on the dense ones
(zero-padded in front where start is negative). Layouts: any in, COO out; a compressed input's
batch dimensions count as sparse dimensions, and its output is in row-major order.""",
    args=[SP_INPUT,
          Arg("start", INT_LIST, "First index of the slice on each dimension (may be negative)."),
          Arg("size", INT_LIST, "Length of the slice on each dimension (clipped at the input's end).")],
    outputs=[Output("output", "sparse", "The slice (COO), entries in input order.")],
    check=check_slice,
    result_bytes=_slice_bytes,
)
def slice_(sp_input: SparseTensor, start: list[int], size: list[int]) -> SparseTensor:
    lo, hi = _slice_box(sp_input.dense_shape, start, size)
    t = as_coo(sp_input)
    s = t.indices.shape[1]
    if any(h <= max(b, 0) for b, h in zip(lo[:s], hi[:s])):  # the box holds no index: none inside
        rows, indices = np.zeros(0, np.int64), np.zeros((0, s), np.int64)
    else:  # here lo > -(the slice's dimension): it fits int64, as every shifted index does
        rows, indices = shk.slice_entries(t.indices, lo[:s], hi[:s])
    values = _slice_blocks(gather_rows(t.values, rows), t.dense_shape[s:], lo[s:], hi[s:])
    out = SparseTensor(indices=indices, values=values, dense_shape=[h - b for b, h in zip(lo, hi)],
                       coalesced=t.coalesced)
    return _row_major(out, sp_input)


# ----------------------------------------------------------- partitioned tensors
REGISTRY.partitioned("transpose", Shuffle())
