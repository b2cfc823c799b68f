"""The dtypes of docs/contract.md ("Tensors"), in one table.

Named as numpy names them; the proto enum value is the upper-cased name, so the
table cannot drift from ``sparseserve.v1.DType``.
"""

from __future__ import annotations

import numpy as np
from .reasons import Reason

DTYPE_NAMES: tuple[str, ...] = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
)
_BY_NAME = {name: np.dtype(name) for name in DTYPE_NAMES}
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
# Native-order dtypes map to themselves; others go through the full check.
_SUPPORTED_NATIVE = {dtype: dtype for dtype in _BY_NAME.values()}


def dtype_from_name(name: str, *, argument: str = "dtype") -> np.dtype:
    """The numpy dtype for a dtype name of docs/contract.md; ``InvalidArgumentError`` names the argument otherwise."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        from .errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"{argument} = {name!r} is not a supported dtype; expected one of {', '.join(DTYPE_NAMES)}",
            reason=Reason.BAD_DTYPE,
        ) from None


def check_supported(dtype: np.dtype, argument: str) -> np.dtype:
    """The native-order dtype if it is one of the contract's; ``InvalidArgumentError`` otherwise."""
    native = _SUPPORTED_NATIVE.get(dtype)  # the common case: a dict lookup per array
    if native is not None:
        return native
    native = np.dtype(dtype).newbyteorder("=")
    if native.name not in _BY_NAME:
        from .errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"{argument} has dtype {np.dtype(dtype)}, which is not supported; expected one of "
            f"{', '.join(DTYPE_NAMES)}",
            reason=Reason.BAD_DTYPE,
        )
    return native
