"""GraphBLAS operations, exact to python-graphblas: ``mxm``, ``mxv``, ``vxm``, ``ewise_add``,
``ewise_mult``, ``ewise_union``, ``apply``, ``gb_select``, ``reduce_rowwise``, ``reduce_columnwise``,
``reduce_scalar``, ``extract``, ``kronecker``, ``nvals``, ``isequal``.

The engine is SuiteSparse:GraphBLAS through python-graphblas (multi-threaded, masks and semirings
fused in its kernels): each op is the python-graphblas method of the same name (``Matrix.mxm``,
``Matrix.apply``, ``Vector.reduce`` ...), with its argument names and meanings, its operator
names as strings (``_graphblas_names.py``) and its dtype rules (mixed operand dtypes unify as
python-graphblas unifies them; an operator is typed as python-graphblas types it). A sparse
vector is a rank-1 sparse tensor (COO), a matrix a rank-2 one (COO, CSR or CSC); a dense array
of rank 1 or 2 is a full vector or matrix (every element stored, as ``from_dense``). Results
come back as CSR (matrices), COO with sorted indices (vectors) or a 0-d array (scalars).

Every op that writes a matrix or vector takes GraphBLAS's output controls, with
python-graphblas's semantics ``C(mask, accum=accum, replace=replace) << expression``: ``mask``
(a tensor of the result's shape; its values, ``M.V``, or with ``mask_structure`` its pattern,
``M.S``; ``mask_complement`` for ``~M``), ``accum`` (a binary op merging the result into
``out``), ``replace`` (entries of ``out`` outside the mask are dropped) and ``out`` (the
existing C, whose dtype the result takes). Without ``out`` the result is ``expression.new(mask=M)``:
``accum`` and ``replace`` need ``out`` (python-graphblas's ``new`` has neither).

Each ``check`` makes the refusals: ranks, shapes (naming both), dtypes GraphBLAS defines,
operator kinds, scalar and thunk types, index ranges; then it runs the same python-graphblas
expression on entry-less stand-ins of the operands (same dtypes and shapes, no entries: no work)
so that whatever python-graphblas itself refuses from metadata (an operator not defined for the
dtypes) is refused here too, and the result's dtype is python-graphblas's. The kernels convert
(CSR/CSC arrays as they are where canonical, COO through ``from_coo`` with duplicates summed, as
the contract sums them) and compute.

Two names differ from python-graphblas's, because the SDK already uses them: ``select`` is torch's
(the GraphBLAS one is ``gb_select``), and ``op`` is the op's name in ``Client.call(op, ...)``,
``Pipeline.add(op, ...)`` and ``RemoteTensor`` calls, so python-graphblas's ``op`` argument is
``binary_op`` (ewise_*, kronecker), ``monoid`` (reductions) or ``operator`` (apply, gb_select).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from sparseserve.core.errors import InvalidArgumentError, UnimplementedError
from sparseserve.core.reasons import Reason
from sparseserve.core.tensor import SparseTensor

from ..argtypes import BOOL, SCALAR, TENSOR, ArgType, choice
from ..registry import REGISTRY, Arg, Output, Plan
from ._graphblas_names import BINARY_OPS, INDEX_UNARY_OPS, MONOIDS, SELECT_OPS, SEMIRINGS, UNARY_OPS
from ._sputils import shape_of

__all__ = ["DTYPES", "to_graphblas", "from_graphblas"]

# The dtypes GraphBLAS defines (SuiteSparse adds the complex ones), as numpy names.
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64",
          "complex64", "complex128")
LAYOUTS = ("coo", "csr", "csc", "dense")
# Operators whose thunk is a position (a row, a column, a diagonal): an integer.
_POSITIONAL = frozenset({"tril", "triu", "diag", "offdiag", "rowle", "rowgt", "colle", "colgt", "indexle", "indexgt",
                         "rowindex", "colindex", "diagindex", "index"})


# ------------------------------------------------------------------ python-graphblas, imported when first used
@functools.cache
def _gb():
    try:
        import graphblas
    except ImportError:
        raise UnimplementedError("the GraphBLAS ops need python-graphblas on the server (pip install "
                                 "'sparseserve[server]')", reason=Reason.MISSING_DEPENDENCY) from None
    return graphblas


def _operator(kind: str, name: str) -> Any:
    """python-graphblas's operator ``kind.name`` (``semiring.plus_times``); SuiteSparse's own
    (``any_secondi``) are read without python-graphblas's warning that they moved under ``ss``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return getattr(getattr(_gb(), kind), name)


def _plain(value: Any) -> Any:
    """A scalar argument as a Python number: python-graphblas types a literal as a user's would be."""
    return value.item() if isinstance(value, np.generic) else value


# ------------------------------------------------------------------ conversions
def _canonical(ptr: np.ndarray, idx: np.ndarray) -> bool:
    """Indices strictly increasing within each compressed row (or column): no repeats."""
    if idx.size < 2:
        return True
    rising = np.diff(idx) > 0
    starts = ptr[1:-1]
    starts = starts[(starts > 0) & (starts < idx.size)]
    rising[starts - 1] = True  # a new row may start anywhere
    return bool(rising.all())


def to_graphblas(t: Any) -> Any:
    """A checked tensor (rank 1 or 2, a GraphBLAS dtype) as a python-graphblas Vector or Matrix.
    CSR and CSC arrays go in as they are where no row repeats an index; COO and the rest through
    ``from_coo``, repeated indices summed (the contract's rule)."""
    gb = _gb()
    if not isinstance(t, SparseTensor):
        return (gb.Vector if t.ndim == 1 else gb.Matrix).from_dense(np.asarray(t))
    if len(t.dense_shape) == 1:
        return gb.Vector.from_coo(t.indices[:, 0], t.values, size=t.dense_shape[0], dtype=t.dtype,
                                  dup_op=_operator("binary", "plus"))
    m, n = (int(d) for d in t.dense_shape)
    if t.layout in ("csr", "csc") and _canonical(t.compressed_indices, t.plain_indices):
        if t.layout == "csr":
            return gb.Matrix.from_csr(t.compressed_indices, t.plain_indices, t.values, dtype=t.dtype, nrows=m, ncols=n)
        return gb.Matrix.from_csc(t.compressed_indices, t.plain_indices, t.values, dtype=t.dtype, nrows=m, ncols=n)
    coo = t.to_coo() if t.layout != "coo" else t
    return gb.Matrix.from_coo(coo.indices[:, 0], coo.indices[:, 1], coo.values, dtype=t.dtype, nrows=m, ncols=n,
                              dup_op=_operator("binary", "plus"))


def from_graphblas(x: Any) -> Any:
    """A python-graphblas Matrix as a CSR tensor, a Vector as a COO one (sorted indices)."""
    gb = _gb()
    dtype = np.dtype(x.dtype.np_type)
    if isinstance(x, gb.Vector):
        idx, values = x.to_coo()
        return SparseTensor(indices=idx.astype(np.int64, copy=False).reshape(-1, 1),
                            values=values.astype(dtype, copy=False), dense_shape=(x.size,), coalesced=True)
    ptr, idx, values = x.to_csr()
    return SparseTensor(layout="csr", compressed_indices=ptr.astype(np.int64, copy=False),
                        plain_indices=idx.astype(np.int64, copy=False), values=values.astype(dtype, copy=False),
                        dense_shape=(x.nrows, x.ncols))


def _stand_in(t: Any) -> Any:
    """An entry-less Vector or Matrix of ``t``'s dtype and shape: what ``check`` runs python-graphblas on."""
    gb = _gb()
    shape = shape_of(t)
    if len(shape) == 1:
        return gb.Vector(t.dtype, size=shape[0])
    return gb.Matrix(t.dtype, nrows=shape[0], ncols=shape[1])


# ------------------------------------------------------------------ checks (metadata)
def _bad(message: str, reason: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, reason=reason)


def _operand(t: Any, name: str, op: str, ranks: tuple[int, ...] = (1, 2)) -> tuple[int, ...]:
    """The shape of ``t``, a vector or matrix (per ``ranks``) of a GraphBLAS dtype."""
    shape = tuple(shape_of(t))
    if isinstance(t, SparseTensor) and t.dense_ndim:
        raise UnimplementedError(f"{op} does not take hybrid tensors: {name} has {t.dense_ndim} dense dimensions",
                                 reason=Reason.UNSUPPORTED_HYBRID)
    if len(shape) not in ranks:
        kinds = " or ".join({1: "a vector (rank 1)", 2: "a matrix (rank 2)"}[r] for r in ranks)
        raise _bad(f"{name} has shape {list(shape)}; {op} needs {kinds}", Reason.RANK)
    if np.dtype(t.dtype).name not in DTYPES:
        raise _bad(f"{name} has dtype {np.dtype(t.dtype).name}; GraphBLAS defines {', '.join(DTYPES)} (cast it first)",
                   Reason.UNSUPPORTED_DTYPE)
    return shape


def _same_shape(a: Any, b: Any, op: str) -> tuple[int, ...]:
    sa, sb = _operand(a, "a", op), _operand(b, "b", op)
    if sa != sb:
        raise _bad(f"a has shape {list(sa)} and b has shape {list(sb)}; {op} needs equal shapes", Reason.SHAPE_MISMATCH)
    return sa


def _scalar(value: Any, name: str, op: str, *, integer: bool = False) -> Any:
    if value is None:
        return None
    value = _plain(value)
    if integer and (isinstance(value, bool) or not isinstance(value, int)):
        raise _bad(f"{name} = {value!r}; {op} needs an integer here (a row, column or diagonal)",
                   Reason.BAD_ARGUMENT_TYPE)
    return value


@dataclass(frozen=True)
class _Controls:
    mask: Any
    mask_structure: bool
    mask_complement: bool
    accum: str | None
    replace: bool
    out: Any


def _check_controls(c: _Controls, shape: tuple[int, ...], op: str) -> None:
    """The output controls against the result's shape (``out`` and ``mask`` must have it)."""
    if c.mask is None and (c.mask_structure or c.mask_complement):
        raise _bad(f"{op}: mask_structure and mask_complement describe a mask; give mask", Reason.UNEXPECTED_ARGUMENT)
    if c.out is None and (c.accum is not None or c.replace):
        raise _bad(f"{op}: accum and replace act on an existing result; give out (without it the result is "
                   "expression.new(mask=mask))", Reason.UNEXPECTED_ARGUMENT)
    if c.replace and c.mask is None:
        raise _bad(f"{op}: replace needs a mask (python-graphblas: 'replace' may only be True with a mask)",
                   Reason.UNEXPECTED_ARGUMENT)
    for name, t in (("mask", c.mask), ("out", c.out)):
        if t is not None:
            got = _operand(t, name, op)
            if got != shape:
                raise _bad(f"{name} has shape {list(got)} and the result of {op} has shape {list(shape)}; "
                           f"{name} needs the result's shape", Reason.SHAPE_MISMATCH)


def _evaluate(expression: Callable[[dict[str, Any]], Any], operands: dict[str, Any], c: _Controls | None,
              make: Callable[[Any], Any]) -> Any:
    """``C(mask, accum, replace) << expression`` on ``operands`` made by ``make`` (a conversion,
    or ``_stand_in``): a python-graphblas Matrix or Vector, or, with ``c`` None, the expression's
    own value (a scalar op)."""
    x = {name: make(t) for name, t in operands.items() if t is not None}
    expr = expression(x)
    if c is None:
        return expr
    mask = None
    if c.mask is not None:
        m = make(c.mask)
        mask = m.S if c.mask_structure else m.V
        if c.mask_complement:
            mask = ~mask
    if c.out is None:
        return expr.new(mask=mask)
    out = make(c.out)
    out(mask=mask, accum=None if c.accum is None else _operator("binary", c.accum), replace=c.replace) << expr
    return out


def _dry_run(op: str, expression: Callable[[dict[str, Any]], Any], operands: dict[str, Any],
             c: _Controls | None) -> Any:
    """python-graphblas on entry-less stand-ins: its own refusals (from dtypes and shapes) as ours."""
    gb = _gb()
    try:
        return _evaluate(expression, operands, c, _stand_in)
    except KeyError as exc:  # an operator python-graphblas has no typed version of
        raise _bad(f"{op}: {exc.args[0] if exc.args else exc}", Reason.OPERATOR_DTYPE) from None
    except (gb.exceptions.DimensionMismatch, gb.exceptions.DomainMismatch) as exc:
        reason = Reason.SHAPE_MISMATCH if isinstance(exc, gb.exceptions.DimensionMismatch) else Reason.OPERATOR_DTYPE
        raise _bad(f"{op}: {str(exc).strip().splitlines()[-1]}", reason) from None
    except (TypeError, ValueError, gb.exceptions.GraphblasException) as exc:
        raise _bad(f"{op}: {str(exc).strip().splitlines()[0]}", Reason.BAD_ARGUMENT_TYPE) from None


def _plan(op: str, expression: Callable[[dict[str, Any]], Any], operands: dict[str, Any], shape: tuple[int, ...],
          c: _Controls) -> Plan:
    """The plan of an op that writes a matrix or vector of ``shape``."""
    _check_controls(c, shape, op)
    made = _dry_run(op, expression, operands, c)
    return Plan(dtype=np.dtype(made.dtype.np_type), layout="csr" if len(shape) == 2 else "coo", shape=shape)


def _run(expression: Callable[[dict[str, Any]], Any], operands: dict[str, Any], c: _Controls) -> SparseTensor:
    return from_graphblas(_evaluate(expression, operands, c, to_graphblas))


# ------------------------------------------------------------------ declarations' pieces
def _kind_choice(words: tuple[str, ...], what: str) -> ArgType:
    return choice(*words, reason=Reason.BAD_OPERATOR, hint=f"python-graphblas's {what} names")


SEMIRING = _kind_choice(SEMIRINGS, "semiring")
MONOID = _kind_choice(MONOIDS, "monoid")
BINARY = _kind_choice(BINARY_OPS, "binary op")
SELECT = _kind_choice(SELECT_OPS, "select op")
APPLY_OPS = tuple(dict.fromkeys((*UNARY_OPS, *BINARY_OPS, *INDEX_UNARY_OPS)))
APPLY = _kind_choice(APPLY_OPS, "unary, binary or index-unary op")

_CONTROL_NAMES = ("mask", "mask_structure", "mask_complement", "accum", "replace", "out")
CONTROLS = [
    Arg("mask", TENSOR, "Where the result is written: a tensor of the result's shape (python-graphblas's mask M).",
        default=None, layouts=LAYOUTS),
    Arg("mask_structure", BOOL, "Use the mask's pattern (M.S) rather than its values (M.V, the default).",
        default=False),
    Arg("mask_complement", BOOL, "Write where the mask is not (~M).", default=False),
    Arg("accum", BINARY, "A binary op merging the result into out (C(accum=op) << expr); needs out.", default=None),
    Arg("replace", BOOL, "Drop out's entries outside the mask (C(mask, replace=True)); needs out and mask.",
        default=False),
    Arg("out", TENSOR, "An existing result C to write into: C(mask, accum, replace) << expr, in C's dtype.",
        default=None, layouts=LAYOUTS),
]


def _controls(kw: dict[str, Any]) -> _Controls:
    return _Controls(**{name: kw[name] for name in _CONTROL_NAMES})


def _written(kind: str) -> list[Output]:
    layout = "CSR" if kind == "matrix" else "COO, rank 1"
    return [Output("output", "sparse", f"The {kind} written ({layout}): the expression, or out updated.")]


# ------------------------------------------------------------------ mxm, mxv, vxm
def _t(x: Any, transpose: bool) -> Any:
    return x.T if transpose else x


def _mxm_expression(semiring: str, transpose_a: bool, transpose_b: bool):
    return lambda x: _t(x["a"], transpose_a).mxm(_t(x["b"], transpose_b), _operator("semiring", semiring))


def _transposed(shape: tuple[int, ...], transpose: bool) -> tuple[int, ...]:
    return shape[::-1] if transpose else shape


def check_mxm(a, b, semiring, transpose_a, transpose_b, **controls) -> Plan:
    sa = _transposed(_operand(a, "a", "mxm", (2,)), transpose_a)
    sb = _transposed(_operand(b, "b", "mxm", (2,)), transpose_b)
    if sa[1] != sb[0]:
        raise _bad(f"a{'.T' if transpose_a else ''} has shape {list(sa)} and b{'.T' if transpose_b else ''} has shape "
                   f"{list(sb)}; mxm needs a's columns to equal b's rows", Reason.SHAPE_MISMATCH)
    return _plan("mxm", _mxm_expression(semiring, transpose_a, transpose_b), {"a": a, "b": b}, (sa[0], sb[1]),
                 _controls(controls))


@REGISTRY.op("mxm", doc="""
Matrix-matrix product over a semiring: python-graphblas's ``a.mxm(b, semiring)``.

``semiring`` is python-graphblas's name (``plus_times``, ``min_plus``, ``any_pair``, ``lor_land``,
``any_secondi`` ...); ``transpose_a``/``transpose_b`` multiply ``a.T``/``b.T``. Mixed dtypes unify
as python-graphblas unifies them. Takes the output controls (``mask``, ``accum``, ``out`` ...):
a masked product computes only the entries the mask lets through.
""", args=[
    Arg("a", TENSOR, "The left matrix [m, k].", layouts=LAYOUTS),
    Arg("b", TENSOR, "The right matrix [k, n].", layouts=LAYOUTS),
    Arg("semiring", SEMIRING, "The semiring, by python-graphblas's name.", default="plus_times"),
    Arg("transpose_a", BOOL, "Multiply a.T.", default=False),
    Arg("transpose_b", BOOL, "Multiply b.T.", default=False),
    *CONTROLS,
], outputs=_written("matrix"), check=check_mxm)
def mxm(a, b, semiring, transpose_a, transpose_b, **controls):
    return _run(_mxm_expression(semiring, transpose_a, transpose_b), {"a": a, "b": b}, _controls(controls))


def _mxv_expression(semiring: str, transpose_a: bool):
    return lambda x: _t(x["a"], transpose_a).mxv(x["v"], _operator("semiring", semiring))


def check_mxv(a, v, semiring, transpose_a, **controls) -> Plan:
    sa = _transposed(_operand(a, "a", "mxv", (2,)), transpose_a)
    sv = _operand(v, "v", "mxv", (1,))
    if sa[1] != sv[0]:
        raise _bad(f"a{'.T' if transpose_a else ''} has shape {list(sa)} and v has shape {list(sv)}; mxv needs a's "
                   "columns to equal v's size", Reason.SHAPE_MISMATCH)
    return _plan("mxv", _mxv_expression(semiring, transpose_a), {"a": a, "v": v}, (sa[0],), _controls(controls))


@REGISTRY.op("mxv", doc="""
Matrix-vector product over a semiring: python-graphblas's ``a.mxv(v, semiring)``.

``v`` is a rank-1 sparse tensor or a dense vector (every element stored); the result is a sparse
vector. ``transpose_a`` multiplies ``a.T`` (``vxm`` is the same product from the left).
""", args=[
    Arg("a", TENSOR, "The matrix [m, n].", layouts=LAYOUTS),
    Arg("v", TENSOR, "The vector [n].", layouts=LAYOUTS),
    Arg("semiring", SEMIRING, "The semiring, by python-graphblas's name.", default="plus_times"),
    Arg("transpose_a", BOOL, "Multiply a.T.", default=False),
    *CONTROLS,
], outputs=_written("vector"), check=check_mxv)
def mxv(a, v, semiring, transpose_a, **controls):
    return _run(_mxv_expression(semiring, transpose_a), {"a": a, "v": v}, _controls(controls))


def _vxm_expression(semiring: str, transpose_b: bool):
    return lambda x: x["v"].vxm(_t(x["b"], transpose_b), _operator("semiring", semiring))


def check_vxm(v, b, semiring, transpose_b, **controls) -> Plan:
    sv = _operand(v, "v", "vxm", (1,))
    sb = _transposed(_operand(b, "b", "vxm", (2,)), transpose_b)
    if sv[0] != sb[0]:
        raise _bad(f"v has shape {list(sv)} and b{'.T' if transpose_b else ''} has shape {list(sb)}; vxm needs v's "
                   "size to equal b's rows", Reason.SHAPE_MISMATCH)
    return _plan("vxm", _vxm_expression(semiring, transpose_b), {"v": v, "b": b}, (sb[1],), _controls(controls))


@REGISTRY.op("vxm", doc="""
Vector-matrix product over a semiring: python-graphblas's ``v.vxm(b, semiring)``.

The product of the row vector ``v`` [m] and ``b`` [m, n] (``b.T`` with ``transpose_b``), a sparse vector [n].
""", args=[
    Arg("v", TENSOR, "The vector [m].", layouts=LAYOUTS),
    Arg("b", TENSOR, "The matrix [m, n].", layouts=LAYOUTS),
    Arg("semiring", SEMIRING, "The semiring, by python-graphblas's name.", default="plus_times"),
    Arg("transpose_b", BOOL, "Multiply b.T.", default=False),
    *CONTROLS,
], outputs=_written("vector"), check=check_vxm)
def vxm(v, b, semiring, transpose_b, **controls):
    return _run(_vxm_expression(semiring, transpose_b), {"v": v, "b": b}, _controls(controls))


# ------------------------------------------------------------------ element-wise
def _ewise_add_expression(op: str):
    return lambda x: x["a"].ewise_add(x["b"], _operator("binary", op))


def _ewise_mult_expression(op: str):
    return lambda x: x["a"].ewise_mult(x["b"], _operator("binary", op))


def _ewise_union_expression(op: str, left_default: Any, right_default: Any):
    return lambda x: x["a"].ewise_union(x["b"], _operator("binary", op), left_default, right_default)


def check_ewise_add(a, b, binary_op, **controls) -> Plan:
    return _plan("ewise_add", _ewise_add_expression(binary_op), {"a": a, "b": b}, _same_shape(a, b, "ewise_add"),
                 _controls(controls))


def check_ewise_mult(a, b, binary_op, **controls) -> Plan:
    return _plan("ewise_mult", _ewise_mult_expression(binary_op), {"a": a, "b": b}, _same_shape(a, b, "ewise_mult"),
                 _controls(controls))


def check_ewise_union(a, b, binary_op, left_default, right_default, **controls) -> Plan:
    shape = _same_shape(a, b, "ewise_union")
    left, right = _scalar(left_default, "left_default", "ewise_union"), _scalar(right_default, "right_default",
                                                                                 "ewise_union")
    made = _plan("ewise_union", _ewise_union_expression(binary_op, left, right), {"a": a, "b": b}, shape,
                 _controls(controls))
    return made.with_args(left_default=left, right_default=right)


_TWO = [Arg("a", TENSOR, "The first operand, a vector or matrix.", layouts=LAYOUTS),
        Arg("b", TENSOR, "The second operand, of a's shape.", layouts=LAYOUTS)]


@REGISTRY.op("ewise_add", doc="""
Element-wise union: python-graphblas's ``a.ewise_add(b, op)``.

Where both hold an entry, ``op(a, b)``; where one does, its value as it is. ``op`` is a binary op
(or monoid) by python-graphblas's name.
""", args=[*_TWO, Arg("binary_op", BINARY, "The binary op, by python-graphblas's name.", default="plus"), *CONTROLS],
    outputs=_written("matrix or vector"), check=check_ewise_add)
def ewise_add(a, b, binary_op, **controls):
    return _run(_ewise_add_expression(binary_op), {"a": a, "b": b}, _controls(controls))


@REGISTRY.op("ewise_mult", doc="""
Element-wise intersection: python-graphblas's ``a.ewise_mult(b, op)``.

Entries only where both hold one, ``op(a, b)`` there.
""", args=[*_TWO, Arg("binary_op", BINARY, "The binary op, by python-graphblas's name.", default="times"), *CONTROLS],
    outputs=_written("matrix or vector"), check=check_ewise_mult)
def ewise_mult(a, b, binary_op, **controls):
    return _run(_ewise_mult_expression(binary_op), {"a": a, "b": b}, _controls(controls))


@REGISTRY.op("ewise_union", doc="""
Element-wise union with defaults: python-graphblas's ``a.ewise_union(b, op, left_default, right_default)``.

Where both hold an entry, ``op(a, b)``; where only ``a`` does, ``op(a, right_default)``; where
only ``b`` does, ``op(left_default, b)``.
""", args=[*_TWO, Arg("binary_op", BINARY, "The binary op, by python-graphblas's name."),
           Arg("left_default", SCALAR, "a's value where only b holds an entry."),
           Arg("right_default", SCALAR, "b's value where only a holds an entry."), *CONTROLS],
    outputs=_written("matrix or vector"), check=check_ewise_union)
def ewise_union(a, b, binary_op, left_default, right_default, **controls):
    return _run(_ewise_union_expression(binary_op, left_default, right_default), {"a": a, "b": b}, _controls(controls))


# ------------------------------------------------------------------ apply, select
def _apply_expression(op: str, left: Any, right: Any, thunk: Any):
    def expression(x):
        if op in INDEX_UNARY_OPS and left is None and right is None:
            return x["a"].apply(_operator("indexunary", op), thunk)
        if left is not None:
            return x["a"].apply(_operator("binary", op), left=left)
        if right is not None:
            return x["a"].apply(_operator("binary", op), right=right)
        return x["a"].apply(_operator("unary", op))
    return expression


def check_apply(a, operator, left, right, thunk, **controls) -> Plan:
    shape = _operand(a, "a", "apply")
    if left is not None and right is not None:
        raise _bad("apply takes left or right (the binary op's bound scalar), not both", Reason.EXCLUSIVE_ARGUMENTS)
    bound = left is not None or right is not None
    if bound and operator not in BINARY_OPS:
        raise _bad(f"apply: left/right bind a binary op's scalar, and {operator!r} is not a binary op",
                   Reason.BAD_OPERATOR)
    if thunk is not None and (bound or operator not in INDEX_UNARY_OPS):
        raise _bad(f"apply: thunk goes with an index-unary op (rowindex, colindex, diagindex, ...), not {operator!r}"
                   + (" with left/right" if bound else ""), Reason.UNEXPECTED_ARGUMENT)
    if not bound and operator not in UNARY_OPS and operator not in INDEX_UNARY_OPS:
        raise _bad(f"apply: {operator!r} is a binary op; bind its scalar with left or right", Reason.MISSING_ARGUMENT)
    left, right = _scalar(left, "left", "apply"), _scalar(right, "right", "apply")
    thunk = _scalar(thunk, "thunk", "apply", integer=operator in _POSITIONAL)
    made = _plan("apply", _apply_expression(operator, left, right, thunk), {"a": a}, shape, _controls(controls))
    return made.with_args(left=left, right=right, thunk=thunk)


@REGISTRY.op("apply", doc="""
An operator applied to every entry: python-graphblas's ``a.apply(op, ...)``.

A unary op alone (``abs``, ``ainv``, ``one``, ``identity`` ...); a binary op with its scalar bound
on the left (``left``: ``op(left, x)``) or the right (``right``: ``op(x, right)``); an index-unary
op (``rowindex``, ``colindex``, ``diagindex`` ...) with ``thunk`` (python-graphblas's ``right``
for those).
""", args=[
    Arg("a", TENSOR, "The vector or matrix.", layouts=LAYOUTS),
    Arg("operator", APPLY, "A unary, binary or index-unary op, by python-graphblas's name."),
    Arg("left", SCALAR, "A binary op's bound first argument.", default=None),
    Arg("right", SCALAR, "A binary op's bound second argument.", default=None),
    Arg("thunk", SCALAR, "An index-unary op's thunk (python-graphblas's default when null).", default=None),
    *CONTROLS,
], outputs=_written("matrix or vector"), check=check_apply)
def apply(a, operator, left, right, thunk, **controls):
    return _run(_apply_expression(operator, left, right, thunk), {"a": a}, _controls(controls))


def _select_expression(op: str, thunk: Any):
    return lambda x: x["a"].select(_operator("select", op), thunk)


def check_gb_select(a, operator, thunk, **controls) -> Plan:
    shape = _operand(a, "a", "gb_select")
    thunk = _scalar(thunk, "thunk", "gb_select", integer=operator in _POSITIONAL)
    made = _plan("gb_select", _select_expression(operator, thunk), {"a": a}, shape, _controls(controls))
    return made.with_args(thunk=thunk)


@REGISTRY.op("gb_select", doc="""
The entries an index-unary predicate keeps: python-graphblas's ``a.select(op, thunk)``.

``tril``, ``triu``, ``diag``, ``offdiag`` (thunk: the diagonal), ``rowle``, ``rowgt``, ``colle``,
``colgt`` (thunk: a row or column), ``valueeq`` ... ``valuele`` (thunk: the value compared).
Named ``gb_select`` because ``select`` is torch's.
""", args=[
    Arg("a", TENSOR, "The vector or matrix.", layouts=LAYOUTS),
    Arg("operator", SELECT, "The select op, by python-graphblas's name."),
    Arg("thunk", SCALAR, "The op's thunk (python-graphblas's default when null).", default=None),
    *CONTROLS,
], outputs=_written("matrix or vector"), check=check_gb_select)
def gb_select(a, operator, thunk, **controls):
    return _run(_select_expression(operator, thunk), {"a": a}, _controls(controls))


# ------------------------------------------------------------------ reductions
def _reduce_expression(rowwise: bool, op: str):
    if rowwise:
        return lambda x: x["a"].reduce_rowwise(_operator("monoid", op))
    return lambda x: x["a"].reduce_columnwise(_operator("monoid", op))


def check_reduce_rowwise(a, monoid, **controls) -> Plan:
    shape = _operand(a, "a", "reduce_rowwise", (2,))
    return _plan("reduce_rowwise", _reduce_expression(True, monoid), {"a": a}, (shape[0],), _controls(controls))


def check_reduce_columnwise(a, monoid, **controls) -> Plan:
    shape = _operand(a, "a", "reduce_columnwise", (2,))
    return _plan("reduce_columnwise", _reduce_expression(False, monoid), {"a": a}, (shape[1],), _controls(controls))


_REDUCE_ARGS = [Arg("a", TENSOR, "The matrix.", layouts=LAYOUTS),
                Arg("monoid", MONOID, "The monoid, by python-graphblas's name.", default="plus"), *CONTROLS]


@REGISTRY.op("reduce_rowwise", doc="""
Each row reduced by a monoid: python-graphblas's ``a.reduce_rowwise(op)``, a sparse vector [m]
(rows without entries have none).
""", args=_REDUCE_ARGS, outputs=_written("vector"), check=check_reduce_rowwise)
def reduce_rowwise(a, monoid, **controls):
    return _run(_reduce_expression(True, monoid), {"a": a}, _controls(controls))


@REGISTRY.op("reduce_columnwise", doc="""
Each column reduced by a monoid: python-graphblas's ``a.reduce_columnwise(op)``, a sparse vector [n].
""", args=_REDUCE_ARGS, outputs=_written("vector"), check=check_reduce_columnwise)
def reduce_columnwise(a, monoid, **controls):
    return _run(_reduce_expression(False, monoid), {"a": a}, _controls(controls))


def _reduce_scalar_expression(op: str):
    def expression(x):
        a, monoid = x["a"], _operator("monoid", op)
        if a.ndim == 1:
            return a.reduce(monoid, allow_empty=False)
        return a.reduce_scalar(monoid, allow_empty=False)
    return expression


def _scalar_plan(op: str, expression, operands: dict[str, Any]) -> Plan:
    made = _dry_run(op, expression, operands, None)
    return Plan(dtype=np.dtype(made.dtype.np_type), layout="dense", shape=())


def _scalar_result(expression, operands: dict[str, Any]) -> np.ndarray:
    made = _evaluate(expression, operands, None, to_graphblas).new()
    return np.asarray(made.value, dtype=made.dtype.np_type)


def check_reduce_scalar(a, monoid) -> Plan:
    _operand(a, "a", "reduce_scalar")
    return _scalar_plan("reduce_scalar", _reduce_scalar_expression(monoid), {"a": a})


@REGISTRY.op("reduce_scalar", doc="""
Every entry reduced by a monoid to one scalar: python-graphblas's ``a.reduce_scalar(op)``
(``v.reduce(op)`` for a vector), with ``allow_empty=False``: a tensor without entries gives the
monoid's identity (a 0-d array can hold no "empty").
""", args=[Arg("a", TENSOR, "The vector or matrix.", layouts=LAYOUTS),
           Arg("monoid", MONOID, "The monoid, by python-graphblas's name.", default="plus")],
    outputs=[Output("output", "dense", "The scalar (a 0-d array of the monoid's dtype).")], check=check_reduce_scalar)
def reduce_scalar(a, monoid):
    return _scalar_result(_reduce_scalar_expression(monoid), {"a": a})


# ------------------------------------------------------------------ extract, kronecker
def _index_list(value: Any, name: str) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if not isinstance(value, list) or any(isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer))
                                          for v in value):
        raise _bad(f"{name} must be a list of integers or null (every index)", Reason.BAD_ARGUMENT_TYPE)
    return [int(v) for v in value]


INDICES = ArgType("int_list", {"type": ["array", "null"], "items": {"type": "integer"}}, _index_list)


def _extract_expression(rows: list[int] | None, cols: list[int] | None):
    def expression(x):
        a = x["a"]
        r = slice(None) if rows is None else np.asarray(rows, dtype=np.int64)  # [] typed as indices
        if a.ndim == 1:
            return a[r]
        return a[r, slice(None) if cols is None else np.asarray(cols, dtype=np.int64)]
    return expression


def _checked_indices(indices: list[int] | None, n: int, name: str) -> int:
    if indices is None:
        return n
    for i, index in enumerate(indices):
        if not -n <= index < n:
            raise _bad(f"{name}[{i}] = {index} is out of range for a dimension of {n}", Reason.INDEX_OUT_OF_RANGE)
    return len(indices)


def check_extract(a, rows, cols, **controls) -> Plan:
    shape = _operand(a, "a", "extract")
    if len(shape) == 1 and cols is not None:
        raise _bad("extract: a is a vector; give its indices as rows (cols is for matrices)",
                   Reason.UNEXPECTED_ARGUMENT)
    out_shape = tuple(_checked_indices(ix, n, name) for ix, n, name in zip((rows, cols), shape, ("rows", "cols")))
    return _plan("extract", _extract_expression(rows, cols), {"a": a}, out_shape, _controls(controls))


@REGISTRY.op("extract", doc="""
A submatrix or subvector: python-graphblas's ``a[rows, cols]`` (``v[rows]``).

``rows`` and ``cols`` list indices (repeats allowed, negative ones from the end as in Python);
null takes every index. The result is a matrix [len(rows), len(cols)] (a vector [len(rows)]).
""", args=[Arg("a", TENSOR, "The vector or matrix.", layouts=LAYOUTS),
           Arg("rows", INDICES, "The rows (a vector's indices); null for all.", default=None),
           Arg("cols", INDICES, "The columns; null for all.", default=None), *CONTROLS],
    outputs=_written("matrix or vector"), check=check_extract)
def extract(a, rows, cols, **controls):
    return _run(_extract_expression(rows, cols), {"a": a}, _controls(controls))


def _kronecker_expression(op: str):
    return lambda x: x["a"].kronecker(x["b"], _operator("binary", op))


def check_kronecker(a, b, binary_op, **controls) -> Plan:
    sa, sb = _operand(a, "a", "kronecker", (2,)), _operand(b, "b", "kronecker", (2,))
    return _plan("kronecker", _kronecker_expression(binary_op), {"a": a, "b": b}, (sa[0] * sb[0], sa[1] * sb[1]),
                 _controls(controls))


@REGISTRY.op("kronecker", doc="""
The Kronecker product under a binary op: python-graphblas's ``a.kronecker(b, op)``, [m1 m2, n1 n2].
""", args=[Arg("a", TENSOR, "The left matrix [m1, n1].", layouts=LAYOUTS),
           Arg("b", TENSOR, "The right matrix [m2, n2].", layouts=LAYOUTS),
           Arg("binary_op", BINARY, "The binary op, by python-graphblas's name.", default="times"), *CONTROLS],
    outputs=_written("matrix"), check=check_kronecker)
def kronecker(a, b, binary_op, **controls):
    return _run(_kronecker_expression(binary_op), {"a": a, "b": b}, _controls(controls))


# ------------------------------------------------------------------ nvals, isequal
def check_nvals(a) -> Plan:
    _operand(a, "a", "nvals")
    return Plan(dtype=np.dtype(np.int64), layout="dense", shape=())


@REGISTRY.op("nvals", doc="""
The number of stored entries: python-graphblas's ``a.nvals`` (repeated COO indices count once).
""", args=[Arg("a", TENSOR, "The vector or matrix.", layouts=LAYOUTS)],
    outputs=[Output("output", "dense", "The count (a 0-d int64 array).")], check=check_nvals)
def nvals(a):
    return np.asarray(to_graphblas(a).nvals, dtype=np.int64)


def check_isequal(a, b, check_dtype) -> Plan:
    _operand(a, "a", "isequal")
    _operand(b, "b", "isequal")
    return Plan(dtype=np.dtype(np.bool_), layout="dense", shape=())


@REGISTRY.op("isequal", doc="""
Whether two vectors or matrices are equal: python-graphblas's ``a.isequal(b, check_dtype=...)``.

Equal shape, equal pattern, equal values; with ``check_dtype`` equal dtypes too. Tensors of
different shapes or ranks are not equal (false, not an error).
""", args=[Arg("a", TENSOR, "The first vector or matrix.", layouts=LAYOUTS),
           Arg("b", TENSOR, "The second.", layouts=LAYOUTS),
           Arg("check_dtype", BOOL, "Unequal dtypes make them unequal.", default=False)],
    outputs=[Output("output", "dense", "The answer (a 0-d bool array).")], check=check_isequal)
def isequal(a, b, check_dtype):
    x, y = to_graphblas(a), to_graphblas(b)
    if type(x) is not type(y) or shape_of(a) != shape_of(b):
        return np.asarray(False)
    return np.asarray(bool(x.isequal(y, check_dtype=check_dtype)))
