"""Small helpers shared by op declarations."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from sparseserve.core.tensor import SparseTensor, coo_tensor
from sparseserve.core.errors import InvalidArgumentError
from sparseserve.core.reasons import Reason


def cast_scalar(value: Any, dtype: np.dtype, name: str) -> Any:
    """``value`` as a scalar of ``dtype``, refusing casts that change it (1.5 to int, 300 to int8)."""
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cast = np.asarray(value).astype(dtype)[()]
            back = np.asarray(cast).astype(np.asarray(value).dtype)[()]
    except (TypeError, ValueError, OverflowError):
        cast, back = None, None
    same = back == value or (np.isnan(value) if isinstance(value, (float, np.floating)) else False)
    if cast is None or not bool(same):
        raise InvalidArgumentError(f"{name} = {value!r} cannot be represented as {dtype.name}",
                                   reason=Reason.SCALAR_DTYPE)
    return cast


def coo(indices: np.ndarray, values: np.ndarray, like: SparseTensor, *, coalesced: bool) -> SparseTensor:
    return coo_tensor(indices, values, like.dense_shape, coalesced=coalesced)


def check_ordered(indices: np.ndarray, dense_shape, name: str, remedy: str) -> None:
    """validate_indices: row-major order and no repeats, or INVALID_ARGUMENT naming the entry."""
    from sparseserve import kernels

    position, repeated = kernels.first_disorder(indices, dense_shape)
    if position < 0:
        return
    index = indices[position].tolist()
    if repeated:
        raise InvalidArgumentError(f"{name}[{position}] = {index} is repeated", reason=Reason.INDICES_REPEATED)
    raise InvalidArgumentError(f"{name}[{position}] = {index} is out of order; {remedy} or pass "
                               "validate_indices=false", reason=Reason.INDICES_UNSORTED)
