"""Element-wise ops: with_values, retain, mul, div, add, map_values.

Arguments follow TensorFlow (tf.SparseTensor.with_values, tf.sparse.retain,
SparseDenseCwiseMul/Div behind SparseTensor.__mul__/__div__, tf.sparse.add,
tf.sparse.map_values). Every shape rule a kernel relies on is checked here
first. Result dtypes of two-operand ops are numpy's ``result_type`` of the two
operands' dtypes (TensorFlow requires equal dtypes; with equal dtypes the
result is that dtype).
"""

from __future__ import annotations

import math

import numpy as np

from sparseserve._tensor import SparseTensor
from sparseserve.errors import InvalidArgumentError, UnimplementedError
from sparseserve.kernels import arrays as ka
from sparseserve.kernels import elementwise as ek

from ..argtypes import DENSE, FLOAT, SPARSE, STRING, TENSOR
from ..device import Fallback
from ..partition import Rowwise
from ..registry import REGISTRY, Arg, Output
from . import _gpu

SP_INPUT = Arg("sp_input", SPARSE, "The input sparse tensor (COO).")


def _same_structure(sp_input: SparseTensor, values: np.ndarray) -> SparseTensor:
    return SparseTensor(indices=sp_input.indices, values=values, dense_shape=sp_input.dense_shape,
                        coalesced=sp_input.coalesced)


def _shape(shape) -> list[int]:
    return [int(d) for d in shape]


# ------------------------------------------------------------------ with_values
@REGISTRY.op(
    "with_values",
    doc="""Returns sp_input with its values replaced by new_values (tf.SparseTensor.with_values).
Indices and dense_shape are unchanged; new_values must have exactly the shape of sp_input.values,
[nnz, *dense_shape[sparse_ndim:]], and may have any dtype (the result takes it).""",
    args=[SP_INPUT,
          Arg("new_values", DENSE, "The new values, shape [nnz, *dense dims].", layouts=("dense",))],
    outputs=[Output("output", "sparse", "Same indices and shape, new values.")],
)
def with_values(sp_input: SparseTensor, new_values: np.ndarray) -> SparseTensor:
    want = (sp_input.nnz, *sp_input.dense_shape[sp_input.sparse_ndim:])
    if tuple(new_values.shape) != want:
        raise InvalidArgumentError(
            f"new_values has shape {_shape(new_values.shape)}, but sp_input.values has shape "
            f"{_shape(want)}; they must be equal", reason="VALUES_SHAPE_MISMATCH")
    return _same_structure(sp_input, np.array(new_values, copy=True))


def _with_values_on_gpu(sp_input, new_values, **_) -> str | None:
    want = (sp_input.nnz, *sp_input.dense_shape[sp_input.sparse_ndim:])
    if tuple(new_values.shape) != want:
        return "shape"
    return None if _gpu.native(sp_input, new_values) else "dtype"


@REGISTRY.gpu("with_values", supports=_with_values_on_gpu)
@_gpu.quiet
def with_values_gpu(be, sp_input: SparseTensor, new_values) -> SparseTensor:
    return _gpu.same_structure(sp_input, be.xp.array(new_values, copy=True))


# ----------------------------------------------------------------------- retain
@REGISTRY.op(
    "retain",
    doc="""Keeps the entries of sp_input where to_retain is true (tf.sparse.retain).
to_retain is a bool vector with one element per stored entry (length nnz); the kept entries keep
their order, so a coalesced input stays coalesced. The shape is unchanged.""",
    args=[SP_INPUT,
          Arg("to_retain", DENSE, "bool [nnz]: which entries to keep.", layouts=("dense",))],
    outputs=[Output("output", "sparse", "The retained entries, same dense_shape.")],
)
def retain(sp_input: SparseTensor, to_retain: np.ndarray) -> SparseTensor:
    if to_retain.dtype != np.bool_:
        raise InvalidArgumentError(f"to_retain has dtype {to_retain.dtype}; it must be bool",
                                   reason="BAD_DTYPE")
    if to_retain.ndim != 1 or to_retain.shape[0] != sp_input.nnz:
        raise InvalidArgumentError(
            f"to_retain has shape {_shape(to_retain.shape)}; it must be [{sp_input.nnz}], one flag per "
            "entry of sp_input", reason="SHAPE_MISMATCH")
    keep = np.flatnonzero(to_retain)
    return SparseTensor(indices=sp_input.indices[keep], values=sp_input.values[keep],
                        dense_shape=sp_input.dense_shape, coalesced=sp_input.coalesced)


# -------------------------------------------------------------------- mul / div
def _check_broadcast(sp_input: SparseTensor, dense: np.ndarray) -> None:
    shape = tuple(sp_input.dense_shape)
    ok = dense.ndim <= len(shape) and all(
        d == 1 or d == s for d, s in zip(reversed(dense.shape), reversed(shape)))
    if not ok:
        raise InvalidArgumentError(
            f"dense has shape {_shape(dense.shape)}, which does not broadcast to sp_input.dense_shape "
            f"{list(shape)} (only the dense side is broadcast)", reason="SHAPE_MISMATCH")


def _cwise(sp_input: SparseTensor, dense: np.ndarray):
    _check_broadcast(sp_input, dense)
    dtype = np.result_type(sp_input.dtype, dense.dtype)
    operand = ek.gather_operand(sp_input.indices, dense, sp_input.ndim)
    return dtype, operand


_CWISE_DOC = """The dense operand is broadcast (numpy rules) to sp_input's shape, never the other way
(a dense that would enlarge the result is INVALID_ARGUMENT). Only stored entries are computed: the
result has sp_input's indices (unsorted or repeated ones included, each computed on its own), and
implicit zeros stay implicit whatever the dense holds (inf, nan). Hybrid values broadcast over their
dense dimensions too. Result dtype: numpy's result_type of the two dtypes."""


@REGISTRY.op(
    "mul",
    doc="Multiplies the stored entries of sp_input by a dense tensor (SparseDenseCwiseMul, "
        "SparseTensor.__mul__).\n" + _CWISE_DOC + "\nFor bool the product is logical and; "
        "integers wrap as numpy's do.",
    args=[SP_INPUT,
          Arg("dense", DENSE, "Dense operand, broadcastable to sp_input.dense_shape.",
              layouts=("dense",))],
    outputs=[Output("output", "sparse", "sp_input's indices with the products.")],
)
def mul(sp_input: SparseTensor, dense: np.ndarray) -> SparseTensor:
    _check_broadcast(sp_input, dense)
    fused = ek.multiply_stored(sp_input.indices, sp_input.values, dense, sp_input.ndim)
    if fused is not None:
        return _same_structure(sp_input, fused)
    dtype, operand = _cwise(sp_input, dense)
    return _same_structure(sp_input, ek.multiply(sp_input.values, operand, dtype))


@REGISTRY.op(
    "div",
    doc="Divides the stored entries of sp_input by a dense tensor (SparseDenseCwiseDiv, "
        "SparseTensor.__div__).\n" + _CWISE_DOC + "\nFloating and complex division follow IEEE "
        "(x/0 is inf or nan). Integer division truncates toward zero (C and TensorFlow, not numpy's "
        "floor; INT_MIN / -1 wraps), and a zero divisor at a stored entry is INVALID_ARGUMENT "
        "(DIVISION_BY_ZERO). bool / bool is UNIMPLEMENTED.",
    args=[SP_INPUT,
          Arg("dense", DENSE, "Dense divisor, broadcastable to sp_input.dense_shape.",
              layouts=("dense",))],
    outputs=[Output("output", "sparse", "sp_input's indices with the quotients.")],
)
def div(sp_input: SparseTensor, dense: np.ndarray) -> SparseTensor:
    dtype = np.result_type(sp_input.dtype, dense.dtype)
    if dtype == np.bool_:
        raise UnimplementedError("div does not support bool / bool; cast the values to a number type",
                                 reason="UNSUPPORTED_DTYPE")
    dtype, operand = _cwise(sp_input, dense)
    if dtype.kind in "iu":
        pos = ek.first_zero(operand, sp_input.values.shape)
        if pos is not None:
            entry, inner = pos[0], pos[1:]
            index = sp_input.indices[entry].tolist() + list(inner)
            raise InvalidArgumentError(
                f"integer division by zero: dense (broadcast to sp_input.dense_shape) is 0 at {index} (stored entry "
                f"sp_input.indices[{entry}] = {sp_input.indices[entry].tolist()})",
                reason="DIVISION_BY_ZERO")
    return _same_structure(sp_input, ek.divide(sp_input.values, operand, dtype))


# mul and div on the GPU: the dense operand's row for each entry is gathered by its broadcast
# key (the CPU's gather_operand), then numpy's arithmetic rules over the device arrays. Complex
# division runs on the CPU (CUDA's complex quotient rounds and treats inf/nan differently from
# numpy's), as do integer divisions by zero (the CPU kernel names the entry).
def _cwise_on_gpu(sp_input, dense, **_) -> str | None:
    if _gpu.refused(_check_broadcast, sp_input, dense):
        return "shape"
    return None if _gpu.native(sp_input, dense) else "dtype"


def _div_on_gpu(sp_input, dense, **_) -> str | None:
    dtype = np.result_type(sp_input.dtype, dense.dtype)
    if dtype == np.bool_ or dtype.kind == "c":
        return "dtype"
    return _cwise_on_gpu(sp_input, dense)


def _gather_operand_gpu(xp, sp_input: SparseTensor, dense):
    """The CPU's ek.gather_operand over device arrays: dense's row at each entry's broadcast
    index, ``[nnz, *padded dense shape[sparse_ndim:]]``."""
    s = sp_input.sparse_ndim
    shape = ek.padded_shape(dense.shape, sp_input.ndim)
    lead, inner = shape[:s], shape[s:]
    rows = xp.ascontiguousarray(dense).reshape((int(np.prod(lead, dtype=np.int64)), *inner))
    indices = sp_input.indices
    keys = xp.zeros(int(indices.shape[0]), dtype=xp.int64)
    for j, d in enumerate(lead):
        keys = keys * int(d) + (0 if d == 1 else indices[:, j])
    return rows[keys]


@REGISTRY.gpu("mul", supports=_cwise_on_gpu)
@_gpu.quiet
def mul_gpu(be, sp_input: SparseTensor, dense) -> SparseTensor:
    xp = be.xp
    dtype = np.result_type(sp_input.dtype, dense.dtype)
    operand = _gather_operand_gpu(xp, sp_input, dense)
    if dtype == np.bool_:
        out = xp.logical_and(sp_input.values, operand)
    else:
        out = xp.multiply(sp_input.values, operand, dtype=dtype)
    return _gpu.same_structure(sp_input, out)


@REGISTRY.gpu("div", supports=_div_on_gpu)
@_gpu.quiet
def div_gpu(be, sp_input: SparseTensor, dense) -> SparseTensor:
    xp = be.xp
    dtype = np.result_type(sp_input.dtype, dense.dtype)
    operand = _gather_operand_gpu(xp, sp_input, dense)
    values = sp_input.values
    if dtype.kind == "f":
        return _gpu.same_structure(sp_input, xp.true_divide(values, operand, dtype=dtype))
    a, b = values.astype(dtype), operand.astype(dtype)
    zero = xp.broadcast_to(b == 0, np.broadcast_shapes(a.shape, b.shape))
    if zero.size and bool(xp.any(zero)):
        raise Fallback("division_by_zero")  # the CPU kernel names the entry
    if dtype.kind == "i":
        # Truncation toward zero; x / -1 as a wrapping negation (INT_MIN / -1 wraps, where a
        # native division overflows), the other quotients from numpy's floor division.
        minus_one = b == -1
        b = xp.where(minus_one, dtype.type(1), b)
        q = xp.floor_divide(a, b)
        q = q + ((xp.remainder(a, b) != 0) & ((a < 0) != (b < 0))).astype(dtype)
        q = xp.where(minus_one, xp.negative(a), q)
    else:
        q = xp.floor_divide(a, b)
    return _gpu.same_structure(sp_input, q.astype(dtype))


# -------------------------------------------------------------------------- add
def _add_bytes(a, b, threshold=0, **_) -> int:
    try:
        dtype = np.result_type(a.dtype, b.dtype)
    except TypeError:
        return 0
    if isinstance(a, SparseTensor) and isinstance(b, SparseTensor):
        inner = int(np.prod(a.dense_shape[a.sparse_ndim:], dtype=object))
        return (a.nnz + b.nnz) * (inner * dtype.itemsize + 8 * a.sparse_ndim)
    dense = b if isinstance(a, SparseTensor) else a
    return int(np.prod(dense.shape, dtype=object)) * dtype.itemsize


@REGISTRY.op(
    "add",
    doc="""Adds two tensors, at least one sparse (tf.sparse.add); the order does not matter.
Shapes must be equal (no broadcasting). Result dtype: numpy's result_type of the two (bool + bool
is logical or; integers wrap).
sparse + sparse: the coalesced sum (sorted, repeated indices summed), same sparse_ndim required.
An entry is dropped when its magnitude is strictly below threshold (a hybrid entry when every
element of its block is; NaN is never below); threshold = 0 keeps everything, including exact
zeros from cancellation (TensorFlow's thresh).
sparse + dense: a dense result (threshold does not apply). dense + dense is UNIMPLEMENTED.""",
    args=[Arg("a", TENSOR, "First operand (COO or dense).", layouts=("coo", "dense")),
          Arg("b", TENSOR, "Second operand (COO or dense).", layouts=("coo", "dense")),
          Arg("threshold", FLOAT, "Magnitude below which a sparse+sparse sum entry is dropped "
              "(non-negative).", default=0.0)],
    outputs=[Output("output", "sparse", "Sparse for sparse + sparse, dense when an operand is dense.")],
    result_bytes=_add_bytes,
)
def add(a, b, threshold: float = 0.0):
    a_sparse, b_sparse = isinstance(a, SparseTensor), isinstance(b, SparseTensor)
    if not a_sparse and not b_sparse:
        raise UnimplementedError("add needs at least one sparse operand; for dense + dense use a "
                                 "dense library", reason="UNSUPPORTED_LAYOUT")
    if math.isnan(threshold) or threshold < 0:
        raise InvalidArgumentError(f"threshold = {threshold} must be a non-negative magnitude",
                                   reason="VALUE_OUT_OF_RANGE")
    a_shape = list(a.dense_shape) if a_sparse else _shape(a.shape)
    b_shape = list(b.dense_shape) if b_sparse else _shape(b.shape)
    if a_shape != b_shape:
        raise InvalidArgumentError(
            f"a has shape {a_shape} and b has shape {b_shape}; add needs equal shapes "
            "(no broadcasting)", reason="SHAPE_MISMATCH")
    dtype = np.result_type(a.dtype, b.dtype)
    if a_sparse and b_sparse:
        if a.sparse_ndim != b.sparse_ndim:
            raise InvalidArgumentError(
                f"a has {a.sparse_ndim} sparse dimensions and b has {b.sparse_ndim}; they must be "
                "equal", reason="SPARSE_DIM_MISMATCH")
        indices, values = ek.add_sparse(a.indices, a.values, b.indices, b.values, a.dense_shape,
                                        dtype, threshold)
        return SparseTensor(indices=indices, values=values, dense_shape=a.dense_shape,
                            coalesced=True)
    sp, dense = (a, b) if a_sparse else (b, a)
    return ek.add_dense(sp.indices, sp.values, sp.dense_shape, dense, dtype)


# add on the GPU: the operands' entries concatenated and coalesced (``arrays.coalesce``), the
# threshold applied to each entry's largest magnitude; sparse + dense adds the coalesced entries
# into a copy of the dense operand. Complex sums with a threshold run on the CPU (|z| is rounded
# differently by CUDA, and the threshold is a sharp edge).
def _add_on_gpu(a, b, threshold=0.0, **_) -> str | None:
    a_sparse, b_sparse = _gpu.is_sparse(a), _gpu.is_sparse(b)
    if not a_sparse and not b_sparse:
        return "argument"
    if math.isnan(threshold) or threshold < 0:
        return "argument"
    a_shape = list(a.dense_shape) if a_sparse else _shape(a.shape)
    b_shape = list(b.dense_shape) if b_sparse else _shape(b.shape)
    if a_shape != b_shape:
        return "shape"
    if a_sparse and b_sparse and a.sparse_ndim != b.sparse_ndim:
        return "shape"
    if not _gpu.native(a, b):
        return "dtype"
    dtype = np.result_type(a.dtype, b.dtype)
    if dtype.kind == "c" and threshold > 0 and a_sparse and b_sparse:
        return "dtype"
    return None


def _magnitude_gpu(xp, values2d):
    """The CPU's ek.block_magnitude over device arrays."""
    n = int(values2d.shape[0])
    if values2d.shape[1] == 0:
        return xp.zeros(n)
    mag = values2d.astype(xp.float64) if values2d.dtype == np.bool_ else xp.abs(values2d).astype(xp.float64)
    return xp.max(mag, axis=1)


@REGISTRY.gpu("add", supports=_add_on_gpu)
@_gpu.quiet
def add_gpu(be, a, b, threshold: float = 0.0):
    xp = be.xp
    dtype = np.result_type(a.dtype, b.dtype)
    if isinstance(a, SparseTensor) and isinstance(b, SparseTensor):
        indices = xp.concatenate([a.indices, b.indices])
        values = xp.concatenate([a.values.astype(dtype), b.values.astype(dtype)])
        indices, values = ka.coalesce(xp, indices, values, a.dense_shape, be.scatter_add)
        n = int(indices.shape[0])
        if threshold > 0 and n:
            keep = ~(_magnitude_gpu(xp, values.reshape(n, -1)) < threshold)
            indices, values = indices[keep], values[keep]
        return _gpu.coo(a.dense_shape, indices, values, coalesced=True)
    sp, dense = (a, b) if isinstance(a, SparseTensor) else (b, a)
    out = xp.array(dense, dtype=dtype, copy=True)
    if sp.nnz == 0 or out.size == 0:
        return out
    indices, values = ka.coalesce(xp, sp.indices, sp.values.astype(dtype), sp.dense_shape, be.scatter_add)
    s = sp.sparse_ndim
    keys = ka.linearize(xp, indices, sp.dense_shape[:s])
    rows = out.reshape(int(np.prod(sp.dense_shape[:s], dtype=np.int64)), -1)
    summed = values.reshape(int(keys.shape[0]), -1)
    rows[keys] = (rows[keys] | summed) if dtype == np.bool_ else (rows[keys] + summed)  # keys are unique
    return out


# ------------------------------------------------------------------- map_values
_ROUNDING = {"ceil": np.ceil, "floor": np.floor, "round": np.round, "trunc": np.trunc}
_ANALYTIC = {"sqrt": np.sqrt, "sin": np.sin, "tan": np.tan, "tanh": np.tanh, "asin": np.arcsin,
             "atan": np.arctan, "sinh": np.sinh, "asinh": np.arcsinh, "atanh": np.arctanh,
             "expm1": np.expm1, "log1p": np.log1p}
_ANGLE = {"deg2rad": np.deg2rad, "rad2deg": np.rad2deg}
_ALIASES = {"negative": "neg", "absolute": "abs", "arcsin": "asin", "arctan": "atan",
            "arcsinh": "asinh", "arctanh": "atanh", "rint": "round", "fix": "trunc"}
_BASIC = ("neg", "abs", "sign", "square", "conj")
MAP_FUNCTIONS = (*_BASIC, *_ROUNDING, *_ANALYTIC, *_ANGLE)
# Functions users ask for that move zero: what f(0) is, for the error message.
_NOT_ZERO_PRESERVING = {
    "cos": "1", "cosh": "1", "exp": "1", "exp2": "1", "acos": "pi/2", "arccos": "pi/2",
    "acosh": "nan", "arccosh": "nan", "log": "-inf", "log2": "-inf", "log10": "-inf",
    "rsqrt": "inf", "reciprocal": "inf", "inv": "inf", "sigmoid": "0.5", "logistic": "0.5",
    "sinc": "1", "logical_not": "true", "invert": "-1", "bitwise_not": "-1", "softplus": "log(2)",
    "erfc": "1", "lgamma": "inf", "digamma": "nan", "reciprocal_no_nan": "inf", "cot": "inf",
    "sec": "1", "csc": "inf",
}


def _map(fn: str, values: np.ndarray) -> np.ndarray:
    dtype, kind = values.dtype, values.dtype.kind

    def unsupported(why: str):
        return UnimplementedError(f"map_values({fn}) does not support {dtype.name} values: {why}",
                                  reason="UNSUPPORTED_DTYPE")

    with np.errstate(all="ignore"):
        if fn in ("abs", "sign", "square", "conj") + tuple(_ROUNDING) and kind == "b":
            return values.copy()  # identity on {false, true}
        if fn == "neg":
            if kind == "b":
                raise unsupported("negating a bool is not defined; cast to a number type")
            return np.negative(values)  # unsigned wraps modulo 2**bits
        if fn == "abs":
            return np.abs(values)  # complex -> its real magnitude dtype
        if fn == "sign":
            return np.sign(values)  # complex: z / |z|
        if fn == "square":
            return np.square(values)
        if fn == "conj":
            return np.conj(values)
        if fn in _ROUNDING:
            if kind in "iu":
                return values.copy()
            if kind == "c":
                raise unsupported("complex numbers have no rounding order")
            return _ROUNDING[fn](values)
        if kind == "b":
            raise unsupported("cast to a number type first")
        if kind == "c" and fn in _ANGLE:
            raise unsupported("angles are real")
        work = values.astype(np.float64) if kind in "iu" else values
        return (_ANALYTIC.get(fn) or _ANGLE[fn])(work)


@REGISTRY.op(
    "map_values",
    doc=f"""Applies a zero-preserving function to the stored values (tf.sparse.map_values).
fn is one of {', '.join(MAP_FUNCTIONS)} (aliases: {', '.join(sorted(_ALIASES))}). Since f(0) = 0,
the implicit zeros stay valid and the indices are unchanged; repeated entries are mapped one by one
(coalesce first to map their sum). Any other function (cos, exp, log, ...) is INVALID_ARGUMENT:
densify with to_dense and apply it to the dense tensor.
dtypes: float and complex keep their dtype (abs of complex gives the real dtype; sign of complex
is z/|z|). Integers: neg, abs, square wrap as numpy's do; ceil, floor, round, trunc are the
identity; sign stays integer; the analytic functions (sqrt ... log1p, deg2rad, rad2deg) return
float64. bool: abs, sign, square, conj and the rounding functions are the identity; the others are
UNIMPLEMENTED, as are ceil, floor, round, trunc, deg2rad and rad2deg on complex. round is half to
even. Out-of-domain inputs follow IEEE (sqrt(-1) = nan, atanh(1) = inf).""",
    args=[SP_INPUT, Arg("fn", STRING, "Name of a zero-preserving function.")],
    outputs=[Output("output", "sparse", "Same indices and shape, mapped values.")],
)
def map_values(sp_input: SparseTensor, fn: str) -> SparseTensor:
    name = _ALIASES.get(fn.lower(), fn.lower())
    if name not in MAP_FUNCTIONS:
        if name in _NOT_ZERO_PRESERVING:
            raise InvalidArgumentError(
                f"fn = {fn!r}: {name}(0) = {_NOT_ZERO_PRESERVING[name]} != 0, so map_values({name}) "
                "would change every implicit zero; densify with to_dense first and apply it to the "
                "dense tensor", reason="NOT_ZERO_PRESERVING")
        raise InvalidArgumentError(
            f"fn = {fn!r} is not a zero-preserving function map_values knows; it accepts "
            f"{', '.join(MAP_FUNCTIONS)}. For other functions densify with to_dense first",
            reason="UNKNOWN_FUNCTION")
    return _same_structure(sp_input, _map(name, sp_input.values))


# map_values on the GPU: the same numpy ufuncs from the device namespace. Complex values under
# sign and the analytic functions run on the CPU (CUDA's complex functions round and handle
# branch cuts and inf/nan differently, and CuPy's complex sign is not numpy 2's z/|z|).
_GPU_MAP = {"neg": "negative", "abs": "abs", "sign": "sign", "square": "square", "conj": "conj", "ceil": "ceil",
            "floor": "floor", "round": "rint", "trunc": "trunc", "sqrt": "sqrt", "sin": "sin", "tan": "tan",
            "tanh": "tanh", "asin": "arcsin", "atan": "arctan", "sinh": "sinh", "asinh": "arcsinh",
            "atanh": "arctanh", "expm1": "expm1", "log1p": "log1p", "deg2rad": "deg2rad", "rad2deg": "rad2deg"}


def _map_values_on_gpu(sp_input, fn, **_) -> str | None:
    name = _ALIASES.get(fn.lower(), fn.lower())
    if name not in MAP_FUNCTIONS:
        return "argument"
    probe = np.zeros(0, sp_input.dtype)  # the CPU's dtype rules, on an empty array
    if _gpu.refused(_map, name, probe):
        return "argument"
    if sp_input.dtype.kind == "c" and name in ("sign", *_ANALYTIC):
        return "dtype"
    return None if _gpu.native(sp_input) else "dtype"


@REGISTRY.gpu("map_values", supports=_map_values_on_gpu)
@_gpu.quiet
def map_values_gpu(be, sp_input: SparseTensor, fn: str) -> SparseTensor:
    xp = be.xp
    name = _ALIASES.get(fn.lower(), fn.lower())
    values = sp_input.values
    kind = values.dtype.kind
    identity = (kind == "b" and name in ("abs", "sign", "square", "conj", *_ROUNDING)) or \
        (kind in "iu" and name in _ROUNDING)
    if identity:
        return _gpu.same_structure(sp_input, values.copy())
    if kind in "iu" and (name in _ANALYTIC or name in _ANGLE):
        values = values.astype(xp.float64)
    out = getattr(xp, _GPU_MAP[name])(values)
    if name == "sign" and kind == "f":
        out = xp.where(xp.isnan(values), values, out)  # numpy's sign(nan) is nan; some CuPy versions give 0
    return _gpu.same_structure(sp_input, out)


# ----------------------------------------------------------- partitioned tensors
def _dense_has_rows(dense, sp_input) -> bool:
    """A dense operand with the tensor's rank and leading size (not broadcast along it) is cut
    with the blocks; any other shape broadcasts the same to every block."""
    return np.ndim(dense) == sp_input.ndim and np.shape(dense)[0] == sp_input.dense_shape[0] != 1


REGISTRY.partitioned("mul", Rowwise("sp_input", rows=("dense",), slice_rows=_dense_has_rows, probe=True))
REGISTRY.partitioned("div", Rowwise("sp_input", rows=("dense",), slice_rows=_dense_has_rows, probe=True))
REGISTRY.partitioned("map_values", Rowwise("sp_input", probe=True))
REGISTRY.partitioned("with_values", Rowwise("sp_input", entries=("new_values",), probe=True))
REGISTRY.partitioned("retain", Rowwise("sp_input", entries=("to_retain",), probe=True))
