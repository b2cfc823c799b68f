"""Moving tensors between layouts inside the server, for ops declared on several.

Op modules call these instead of converting by hand, so one place decides how
each layout pair is converted (and later, how fast).
"""

from __future__ import annotations

import numpy as np

from sparseserve._convert import compressed_to_coo
from sparseserve._tensor import SparseTensor
from sparseserve import kernels

__all__ = ["SPARSE_LAYOUTS", "as_coo", "as_csr"]

SPARSE_LAYOUTS = ("coo", "csr", "csc", "bsr", "bsc")


def as_coo(t: SparseTensor) -> SparseTensor:
    """Any sparse layout -> COO over the same dense_shape (batch dimensions of a compressed
    tensor become leading sparse dimensions; its dense dimensions stay dense)."""
    return t if t.layout == "coo" else compressed_to_coo(t)


def as_csr(t: SparseTensor) -> SparseTensor:
    """A tensor with exactly two sparse dimensions and no batch -> CSR with int64 indices,
    rows in order and columns ascending within each row (duplicates kept, not summed)."""
    if t.layout == "csr":
        return t
    coo = as_coo(t)
    if coo.indices.shape[1] != 2:
        raise ValueError(f"as_csr needs two sparse dimensions, not {coo.indices.shape[1]}")
    indices, values = kernels.reorder(coo.indices, coo.values, coo.dense_shape[:2])
    counts = np.bincount(indices[:, 0], minlength=coo.dense_shape[0])
    crow = np.zeros(coo.dense_shape[0] + 1, np.int64)
    np.cumsum(counts, out=crow[1:])
    return SparseTensor(layout="csr", compressed_indices=crow, plain_indices=indices[:, 1].copy(),
                        values=values, dense_shape=coo.dense_shape)
