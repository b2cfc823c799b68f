"""What the SDK accepts as a tensor: scipy.sparse, torch and TensorFlow-like objects made into
``SparseTensor`` or numpy arrays (the way back is ``SparseTensor``'s own ``to_*`` methods).

Everything here runs locally with numpy alone; scipy and torch are imported only when a
caller hands in one of their objects. Arrays are wrapped without a copy where dtype and
memory order allow.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .layouts import BLOCK_LAYOUTS
from .tensor import HandleRef, SparseTensor

__all__ = ["as_tensor", "is_tensor_like", "scipy_to_sparse", "torch_to_tensor"]


# ------------------------------------------------------------------ into SparseTensor
def as_tensor(obj: Any) -> SparseTensor | np.ndarray | HandleRef:
    """Any tensor-like the SDK accepts -> ``SparseTensor``, ``numpy.ndarray`` or ``HandleRef``."""
    if isinstance(obj, (SparseTensor, HandleRef, np.ndarray)):
        return obj
    if _is_scipy_sparse(obj):
        return scipy_to_sparse(obj)
    if _is_torch_tensor(obj):
        return torch_to_tensor(obj)
    if all(hasattr(obj, a) for a in ("indices", "values", "dense_shape")):
        # tf.sparse.SparseTensor and look-alikes: their parts expose __array__.
        return SparseTensor(indices=np.asarray(obj.indices), values=np.asarray(obj.values),
                            dense_shape=np.asarray(obj.dense_shape))
    return np.asarray(obj)


def is_tensor_like(obj: Any) -> bool:
    return (isinstance(obj, (SparseTensor, HandleRef, np.ndarray)) or _is_scipy_sparse(obj)
            or _is_torch_tensor(obj)
            or all(hasattr(obj, a) for a in ("indices", "values", "dense_shape")))


def _is_scipy_sparse(obj: Any) -> bool:
    mod = sys.modules.get("scipy.sparse")
    return mod is not None and mod.issparse(obj)


def _is_torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def scipy_to_sparse(m) -> SparseTensor:
    fmt = m.format
    shape = m.shape
    if fmt == "csr":
        return SparseTensor(layout="csr", compressed_indices=m.indptr, plain_indices=m.indices,
                            values=m.data, dense_shape=shape)
    if fmt == "csc":
        return SparseTensor(layout="csc", compressed_indices=m.indptr, plain_indices=m.indices,
                            values=m.data, dense_shape=shape)
    if fmt == "bsr":
        return SparseTensor(layout="bsr", compressed_indices=m.indptr, plain_indices=m.indices,
                            values=m.data, dense_shape=shape, blocksize=m.blocksize)
    # Any other format (coo, dia, lil, dok) via scipy's COO; newer scipy has n-D coo arrays.
    coo = m.tocoo()
    coords = getattr(coo, "coords", None) or (coo.row, coo.col)
    indices = np.stack(coords, axis=1) if len(coords) else np.zeros((coo.nnz, 0))
    return SparseTensor(indices=indices.astype(np.int64, copy=False), values=coo.data, dense_shape=shape,
                        coalesced=bool(getattr(coo, "has_canonical_format", False)))


def torch_to_tensor(t) -> SparseTensor | np.ndarray:
    import torch

    t = t.detach().cpu()
    if t.layout == torch.strided:
        return t.numpy()
    if t.layout == torch.sparse_coo:
        # Not coalescing: the service decides; _indices/_values expose the raw entries.
        return SparseTensor(indices=t._indices().numpy().T, values=t._values().numpy(),
                            dense_shape=tuple(t.shape), coalesced=t.is_coalesced())
    names = {torch.sparse_csr: ("csr", "crow_indices", "col_indices"),
             torch.sparse_csc: ("csc", "ccol_indices", "row_indices"),
             torch.sparse_bsr: ("bsr", "crow_indices", "col_indices"),
             torch.sparse_bsc: ("bsc", "ccol_indices", "row_indices")}
    layout, comp, plain = names[t.layout]
    values = t.values().numpy()
    nb = getattr(t, comp)().dim() - 1
    blocksize = tuple(values.shape[nb + 1:nb + 3]) if layout in BLOCK_LAYOUTS else None
    return SparseTensor(layout=layout, compressed_indices=getattr(t, comp)().numpy(),
                        plain_indices=getattr(t, plain)().numpy(), values=values,
                        dense_shape=tuple(t.shape), blocksize=blocksize)
