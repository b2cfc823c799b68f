"""Numba CPU kernels of sparseserve. Every function assumes validated input
(``sparseserve._validate`` runs first) and never raises."""

from __future__ import annotations

import numpy as np

from ._sort import argsort_stable, linearize
from .coo import coalesce, first_disorder, from_dense, reorder, to_dense

__all__ = ["linearize", "argsort_stable", "reorder", "coalesce", "first_disorder", "to_dense",
           "from_dense", "warm_up"]

_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float16", "float32", "float64", "complex64", "complex128")


def warm_up() -> None:
    """Run every kernel once per dtype so numba compiles, or loads from its disk cache, now."""
    indices = np.array([[1, 0], [0, 1], [1, 0]], dtype=np.int64)
    shape = (2, 2)
    for name in _DTYPES:
        values = np.ones(3, dtype=name)
        reorder(indices, values, shape)
        coalesce(indices, values, shape)
        first_disorder(indices, shape)
        dense = to_dense(indices, values, shape, values[0], False)
        from_dense(dense, 2)
