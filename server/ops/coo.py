"""COO basics: reorder, coalesce, to_dense, from_dense."""

from __future__ import annotations

import numpy as np

from sparseserve._tensor import SparseTensor
from sparseserve.errors import InvalidArgumentError
from sparseserve import kernels

from ..argtypes import BOOL, DENSE, OPTIONAL_INT, SCALAR, SPARSE
from ..registry import REGISTRY, Arg, Output
from ._common import cast_scalar, check_ordered, coo

SP_INPUT = Arg("sp_input", SPARSE, "The input sparse tensor (COO).")


@REGISTRY.op(
    "reorder",
    doc="""Reorders a sparse tensor into the canonical row-major order (tf.sparse.reorder).
Duplicates are kept, in their original relative order; values and shape are unchanged.""",
    args=[SP_INPUT],
    outputs=[Output("output", "sparse", "The same entries in row-major order.")],
    batchable=True,
)
def reorder(sp_input: SparseTensor) -> SparseTensor:
    indices, values = kernels.reorder(sp_input.indices, sp_input.values, sp_input.dense_shape)
    return coo(indices, values, sp_input, coalesced=False)


@REGISTRY.op(
    "coalesce",
    doc="""Sorts the entries row-major and sums the values of repeated indices (torch's coalesce).
Booleans combine with logical or; integers wrap as numpy's do.""",
    args=[SP_INPUT],
    outputs=[Output("output", "sparse", "Unique indices, sorted, with summed values.")],
    batchable=True,
)
def coalesce(sp_input: SparseTensor) -> SparseTensor:
    indices, values = kernels.coalesce(sp_input.indices, sp_input.values, sp_input.dense_shape)
    return coo(indices, values, sp_input, coalesced=True)


def _dense_bytes(sp_input: SparseTensor, **_) -> int:
    return int(np.prod(sp_input.dense_shape, dtype=object)) * sp_input.dtype.itemsize


@REGISTRY.op(
    "to_dense",
    doc="""Converts a sparse tensor to a dense one (tf.sparse.to_dense).
Unstored positions take default_value. With validate_indices, indices must be sorted row-major
and unique (INVALID_ARGUMENT otherwise); without it, repeated indices are summed.""",
    args=[SP_INPUT,
          Arg("default_value", SCALAR, "The value of unstored positions, cast to the values' dtype.",
              default=0),
          Arg("validate_indices", BOOL, "Require sorted, unique indices.", default=True)],
    outputs=[Output("output", "dense", "Dense tensor of shape dense_shape.")],
    result_bytes=_dense_bytes,
)
def to_dense(sp_input: SparseTensor, default_value=0, validate_indices: bool = True) -> np.ndarray:
    default = cast_scalar(default_value, sp_input.dtype, "default_value")
    if validate_indices:
        check_ordered(sp_input.indices, sp_input.dense_shape, "sp_input.indices", "reorder the tensor first")
    return kernels.to_dense(sp_input.indices, sp_input.values, sp_input.dense_shape, default,
                            validate_indices)


@REGISTRY.op(
    "from_dense",
    doc="""Converts a dense tensor to a coalesced sparse one (torch's Tensor.to_sparse(sparse_dim)).
With sparse_dim < rank the result is hybrid: the trailing dimensions stay dense in the values,
and only all-zero sub-arrays are dropped.""",
    args=[Arg("tensor", DENSE, "The dense input.", layouts=("dense",)),
          Arg("sparse_dim", OPTIONAL_INT, "Number of sparse dimensions (default: all).", default=None)],
    outputs=[Output("output", "sparse", "Coalesced COO tensor.")],
)
def from_dense(tensor: np.ndarray, sparse_dim: int | None = None) -> SparseTensor:
    sparse_dim = tensor.ndim if sparse_dim is None else sparse_dim
    if tensor.ndim < 1:
        raise InvalidArgumentError("tensor must have rank at least 1 to become sparse",
                                   reason="RANK_TOO_LOW")
    if not 1 <= sparse_dim <= tensor.ndim:
        raise InvalidArgumentError(f"sparse_dim = {sparse_dim} must be between 1 and the rank "
                                   f"{tensor.ndim} of tensor", reason="AXIS_OUT_OF_RANGE")
    indices, values = kernels.from_dense(tensor, sparse_dim)
    return SparseTensor(indices=indices, values=values, dense_shape=tensor.shape, coalesced=True)
