"""Small helpers the op modules share (as scipy.sparse has ``_sputils``): shapes, sizes and index
dtypes, each written once. Layout conversions are ``_layouts``'; axes are the argument types'
(``argtypes.axis_of``, ``normalize_axis``)."""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from sparseserve.core.tensor import SparseTensor
from sparseserve.kernels import linalg as lk

__all__ = ["INT32_MAX", "prod", "shape_of", "index_dtype", "layout_of", "product_dtype", "as_product_dtype",
           "torch_result_type"]

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


# ------------------------------------------------------------------ result dtypes
# Two rules, each its library's: the ops named after TensorFlow's (mul, div, add, ...) take
# numpy's result_type of their operands (TensorFlow asks for equal dtypes, which it keeps); the
# ones named after PyTorch's (multiply) take torch's promotion, below.
_CATEGORY = {"b": 0, "i": 1, "u": 1, "f": 2, "c": 3}


def _promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """torch.promote_types: within a category as numpy; across, the higher category wins
    (float16 * int64 is float16), complex taking the precision of a wider float."""
    ca, cb = _CATEGORY[a.kind], _CATEGORY[b.kind]
    if ca == cb or {ca, cb} == {2, 3}:
        return np.result_type(a, b)
    return a if ca > cb else b


def _complex_of(dtype: np.dtype) -> np.dtype:
    return np.result_type(dtype, np.complex64)


def torch_result_type(a, b) -> np.dtype:
    """torch.result_type of two tensors: a 0-dim dense operand is a scalar whose dtype counts
    only where its category is higher than the other operand's (int32 * 0-dim float64 is
    float64, float32 * 0-dim float64 is float32, float32 * 0-dim complex128 is complex64)."""
    dims = [np.dtype(t.dtype) for t in (a, b) if isinstance(t, SparseTensor) or t.ndim]
    zeros = [np.dtype(t.dtype) for t in (a, b) if not (isinstance(t, SparseTensor) or t.ndim)]
    dim = dims[0] if len(dims) == 1 else _promote(*dims)
    if not zeros:
        return dim
    zero = zeros[0]
    cd, cz = _CATEGORY[dim.kind], _CATEGORY[zero.kind]
    if cd == 3:
        return dim
    if cz == 3:
        return _complex_of(dim) if cd == 2 else zero
    if cd == 2:
        return dim
    if cd == 0 or cz == 2:
        return _promote(dim, zero)
    return dim
