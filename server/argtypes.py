"""Argument types of the op catalogue.

Each type knows its catalogue word, its JSON schema (for OpenAPI) and how to
turn a decoded wire value into what the op's ``check`` receives, raising
``InvalidArgumentError``/``UnimplementedError`` that name the argument.
Tensors are validated here (docs/contract.md, "Tensors") — the one place every
tensor argument passes before any kernel runs. A type states its own rule once:
a choice lists its words (an OpenAPI ``enum``, a ``Literal`` in the SDK, one
message), an axis is made non-negative against its tensor's rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from sparseserve.core.tensor import HandleRef, OutputRef, SparseTensor
from sparseserve.core.validate import check_dense, check_sparse
from sparseserve.core.errors import InvalidArgumentError, SparseServeError, UnimplementedError
from sparseserve.core.reasons import Reason
from sparseserve.kernels import indices_in_range

from .device import is_device_array
from .validated import read_only_tensor, is_validated, has_read_only_arrays

__all__ = ["ArgType", "SPARSE", "DENSE", "TENSOR", "TENSORS", "INT", "OPTIONAL_INT", "INT_LIST", "AXES",
           "BOOL", "FLOAT", "SCALAR", "STRING", "INDEX", "choice", "options", "axis_of", "axes_of", "normalize_axis",
           "normalize_axes"]


class Declared(Protocol):
    """What a type reads of the argument it checks (``registry.Arg``)."""

    @property
    def name(self) -> str: ...
    @property
    def layouts(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class ArgType:
    """``coerce_value(value, name)`` for plain values; tensor types check layouts too."""

    name: str
    schema: dict
    coerce_value: Callable[[Any, str], Any]
    is_tensor: bool = False
    is_tensor_list: bool = False
    # One entry per dimension (a shape, a permutation, axes): held to --max-rank.
    per_dimension: bool = False
    # A choice's words (the catalogue's "choices", OpenAPI's enum, the SDK's Literal).
    choices: tuple[str, ...] = ()
    # resolve(value, bound, name): the value made final against the other bound arguments (an
    # axis against its tensor's rank), once every argument is coerced (``OpDef.bind``).
    resolve: Callable[[Any, Mapping[str, Any], str], Any] | None = None

    def coerce(self, value: Any, arg: Declared, op: str) -> Any:
        if self.is_tensor:
            return _coerce_tensor(value, arg.name, arg.layouts, op)
        if self.is_tensor_list:
            if not isinstance(value, list):
                raise InvalidArgumentError(f"{arg.name} must be a list of tensors",
                                           reason=Reason.BAD_ARGUMENT_TYPE)
            return [_coerce_tensor(v, f"{arg.name}[{i}]", arg.layouts, op) for i, v in enumerate(value)]
        return self.coerce_value(value, arg.name)


def _layout_of(value: Any) -> str:
    return value.layout if isinstance(value, SparseTensor) else "dense"


def _coerce_tensor(value: Any, name: str, layouts: tuple[str, ...], op: str) -> Any:
    if type(value) is SparseTensor and has_read_only_arrays(value):  # as decoded from the wires: bound as it is
        if not is_validated(value):
            check_sparse(value, name, indices_in_range)
        return _in_layouts(value, name, layouts, op)
    if isinstance(value, OutputRef):  # pipelines substitute their references before binding
        raise InvalidArgumentError(f"{name} names the pipeline output {value.ref!r}; such references "
                                   "work only in pipeline steps", reason=Reason.BAD_REF)
    if isinstance(value, HandleRef):  # the service resolves handles before binding
        raise InvalidArgumentError(f"{name}: handle {value.handle!r} was not resolved",
                                   reason=Reason.BAD_HANDLE)
    if isinstance(value, (list, int, float, bool)) and "dense" in layouts:
        try:
            value = np.asarray(value)
        except ValueError as exc:
            raise InvalidArgumentError(f"{name} is not a regular array: {exc}",
                                       reason=Reason.BAD_ARGUMENT_TYPE) from None
    device_array = is_device_array(value)  # a dense tensor a GPU worker keeps: checked when stored
    if not (device_array or isinstance(value, (SparseTensor, np.ndarray))):
        raise InvalidArgumentError(f"{name} must be a tensor, not {type(value).__name__}",
                                   reason=Reason.BAD_ARGUMENT_TYPE)
    # Validate first: a malformed tensor is INVALID_ARGUMENT whatever its layout.
    if not (device_array or (isinstance(value, SparseTensor) and is_validated(value))):
        if isinstance(value, SparseTensor):
            check_sparse(value, name, indices_in_range)
        else:
            check_dense(value, name)
        if not (isinstance(value, SparseTensor) and has_read_only_arrays(value)):
            value = read_only_tensor(value)
    return _in_layouts(value, name, layouts, op)


def _in_layouts(value: Any, name: str, layouts: tuple[str, ...], op: str) -> Any:
    layout = _layout_of(value)
    if layout not in layouts:
        raise UnimplementedError(
            f"{op} does not support layout {layout} for {name}; it accepts "
            f"{', '.join(layouts)}", reason=Reason.UNSUPPORTED_LAYOUT)
    return value


def _scalar_of_array(value: Any, name: str) -> Any:
    if isinstance(value, np.ndarray):
        if value.ndim != 0:
            raise InvalidArgumentError(f"{name} must be a scalar, got an array of shape "
                                       f"{list(value.shape)}", reason=Reason.BAD_ARGUMENT_TYPE)
        return value[()]
    return value


def _coerce_int(value: Any, name: str) -> int:
    value = _scalar_of_array(value, name)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentError(f"{name} must be an integer, not {value!r}",
                                   reason=Reason.BAD_ARGUMENT_TYPE)
    return int(value)


def _coerce_int_list(value: Any, name: str) -> list[int]:
    if isinstance(value, np.ndarray):
        value = value.tolist() if value.ndim == 1 else value
    if not isinstance(value, list):
        raise InvalidArgumentError(f"{name} must be a list of integers", reason=Reason.BAD_ARGUMENT_TYPE)
    return [_coerce_int(v, f"{name}[{i}]") for i, v in enumerate(value)]


def _coerce_float(value: Any, name: str) -> float:
    value = _scalar_of_array(value, name)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidArgumentError(f"{name} must be a real number, not {value!r}",
                                   reason=Reason.BAD_ARGUMENT_TYPE)
    return float(value)


def _coerce_string(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{name} must be a string, not {value!r}", reason=Reason.BAD_ARGUMENT_TYPE)
    return value


def _coerce_index(value: Any, name: str) -> list[int | slice]:
    """PyTorch-style indexing: each item an int, or a [start, stop, step] slice (null for a default)."""
    if not isinstance(value, list):
        raise InvalidArgumentError(f"{name} must be a list of ints and [start, stop, step] slices",
                                   reason=Reason.BAD_ARGUMENT_TYPE)
    out: list[int | slice] = []
    for i, item in enumerate(value):
        if isinstance(item, list):
            if len(item) != 3:
                raise InvalidArgumentError(f"{name}[{i}] must be [start, stop, step]",
                                           reason=Reason.BAD_ARGUMENT_TYPE)
            parts = [None if p is None else _coerce_int(p, f"{name}[{i}][{j}]") for j, p in enumerate(item)]
            out.append(slice(*parts))
        else:
            out.append(_coerce_int(item, f"{name}[{i}]"))
    return out


def _coerce_bool(value: Any, name: str) -> bool:
    value = _scalar_of_array(value, name)
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidArgumentError(f"{name} must be true or false, not {value!r}",
                                   reason=Reason.BAD_ARGUMENT_TYPE)
    return bool(value)


def _coerce_scalar(value: Any, name: str) -> Any:
    value = _scalar_of_array(value, name)
    if not isinstance(value, (bool, int, float, complex, np.generic)) or isinstance(value, (np.str_, np.bytes_)):
        raise InvalidArgumentError(f"{name} must be a number, not {value!r}",
                                   reason=Reason.BAD_ARGUMENT_TYPE)
    return value


def _coerce_axes(value: Any, name: str) -> list[int]:
    """An int or a list of ints (a numpy vector too); one int means a one-axis list."""
    if isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim == 1):
        return _coerce_int_list(list(value) if isinstance(value, tuple) else value, name)
    return [_coerce_int(value, name)]


_TENSOR_SCHEMA = {"$ref": "#/components/schemas/Tensor"}
_INT_OR_NULL = {"type": ["integer", "null"]}

# Tensor types: which layouts are accepted is the argument's `layouts`.
SPARSE = ArgType("sparse", _TENSOR_SCHEMA, lambda v, n: v, is_tensor=True)
DENSE = ArgType("dense", _TENSOR_SCHEMA, lambda v, n: v, is_tensor=True)
TENSOR = ArgType("tensor", _TENSOR_SCHEMA, lambda v, n: v, is_tensor=True)
TENSORS = ArgType("tensors", {"type": "array", "items": _TENSOR_SCHEMA}, lambda v, n: v,
                  is_tensor_list=True)
INT = ArgType("int", {"type": "integer"}, _coerce_int)
OPTIONAL_INT = ArgType("int?", _INT_OR_NULL, _coerce_int)
INT_LIST = ArgType("int_list", {"type": "array", "items": {"type": "integer"}}, _coerce_int_list,
                   per_dimension=True)
# An int, a list of ints, or null (every axis): TensorFlow's reduction `axis`.
AXES = ArgType("int_list?", {"oneOf": [{"type": "integer"}, {"type": "array", "items": {"type": "integer"}},
                                       {"type": "null"}]}, _coerce_axes, per_dimension=True)
BOOL = ArgType("bool", {"type": "boolean"}, _coerce_bool)
FLOAT = ArgType("float", {"type": "number"}, _coerce_float)
STRING = ArgType("string", {"type": "string"}, _coerce_string)
INDEX = ArgType("index", {"type": "array", "items": {"oneOf": [
    {"type": "integer"}, {"type": "array", "items": _INT_OR_NULL, "minItems": 3, "maxItems": 3}]}},
    _coerce_index, per_dimension=True)
SCALAR = ArgType("scalar", {"oneOf": [{"type": "number"}, {"type": "boolean"}, _TENSOR_SCHEMA]},
                 _coerce_scalar)


# ------------------------------------------------------------------ choices
def choice(*words: str, reason: Reason, aliases: Mapping[str, str] | None = None, fold_case: bool = False,
           hint: str = "", explain: Callable[[str, str], SparseServeError | None] | None = None) -> ArgType:
    """A string that must be one of ``words`` (or one of ``aliases``, which name a word): the
    canonical word is what ``check`` receives. ``fold_case`` takes any case. Anything else is
    INVALID_ARGUMENT with ``reason``, the message naming every word (and ``hint``, what to do
    instead), unless ``explain(value, name)`` has a better error for it (map_values names what
    a function does to zero)."""
    aliases = dict(aliases or {})

    def coerce(value: Any, name: str) -> str:
        text = _coerce_string(value, name)
        key = text.lower() if fold_case else text
        key = aliases.get(key, key)
        if key in words:
            return key
        better = explain(text, name) if explain is not None else None
        if better is not None:
            raise better
        raise InvalidArgumentError(f"{name} must be one of {', '.join(words)}, not {text!r}"
                                   + (f"; {hint}" if hint else ""), reason=reason)

    accepted = (*words, *sorted(aliases))
    return ArgType("string", {"type": "string", "enum": list(accepted)}, coerce, choices=accepted)


# ------------------------------------------------------------------ options
def options(keys: tuple[str, ...], normalize: Callable[[Any, str], Any]) -> ArgType:
    """A JSON object of named options, or null (an OpenAPI object, a ``dict[str, Any]`` in the
    SDK, a map on gRPC): any key outside ``keys`` is refused here, then ``normalize(value, name)``
    checks each option's value by its own rule (the message naming the option and the rule,
    INVALID_ARGUMENT) and returns what ``check`` receives (it is given null too)."""
    def coerce(value: Any, name: str) -> Any:
        if value is not None and not isinstance(value, dict):
            raise InvalidArgumentError(f"{name} must be an object of options ({', '.join(keys)}) or null, not "
                                       f"{value!r}", reason=Reason.BAD_ARGUMENT_TYPE)
        return normalize(value, name)

    schema = {"type": ["object", "null"], "properties": {key: {} for key in keys}, "additionalProperties": False}
    return ArgType("options", schema, coerce)


# ------------------------------------------------------------------ axes
def normalize_axis(axis: int, rank: int, name: str = "axis", *, what: str = "a tensor", extra: int = 0) -> int:
    """``axis`` made non-negative: -(rank + extra) <= axis < rank + extra, else INVALID_ARGUMENT
    (AXIS_OUT_OF_RANGE). ``extra`` = 1 for a position between dimensions (expand_dims)."""
    n = rank + extra
    if not -n <= axis < n:
        raise InvalidArgumentError(f"{name} = {axis} is out of range for {what} of rank {rank}: it must be in "
                                   f"[{-n}, {n - 1}]", reason=Reason.AXIS_OUT_OF_RANGE)
    return axis + n if axis < 0 else axis


def normalize_axes(axes: list[int] | None, rank: int, name: str = "axis", *, what: str = "a tensor") -> list[int]:
    """Sorted non-negative axes, each named once (an axis named twice, 1 and -1 of a matrix too,
    counts once, as TensorFlow's reductions have it); None means every axis."""
    if axes is None:
        return list(range(rank))
    return sorted({normalize_axis(a, rank, f"{name}[{i}]", what=what) for i, a in enumerate(axes)})


def _rank(value: Any) -> int | None:
    """The rank of a bound tensor argument (the first of a list), None when there is none."""
    if isinstance(value, list):
        value = value[0] if value else None
    if value is None:
        return None
    return len(value.dense_shape) if isinstance(value, SparseTensor) else int(np.ndim(value))


def axis_of(tensor: str, *, extra: int = 0) -> ArgType:
    """An axis (int) of the tensor argument ``tensor``, made non-negative when the call binds
    (``normalize_axis``); ``extra`` = 1 for a position between dimensions."""
    def resolve(value: Any, bound: Mapping[str, Any], name: str) -> Any:
        rank = _rank(bound.get(tensor))
        if value is None or rank is None:
            return value
        return normalize_axis(value, rank, name, what=tensor, extra=extra)

    return ArgType("int", {"type": "integer"}, _coerce_int, resolve=resolve)


def axes_of(tensor: str) -> ArgType:
    """Axes of ``tensor`` (an int, a list of ints, or null for every axis) as a sorted list of
    distinct non-negative axes when the call binds (``normalize_axes``)."""
    def resolve(value: Any, bound: Mapping[str, Any], name: str) -> Any:
        rank = _rank(bound.get(tensor))
        return value if rank is None else normalize_axes(value, rank, name, what=tensor)

    return ArgType(AXES.name, AXES.schema, _coerce_axes, per_dimension=True, resolve=resolve)
