"""Conversions between ``SparseTensor`` and numpy, scipy.sparse, torch and TensorFlow-like objects.

Everything here runs locally with numpy alone; scipy and torch are imported
only when a caller hands in or asks for one of their objects. Arrays are
wrapped without a copy where dtype and memory order allow.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ._tensor import BLOCK_LAYOUTS, HandleRef, SparseTensor

__all__ = ["as_tensor", "compressed_to_coo", "sparse_to_numpy", "sparse_to_scipy",
           "sparse_to_torch", "numpy_to_sparse"]


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


def numpy_to_sparse(array: np.ndarray, sparse_dim: int | None = None) -> SparseTensor:
    """Coalesced COO of a dense array; only all-zero sub-arrays are dropped (torch's to_sparse)."""
    sparse_dim = array.ndim if sparse_dim is None else int(sparse_dim)
    lead = array.shape[:sparse_dim]
    rows = array.reshape(int(np.prod(lead, dtype=np.int64)), -1)
    keep = np.flatnonzero(np.any(rows != 0, axis=1))
    indices = np.stack(np.unravel_index(keep, lead), axis=1) if keep.size else np.zeros((0, sparse_dim))
    return SparseTensor(indices=indices.astype(np.int64), values=rows[keep].reshape(-1, *array.shape[sparse_dim:]),
                        dense_shape=array.shape, coalesced=True)


# ------------------------------------------------------------------ out of SparseTensor
def compressed_to_coo(t: SparseTensor) -> SparseTensor:
    """CSR/CSC/BSR/BSC (batched, hybrid) -> COO with indices over batch and both sparse dims."""
    nb = t.batch_ndim
    batch = t.dense_shape[:nb]
    n_batch = int(np.prod(batch, dtype=np.int64))
    # Explicit lengths: a batch dimension of 0 leaves nothing for -1 to infer from.
    ci = t.compressed_indices.reshape(n_batch, t.compressed_indices.shape[-1]).astype(np.int64)
    pi = t.plain_indices.reshape(n_batch, t.plain_indices.shape[-1]).astype(np.int64)
    nse = pi.shape[1]
    block = tuple(t.blocksize) if t.layout in BLOCK_LAYOUTS else (1, 1)
    dense_dims = t.dense_shape[nb + 2:]
    values = t.values.reshape(n_batch, nse, *block, *dense_dims)
    counts = np.diff(ci, axis=1)
    # The compressed coordinate of every stored entry, per batch.
    comp = np.concatenate([np.repeat(np.arange(counts.shape[1]), counts[b]) for b in range(n_batch)]) \
        if n_batch else np.zeros(0, np.int64)
    plain = pi.reshape(-1)
    batch_id = np.repeat(np.arange(n_batch), nse)
    block_row, block_col = (comp, plain) if t.layout in ("csr", "bsr") else (plain, comp)
    # Expand each block into its block[0] * block[1] elements.
    r_in, c_in = np.meshgrid(np.arange(block[0]), np.arange(block[1]), indexing="ij")
    rows = (block_row[:, None] * block[0] + r_in.reshape(1, -1)).reshape(-1)
    cols = (block_col[:, None] * block[1] + c_in.reshape(1, -1)).reshape(-1)
    batch_ids = np.repeat(batch_id, block[0] * block[1])
    batch_coords = np.unravel_index(batch_ids, batch) if nb else ()
    indices = np.stack([*batch_coords, rows, cols], axis=1).astype(np.int64)
    n = n_batch * nse * block[0] * block[1]
    return SparseTensor(indices=indices.reshape(n, nb + 2),
                        values=values.reshape(n, *dense_dims), dense_shape=t.dense_shape)


def sparse_to_numpy(t: SparseTensor) -> np.ndarray:
    coo = t.to_coo()
    out = np.zeros(coo.dense_shape, dtype=coo.values.dtype)
    if coo.nnz:
        key = tuple(coo.indices.T)
        if coo.values.dtype == np.bool_:
            np.logical_or.at(out, key, coo.values)
        else:
            np.add.at(out, key, coo.values)
    return out


def sparse_to_scipy(t: SparseTensor):
    import scipy.sparse as sp

    if t.layout == "bsc":
        raise ValueError("scipy.sparse has no BSC format; convert the tensor to bsr or csc first")
    if t.batch_ndim:
        raise ValueError(f"scipy.sparse holds single 2-D matrices; this {t.layout} tensor has "
                         f"{t.batch_ndim} batch dimensions (dense_shape {list(t.dense_shape)}): "
                         "convert each batch, or use to_torch()")
    if t.ndim != 2 or t.dense_ndim != 0:
        raise ValueError(f"scipy.sparse holds 2-D tensors without dense dimensions; this one has "
                         f"dense_shape {list(t.dense_shape)} with {t.dense_ndim} dense dimensions")
    if t.layout == "coo":
        return sp.coo_array((t.values, (t.indices[:, 0], t.indices[:, 1])), shape=t.dense_shape)
    if t.layout == "csr":
        return sp.csr_array((t.values, t.plain_indices, t.compressed_indices), shape=t.dense_shape)
    if t.layout == "csc":
        return sp.csc_array((t.values, t.plain_indices, t.compressed_indices), shape=t.dense_shape)
    if t.layout == "bsr":
        return sp.bsr_array((t.values, t.plain_indices, t.compressed_indices), shape=t.dense_shape,
                            blocksize=tuple(t.blocksize))
    raise ValueError(f"unknown layout {t.layout!r}")


def _to_torch_array(a: np.ndarray):
    import torch

    # Arrays decoded from the wire are read-only views of the message; torch
    # tensors are always writable, so those are copied.
    a = np.ascontiguousarray(a)
    return torch.from_numpy(a if a.flags.writeable else a.copy())


def sparse_to_torch(t: SparseTensor):
    import torch

    # torch's invariant checks are on: a SparseTensor built by hand may not have been validated.
    if t.layout == "coo":
        return torch.sparse_coo_tensor(_to_torch_array(t.indices.T), _to_torch_array(t.values),
                                       size=t.dense_shape, is_coalesced=t.coalesced or None,
                                       check_invariants=True)
    ctor = {"csr": torch.sparse_csr_tensor, "csc": torch.sparse_csc_tensor,
            "bsr": torch.sparse_bsr_tensor, "bsc": torch.sparse_bsc_tensor}[t.layout]
    return ctor(_to_torch_array(t.compressed_indices), _to_torch_array(t.plain_indices),
                _to_torch_array(t.values), size=t.dense_shape, check_invariants=True)
