"""COO basics: reorder, coalesce, to_dense, from_dense.

Each op's ``check`` makes its refusals from metadata before any kernel, on every device; the
kernels raise only what the entries decide (unsorted or repeated indices when validate_indices
asks, batches a coalesce would leave unequal). A shape whose element count int64 cannot hold
never gets here: the tensor's validation (docs/contract.md, "Tensors") refuses it when it binds.
"""

from __future__ import annotations

import numpy as np

from sparseserve.core.tensor import SparseTensor
from sparseserve.core.errors import InvalidArgumentError
from sparseserve.core.reasons import Reason
from sparseserve import kernels
from sparseserve.kernels import arrays as ka

from ..argtypes import BOOL, DENSE, OPTIONAL_INT, SCALAR, SPARSE
from ..device import Fallback
from ..partition import Rowwise
from ..registry import REGISTRY, Arg, Output, Plan
from . import _gpu
from ._common import cast_scalar, check_ordered, coo
from ._sputils import prod
from ._layouts import SPARSE_LAYOUTS, BatchNseError, coo_view, coalesced_coo, first_noncanonical, like, sort_segments

SP_INPUT = Arg("sp_input", SPARSE, "The input sparse tensor (any sparse layout).", layouts=SPARSE_LAYOUTS)


def _canonical_or_raise(t: SparseTensor, remedy: str) -> bool:
    """validate_indices for a compressed tensor: each segment's plain indices strictly increase
    (the compressed form of sorted and unique), or INVALID_ARGUMENT naming the entry."""
    bad = first_noncanonical(t)
    if bad is None:
        return True
    position, repeated = bad
    where = f"sp_input.plain_indices[{', '.join(map(str, position))}] = {int(t.plain_indices[position])}"
    segment = "row" if t.layout in ("csr", "bsr") else "column"
    if repeated:
        raise InvalidArgumentError(f"{where} is repeated in its {segment}", reason=Reason.INDICES_REPEATED)
    raise InvalidArgumentError(f"{where} is out of order in its {segment}; {remedy} or pass "
                               "validate_indices=false", reason=Reason.INDICES_UNSORTED)


# ------------------------------------------------------------- reorder, coalesce
def check_reorder(sp_input: SparseTensor) -> Plan:
    """Nothing to refuse: every validated tensor (a merged batch too) has an order; the result
    has the input's dtype, layout and shape."""
    return Plan(dtype=sp_input.dtype, layout=sp_input.layout, shape=sp_input.dense_shape)


@REGISTRY.op(
    "reorder",
    doc="""Reorders a sparse tensor into the canonical row-major order (tf.sparse.reorder).
Duplicates are kept, in their original relative order; values and shape are unchanged.
CSR, CSC, BSR, BSC: the result keeps the layout, with each row's (column's) plain indices
ascending (repeats kept in order); a tensor already so is returned as it is.""",
    args=[SP_INPUT],
    outputs=[Output("output", "sparse", "The same entries in row-major order.")],
    check=check_reorder,
    batchable=True,
)
def reorder(sp_input: SparseTensor) -> SparseTensor:
    if sp_input.layout != "coo":
        return sort_segments(sp_input)
    indices, values = kernels.reorder(sp_input.indices, sp_input.values, sp_input.dense_shape)
    return coo(indices, values, sp_input, coalesced=False)


# GPU kernels of the COO basics: COO inputs, every dtype (values move by gathers; sums go
# through ``arrays.segment_sum``, which has a work form for each dtype of docs/contract.md).
_ON_GPU = {"sp_input": ("coo",)}


@REGISTRY.gpu("reorder", layouts=_ON_GPU)
@_gpu.quiet
def reorder_gpu(be, sp_input: SparseTensor) -> SparseTensor:
    indices, values = ka.reorder(be.xp, sp_input.indices, sp_input.values, sp_input.dense_shape)
    return _gpu.coo(sp_input.dense_shape, indices, values, coalesced=False)


check_coalesce = check_reorder  # the same rules (none) and the same result metadata


@REGISTRY.op(
    "coalesce",
    doc="""Sorts the entries row-major and sums the values of repeated indices (torch's coalesce).
Booleans combine with logical or; integers wrap as numpy's do.
CSR, CSC, BSR, BSC: the result keeps the layout, blocksize and index dtype, each row's (column's)
plain indices strictly ascending, repeated ones (repeated blocks) summed; a tensor already so is
returned as it is. A batched tensor whose batches would then hold different numbers of entries is
INVALID_ARGUMENT (BATCH_NSE_MISMATCH).""",
    args=[SP_INPUT],
    outputs=[Output("output", "sparse", "Unique indices, sorted, with summed values.")],
    check=check_coalesce,
    batchable=True,
)
def coalesce(sp_input: SparseTensor) -> SparseTensor:
    if sp_input.layout != "coo":
        if first_noncanonical(sp_input) is None:
            return sp_input
        try:
            return like(coalesced_coo(sp_input), sp_input)
        except BatchNseError as exc:  # which indices repeat decides it: the kernel's to say
            raise InvalidArgumentError(f"coalesce of sp_input: {exc}", reason=Reason.BATCH_NSE_MISMATCH) from None
    indices, values = kernels.coalesce(sp_input.indices, sp_input.values, sp_input.dense_shape)
    return coo(indices, values, sp_input, coalesced=True)


@REGISTRY.gpu("coalesce", layouts=_ON_GPU)
@_gpu.quiet
def coalesce_gpu(be, sp_input: SparseTensor) -> SparseTensor:
    indices, values = ka.coalesce(be.xp, sp_input.indices, sp_input.values, sp_input.dense_shape,
                                  be.scatter_add)
    return _gpu.coo(sp_input.dense_shape, indices, values, coalesced=True)


# --------------------------------------------------------------------- to_dense
def check_to_dense(sp_input: SparseTensor, default_value=0, validate_indices: bool = True) -> Plan:
    """default_value takes the values' dtype unchanged; the kernels get it cast."""
    default = cast_scalar(default_value, sp_input.dtype, "default_value")
    return Plan(args={"default_value": default}, dtype=sp_input.dtype, layout="dense", shape=sp_input.dense_shape)


def _dense_bytes(sp_input: SparseTensor, **_) -> int:
    return prod(sp_input.dense_shape) * sp_input.dtype.itemsize


@REGISTRY.op(
    "to_dense",
    doc="""Converts a sparse tensor to a dense one (tf.sparse.to_dense).
Unstored positions take default_value. With validate_indices, indices must be sorted row-major
and unique (INVALID_ARGUMENT otherwise); without it, repeated indices are summed (docs/contract.md, as torch's
to_dense; TensorFlow's kernel, which documents repeats as unsupported, keeps the last one written).
CSR, CSC, BSR, BSC (batch and dense dimensions too, as torch's to_dense): with validate_indices
each row's (column's) plain indices must strictly increase; every element of a stored block is
stored (its zeros stay zero whatever default_value).""",
    args=[SP_INPUT,
          Arg("default_value", SCALAR, "The value of unstored positions, cast to the values' dtype.",
              default=0),
          Arg("validate_indices", BOOL, "Require sorted, unique indices.", default=True)],
    outputs=[Output("output", "dense", "Dense tensor of shape dense_shape.")],
    check=check_to_dense,
    result_bytes=_dense_bytes,
)
def to_dense(sp_input: SparseTensor, default_value=0, validate_indices: bool = True) -> np.ndarray:
    # The order of the indices is the entries' to decide: validate_indices is checked here.
    if sp_input.layout != "coo":
        if validate_indices:
            _canonical_or_raise(sp_input, "coalesce the tensor first")
        view = coo_view(sp_input)  # row-major, and unique when validated
        return kernels.to_dense(view.indices, view.values, view.dense_shape, default_value, validate_indices)
    if validate_indices:
        check_ordered(sp_input.indices, sp_input.dense_shape, "sp_input.indices", "reorder the tensor first")
    return kernels.to_dense(sp_input.indices, sp_input.values, sp_input.dense_shape, default_value,
                            validate_indices)


@REGISTRY.gpu("to_dense", layouts=_ON_GPU)
@_gpu.quiet
def to_dense_gpu(be, sp_input: SparseTensor, default_value=0, validate_indices: bool = True):
    xp = be.xp
    shape = sp_input.dense_shape
    s = sp_input.sparse_ndim
    keys = ka.linearize(xp, sp_input.indices, shape[:s])
    if validate_indices:
        if not ka.is_strictly_increasing(xp, keys):
            raise Fallback("unordered")  # the CPU kernel names the first bad entry
        values = sp_input.values
    else:
        indices, values = ka.coalesce(xp, sp_input.indices, sp_input.values, shape, be.scatter_add)
        keys = ka.linearize(xp, indices, shape[:s])
    return ka.fill_dense(xp, keys, values, prod(shape[:s]), default_value, sp_input.dtype, shape)


# ------------------------------------------------------------------- from_dense
def check_from_dense(tensor: np.ndarray, sparse_dim: int | None = None) -> Plan:
    """A tensor of rank at least 1, and sparse_dim (default: the rank) between 1 and the rank:
    a count of leading dimensions, not an axis (no negatives)."""
    ndim = tensor.ndim
    if ndim < 1:
        raise InvalidArgumentError("tensor must have rank at least 1 to become sparse",
                                   reason=Reason.RANK_TOO_LOW)
    sparse_dim = ndim if sparse_dim is None else sparse_dim
    if not 1 <= sparse_dim <= ndim:
        raise InvalidArgumentError(f"sparse_dim = {sparse_dim} must be between 1 and the rank "
                                   f"{ndim} of tensor", reason=Reason.AXIS_OUT_OF_RANGE)
    return Plan(args={"sparse_dim": sparse_dim}, dtype=tensor.dtype, layout="coo", shape=tensor.shape)


@REGISTRY.op(
    "from_dense",
    doc="""Converts a dense tensor to a coalesced sparse one (torch's Tensor.to_sparse(sparse_dim)).
With sparse_dim < rank the result is hybrid: the trailing dimensions stay dense in the values,
and only all-zero sub-arrays are dropped.""",
    args=[Arg("tensor", DENSE, "The dense input.", layouts=("dense",)),
          Arg("sparse_dim", OPTIONAL_INT, "Number of sparse dimensions (default: all).", default=None)],
    outputs=[Output("output", "sparse", "Coalesced COO tensor.")],
    check=check_from_dense,
)
def from_dense(tensor: np.ndarray, sparse_dim: int) -> SparseTensor:
    indices, values = kernels.from_dense(tensor, sparse_dim)
    return SparseTensor(indices=indices, values=values, dense_shape=tensor.shape, coalesced=True)


# ----------------------------------------------------------- partitioned tensors
# Blocks hold disjoint row ranges in row order, so row-major order and duplicates never cross one.
REGISTRY.partitioned("reorder", Rowwise("sp_input"))
REGISTRY.partitioned("coalesce", Rowwise("sp_input"))
REGISTRY.partitioned("to_dense", Rowwise("sp_input"))
