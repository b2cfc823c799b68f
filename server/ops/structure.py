"""Structure ops: sparse_to_dense, to_indicator, concat, fill_empty_rows, select.

Arguments follow TensorFlow (tf.sparse_to_dense, tf.sparse.to_indicator,
tf.sparse.concat, tf.sparse.fill_empty_rows) and PyTorch (indexing, for
select). Each op's ``check`` makes every refusal that metadata decides (shapes,
dtypes, layouts, the index and scalar arguments) before any kernel runs; the
kernels raise only what the entries decide (an index or id out of range,
unsorted indices under validate_indices, batches a compressed result would
leave unequal). Ops that could produce large dense results declare
``result_bytes`` so the server checks --max-result-bytes before anything is
allocated.
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
from sparseserve.kernels import argsort_stable, gather_rows

from ..argtypes import BOOL, DENSE, INDEX, INT, INT_LIST, SCALAR, SPARSE, TENSORS, normalize_axis
from ..partition import Stack
from ..registry import REGISTRY, Arg, Output, Plan
from ._common import cast_scalar, check_ordered
from ._sputils import prod
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
    except BatchNseError as exc:  # where the entries fall decides it: the kernel's to say
        raise InvalidArgumentError(f"{op}: the result cannot be {t.layout}: {exc}",
                                   reason=Reason.BATCH_NSE_MISMATCH) from None


def _nbytes(shape, dtype) -> int:
    return prod(shape) * np.dtype(dtype).itemsize


# --------------------------------------------------------------- sparse_to_dense
def check_sparse_to_dense(sparse_indices: np.ndarray, output_shape: list[int], sparse_values: np.ndarray,
                          default_value=0, validate_indices: bool = True) -> Plan:
    """The shapes and dtypes of the indices and values agree with output_shape; default_value
    (the kernels take it cast) is representable in the values' dtype."""
    shape = check_shape(output_shape, "output_shape")
    idx, values = sparse_indices, sparse_values
    if idx.dtype.kind not in "iu":
        raise InvalidArgumentError(f"sparse_indices has dtype {idx.dtype}; it must be an integer type",
                                   reason=Reason.INDEX_DTYPE)
    if idx.ndim > 2:
        raise InvalidArgumentError(f"sparse_indices has rank {idx.ndim}; it must be 0-D, 1-D or 2-D",
                                   reason=Reason.INDICES_RANK)
    n, rank = _index_count(idx), _index_rank(idx)
    if rank != len(shape):
        raise InvalidArgumentError(
            f"sparse_indices gives indices of rank {rank} but output_shape = {list(shape)} has rank "
            f"{len(shape)}", reason=Reason.RANK_MISMATCH)
    if values.ndim > 1 or (values.ndim == 1 and values.shape[0] != n):
        raise InvalidArgumentError(
            f"sparse_values has shape {list(values.shape)}; it must be a scalar or a vector of the "
            f"{n} values of sparse_indices", reason=Reason.VALUES_SHAPE_MISMATCH)
    default = cast_scalar(default_value, values.dtype, "default_value")
    return Plan(args={"default_value": default}, dtype=values.dtype, layout="dense", shape=shape)


def _index_count(idx: np.ndarray) -> int:
    """How many indices sparse_indices holds (a 0-D one holds one)."""
    return 1 if idx.ndim == 0 else int(idx.shape[0])


def _index_rank(idx: np.ndarray) -> int:
    return int(idx.shape[1]) if idx.ndim == 2 else 1


def _std_bytes(output_shape, sparse_values, **_) -> int:
    return _nbytes(output_shape, sparse_values.dtype)


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
    check=check_sparse_to_dense,
    result_bytes=_std_bytes,
)
def sparse_to_dense(sparse_indices, output_shape, sparse_values, default_value=0,
                    validate_indices: bool = True) -> np.ndarray:
    idx, shape = sparse_indices, tuple(output_shape)
    if idx.dtype.kind == "u" and idx.size and int(idx.max()) > INT64_MAX:
        pos = tuple(int(i) for i in np.unravel_index(int(np.argmax(idx)), idx.shape))
        raise InvalidArgumentError(f"sparse_indices{list(pos)} = {int(idx[pos])} is out of range for "
                                   f"output_shape {list(shape)}", reason=Reason.INDEX_OUT_OF_RANGE)
    n = _index_count(idx)
    idx = idx.astype(np.int64, copy=False).reshape(n, _index_rank(idx))
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
    values = np.broadcast_to(sparse_values, (n,))
    return kernels.to_dense(idx, values, shape, default_value, validate_indices)


# ----------------------------------------------------------------- to_indicator
def check_to_indicator(sp_input: SparseTensor, vocab_size: int) -> Plan:
    """vocab_size is a size and sp_input holds integer ids (their range is the kernel's to check)."""
    if vocab_size < 0:
        raise InvalidArgumentError(f"vocab_size = {vocab_size} must not be negative",
                                   reason=Reason.NEGATIVE_DIMENSION)
    shape = check_shape(_indicator_shape(sp_input, vocab_size), "output shape")
    if sp_input.dtype.kind not in "iu":
        raise UnimplementedError(
            f"to_indicator needs integer ids; sp_input has dtype {sp_input.dtype.name}",
            reason=Reason.UNSUPPORTED_DTYPE)
    return Plan(dtype=np.dtype(np.bool_), layout="dense", shape=shape)


def _indicator_shape(sp_input: SparseTensor, vocab_size: int) -> tuple[int, ...]:
    return (*sp_input.dense_shape[:-1], vocab_size)


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
    check=check_to_indicator,
    result_bytes=_indicator_bytes,
)
def to_indicator(sp_input: SparseTensor, vocab_size: int) -> np.ndarray:
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
def _concat_shape(axis: int, sp_inputs: list[SparseTensor]) -> list[int]:
    """The output's shape: the inputs' sizes summed along ``axis`` (non-negative), the largest
    elsewhere (every input's, unless expand_nonconcat_dims)."""
    return [sum(dims) if d == axis else max(dims)
            for d, dims in enumerate(zip(*(t.dense_shape for t in sp_inputs)))]


def check_concat(axis: int, sp_inputs: list[SparseTensor], expand_nonconcat_dims: bool = False) -> Plan:
    """The inputs share one layout, rank, sparse_ndim and dtype, axis is one of their
    dimensions (the kernels take it non-negative) and the other dimensions agree unless
    expand_nonconcat_dims. A single input comes back as it is, so any axis does for it (as
    TensorFlow's)."""
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
    if len(sp_inputs) == 1:
        if -rank <= axis < rank:
            axis = normalize_axis(axis, rank, what="sp_inputs")
        return Plan(args={"axis": axis}, dtype=dtype, layout=first.layout, shape=first.dense_shape)
    axis = normalize_axis(axis, rank, what="sp_inputs")
    if not expand_nonconcat_dims:
        for d in range(rank):
            dims = [t.dense_shape[d] for t in sp_inputs]
            for i, dim in enumerate(dims):
                if d != axis and dim != dims[0]:
                    raise InvalidArgumentError(
                        f"sp_inputs[{i}].dense_shape[{d}] = {dim} differs from sp_inputs[0]"
                        f".dense_shape[{d}] = {dims[0]}; only axis {axis} may differ (or pass "
                        "expand_nonconcat_dims=true)", reason=Reason.SHAPE_MISMATCH)
    shape = check_shape(_concat_shape(axis, sp_inputs), "output dense_shape")
    # Row-major keys run over the sparse dimensions: they must fit int64 even when a dense
    # dimension of 0 makes the whole product 0.
    check_shape(shape[:sparse_ndim], f"output dense_shape[:{sparse_ndim}]")
    return Plan(args={"axis": axis}, dtype=dtype, layout=first.layout, shape=shape)


def _concat_bytes(axis, sp_inputs, **_) -> int:
    s = view_sparse_ndim(sp_inputs[0])
    nnz = sum(view_nnz(t) for t in sp_inputs)
    return nnz * (8 * s + _nbytes(_concat_shape(axis, sp_inputs)[s:], sp_inputs[0].dtype))


@REGISTRY.op(
    "concat",
    doc="""Concatenates sparse tensors along axis (tf.sparse.concat); negative axis counts from the end.
All inputs have the same rank, sparse dimensions and dtype, and the same size on every other
dimension unless expand_nonconcat_dims, when each such dimension is the largest input's.
The output is re-sorted row-major (stable: entries at one index keep the input order;
duplicates are kept); a single input comes back as it is, unsorted if it was, whatever the axis
(as TensorFlow's: no rule of several inputs applies to it).
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
    check=check_concat,
    result_bytes=_concat_bytes,
)
def concat(axis: int, sp_inputs: list[SparseTensor], expand_nonconcat_dims: bool = False) -> SparseTensor:
    if len(sp_inputs) == 1:
        # As tf.sparse.concat: one input comes back as it is, not re-sorted (a COO one flagged as
        # any concat result is, so a partitioned concat's blocks say what a whole one says).
        t = sp_inputs[0]
        if t.layout != "coo":
            return t
        return SparseTensor(indices=t.indices, values=t.values, dense_shape=t.dense_shape, coalesced=False)
    shape = tuple(_concat_shape(axis, sp_inputs))
    dtype, s, ax = sp_inputs[0].dtype, view_sparse_ndim(sp_inputs[0]), axis
    compressed = sp_inputs[0].layout != "coo"
    if compressed:
        ref = max(sp_inputs, key=lambda t: t.compressed_indices.dtype.itemsize)
        sp_inputs = [coo_view(t) for t in sp_inputs]
    block = shape[s:]
    all_indices, all_values = [], []
    offset = 0
    for t in sp_inputs:
        idx = t.indices
        if ax < s and offset:
            idx = idx.copy()
            idx[:, ax] += offset
        vals = t.values
        if tuple(vals.shape[1:]) != block:  # pad value blocks (dense-axis concat or expanded dims)
            padded = np.zeros((t.nnz, *block), dtype)
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
    indices, values = kernels.reorder(indices, values, shape)
    out = SparseTensor(indices=indices, values=values, dense_shape=shape, coalesced=False)
    return _in_layout_of(out, ref, "concat") if compressed else out


# -------------------------------------------------------------- fill_empty_rows
def check_fill_empty_rows(sp_input: SparseTensor, default_value) -> Plan:
    """default_value (the kernels take it cast) is representable in the values' dtype, and an
    empty row has an index [row, 0, ...] to fill."""
    default = cast_scalar(default_value, sp_input.dtype, "default_value")
    shape, s = sp_input.dense_shape, view_sparse_ndim(sp_input)
    # A sparse dimension of 0 past the first leaves no valid index, so every row is empty.
    if shape[0] and 0 in shape[1:s]:
        raise InvalidArgumentError(
            f"sp_input.dense_shape = {list(shape)} has an empty sparse dimension, so "
            "there is no index [row, 0, ...] for the empty rows", reason=Reason.EMPTY_DIMENSION)
    return Plan(args={"default_value": default}, dtype=sp_input.dtype, layout=sp_input.layout, shape=shape)


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
    check=check_fill_empty_rows,
    result_bytes=_fill_bytes,
)
def fill_empty_rows(sp_input: SparseTensor, default_value):
    if sp_input.layout != "coo":
        out, empty = fill_empty_rows(coo_view(sp_input), default_value)
        return _in_layout_of(out, sp_input, "fill_empty_rows"), empty
    s = sp_input.sparse_ndim
    rows = sp_input.dense_shape[0]
    empty = np.ones(rows, np.bool_)
    empty[sp_input.indices[:, 0]] = False
    new_rows = np.flatnonzero(empty)
    k = new_rows.size
    new_indices = np.zeros((k, s), np.int64)
    new_indices[:, 0] = new_rows
    new_values = np.full((k, *sp_input.values.shape[1:]), default_value, sp_input.dtype)
    indices = np.concatenate([sp_input.indices, new_indices])
    values = np.concatenate([sp_input.values, new_values])
    # Ordered by row only, stably (as TensorFlow's kernel): a row's entries keep their input order.
    perm = argsort_stable(indices[:, 0])
    indices, values = indices[perm], gather_rows(values, perm)
    out = SparseTensor(indices=indices, values=values, dense_shape=sp_input.dense_shape,
                       coalesced=sp_input.coalesced)
    return out, empty


# ----------------------------------------------------------------------- select
def _normalized_index(sp_input: SparseTensor, index: list) -> list[int | slice]:
    """index with one item per dimension (missing trailing ones taken whole): ints made
    non-negative, slices as slice(start, stop, step) with start and stop inside the dimension."""
    shape = sp_input.dense_shape
    if len(index) > len(shape):
        raise InvalidArgumentError(f"index has {len(index)} items but sp_input has rank {len(shape)}",
                                   reason=Reason.TOO_MANY_INDICES)
    items = list(index) + [slice(None)] * (len(shape) - len(index))
    out: list[int | slice] = []
    for d, (item, dim) in enumerate(zip(items, shape)):
        if isinstance(item, slice):
            if item.step is not None and item.step <= 0:
                raise InvalidArgumentError(f"index[{d}] has step {item.step}; steps must be positive",
                                           reason=Reason.BAD_SLICE_STEP)
            b, e, st = item.indices(dim)
            out.append(slice(b, e, min(st, max(dim, 1))))  # same progression (n <= 1 past dim), and it fits int64
        else:
            i = int(item)
            if not -dim <= i < dim:
                raise InvalidArgumentError(f"index[{d}] = {i} is out of range for dense_shape[{d}] = {dim}",
                                           reason=Reason.INDEX_OUT_OF_RANGE)
            out.append(i % dim)
    return out


@dataclass
class _Selection:
    """What a normalized index selects, per dimension and over the values' dense ones."""

    start: list[int]
    step: list[int]
    length: list[int]
    keep: list[bool]  # a slice keeps its dimension, an int removes it
    dense_index: tuple  # numpy basic index over the values' dense dimensions
    dense_out: bool  # every sparse dimension fixed by an int: a dense result
    out_shape: tuple[int, ...]  # of the result, sparse or dense


def _selection(index: list[int | slice], sparse_ndim: int) -> _Selection:
    s = sparse_ndim
    start, step, length, keep = [], [], [], []
    for item in index:
        if isinstance(item, slice):
            start.append(item.start)
            step.append(item.step)
            length.append(len(range(item.start, item.stop, item.step)))
            keep.append(True)
        else:
            start.append(item)
            step.append(1)
            length.append(1)
            keep.append(False)
    dense_index = tuple(slice(b, b + st * n, st) if k else b
                        for b, st, n, k in zip(start[s:], step[s:], length[s:], keep[s:]))
    out_shape = tuple(n for n, k in zip(length, keep) if k)
    return _Selection(start, step, length, keep, dense_index, not any(keep[:s]), out_shape)


def _keeps_compressed(sp_input: SparseTensor, sel: _Selection) -> bool:
    """Whether a compressed input's two compressed dimensions both remain (its layout can)."""
    nb = sp_input.batch_ndim
    return sp_input.layout != "coo" and sel.keep[nb] and sel.keep[nb + 1]


def check_select(sp_input: SparseTensor, index: list) -> Plan:
    """index fits sp_input (the kernels take it normalized: ``_normalized_index``); a BSR/BSC
    result keeps whole blocks."""
    index = _normalized_index(sp_input, index)
    sel = _selection(index, view_sparse_ndim(sp_input))
    layout = "dense" if sel.dense_out else "coo"
    if _keeps_compressed(sp_input, sel):
        layout = sp_input.layout
        if sp_input.layout in ("bsr", "bsc"):
            nb = sp_input.batch_ndim
            kept = [n for n, k in zip(sel.length[:nb + 2], sel.keep[:nb + 2]) if k][-2:]
            br, bc = (int(b) for b in sp_input.blocksize)
            if kept[0] % br or kept[1] % bc:
                raise InvalidArgumentError(
                    f"index leaves compressed dimensions {kept}, which blocksize {[br, bc]} of the "
                    f"{sp_input.layout} sp_input does not divide; slice whole blocks (lengths that are "
                    "multiples of the blocksize)", reason=Reason.BLOCKSIZE)
    return Plan(args={"index": index}, dtype=sp_input.dtype, layout=layout, shape=sel.out_shape)


def _select_bytes(sp_input, index, **_) -> int:
    sel = _selection(index, view_sparse_ndim(sp_input))
    return _nbytes(sel.out_shape, sp_input.dtype) if sel.dense_out else 0


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
    check=check_select,
    result_bytes=_select_bytes,
)
def select(sp_input: SparseTensor, index: list[int | slice]):
    if sp_input.layout != "coo":
        out = select(coo_view(sp_input), index)
        keeps = _keeps_compressed(sp_input, _selection(index, view_sparse_ndim(sp_input)))
        return _in_layout_of(out, sp_input, "select") if keeps else out
    s = sp_input.sparse_ndim
    sel = _selection(index, s)
    rows, new_indices = sk.select(sp_input.indices, sel.start[:s], sel.step[:s], sel.length[:s], sel.keep[:s])
    values = sk.take_rows(sp_input.values, rows)
    values = values[(slice(None), *sel.dense_index)]
    if sel.dense_out:
        return _sum_rows(values, sel.out_shape)
    return SparseTensor(indices=new_indices, values=np.ascontiguousarray(values), dense_shape=sel.out_shape,
                        coalesced=sp_input.coalesced)


# ----------------------------------------------------------- partitioned tensors
REGISTRY.partitioned("concat", Stack())
