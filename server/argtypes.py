"""Argument types of the op catalogue.

Each type knows its catalogue word, its JSON schema (for OpenAPI) and how to
turn a decoded wire value into what the kernel function receives, raising
``InvalidArgumentError``/``UnimplementedError`` that name the argument.
Tensors are validated here (SPEC section 2) — the one place every tensor
argument passes before any kernel runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from sparseserve._tensor import HandleRef, SparseTensor
from sparseserve._validate import check_dense, check_sparse
from sparseserve.errors import InvalidArgumentError, UnimplementedError

if TYPE_CHECKING:
    from .registry import Arg

__all__ = ["ArgType", "SPARSE", "DENSE", "INT", "OPTIONAL_INT", "BOOL", "SCALAR"]


@dataclass(frozen=True)
class ArgType:
    name: str
    schema: dict
    coerce_value: Callable[[Any, str], Any]
    is_tensor: bool = False

    def coerce(self, value: Any, arg: "Arg", op: str) -> Any:
        if self.is_tensor:
            return _coerce_tensor(value, arg, op, self)
        return self.coerce_value(value, arg.name)


def _layout_of(value: Any) -> str:
    return value.layout if isinstance(value, SparseTensor) else "dense"


def _coerce_tensor(value: Any, arg: "Arg", op: str, kind: ArgType) -> Any:
    if isinstance(value, HandleRef):  # the service resolves handles before binding
        raise InvalidArgumentError(f"{arg.name}: handle {value.handle!r} was not resolved",
                                   reason="BAD_HANDLE")
    if isinstance(value, (list, int, float, bool)) and "dense" in arg.layouts:
        value = np.asarray(value)
    if not isinstance(value, (SparseTensor, np.ndarray)):
        raise InvalidArgumentError(f"{arg.name} must be a tensor, not {type(value).__name__}",
                                   reason="BAD_ARGUMENT_TYPE")
    # Validate first: a malformed tensor is INVALID_ARGUMENT whatever its layout.
    if isinstance(value, SparseTensor):
        check_sparse(value, arg.name)
    else:
        check_dense(value, arg.name)
    layout = _layout_of(value)
    if layout not in arg.layouts:
        raise UnimplementedError(
            f"{op} does not support layout {layout} for {arg.name}; it accepts "
            f"{', '.join(arg.layouts)}", reason="UNSUPPORTED_LAYOUT")
    return value


def _scalar_of_array(value: Any, name: str) -> Any:
    if isinstance(value, np.ndarray):
        if value.ndim != 0:
            raise InvalidArgumentError(f"{name} must be a scalar, got an array of shape "
                                       f"{list(value.shape)}", reason="BAD_ARGUMENT_TYPE")
        return value[()]
    return value


def _coerce_int(value: Any, name: str) -> int:
    value = _scalar_of_array(value, name)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentError(f"{name} must be an integer, not {value!r}",
                                   reason="BAD_ARGUMENT_TYPE")
    return int(value)


def _coerce_bool(value: Any, name: str) -> bool:
    value = _scalar_of_array(value, name)
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidArgumentError(f"{name} must be true or false, not {value!r}",
                                   reason="BAD_ARGUMENT_TYPE")
    return bool(value)


def _coerce_scalar(value: Any, name: str) -> Any:
    value = _scalar_of_array(value, name)
    if not isinstance(value, (bool, int, float, complex, np.generic)) or isinstance(value, (np.str_, np.bytes_)):
        raise InvalidArgumentError(f"{name} must be a number, not {value!r}",
                                   reason="BAD_ARGUMENT_TYPE")
    return value


_TENSOR_SCHEMA = {"$ref": "#/components/schemas/Tensor"}

SPARSE = ArgType("sparse", _TENSOR_SCHEMA, lambda v, n: v, is_tensor=True)
DENSE = ArgType("dense", _TENSOR_SCHEMA, lambda v, n: v, is_tensor=True)
INT = ArgType("int", {"type": "integer"}, _coerce_int)
OPTIONAL_INT = ArgType("int?", {"type": ["integer", "null"]}, _coerce_int)
BOOL = ArgType("bool", {"type": "boolean"}, _coerce_bool)
SCALAR = ArgType("scalar", {"oneOf": [{"type": "number"}, {"type": "boolean"}, _TENSOR_SCHEMA]},
                 _coerce_scalar)
