"""Structure ops: sparse_to_dense, to_indicator, concat, fill_empty_rows, select.

Arguments follow TensorFlow (tf.sparse_to_dense, tf.sparse.to_indicator,
tf.sparse.concat, tf.sparse.fill_empty_rows) and PyTorch (indexing, for
select). Everything a kernel relies on is checked here first; ops that could
produce large dense results declare ``result_bytes`` so the server checks
--max-result-bytes before anything is allocated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparseserve import kernels
from sparseserve.core.tensor import SparseTensor
from sparseserve.core.validate import INT64_MAX, check_shape
from sparseserve.core.errors import InvalidArgumentError, UnimplementedError
from sparseserve.core.reasons import Reason
from sparseserve.kernels import structure as sk
from sparseserve.kernels._sort import argsort_stable, gather_rows

from ..argtypes import BOOL, DENSE, INDEX, INT, INT_LIST, SCALAR, SPARSE, TENSORS
from ..partition import Stack
from ..registry import REGISTRY, Arg, Output
from ._common import cast_scalar, check_ordered
from ._layouts import SPARSE_LAYOUTS, BatchNseError, coo_view, like, view_nnz, view_sparse_ndim

SP_INPUT = Arg("sp_input", SPARSE, "The input sparse tensor (any sparse layout).", layouts=SPARSE_LAYOUTS)

# How the ops here take the compressed layouts (CSR, CSC, BSR, BSC, batch and dense dims too).
_VIEW_DOC = """
CSR, CSC, BSR, BSC: computed on the tensor's COO view (batch dimensions lead as sparse ones;
every element of a stored block is a stored entry, zeros included)"""


def _in_layout_of(out: SparseTensor, t: SparseTensor, op: str) -> SparseTensor:
    """A COO result in ``t``'s compressed layout (``_layouts.like``), errors named for ``op``."""
    try:
        return like(out, t)
    except BatchNseError as exc:
        raise InvalidArgumentError(f"{op}: the result cannot be {t.layout}: {exc}",
                                   reason=Reason.BATCH_NSE_MISMATCH) from None


def _nbytes(shape, dtype) -> int:
    return int(np.prod([int(d) for d in shape], dtype=object)) * np.dtype(dtype).itemsize


# --------------------------------------------------------------- sparse_to_dense
@dataclass
class _StdPlan:
    indices: np.ndarray  # int64 [N, rank], not yet range-checked
    shape: tuple[int, ...]
    values: np.ndarray


def _std_plan(sparse_indices: np.ndarray, output_shape: list[int], sparse_values: np.ndarray) -> _StdPlan:
    shape = check_shape(output_shape, "output_shape")
    idx = np.asarray(sparse_indices)
    if idx.dtype.kind not in "iu":
        raise InvalidArgumentError(f"sparse_indices has dtype {idx.dtype}; it must be an integer type",
                                   reason=Reason.INDEX_DTYPE)
    if idx.ndim > 2:
        raise InvalidArgumentError(f"sparse_indices has rank {idx.ndim}; it must be 0-D, 1-D or 2-D",
                                   reason=Reason.INDICES_RANK)
    n = 1 if idx.ndim == 0 else idx.shape[0]
    rank = idx.shape[1] if idx.ndim == 2 else 1
    if rank != len(shape):
        raise InvalidArgumentError(
            f"sparse_indices gives indices of rank {rank} but output_shape = {list(shape)} has rank "
            f"{len(shape)}", reason=Reason.RANK_MISMATCH)
    values = np.asarray(sparse_values)
    if values.ndim > 1 or (values.ndim == 1 and values.shape[0] != n):
        raise InvalidArgumentError(
            f"sparse_values has shape {list(values.shape)}; it must be a scalar or a vector of the "
            f"{n} values of sparse_indices", reason=Reason.VALUES_SHAPE_MISMATCH)
    if idx.dtype.kind == "u" and idx.size and int(idx.max()) > INT64_MAX:
        pos = tuple(int(i) for i in np.unravel_index(int(np.argmax(idx)), idx.shape))
        raise InvalidArgumentError(f"sparse_indices{list(pos)} = {int(idx[pos])} is out of range for "
                                   f"output_shape {list(shape)}", reason=Reason.INDEX_OUT_OF_RANGE)
    return _StdPlan(idx.astype(np.int64, copy=False).reshape(n, rank), shape, values)


def _std_bytes(sparse_indices, output_shape, sparse_values, **_) -> int:
    plan = _std_plan(sparse_indices, output_shape, sparse_values)
    return _nbytes(plan.shape, plan.values.dtype)


@REGISTRY.op(
    "sparse_to_dense",
    doc="""Builds a dense tensor from indices and values (tf.sparse_to_dense).
sparse_indices is 0-D (one index into a 1-D output), 1-D (indices into a 1-D output) or 2-D
[N, rank] (sparse_indices[i] is the complete index of sparse_values[i]); sparse_values is a
scalar used for every index, or a vector of N values. Other positions take default_value.
Indices out of range are INVALID_ARGUMENT. With validate_indices, indices must be sorted
row-major and unique (INVALID_ARGUMENT otherwise); without it, repeated indices are summed, as
to_dense's are (TensorFlow's kernel, which documents repeats as unsupported, keeps the last).""",
    args=[Arg("sparse_indices", DENSE, "Integer indices: 0-D, 1-D or 2-D [N, rank].", layouts=("dense",)),
          Arg("output_shape", INT_LIST, "Shape of the dense output."),
          Arg("sparse_values", DENSE, "A scalar, or one value per index.", layouts=("dense",)),
          Arg("default_value", SCALAR, "The value of other positions, cast to sparse_values' dtype.",
              default=0),
          Arg("validate_indices", BOOL, "Require sorted, unique indices.", default=True)],
    outputs=[Output("output", "dense", "Dense tensor of shape output_shape, dtype of sparse_values.")],
    result_bytes=_std_bytes,
)
def sparse_to_dense(sparse_indices, output_shape, sparse_values, default_value=0,
                    validate_indices: bool = True) -> np.ndarray:
    plan = _std_plan(sparse_indices, output_shape, sparse_values)
    idx, shape = plan.indices, plan.shape
    default = cast_scalar(default_value, plan.values.dtype, "default_value")
    n = idx.shape[0]
    if n:
        limits = np.asarray(shape, np.int64)
        bad = (idx < 0) | (idx >= limits)
        if bad.any():
            i = int(np.argmax(bad.any(axis=1)))
            raise InvalidArgumentError(
                f"sparse_indices[{i}] = {idx[i].tolist()} is out of range for output_shape "
                f"{list(shape)}", reason=Reason.INDEX_OUT_OF_RANGE)
    if validate_indices and n > 1:
        check_ordered(idx, shape, "sparse_indices", "sort the indices")
    values = np.broadcast_to(plan.values, (n,))
    return kernels.to_dense(idx, values, shape, default, validate_indices)


# ----------------------------------------------------------------- to_indicator
def _indicator_shape(sp_input: SparseTensor, vocab_size: int) -> tuple[int, ...]:
    if vocab_size < 0:
        raise InvalidArgumentError(f"vocab_size = {vocab_size} must not be negative",
                                   reason=Reason.NEGATIVE_DIMENSION)
    return check_shape((*sp_input.dense_shape[:-1], vocab_size), "output shape")


def _indicator_bytes(sp_input, vocab_size, **_) -> int:
    return _nbytes(_indicator_shape(sp_input, vocab_size), np.bool_)


@REGISTRY.op(
    "to_indicator",
    doc="""Converts a sparse tensor of integer ids into a dense bool indicator (tf.sparse.to_indicator).
The last dimension is replaced by vocab_size: output[d_0, ..., d_{n-1}, id] is true where some
stored entry [d_0, ..., d_{n-1}, k] has value id. Repeated ids and unsorted input are allowed.
Every id must be in [0, vocab_size) (INVALID_ARGUMENT otherwise); non-integer values are
UNIMPLEMENTED. For a hybrid tensor every element of a stored value block is an id.""" + _VIEW_DOC + ".",
    args=[Arg("sp_input", SPARSE, "Sparse tensor of integer ids (any sparse layout).", layouts=SPARSE_LAYOUTS),
          Arg("vocab_size", INT, "Size of the new last dimension; every id is below it.")],
    outputs=[Output("output", "dense", "Dense bool tensor, shape dense_shape[:-1] + [vocab_size].")],
    result_bytes=_indicator_bytes,
)
def to_indicator(sp_input: SparseTensor, vocab_size: int) -> np.ndarray:
    if sp_input.dtype.kind not in "iu":
        raise UnimplementedError(
            f"to_indicator needs integer ids; sp_input has dtype {sp_input.dtype.name}",
            reason=Reason.UNSUPPORTED_DTYPE)
    _indicator_shape(sp_input, vocab_size)
    ids = sp_input.values
    if ids.size:
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= vocab_size:
            bad = (ids < 0) | (ids >= vocab_size) if ids.dtype.kind == "i" else ids >= np.uint64(vocab_size)
            pos = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape))
            raise InvalidArgumentError(
                f"sp_input.values[{', '.join(map(str, pos))}] = {int(ids[pos])} is out of range "
                f"for vocab_size = {vocab_size}", reason=Reason.VALUE_OUT_OF_RANGE)
    view = coo_view(sp_input)
    return sk.to_indicator(view.indices, view.values.astype(np.int64, copy=False), sp_input.dense_shape,
                           vocab_size)


# ----------------------------------------------------------------------- concat
@dataclass
class _ConcatPlan:
    axis: int
    shape: tuple[int, ...]
    sparse_ndim: int
    dtype: np.dtype


def _concat_plan(axis: int, sp_inputs: list[SparseTensor], expand_nonconcat_dims: bool) -> _ConcatPlan:
    if not sp_inputs:
        raise InvalidArgumentError("sp_inputs must hold at least one tensor", reason=Reason.EMPTY_LIST)
    first = sp_inputs[0]
    rank, sparse_ndim, dtype = first.ndim, view_sparse_ndim(first), first.dtype
    for i, t in enumerate(sp_inputs[1:], 1):
        if t.layout != first.layout or tuple(t.blocksize or ()) != tuple(first.blocksize or ()):
            raise UnimplementedError(
                f"concat does not support mixing layouts: sp_inputs[{i}] is {t.layout}"
                f"{'' if t.blocksize is None else f' (blocksize {list(t.blocksize)})'} but sp_inputs[0] is "
                f"{first.layout}{'' if first.blocksize is None else f' (blocksize {list(first.blocksize)})'}; "
                "every input must share one layout", reason=Reason.UNSUPPORTED_LAYOUT)
        if t.ndim != rank:
            raise InvalidArgumentError(f"sp_inputs[{i}] has rank {t.ndim} but sp_inputs[0] has rank {rank}",
                                       reason=Reason.RANK_MISMATCH)
        if view_sparse_ndim(t) != sparse_ndim:
            raise InvalidArgumentError(
                f"sp_inputs[{i}] has {view_sparse_ndim(t)} sparse dimensions but sp_inputs[0] has "
                f"{sparse_ndim}", reason=Reason.SPARSE_DIM_MISMATCH)
        if t.dtype != dtype:
            raise InvalidArgumentError(
                f"sp_inputs[{i}] has dtype {t.dtype.name} but sp_inputs[0] has {dtype.name}",
                reason=Reason.DTYPE_MISMATCH)
    if not -rank <= axis < rank:
        raise InvalidArgumentError(f"axis = {axis} is out of range for rank {rank}",
                                   reason=Reason.AXIS_OUT_OF_RANGE)
    axis %= rank
    shape = []
    for d in range(rank):
        dims = [t.dense_shape[d] for t in sp_inputs]
        if d == axis:
            shape.append(sum(dims))
        elif expand_nonconcat_dims:
            shape.append(max(dims))
        else:
            for i, dim in enumerate(dims):
                if dim != dims[0]:
                    raise InvalidArgumentError(
                        f"sp_inputs[{i}].dense_shape[{d}] = {dim} differs from sp_inputs[0]"
                        f".dense_shape[{d}] = {dims[0]}; only axis {axis} may differ (or pass "
                        "expand_nonconcat_dims=true)", reason=Reason.SHAPE_MISMATCH)
            shape.append(dims[0])
    shape = check_shape(shape, "output dense_shape")
    # Row-major keys run over the sparse dimensions: they must fit int64 even when a dense
    # dimension of 0 makes the whole product 0.
    check_shape(shape[:sparse_ndim], f"output dense_shape[:{sparse_ndim}]")
    return _ConcatPlan(axis, shape, sparse_ndim, dtype)


def _concat_bytes(axis, sp_inputs, expand_nonconcat_dims=False, **_) -> int:
    plan = _concat_plan(axis, sp_inputs, expand_nonconcat_dims)
    nnz = sum(view_nnz(t) for t in sp_inputs)
    return nnz * (8 * plan.sparse_ndim + _nbytes(plan.shape[plan.sparse_ndim:], plan.dtype))


@REGISTRY.op(
    "concat",
    doc="""Concatenates sparse tensors along axis (tf.sparse.concat); negative axis counts from the end.
All inputs have the same rank, sparse dimensions and dtype, and the same size on every other
dimension unless expand_nonconcat_dims, when each such dimension is the largest input's.
The output is re-sorted row-major (stable: entries at one index keep the input order;
duplicates are kept); a single input comes back as it is, unsorted if it was (as TensorFlow's).
Concatenating hybrid tensors along a dense dimension zero-pads each input's value blocks, so an
index stored in several inputs appears once per input.""" + _VIEW_DOC + """;
every input in one layout (one blocksize; mixing is UNIMPLEMENTED), the result in it (torch's
layout), coalesced, with the inputs' blocksize and index dtype (int64 if any input's is). A batched
result whose batches would hold different numbers of entries is INVALID_ARGUMENT.""",
    args=[Arg("axis", INT, "Dimension to concatenate along."),
          Arg("sp_inputs", TENSORS, "The sparse tensors (any one layout) to concatenate.",
              layouts=SPARSE_LAYOUTS),
          Arg("expand_nonconcat_dims", BOOL, "Let other dimensions differ; the output takes the largest.",
              default=False)],
    outputs=[Output("output", "sparse", "The concatenation, in row-major order.")],
    result_bytes=_concat_bytes,
)
def concat(axis: int, sp_inputs: list[SparseTensor], expand_nonconcat_dims: bool = False) -> SparseTensor:
    plan = _concat_plan(axis, sp_inputs, expand_nonconcat_dims)
    if len(sp_inputs) == 1:
        # As tf.sparse.concat: one input comes back as it is, not re-sorted (a COO one flagged as
        # any concat result is, so a partitioned concat's blocks say what a whole one says).
        t = sp_inputs[0]
        if t.layout != "coo":
            return t
        return SparseTensor(indices=t.indices, values=t.values, dense_shape=t.dense_shape, coalesced=False)
    compressed = sp_inputs[0].layout != "coo"
    if compressed:
        ref = max(sp_inputs, key=lambda t: t.compressed_indices.dtype.itemsize)
        sp_inputs = [coo_view(t) for t in sp_inputs]
    s, ax = plan.sparse_ndim, plan.axis
    block = plan.shape[s:]
    all_indices, all_values = [], []
    offset = 0
    for t in sp_inputs:
        idx = t.indices
        if ax < s and offset:
            idx = idx.copy()
            idx[:, ax] += offset
        vals = t.values
        if tuple(vals.shape[1:]) != block:  # pad value blocks (dense-axis concat or expanded dims)
            padded = np.zeros((t.nnz, *block), plan.dtype)
            where = [slice(None)] + [slice(0, dim) for dim in t.dense_shape[s:]]
            if ax >= s:
                where[ax - s + 1] = slice(offset, offset + t.dense_shape[ax])
            padded[tuple(where)] = vals
            vals = padded
        all_indices.append(idx)
        all_values.append(vals)
        offset += t.dense_shape[ax]
    indices = np.concatenate(all_indices) if len(all_indices) > 1 else all_indices[0]
    values = np.concatenate(all_values) if len(all_values) > 1 else all_values[0]
    indices, values = kernels.reorder(indices, values, plan.shape)
    out = SparseTensor(indices=indices, values=values, dense_shape=plan.shape, coalesced=False)
    return _in_layout_of(out, ref, "concat") if compressed else out


# -------------------------------------------------------------- fill_empty_rows
def _fill_bytes(sp_input, default_value=None, **_) -> int:
    rows = sp_input.dense_shape[0] if sp_input.ndim else 0
    s = view_sparse_ndim(sp_input)
    if sp_input.layout == "coo":
        present = int(np.unique(sp_input.indices[:, 0]).size) if sp_input.nnz else 0
    else:
        present = 0  # an upper bound: every row may be empty
    entry = 8 * s + _nbytes(sp_input.dense_shape[s:], sp_input.dtype)
    return rows + (view_nnz(sp_input) + rows - present) * entry


@REGISTRY.op(
    "fill_empty_rows",
    doc="""Fills empty rows with default_value (tf.sparse.fill_empty_rows).
Rows are the first dimension. Each row without a stored entry gets one at [row, 0, ..., 0]
(a whole value block of default_value for a hybrid tensor). The output is ordered by row, as
TensorFlow's is: stably, so the entries of one row keep their input order (a sorted input gives a
sorted output); empty_row_indicator[i] is true iff row i
of the input was empty.""" + _VIEW_DOC + """ (a stored block fills each of its rows),
the result in the input's layout, blocksize and index dtype, coalesced (torch's layout). Rows are
the first dimension, a batch dimension of a batched tensor; its batches must then hold the same
number of entries after filling (INVALID_ARGUMENT otherwise).""",
    args=[SP_INPUT,
          Arg("default_value", SCALAR, "The value of the entries added, cast to the values' dtype.")],
    outputs=[Output("output", "sparse", "The input with every empty row filled, row-major."),
             Output("empty_row_indicator", "dense", "Bool [dense_shape[0]]: which rows were empty.")],
    result_bytes=_fill_bytes,
)
def fill_empty_rows(sp_input: SparseTensor, default_value):
    default = cast_scalar(default_value, sp_input.dtype, "default_value")
    if sp_input.layout != "coo":
        out, empty = fill_empty_rows(coo_view(sp_input), default)
        return _in_layout_of(out, sp_input, "fill_empty_rows"), empty
    s = sp_input.sparse_ndim
    rows = sp_input.dense_shape[0]
    empty = np.ones(rows, np.bool_)
    empty[sp_input.indices[:, 0]] = False
    new_rows = np.flatnonzero(empty)
    k = new_rows.size
    if k and any(d == 0 for d in sp_input.dense_shape[1:s]):
        raise InvalidArgumentError(
            f"sp_input.dense_shape = {list(sp_input.dense_shape)} has an empty sparse dimension, so "
            "there is no index [row, 0, ...] for the empty rows", reason=Reason.EMPTY_DIMENSION)
    new_indices = np.zeros((k, s), np.int64)
    new_indices[:, 0] = new_rows
    new_values = np.full((k, *sp_input.values.shape[1:]), default, sp_input.dtype)
    indices = np.concatenate([sp_input.indices, new_indices])
    values = np.concatenate([sp_input.values, new_values])
    # Ordered by row only, stably (as TensorFlow's kernel): a row's entries keep their input order.
    perm = argsort_stable(indices[:, 0])
    indices, values = indices[perm], gather_rows(values, perm)
    out = SparseTensor(indices=indices, values=values, dense_shape=sp_input.dense_shape,
                       coalesced=sp_input.coalesced)
    return out, empty


# ----------------------------------------------------------------------- select
@dataclass
class _SelectPlan:
    start: list[int]
    step: list[int]
    length: list[int]
    keep: list[bool]
    dense_index: tuple  # numpy basic index over the values' dense dimensions
    dense_out: bool
    out_shape: tuple[int, ...]  # of the sparse result, or of the dense one


def _select_plan(sp_input: SparseTensor, index: list) -> _SelectPlan:
    shape, s = sp_input.dense_shape, view_sparse_ndim(sp_input)
    if len(index) > len(shape):
        raise InvalidArgumentError(f"index has {len(index)} items but sp_input has rank {len(shape)}",
                                   reason=Reason.TOO_MANY_INDICES)
    items = list(index) + [slice(None)] * (len(shape) - len(index))
    start, step, length, keep, out_shape = [], [], [], [], []
    for d, (item, dim) in enumerate(zip(items, shape)):
        if isinstance(item, slice):
            if item.step is not None and item.step <= 0:
                raise InvalidArgumentError(f"index[{d}] has step {item.step}; steps must be positive",
                                           reason=Reason.BAD_SLICE_STEP)
            b, e, st = item.indices(dim)
            n = len(range(b, e, st))
            st = min(st, max(dim, 1))  # same progression (n <= 1 past dim), and it fits int64
            start.append(b)
            step.append(st)
            length.append(n)
            keep.append(True)
            out_shape.append(n)
        else:
            i = int(item)
            if not -dim <= i < dim:
                raise InvalidArgumentError(f"index[{d}] = {i} is out of range for dense_shape[{d}] = {dim}",
                                           reason=Reason.INDEX_OUT_OF_RANGE)
            i %= dim
            start.append(i)
            step.append(1)
            length.append(1)
            keep.append(False)
    dense_index = tuple(slice(b, b + st * n, st) if k else b
                        for b, st, n, k in zip(start[s:], step[s:], length[s:], keep[s:]))
    dense_out = not any(keep[:s])
    if dense_out:
        out_shape = [n for n, k in zip(length[s:], keep[s:]) if k]
    return _SelectPlan(start, step, length, keep, dense_index, dense_out, tuple(out_shape))


def _select_bytes(sp_input, index, **_) -> int:
    plan = _select_plan(sp_input, index)
    return _nbytes(plan.out_shape, sp_input.dtype) if plan.dense_out else 0


def _sum_rows(values: np.ndarray, block: tuple[int, ...]) -> np.ndarray:
    """The sum of ``values`` over axis 0 in its own dtype (bool: or)."""
    if values.shape[0] == 0:
        return np.zeros(block, values.dtype)
    if values.dtype == np.bool_:
        return np.array(values.any(axis=0)).reshape(block)
    if values.dtype == np.float16:
        return np.array(values.astype(np.float32).sum(axis=0).astype(np.float16)).reshape(block)
    with np.errstate(all="ignore"):
        return np.array(values.sum(axis=0, dtype=values.dtype)).reshape(block)


@REGISTRY.op(
    "select",
    doc="""Indexes a sparse tensor as PyTorch's t[index] does.
index holds ints and [start, stop, step] slices (null for a default, Python semantics,
negative start/stop allowed, step positive) over the leading dimensions; missing trailing
ones are taken whole. An int removes its dimension, a slice keeps it. Sparse dimensions come
first; for a hybrid tensor, items past them index the values' dense dimensions. The result is
sparse of lower (or equal) rank, keeping the input's entry order (duplicates kept), or dense
when every sparse dimension is fixed by an int (repeated entries summed).""" + _VIEW_DOC + """:
ints and slices over batch dimensions select batches. The result keeps the input's layout,
blocksize and index dtype while both compressed dimensions remain (slices over them; torch
keeps CSR for a batch index or a dense-dimension index), for BSR/BSC only when the blocksize
divides the remaining ones (INVALID_ARGUMENT, BLOCKSIZE, otherwise); an int over a compressed
dimension gives COO, as torch's select does (every element of a stored block stored).""",
    args=[SP_INPUT,
          Arg("index", INDEX, "Ints and [start, stop, step] slices over the leading dimensions.")],
    outputs=[Output("output", "sparse", "The selection: sparse, or dense when every sparse dim is fixed.")],
    result_bytes=_select_bytes,
)
def select(sp_input: SparseTensor, index: list):
    plan = _select_plan(sp_input, index)
    if sp_input.layout != "coo":
        nb = sp_input.batch_ndim
        out = select(coo_view(sp_input), index)
        if not (plan.keep[nb] and plan.keep[nb + 1]):
            return out
        if sp_input.layout in ("bsr", "bsc"):
            kept = [n for n, k in zip(plan.length[:nb + 2], plan.keep[:nb + 2]) if k][-2:]
            br, bc = (int(b) for b in sp_input.blocksize)
            if kept[0] % br or kept[1] % bc:
                raise InvalidArgumentError(
                    f"index leaves compressed dimensions {kept}, which blocksize {[br, bc]} of the "
                    f"{sp_input.layout} sp_input does not divide; slice whole blocks (lengths that are "
                    "multiples of the blocksize)", reason=Reason.BLOCKSIZE)
        return _in_layout_of(out, sp_input, "select")
    s = sp_input.sparse_ndim
    rows, new_indices = sk.select(sp_input.indices, plan.start[:s], plan.step[:s], plan.length[:s],
                                  plan.keep[:s])
    values = sk.take_rows(sp_input.values, rows)
    values = values[(slice(None), *plan.dense_index)]
    if plan.dense_out:
        return _sum_rows(values, plan.out_shape)
    sparse_shape = [n for n, k in zip(plan.length[:s], plan.keep[:s]) if k]
    return SparseTensor(indices=new_indices, values=np.ascontiguousarray(values),
                        dense_shape=(*sparse_shape, *plan.out_shape[len(sparse_shape):]),
                        coalesced=sp_input.coalesced)


# ----------------------------------------------------------- partitioned tensors
REGISTRY.partitioned("concat", Stack(
    axis=lambda bound: _concat_plan(bound["axis"], bound["sp_inputs"], bound["expand_nonconcat_dims"]).axis))
