"""Small helpers the op modules share (as scipy.sparse has ``_sputils``): shapes, sizes and index
dtypes, each written once. Layout conversions are ``_layouts``'; axes are the argument types'
(``argtypes.axis_of``, ``normalize_axis``)."""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from sparseserve.core.tensor import SparseTensor

__all__ = ["INT32_MAX", "prod", "shape_of", "index_dtype", "layout_of"]

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
