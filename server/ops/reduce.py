"""Reductions and friends: reduce_sum, reduce_max, softmax, log_softmax, maximum, minimum."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparseserve.core.tensor import SparseTensor
from sparseserve.core.errors import InvalidArgumentError, UnimplementedError
from sparseserve.core.reasons import Reason
from sparseserve import kernels
from sparseserve.kernels import arrays as ka
from sparseserve.kernels import reduce as rk

from ..argtypes import AXES, BOOL, INT, SPARSE
from ..partition import Reduction
from ..registry import REGISTRY, Arg, Output
from . import _gpu
from ._layouts import SPARSE_LAYOUTS, as_coo, as_csr


SP_INPUT = Arg("sp_input", SPARSE, "The input sparse tensor (COO, CSR, CSC, BSR or BSC).",
               layouts=SPARSE_LAYOUTS)


def _axis_index(axis: int, rank: int, name: str) -> int:
    if not -rank <= axis < rank:
        raise InvalidArgumentError(f"{name} = {axis} is out of range for a tensor of rank {rank} "
                                   f"(valid: {-rank} to {rank - 1})", reason=Reason.AXIS_OUT_OF_RANGE)
    return axis % rank


def _reduction_axes(axis: list[int] | None, rank: int) -> list[int]:
    """Sorted non-negative axes; None means all of them. An axis named twice (1 and -1 of a
    matrix too) is reduced once, as tf.sparse.reduce_sum/reduce_max do."""
    if axis is None:
        return list(range(rank))
    return sorted({_axis_index(a, rank, f"axis[{i}]") for i, a in enumerate(axis)})


@dataclass
class _ReducePlan:
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


def _reduce_bytes(sp_input, axis=None, keepdims=False, output_is_sparse=False, **_) -> int:
    if output_is_sparse:
        return 0
    out = _out_shape(sp_input.dense_shape, _reduction_axes(axis, len(sp_input.dense_shape)), keepdims)
    return int(np.prod(out, dtype=object)) * sp_input.dtype.itemsize


def _check_reduce_dtype(op: str, dtype: np.dtype) -> None:
    if dtype == np.bool_ or (op == rk.MAX and dtype.kind == "c"):
        what = "bool" if dtype == np.bool_ else "complex"
        raise UnimplementedError(f"reduce_{op} does not support {what} values ({dtype.name}), as "
                                 f"TensorFlow's does not", reason=Reason.UNSUPPORTED_DTYPE)


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


def _reduce(op: str, sp_input: SparseTensor, axis, keepdims: bool, output_is_sparse: bool):
    _check_reduce_dtype(op, sp_input.dtype)
    axes = _reduction_axes(axis, len(sp_input.dense_shape))
    plain_csr = sp_input.layout == "csr" and sp_input.batch_ndim == 0 and sp_input.values.ndim == 1
    t = sp_input if plain_csr else as_coo(sp_input)
    plan = _ReducePlan(tuple(t.dense_shape), t.sparse_ndim, axes, keepdims)
    if output_is_sparse and not plan.out_shape:
        raise InvalidArgumentError(
            f"reduce_{op} over every axis without keepdims gives a scalar, which cannot be sparse; "
            "pass keepdims=true or output_is_sparse=false", reason=Reason.RANK_TOO_LOW)
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
    Arg("axis", AXES, "An axis or a list of axes to reduce (negative counts from the end; one named "
        "twice is reduced once, as in TensorFlow); null reduces every axis, [] none.", default=None),
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
    result_bytes=_reduce_bytes,
)
def reduce_sum(sp_input: SparseTensor, axis=None, keepdims: bool = False, output_is_sparse: bool = False):
    return _reduce(rk.SUM, sp_input, axis, keepdims, output_is_sparse)


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
    result_bytes=_reduce_bytes,
)
def reduce_max(sp_input: SparseTensor, axis=None, keepdims: bool = False, output_is_sparse: bool = False):
    return _reduce(rk.MAX, sp_input, axis, keepdims, output_is_sparse)


# ------------------------------------------------------------------ reduce_sum / reduce_max on the GPU
# COO of any rank (hybrid too) and 2-D CSR/CSC, dense or sparse output, every dtype the op takes:
# sums scatter into the work dtype (``arrays.scatter_sum``/``segment_sum``), maxima come from a
# sort by (output key, value) (``arrays.group_max``). Block and batched compressed tensors run on
# the CPU, as do the calls it refuses.
def _reduce_on_gpu(op: str, sp_input, axis=None, keepdims=False, output_is_sparse=False) -> str | None:
    if _gpu.refused(_check_reduce_dtype, op, sp_input.dtype):
        return "dtype"
    if _gpu.refused(_reduction_axes, axis, len(sp_input.dense_shape)):
        return "argument"
    if output_is_sparse and not _out_shape(sp_input.dense_shape, _reduction_axes(axis, sp_input.ndim), keepdims):
        return "argument"
    if not _gpu.native(sp_input):
        return "dtype"
    return None if sp_input.layout == "coo" else _gpu.plain_matrix(sp_input)


def _reduce_gpu(be, op: str, sp_input: SparseTensor, axis, keepdims: bool, output_is_sparse: bool):
    xp = be.xp
    t = sp_input
    if t.layout == "coo":
        indices, values = t.indices, t.values
    else:
        rows, cols, values = _gpu.coo_entries(xp, t)
        indices = xp.stack([rows, cols], axis=1)
    sparse_ndim = int(indices.shape[1])
    plan = _ReducePlan(tuple(t.dense_shape), sparse_ndim, _reduction_axes(axis, t.ndim), keepdims)
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


@REGISTRY.gpu("reduce_sum", supports=lambda **bound: _reduce_on_gpu(rk.SUM, **bound))
@_gpu.quiet
def reduce_sum_gpu(be, sp_input, axis=None, keepdims: bool = False, output_is_sparse: bool = False):
    return _reduce_gpu(be, rk.SUM, sp_input, axis, keepdims, output_is_sparse)


@REGISTRY.gpu("reduce_max", supports=lambda **bound: _reduce_on_gpu(rk.MAX, **bound))
@_gpu.quiet
def reduce_max_gpu(be, sp_input, axis=None, keepdims: bool = False, output_is_sparse: bool = False):
    return _reduce_gpu(be, rk.MAX, sp_input, axis, keepdims, output_is_sparse)


# ------------------------------------------------------------------ softmax
def _softmax(name: str, sp_input: SparseTensor, axis: int, log: bool) -> SparseTensor:
    dtype = sp_input.dtype
    if dtype.kind != "f":
        raise UnimplementedError(f"{name} needs floating values, not {dtype.name}",
                                 reason=Reason.UNSUPPORTED_DTYPE)
    d = _axis_index(axis, len(sp_input.dense_shape), "axis")
    t = as_coo(sp_input)
    s = t.sparse_ndim
    indices, values = kernels.coalesce(t.indices, t.values, t.dense_shape)
    work = values.astype(rk.work_dtype(rk.MAX, dtype), copy=False)
    if d >= s:
        out = rk.softmax_dense_axis(work, 1 + d - s, log)
    else:
        cols = [j for j in range(s) if j != d]
        line_shape = [t.dense_shape[j] for j in cols]
        inner = int(np.prod(values.shape[1:], dtype=np.int64))
        out = rk.softmax_lines(indices[:, cols], line_shape, work.reshape(indices.shape[0], inner), log)
    result = SparseTensor(indices=indices, values=out.astype(dtype, copy=False).reshape(values.shape),
                          dense_shape=t.dense_shape, coalesced=True)
    if sp_input.layout == "csr" and sp_input.batch_ndim == 0:
        return as_csr(result)
    return result


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


@REGISTRY.op(
    "softmax",
    doc=_SOFTMAX_DOC.format(what="softmax", name="softmax"),
    args=[SP_INPUT, Arg("axis", INT, "The axis (negative counts from the end).", default=-1)],
    outputs=[Output("output", "sparse", "Softmax values at the input's (coalesced) entries.")],
)
def softmax(sp_input: SparseTensor, axis: int = -1) -> SparseTensor:
    return _softmax("softmax", sp_input, axis, log=False)


@REGISTRY.op(
    "log_softmax",
    doc=_SOFTMAX_DOC.format(what="log(softmax)", name="log_softmax"),
    args=[SP_INPUT, Arg("axis", INT, "The axis (negative counts from the end).", default=-1)],
    outputs=[Output("output", "sparse", "Log-softmax values at the input's (coalesced) entries.")],
)
def log_softmax(sp_input: SparseTensor, axis: int = -1) -> SparseTensor:
    return _softmax("log_softmax", sp_input, axis, log=True)


# ------------------------------------------------------------------ maximum, minimum
def _extreme(name: str, sp_a: SparseTensor, sp_b: SparseTensor, take_max: bool) -> SparseTensor:
    if list(sp_a.dense_shape) != list(sp_b.dense_shape):
        raise InvalidArgumentError(
            f"sp_a has shape {list(sp_a.dense_shape)} and sp_b has shape {list(sp_b.dense_shape)}; "
            f"{name} needs equal shapes (no broadcasting)", reason=Reason.SHAPE_MISMATCH)
    if sp_a.dtype != sp_b.dtype:
        raise InvalidArgumentError(f"sp_a is {sp_a.dtype.name} and sp_b is {sp_b.dtype.name}; {name} "
                                   "needs one dtype", reason=Reason.DTYPE_MISMATCH)
    if sp_a.dtype == np.bool_ or sp_a.dtype.kind == "c":
        raise UnimplementedError(f"{name} needs real number values, not {sp_a.dtype.name}",
                                 reason=Reason.UNSUPPORTED_DTYPE)
    a, b = as_coo(sp_a), as_coo(sp_b)
    if a.sparse_ndim != b.sparse_ndim:
        raise InvalidArgumentError(f"sp_a has {a.sparse_ndim} sparse dimensions and sp_b has "
                                   f"{b.sparse_ndim}; they must be equal", reason=Reason.SPARSE_DIM_MISMATCH)
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


@REGISTRY.op(
    "maximum",
    doc=_EXTREME_DOC.format(which="maximum", name="maximum"),
    args=[Arg("sp_a", SPARSE, "First operand.", layouts=SPARSE_LAYOUTS),
          Arg("sp_b", SPARSE, "Second operand, same shape and dtype.", layouts=SPARSE_LAYOUTS)],
    outputs=[Output("output", "sparse", "Coalesced COO over the union of the entries.")],
)
def maximum(sp_a: SparseTensor, sp_b: SparseTensor) -> SparseTensor:
    return _extreme("maximum", sp_a, sp_b, take_max=True)


@REGISTRY.op(
    "minimum",
    doc=_EXTREME_DOC.format(which="minimum", name="minimum"),
    args=[Arg("sp_a", SPARSE, "First operand.", layouts=SPARSE_LAYOUTS),
          Arg("sp_b", SPARSE, "Second operand, same shape and dtype.", layouts=SPARSE_LAYOUTS)],
    outputs=[Output("output", "sparse", "Coalesced COO over the union of the entries.")],
)
def minimum(sp_a: SparseTensor, sp_b: SparseTensor) -> SparseTensor:
    return _extreme("minimum", sp_a, sp_b, take_max=False)


# ----------------------------------------------------------- partitioned tensors
REGISTRY.partitioned("reduce_sum", Reduction(axes=lambda bound, rank: _reduction_axes(bound["axis"], rank),
                                             additive=True))
REGISTRY.partitioned("reduce_max", Reduction(axes=lambda bound, rank: _reduction_axes(bound["axis"], rank)))
