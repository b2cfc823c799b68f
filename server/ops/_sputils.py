"""Small helpers the op modules share (as scipy.sparse has ``_sputils``): shapes, sizes and index
dtypes, each written once. Layout conversions are ``_layouts``'; axes are the argument types'
(``argtypes.axis_of``, ``normalize_axis``)."""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from sparseserve.core.tensor import SparseTensor
from sparseserve.kernels import linalg as lk

__all__ = ["INT32_MAX", "prod", "shape_of", "index_dtype", "layout_of", "product_dtype", "as_product_dtype"]

INT32_MAX = int(np.iinfo(np.int32).max)


def prod(dims: Iterable[Any]) -> int:
    """The product of ``dims`` as a Python int (exact: no int64 overflow)."""
    out = 1
    for d in dims:
        out *= int(d)
    return out


def shape_of(t: Any) -> list[int]:
    """A tensor's shape as a list of ints: a sparse tensor's dense_shape, an array's shape (or a
    shape given as it is)."""
    if isinstance(t, SparseTensor):
        return [int(d) for d in t.dense_shape]
    return [int(d) for d in (t.shape if hasattr(t, "shape") else t)]


def layout_of(t: Any) -> str:
    """"dense" for an array, else the sparse tensor's layout."""
    return t.layout if isinstance(t, SparseTensor) else "dense"


def index_dtype(wanted: Any, *limits: int) -> np.dtype:
    """The index dtype ``wanted``, or int64 where int32 cannot hold ``limits`` (the result's entry
    count and dimensions), as PyTorch widens a compressed tensor's indices."""
    dtype = np.dtype(wanted)
    return np.dtype(np.int64) if dtype == np.int32 and max(limits, default=0) > INT32_MAX else dtype


def product_dtype(dtype: Any) -> np.dtype:
    """The dtype the product kernels (``kernels.linalg``: matmul, hspmm's SpMM) run ``dtype`` in:
    one of ``COMPUTE_DTYPES`` as it is, float16 in float32, narrower integers and uint64 in int64
    (they wrap identically there). bool is the ops' to refuse first."""
    dtype = np.dtype(dtype)
    if dtype.name in lk.COMPUTE_DTYPES:
        return dtype
    return np.dtype(np.float32) if dtype == np.float16 else np.dtype(np.int64)


def as_product_dtype(a: np.ndarray, dtype: Any = None) -> np.ndarray:
    """``a`` contiguous in the ``product_dtype`` of ``dtype`` (default: its own), uint64
    reinterpreted as int64 rather than converted."""
    a = np.ascontiguousarray(a)
    if a.dtype == np.uint64:
        return a.view(np.int64)
    return a.astype(product_dtype(a.dtype if dtype is None else dtype), copy=False)
