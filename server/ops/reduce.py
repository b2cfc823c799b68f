"""Reductions and friends: reduce_sum, reduce_max, softmax, log_softmax, maximum, minimum.

Each op's ``check`` makes its refusals from metadata (dtypes, shapes, sparse dimensions,
arguments; the axes are normalised when the call binds, ``argtypes.axes_of``/``axis_of``)
before any kernel, on every device; a reduction's check also works out the shapes its kernels
use (``_ReducePlan``), once. The kernels raise nothing of their own: every refusal here depends
on metadata alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparseserve.core.tensor import SparseTensor
from sparseserve.core.errors import InvalidArgumentError, UnimplementedError
from sparseserve.core.reasons import Reason
from sparseserve import kernels
from sparseserve.kernels import arrays as ka
from sparseserve.kernels import reduce as rk

from ..argtypes import BOOL, SPARSE, axes_of, axis_of
from ..device import not_a_matrix
from ..partition import Reduction
from ..registry import REGISTRY, Arg, Output, Plan
from . import _gpu
from ._sputils import shape_of
from ._layouts import SPARSE_LAYOUTS, as_coo, as_csr, view_sparse_ndim


SP_INPUT = Arg("sp_input", SPARSE, "The input sparse tensor (COO, CSR, CSC, BSR or BSC).",
               layouts=SPARSE_LAYOUTS)


@dataclass(frozen=True)
class _ReducePlan:
    """The shapes a reduction's kernels work with, from the input's COO view (a compressed
    tensor's batch dimensions count as sparse ones): worked out once by the check."""

    shape: tuple[int, ...]
    sparse_ndim: int
    axes: list[int]
    keepdims: bool

    @property
    def kept_sparse(self) -> list[int]:
        return [d for d in range(self.sparse_ndim) if d not in self.axes]

    @property
    def reduced_dense(self) -> tuple[int, ...]:
        """Axes of the values array (entry axis first) that are reduced."""
        return tuple(1 + d - self.sparse_ndim for d in self.axes if d >= self.sparse_ndim)

    @property
    def out_dense_shape(self) -> tuple[int, ...]:
        dims = range(self.sparse_ndim, len(self.shape))
        if self.keepdims:
            return tuple(1 if d in self.axes else self.shape[d] for d in dims)
        return tuple(self.shape[d] for d in dims if d not in self.axes)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return _out_shape(self.shape, self.axes, self.keepdims)


def _out_shape(shape, axes: list[int], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in axes)


def _reduce_bytes(sp_input, axis: list[int], keepdims=False, output_is_sparse=False, **_) -> int:
    """Bytes of a dense result; ``axis`` as bound (sorted, non-negative)."""
    if output_is_sparse:
        return 0
    out = _out_shape(sp_input.dense_shape, axis, keepdims)
    return int(np.prod(out, dtype=object)) * sp_input.dtype.itemsize


def _check_reduce_dtype(op: str, dtype: np.dtype) -> None:
    if dtype == np.bool_ or (op == rk.MAX and dtype.kind == "c"):
        what = "bool" if dtype == np.bool_ else "complex"
        raise UnimplementedError(f"reduce_{op} does not support {what} values ({dtype.name}), as "
                                 f"TensorFlow's does not", reason=Reason.UNSUPPORTED_DTYPE)


def _check_reduce(op: str, sp_input: SparseTensor, axis: list[int], keepdims: bool,
                  output_is_sparse: bool) -> Plan:
    """The values' dtype, and a sparse result has a dimension; the kernels' shapes
    (``reduction``). ``axis`` is bound: sorted, non-negative, each axis once."""
    _check_reduce_dtype(op, sp_input.dtype)
    reduction = _ReducePlan(tuple(shape_of(sp_input)), view_sparse_ndim(sp_input), list(axis), keepdims)
    if output_is_sparse and not reduction.out_shape:
        raise InvalidArgumentError(
            f"reduce_{op} over every axis without keepdims gives a scalar, which cannot be sparse; "
            "pass keepdims=true or output_is_sparse=false", reason=Reason.RANK_TOO_LOW)
    return Plan(args={"reduction": reduction}, dtype=sp_input.dtype, layout="coo" if output_is_sparse else "dense",
                shape=reduction.out_shape)


def check_reduce_sum(sp_input: SparseTensor, axis: list[int], keepdims: bool = False,
                     output_is_sparse: bool = False) -> Plan:
    return _check_reduce(rk.SUM, sp_input, axis, keepdims, output_is_sparse)


def check_reduce_max(sp_input: SparseTensor, axis: list[int], keepdims: bool = False,
                     output_is_sparse: bool = False) -> Plan:
    return _check_reduce(rk.MAX, sp_input, axis, keepdims, output_is_sparse)


def _entry_values(t: SparseTensor, plan: _ReducePlan, op: str, work: np.dtype) -> np.ndarray:
    """``[nnz, inner]`` values in the work dtype, reduced over the reduced dense axes. An entry
    whose reduced block is empty (a zero-size dense axis) holds no value: none are returned."""
    inner = int(np.prod(plan.out_dense_shape, dtype=np.int64))
    reduced_size = int(np.prod([t.values.shape[a] for a in plan.reduced_dense], dtype=np.int64))
    if reduced_size == 0:
        return np.zeros((0, inner), work)
    values = t.values.astype(work, copy=False)
    if plan.reduced_dense:
        with np.errstate(all="ignore"):
            if op == rk.SUM:
                values = np.sum(values, axis=plan.reduced_dense, dtype=work)
            else:
                values = np.max(values, axis=plan.reduced_dense)
    return np.ascontiguousarray(values).reshape(t.nnz, inner)


def _sparse_result(plan: _ReducePlan, coords: np.ndarray, values2d: np.ndarray) -> SparseTensor:
    groups = coords.shape[0]
    dense_shape = plan.out_dense_shape
    if plan.keepdims:
        indices = np.zeros((groups, plan.sparse_ndim), np.int64)
        indices[:, plan.kept_sparse] = coords
    elif coords.shape[1]:
        indices = coords
    else:
        # Every sparse axis reduced, some dense axis kept: the leading kept axis becomes the
        # sparse one (a COO tensor needs one), each of its positions stored when any entry was.
        n0, dense_shape = dense_shape[0], dense_shape[1:]
        indices = np.arange(n0 if groups else 0, dtype=np.int64)[:, None]
    values = values2d.reshape(indices.shape[0], *dense_shape)
    return SparseTensor(indices=indices, values=values, dense_shape=plan.out_shape, coalesced=True)


def _csr_coordinates(t: SparseTensor, kept: list[int]) -> np.ndarray:
    """A 2-D CSR matrix's entry coordinates along the ``kept`` axes, in storage order (which is
    the order of its COO form): read from its arrays, a row index made only when rows are kept,
    rather than expanding the matrix to COO (which was most of a CSR reduction's time)."""
    n = t.nnz
    if not kept:
        return np.empty((n, 0), np.int64)
    columns = {1: lambda: t.plain_indices.astype(np.int64),
               0: lambda: np.repeat(np.arange(t.dense_shape[0], dtype=np.int64),
                                    np.diff(t.compressed_indices.astype(np.int64)))}
    return np.stack([columns[d]() for d in kept], axis=1)


def _reduce(op: str, sp_input: SparseTensor, plan: _ReducePlan, output_is_sparse: bool):
    plain_csr = sp_input.layout == "csr" and sp_input.batch_ndim == 0 and sp_input.values.ndim == 1
    t = sp_input if plain_csr else as_coo(sp_input)
    work = rk.work_dtype(op, t.dtype)
    values2d = _entry_values(t, plan, op, work)
    kept = plan.kept_sparse
    kept_indices = (_csr_coordinates(t, kept) if plain_csr else t.indices[:, kept])[:values2d.shape[0]]
    kept_shape = [plan.shape[d] for d in kept]
    if not output_is_sparse:
        out2d = rk.reduce_to_dense(kept_indices, kept_shape, values2d, op)
        return out2d.astype(t.dtype, copy=False).reshape(plan.out_shape)
    coords, reduced = rk.reduce_to_sparse(kept_indices, kept_shape, values2d, op)
    return _sparse_result(plan, coords, reduced.astype(t.dtype, copy=False))


_REDUCE_ARGS = [
    SP_INPUT,
    Arg("axis", axes_of("sp_input"), "An axis or a list of axes to reduce (negative counts from the end; one "
        "named twice is reduced once, as in TensorFlow); null reduces every axis, [] none.", default=None),
    Arg("keepdims", BOOL, "Keep reduced axes with length 1.", default=False),
    Arg("output_is_sparse", BOOL, "Return a coalesced COO tensor instead of a dense one.",
        default=False),
]
_REDUCE_OUTPUT = [Output("output", "sparse", "Dense by default; coalesced COO with output_is_sparse.")]


@REGISTRY.op(
    "reduce_sum",
    doc="""Sums a sparse tensor over axes (tf.sparse.reduce_sum).
Repeated indices add up. Hybrid dense dimensions can be reduced too. Integers wrap as numpy's do;
float16 is summed in float32. Dense result (unreached positions 0) unless output_is_sparse, which
returns a coalesced COO tensor with one entry per group of kept indices holding a stored value
(when every sparse axis is reduced and a dense one kept, the leading kept axis becomes sparse).
output_is_sparse with every axis reduced and keepdims false is INVALID_ARGUMENT (a scalar).
bool is UNIMPLEMENTED. Inputs of any sparse layout are read as COO.""",
    args=_REDUCE_ARGS,
    outputs=_REDUCE_OUTPUT,
    check=check_reduce_sum,
    result_bytes=_reduce_bytes,
)
def reduce_sum(sp_input: SparseTensor, axis: list[int], reduction: _ReducePlan, keepdims: bool = False,
               output_is_sparse: bool = False):
    return _reduce(rk.SUM, sp_input, reduction, output_is_sparse)


@REGISTRY.op(
    "reduce_max",
    doc="""Maximum of a sparse tensor over axes (tf.sparse.reduce_max).
Only stored values take part (unstored positions are not zeros here), so results can be negative;
a group with no stored value is 0 in the dense result and absent from the sparse one. Repeated
indices are separate values (the largest wins, as in TensorFlow), not summed. NaN propagates.
Hybrid dense dimensions can be reduced too. output_is_sparse and keepdims as for reduce_sum.
bool and complex are UNIMPLEMENTED. Inputs of any sparse layout are read as COO.""",
    args=_REDUCE_ARGS,
    outputs=_REDUCE_OUTPUT,
    check=check_reduce_max,
    result_bytes=_reduce_bytes,
)
def reduce_max(sp_input: SparseTensor, axis: list[int], reduction: _ReducePlan, keepdims: bool = False,
               output_is_sparse: bool = False):
    return _reduce(rk.MAX, sp_input, reduction, output_is_sparse)


# ------------------------------------------------------------------ reduce_sum / reduce_max on the GPU
# COO of any rank (hybrid too) and 2-D CSR/CSC, dense or sparse output, every dtype the op takes:
# sums scatter into the work dtype (``arrays.scatter_sum``/``segment_sum``), maxima come from a
# sort by (output key, value) (``arrays.group_max``). Block and batched compressed tensors (and
# compressed ones with dense dimensions) run on the CPU.
def _reduce_declines(plan: Plan) -> str | None:
    """Compressed tensors other than plain 2-D CSR and CSC matrices."""
    t = plan.args["sp_input"]
    return None if t.layout == "coo" else not_a_matrix(t)


def _reduce_gpu(be, op: str, sp_input: SparseTensor, plan: _ReducePlan, output_is_sparse: bool):
    xp = be.xp
    t = sp_input
    if t.layout == "coo":
        indices, values = t.indices, t.values
    else:
        rows, cols, values = _gpu.coo_entries(xp, t)
        indices = xp.stack([rows, cols], axis=1)
    work = rk.work_dtype(op, t.dtype)
    # Each entry's values over the reduced dense axes (the CPU's _entry_values).
    inner = int(np.prod(plan.out_dense_shape, dtype=np.int64))
    reduced_size = int(np.prod([values.shape[a] for a in plan.reduced_dense], dtype=np.int64))
    if reduced_size == 0:
        values2d = xp.zeros((0, inner), dtype=work)
    else:
        values2d = values.astype(work)
        if plan.reduced_dense:
            values2d = xp.sum(values2d, axis=plan.reduced_dense, dtype=work) if op == rk.SUM else \
                xp.max(values2d, axis=plan.reduced_dense)
        values2d = xp.ascontiguousarray(values2d).reshape(int(indices.shape[0]), inner)
    n = int(values2d.shape[0])
    kept = plan.kept_sparse
    kept_indices = indices[:n][:, kept] if kept else xp.zeros((n, 0), dtype=xp.int64)
    kept_shape = [plan.shape[d] for d in kept]
    keys = ka.linearize(xp, kept_indices, kept_shape)
    if not output_is_sparse:
        n_rows = int(np.prod(kept_shape, dtype=np.int64))
        if op == rk.SUM:
            out = xp.zeros((n_rows, inner), dtype=work)
            ka.scatter_sum(xp, out, keys, values2d, be.scatter_add)
        else:
            out = ka.group_max(xp, keys, values2d, n_rows)
        return out.astype(t.dtype).reshape(plan.out_shape)
    perm = ka.argsort_stable(xp, keys)
    first, group, n_groups = ka.runs(xp, keys[perm])
    sorted_values = values2d[perm]
    if op == rk.SUM:
        reduced = ka.segment_sum(xp, sorted_values, first, group, n_groups, be.scatter_add)
    else:
        reduced = ka.group_max(xp, group, sorted_values, n_groups)
    coords = kept_indices[perm][first]
    return _sparse_result_gpu(xp, plan, coords, reduced.astype(t.dtype))


def _sparse_result_gpu(xp, plan: _ReducePlan, coords, values2d):
    """The CPU's _sparse_result over device arrays."""
    groups = int(coords.shape[0])
    dense_shape = plan.out_dense_shape
    if plan.keepdims:
        indices = xp.zeros((groups, plan.sparse_ndim), dtype=xp.int64)
        if plan.kept_sparse:
            indices[:, plan.kept_sparse] = coords
    elif coords.shape[1]:
        indices = xp.ascontiguousarray(coords)
    else:
        n0, dense_shape = dense_shape[0], dense_shape[1:]
        indices = xp.arange(n0 if groups else 0, dtype=xp.int64)[:, None]
    values = values2d.reshape(int(indices.shape[0]), *dense_shape)
    return _gpu.coo(plan.out_shape, indices, values, coalesced=True)


@REGISTRY.gpu("reduce_sum", declines=_reduce_declines)
@_gpu.quiet
def reduce_sum_gpu(be, sp_input, axis: list[int], reduction: _ReducePlan, keepdims: bool = False,
                   output_is_sparse: bool = False):
    return _reduce_gpu(be, rk.SUM, sp_input, reduction, output_is_sparse)


@REGISTRY.gpu("reduce_max", declines=_reduce_declines)
@_gpu.quiet
def reduce_max_gpu(be, sp_input, axis: list[int], reduction: _ReducePlan, keepdims: bool = False,
                   output_is_sparse: bool = False):
    return _reduce_gpu(be, rk.MAX, sp_input, reduction, output_is_sparse)


# ------------------------------------------------------------------ softmax
def _softmax_layout(sp_input: SparseTensor) -> str:
    """CSR for an unbatched CSR input (as torch's), COO otherwise."""
    return "csr" if sp_input.layout == "csr" and sp_input.batch_ndim == 0 else "coo"


def _check_softmax(name: str, sp_input: SparseTensor) -> Plan:
    """Floating values (the axis is bound: non-negative, in range)."""
    dtype = sp_input.dtype
    if dtype.kind != "f":
        raise UnimplementedError(f"{name} needs floating values, not {dtype.name}",
                                 reason=Reason.UNSUPPORTED_DTYPE)
    return Plan(dtype=dtype, layout=_softmax_layout(sp_input), shape=sp_input.dense_shape)


def check_softmax(sp_input: SparseTensor, axis: int) -> Plan:
    return _check_softmax("softmax", sp_input)


def check_log_softmax(sp_input: SparseTensor, axis: int) -> Plan:
    return _check_softmax("log_softmax", sp_input)


def _softmax(sp_input: SparseTensor, axis: int, log: bool) -> SparseTensor:
    dtype = sp_input.dtype
    t = as_coo(sp_input)
    s = t.sparse_ndim
    indices, values = kernels.coalesce(t.indices, t.values, t.dense_shape)
    work = values.astype(rk.work_dtype(rk.MAX, dtype), copy=False)
    if axis >= s:
        out = rk.softmax_dense_axis(work, 1 + axis - s, log)
    else:
        cols = [j for j in range(s) if j != axis]
        line_shape = [t.dense_shape[j] for j in cols]
        inner = int(np.prod(values.shape[1:], dtype=np.int64))
        out = rk.softmax_lines(indices[:, cols], line_shape, work.reshape(indices.shape[0], inner), log)
    result = SparseTensor(indices=indices, values=out.astype(dtype, copy=False).reshape(values.shape),
                          dense_shape=t.dense_shape, coalesced=True)
    return as_csr(result) if _softmax_layout(sp_input) == "csr" else result


_SOFTMAX_DOC = """Applies {what} along one axis of a sparse tensor (torch.sparse.{name}).
Unstored entries count as -inf: they take no part and stay unstored, so the result has the input's
sparsity, coalesced (repeated indices summed first). A line of stored values that are all -inf
gives NaN, as in torch. On a hybrid tensor a sparse axis runs across entries for each dense
position, and a dense axis within each entry's values. Floating dtypes only (float16 computed in
float32); others are UNIMPLEMENTED. Result layout: CSR for an unbatched CSR input, COO otherwise.
With axis=-1, a tensor in canonical order (rank >= 2) gets tf.sparse.softmax's values (log_softmax:
their log). Where the two libraries differ we follow torch, whose argument (the axis) this op
takes: repeated indices are summed first (TensorFlow normalises each repeat as a separate entry),
unsorted input is taken (TensorFlow requires canonical order) and rank 1 is allowed (TensorFlow
requires rank >= 2)."""
_SOFTMAX_AXIS = Arg("axis", axis_of("sp_input"), "The axis (negative counts from the end).", default=-1)


@REGISTRY.op(
    "softmax",
    doc=_SOFTMAX_DOC.format(what="softmax", name="softmax"),
    args=[SP_INPUT, _SOFTMAX_AXIS],
    outputs=[Output("output", "sparse", "Softmax values at the input's (coalesced) entries.")],
    check=check_softmax,
)
def softmax(sp_input: SparseTensor, axis: int) -> SparseTensor:
    return _softmax(sp_input, axis, log=False)


@REGISTRY.op(
    "log_softmax",
    doc=_SOFTMAX_DOC.format(what="log(softmax)", name="log_softmax"),
    args=[SP_INPUT, _SOFTMAX_AXIS],
    outputs=[Output("output", "sparse", "Log-softmax values at the input's (coalesced) entries.")],
    check=check_log_softmax,
)
def log_softmax(sp_input: SparseTensor, axis: int) -> SparseTensor:
    return _softmax(sp_input, axis, log=True)


# ------------------------------------------------------------------ maximum, minimum
def _check_extreme(name: str, sp_a: SparseTensor, sp_b: SparseTensor) -> Plan:
    """One shape, one real dtype, one number of sparse dimensions (of the COO views)."""
    if shape_of(sp_a) != shape_of(sp_b):
        raise InvalidArgumentError(
            f"sp_a has shape {shape_of(sp_a)} and sp_b has shape {shape_of(sp_b)}; "
            f"{name} needs equal shapes (no broadcasting)", reason=Reason.SHAPE_MISMATCH)
    if sp_a.dtype != sp_b.dtype:
        raise InvalidArgumentError(f"sp_a is {sp_a.dtype.name} and sp_b is {sp_b.dtype.name}; {name} "
                                   "needs one dtype", reason=Reason.DTYPE_MISMATCH)
    if sp_a.dtype == np.bool_ or sp_a.dtype.kind == "c":
        raise UnimplementedError(f"{name} needs real number values, not {sp_a.dtype.name}",
                                 reason=Reason.UNSUPPORTED_DTYPE)
    s_a, s_b = view_sparse_ndim(sp_a), view_sparse_ndim(sp_b)
    if s_a != s_b:
        raise InvalidArgumentError(f"sp_a has {s_a} sparse dimensions and sp_b has {s_b}; they must be equal",
                                   reason=Reason.SPARSE_DIM_MISMATCH)
    return Plan(dtype=sp_a.dtype, layout="coo", shape=sp_a.dense_shape)


def check_maximum(sp_a: SparseTensor, sp_b: SparseTensor) -> Plan:
    return _check_extreme("maximum", sp_a, sp_b)


def check_minimum(sp_a: SparseTensor, sp_b: SparseTensor) -> Plan:
    return _check_extreme("minimum", sp_a, sp_b)


def _extreme(sp_a: SparseTensor, sp_b: SparseTensor, take_max: bool) -> SparseTensor:
    a, b = as_coo(sp_a), as_coo(sp_b)
    indices, values = rk.elementwise_extreme(a.indices, a.values, b.indices, b.values, a.dense_shape,
                                             take_max)
    return SparseTensor(indices=indices, values=values, dense_shape=a.dense_shape, coalesced=True)


_EXTREME_DOC = """Element-wise {which} of two sparse tensors (tf.sparse.{name}).
Same shape (no broadcasting), same dtype and same number of sparse dimensions required
(INVALID_ARGUMENT otherwise). The result is coalesced and stored at the union of the two
operands' entries, where an operand's unstored entry counts as 0: {name}([[0]]: 0, [[1]]: 1)
stores [[0]]: 0 and [[1]]: 1. Each operand is coalesced first (repeated indices summed).
NaN propagates. Real dtypes only (bool and complex are UNIMPLEMENTED); inputs of any sparse
layout are read as COO."""
_EXTREME_ARGS = [Arg("sp_a", SPARSE, "First operand.", layouts=SPARSE_LAYOUTS),
                 Arg("sp_b", SPARSE, "Second operand, same shape and dtype.", layouts=SPARSE_LAYOUTS)]


@REGISTRY.op(
    "maximum",
    doc=_EXTREME_DOC.format(which="maximum", name="maximum"),
    args=_EXTREME_ARGS,
    outputs=[Output("output", "sparse", "Coalesced COO over the union of the entries.")],
    check=check_maximum,
)
def maximum(sp_a: SparseTensor, sp_b: SparseTensor) -> SparseTensor:
    return _extreme(sp_a, sp_b, take_max=True)


@REGISTRY.op(
    "minimum",
    doc=_EXTREME_DOC.format(which="minimum", name="minimum"),
    args=_EXTREME_ARGS,
    outputs=[Output("output", "sparse", "Coalesced COO over the union of the entries.")],
    check=check_minimum,
)
def minimum(sp_a: SparseTensor, sp_b: SparseTensor) -> SparseTensor:
    return _extreme(sp_a, sp_b, take_max=False)


# ----------------------------------------------------------- partitioned tensors
# The plans read the reduced axes from the checked call's "axis" (sorted, non-negative).
REGISTRY.partitioned("reduce_sum", Reduction(additive=True))
REGISTRY.partitioned("reduce_max", Reduction())
