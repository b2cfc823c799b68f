"""Layout conversion: ``convert`` between COO, CSR, CSC, BSR and BSC.

Semantics follow PyTorch's ``to_sparse()``, ``to_sparse_csr(dense_dim)``,
``to_sparse_csc``, ``to_sparse_bsr(blocksize, dense_dim)`` and
``to_sparse_bsc``, extended to every pair (torch refuses some, e.g. COO with
batches, or BSR -> CSR): batch dimensions of a compressed tensor are leading
sparse dimensions of its COO form, and blocks are expanded or gathered through
that form. ``check_convert`` decides everything from metadata (the blocksize, the
dense dimensions, the result's layout); the kernels do the work (in ``_layouts``) and
refuse only what the entries decide: batches that would hold unequal numbers of entries.
"""

from __future__ import annotations

from sparseserve.core.tensor import BLOCK_LAYOUTS, SparseTensor
from sparseserve.core.errors import InvalidArgumentError
from sparseserve.core.reasons import Reason
from sparseserve.kernels import arrays as ka

from ..argtypes import AXES, OPTIONAL_INT, SPARSE, choice
from ..device import not_a_matrix
from ..registry import REGISTRY, Arg, Output, Plan
from . import _gpu
from ._layouts import SPARSE_LAYOUTS, BatchNseError, convert_layout
from ._sputils import prod


def _dense_is_to_dense(value: str, name: str) -> InvalidArgumentError | None:
    """The error for layout = "dense": another op gives that."""
    if value != "dense":
        return None
    return InvalidArgumentError(f"{name} must be one of {', '.join(SPARSE_LAYOUTS)}, not {value!r}; use "
                                "to_dense for a dense result", reason=Reason.BAD_LAYOUT)


LAYOUT = choice(*SPARSE_LAYOUTS, reason=Reason.BAD_LAYOUT, explain=_dense_is_to_dense)


def _check_dense_dim(sp_input: SparseTensor, layout: str, dense_dim: int | None) -> int:
    ndim = sp_input.ndim
    target = sp_input.dense_ndim if dense_dim is None else dense_dim
    need = 1 if layout == "coo" else 2
    if target < 0 or ndim - target < need:
        given = f"dense_dim = {target}" if dense_dim is not None else \
            f"the input's {target} dense dimensions"
        raise InvalidArgumentError(
            f"{given} would leave {ndim - target} sparse dimensions of dense_shape "
            f"{list(sp_input.dense_shape)}; layout {layout} needs at least {need}"
            + ("" if dense_dim is not None else "; pass a smaller dense_dim"), reason=Reason.DENSE_DIM)
    return target


def _check_blocksize(sp_input: SparseTensor, layout: str, blocksize, dense_dim: int):
    if layout not in BLOCK_LAYOUTS:
        if blocksize is not None:
            raise InvalidArgumentError(f"blocksize is only for layouts bsr and bsc, not {layout}",
                                       reason=Reason.BLOCKSIZE)
        return None
    if blocksize is None:
        raise InvalidArgumentError(f"layout {layout} needs a blocksize", reason=Reason.BLOCKSIZE)
    if len(blocksize) == 1:  # one int: square blocks
        blocksize = [blocksize[0], blocksize[0]]
    if len(blocksize) != 2 or min(blocksize) < 1:
        raise InvalidArgumentError(f"blocksize = {list(blocksize)} must be two positive integers",
                                   reason=Reason.BLOCKSIZE)
    p = sp_input.ndim - dense_dim
    rows, cols = sp_input.dense_shape[p - 2], sp_input.dense_shape[p - 1]
    if rows % blocksize[0] or cols % blocksize[1]:
        raise InvalidArgumentError(f"blocksize = {list(blocksize)} does not divide the sparse dimensions "
                                   f"{[rows, cols]}", reason=Reason.BLOCKSIZE)
    return tuple(int(b) for b in blocksize)


def check_convert(sp_input: SparseTensor, layout: str, blocksize=None, dense_dim: int | None = None) -> Plan:
    """dense_dim leaves the layout its sparse dimensions, blocksize is given for block layouts
    alone and divides the two compressed dimensions. The kernels get both resolved: dense_dim
    an int (default: the input's), blocksize a pair (one int: square blocks) or None. Checking
    resolved arguments again gives the same plan."""
    dense_dim = _check_dense_dim(sp_input, layout, dense_dim)
    blocksize = _check_blocksize(sp_input, layout, blocksize, dense_dim)
    return Plan(args={"blocksize": blocksize, "dense_dim": dense_dim}, dtype=sp_input.dtype, layout=layout,
                shape=sp_input.dense_shape)


def _stored_positions(sp_input: SparseTensor) -> int:
    """Stored positions over the input's non-dense dimensions (every element of a block)."""
    if sp_input.layout == "coo":
        return sp_input.nnz
    area = prod(sp_input.blocksize) if sp_input.layout in BLOCK_LAYOUTS else 1
    return prod(sp_input.dense_shape[:sp_input.batch_ndim]) * sp_input.nnz * area


def _convert_bytes(sp_input: SparseTensor, layout: str, blocksize=None, dense_dim=None, **_) -> int:
    """An upper bound of the result's bytes: entries can multiply when dense dimensions
    become sparse, and blocks bring their zeros (a few entries in huge blocks). Takes the
    plan's arguments, or the bound ones (resolved here as the check resolves them)."""
    resolved = check_convert(sp_input, layout, blocksize, dense_dim).args
    blocksize, target = resolved["blocksize"], resolved["dense_dim"]
    shape = sp_input.dense_shape
    p_now, p_new = sp_input.ndim - sp_input.dense_ndim, sp_input.ndim - target
    positions = _stored_positions(sp_input)
    if p_new > p_now:
        positions *= prod(shape[p_now:p_new])
    positions = min(positions, prod(shape[:p_new]))
    inner = prod(shape[p_new:]) * sp_input.dtype.itemsize
    if layout == "coo":
        return positions * (8 * p_new + inner)
    n_batch = prod(shape[:p_new - 2])
    br, bc = blocksize or (1, 1)
    n_blocks = min(positions, n_batch * (shape[p_new - 2] // br) * (shape[p_new - 1] // bc))
    n_compressed = shape[p_new - 2] // br if layout in ("csr", "bsr") else shape[p_new - 1] // bc
    return n_blocks * (8 + br * bc * inner) + n_batch * (n_compressed + 1) * 8


@REGISTRY.op(
    "convert",
    doc="""Converts a sparse tensor to another sparse layout (torch's to_sparse, to_sparse_csr,
to_sparse_csc, to_sparse_bsr, to_sparse_bsc), between every pair of coo, csr, csc, bsr, bsc.
A COO tensor with more than two sparse dimensions becomes batch dimensions plus two compressed
ones; every batch must then hold the same number of entries (blocks for bsr/bsc), otherwise
INVALID_ARGUMENT (reason BATCH_NSE_MISMATCH). Repeated COO indices are summed first.
blocksize ([rows, cols], or one int for square blocks) is required for bsr/bsc and must divide
the two compressed dimensions; a block is stored when any of its elements is, the others in it
being zero. dense_dim (default: the input's) sets the trailing dense dimensions: fewer makes
every element of a stored value a stored entry, more merges entries into dense values.
Compressed results keep a compressed input's index dtype (int64 from COO, or where int32 cannot
hold them). A COO result is coalesced (sorted, unique) unless a compressed input repeats an
index within a segment; the same layout and blocksize returns the input unchanged.""",
    args=[Arg("sp_input", SPARSE, "The input sparse tensor.", layouts=SPARSE_LAYOUTS),
          Arg("layout", LAYOUT, "Target layout: coo, csr, csc, bsr or bsc."),
          Arg("blocksize", AXES, "Block shape [rows, cols] for bsr and bsc.", default=None),
          Arg("dense_dim", OPTIONAL_INT, "Trailing dense dimensions of the result (default: the input's).",
              default=None)],
    outputs=[Output("output", "sparse", "The tensor in the target layout.")],
    check=check_convert,
    result_bytes=_convert_bytes,
)
def convert(sp_input: SparseTensor, layout: str, blocksize: tuple[int, int] | None, dense_dim: int) -> SparseTensor:
    try:
        return convert_layout(sp_input, layout, blocksize, dense_dim)
    except BatchNseError as exc:  # where the entries fall decides it: the kernel's to say
        raise InvalidArgumentError(f"sp_input: {exc}", reason=Reason.BATCH_NSE_MISMATCH) from None


# ------------------------------------------------------------------ convert on the GPU
# COO, CSR and CSC matrices (2-D, no batch or dense dimensions; a COO -> COO of any shape is a
# coalesce) with the dense dimensions kept, every dtype: stable sorts and gathers, no cuSPARSE
# (its conversions take five dtypes and leave the order of repeated entries unspecified).
# Block layouts, batches and dense_dim changes run on the CPU.
def _convert_declines(plan: Plan) -> str | None:
    """A dense_dim change, block layouts, batched or hybrid compressed tensors."""
    t, layout, blocksize = plan.args["sp_input"], plan.args["layout"], plan.args["blocksize"]
    if plan.args["dense_dim"] != t.dense_ndim:
        return "dense_dim"
    if layout == t.layout != "coo" and (blocksize is None or tuple(t.blocksize) == blocksize):
        return None  # the input itself, whatever its batches and blocks
    if layout in BLOCK_LAYOUTS:
        return "layout"
    if t.layout == "coo" and layout == "coo":
        return None
    return not_a_matrix(t)


def _coo_to_csr_gpu(be, t: SparseTensor):
    """(ptr, plain, values) int64 of a 2-D COO: coalesced first (the CPU's ``_to_csr``)."""
    xp = be.xp
    indices, values = ka.coalesce(xp, t.indices, t.values, t.dense_shape, be.scatter_add)
    return ka.compress(xp, indices[:, 0], t.dense_shape[0]), xp.ascontiguousarray(indices[:, 1]), values


def _transposed_gpu(be, layout: str, shape, ptr, plain, values):
    """CSR <-> CSC of the same matrix (index dtypes kept)."""
    n_plain = shape[1] if layout == "csr" else shape[0]
    ptr_t, plain_t, perm = ka.transpose_compressed(be.xp, ptr, plain, n_plain)
    return _gpu.compressed("csc" if layout == "csr" else "csr", shape, ptr_t, plain_t, values[perm])


@REGISTRY.gpu("convert", declines=_convert_declines)
@_gpu.quiet
def convert_gpu(be, sp_input: SparseTensor, layout: str, blocksize: tuple[int, int] | None,
                dense_dim: int) -> SparseTensor:
    xp = be.xp
    t, shape = sp_input, sp_input.dense_shape
    if t.layout == "coo":
        if layout == "coo":
            indices, values = ka.coalesce(xp, t.indices, t.values, shape, be.scatter_add)
            return _gpu.coo(shape, indices, values, coalesced=True)
        ptr, plain, values = _coo_to_csr_gpu(be, t)
        return _gpu.compressed("csr", shape, ptr, plain, values) if layout == "csr" else \
            _transposed_gpu(be, "csr", shape, ptr, plain, values)
    if layout == t.layout:
        return t
    if layout != "coo":
        return _transposed_gpu(be, t.layout, shape, t.compressed_indices, t.plain_indices, t.values)
    ptr, plain, values = t.compressed_indices, t.plain_indices, t.values
    if t.layout == "csc":  # row-major first, as the CPU's ``_sorted_coo``
        ptr, plain, perm = ka.transpose_compressed(xp, ptr, plain, shape[0])
        values = values[perm]
    rows = ka.expand_pointers(xp, ptr, int(plain.shape[0]))
    cols = plain.astype(xp.int64)
    unique = ka.segments_strictly_increase(xp, rows, cols)
    return _gpu.coo(shape, xp.stack([rows, cols], axis=1), values, coalesced=unique)
