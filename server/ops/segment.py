"""Segment reductions and bincount: segment_sum, segment_mean, segment_sqrt_n (tf.sparse.segment_*)
and bincount (tf.sparse.bincount).

The segment ops gather rows of a dense ``data`` by ``indices`` and reduce them per
``segment_ids``, which must be sorted, as TensorFlow's kernels require (with num_segments too).
Each op's ``check`` makes the refusals that metadata decides (dtypes, ranks, lengths,
num_segments, bincount's axis and weights) before any kernel. What the entries decide is the
kernels': every index and segment id is checked by the kernel's own pass before it reads or
writes anything (``kernels/segment.py``), and a bad one is INVALID_ARGUMENT naming the argument,
the position and the rule (the GPU kernel falls back for it, so the CPU kernel names it); so are
bincount's negative values. The output's rows come from num_segments, or from the last segment
id, and are held to --max-result-bytes before anything is allocated.
"""

from __future__ import annotations

import numpy as np

from sparseserve.core.tensor import SparseTensor
from sparseserve.core.errors import InvalidArgumentError, UnimplementedError
from sparseserve.core.reasons import Reason
from sparseserve.core.validate import INT64_MAX
from sparseserve.kernels import segment as sk

from ..argtypes import BOOL, DENSE, INT, OPTIONAL_INT, TENSOR
from ..device import Fallback
from ..registry import REGISTRY, Arg, Output, Plan
from . import _gpu
from ._sputils import prod, shape_of
from ._layouts import SPARSE_LAYOUTS, as_coo, view_nnz

INDEX_DTYPES = ("int32", "int64")
SUM_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "float32", "float64")
FLOAT_DTYPES = ("float16", "float32", "float64")
MODES = {"segment_sum": sk.SUM, "segment_mean": sk.MEAN, "segment_sqrt_n": sk.SQRT_N}


# ------------------------------------------------------------------ segment reductions: checks
def _check_index_vector(a, name: str) -> None:
    """``a`` is the int32/int64 vector TensorFlow takes (an empty JSON list, which decodes as
    float64, counts as int64)."""
    if a.ndim != 1:
        raise InvalidArgumentError(f"{name} must be a vector (rank 1), got shape {shape_of(a)}",
                                   reason=Reason.RANK)
    dtype = np.dtype(a.dtype)
    if dtype.name not in INDEX_DTYPES and not (a.shape[0] == 0 and dtype.kind in "fiub"):
        raise InvalidArgumentError(f"{name} has dtype {dtype.name}; it must be int32 or int64",
                                   reason=Reason.BAD_DTYPE)


def _check_segment(op: str, data, indices, segment_ids, num_segments) -> Plan:
    """Every rule that reads only metadata. The result has data's dtype (native byte order) and
    trailing dimensions; its rows are num_segments, or the last segment id's (the entries')."""
    dtypes = FLOAT_DTYPES if op != "segment_sum" else SUM_DTYPES
    if np.dtype(data.dtype).name not in dtypes:
        kinds = "float16, float32 or float64" if op != "segment_sum" else "integer or floating"
        raise UnimplementedError(f"{op} takes {kinds} data, not {np.dtype(data.dtype).name}, as "
                                 "TensorFlow's does", reason=Reason.UNSUPPORTED_DTYPE)
    if data.ndim < 1:
        raise InvalidArgumentError("data must have rank >= 1 (rows to gather), got a scalar",
                                   reason=Reason.RANK_TOO_LOW)
    _check_index_vector(indices, "indices")
    _check_index_vector(segment_ids, "segment_ids")
    if indices.shape[0] != segment_ids.shape[0]:
        raise InvalidArgumentError(
            f"indices has {indices.shape[0]} elements and segment_ids has {segment_ids.shape[0]}; "
            "they must have the same length (one segment id per index)", reason=Reason.SHAPE_MISMATCH)
    if num_segments is not None and not 0 <= num_segments <= INT64_MAX:
        raise InvalidArgumentError(f"num_segments = {num_segments} must be >= 0 (and fit int64)",
                                   reason=Reason.VALUE_OUT_OF_RANGE)
    shape = None if num_segments is None else (num_segments, *data.shape[1:])
    return Plan(dtype=np.dtype(data.dtype).newbyteorder("="), layout="dense", shape=shape)


def check_segment_sum(data, indices, segment_ids, num_segments=None) -> Plan:
    return _check_segment("segment_sum", data, indices, segment_ids, num_segments)


def check_segment_mean(data, indices, segment_ids, num_segments=None) -> Plan:
    return _check_segment("segment_mean", data, indices, segment_ids, num_segments)


def check_segment_sqrt_n(data, indices, segment_ids, num_segments=None) -> Plan:
    return _check_segment("segment_sqrt_n", data, indices, segment_ids, num_segments)


def _n_out(segment_ids, num_segments) -> int:
    """Output rows: num_segments, or the last segment id + 1 (0 without entries)."""
    if num_segments is not None:
        return int(num_segments)
    return max(int(segment_ids[-1]) + 1, 0) if segment_ids.shape[0] else 0


def _segment_bytes(data, indices, segment_ids, num_segments=None, **_) -> int:
    return _n_out(segment_ids, num_segments) * prod(data.shape[1:]) * np.dtype(data.dtype).itemsize


def _segment_error(code: int, indices, segment_ids, n_data: int, num_segments) -> InvalidArgumentError:
    i, kind = divmod(code, 4)
    if kind == sk.BAD_INDEX:
        return InvalidArgumentError(f"indices[{i}] = {int(indices[i])} is out of range for data.shape[0] "
                                    f"= {n_data}", reason=Reason.INDEX_OUT_OF_RANGE)
    s = int(segment_ids[i])
    if kind == sk.UNSORTED:
        return InvalidArgumentError(
            f"segment_ids[{i}] = {s} is less than segment_ids[{i - 1}] = {int(segment_ids[i - 1])}; "
            "segment_ids must be sorted (non-decreasing)", reason=Reason.SEGMENT_IDS_UNSORTED)
    if s < 0:
        return InvalidArgumentError(f"segment_ids[{i}] = {s} is negative; segment ids must be >= 0",
                                    reason=Reason.SEGMENT_ID_OUT_OF_RANGE)
    last = int(segment_ids[-1])
    if num_segments is None and last < 0:  # the last id names no segment: it is the one to fix
        return InvalidArgumentError(f"segment_ids[{len(segment_ids) - 1}] = {last} is negative; segment ids "
                                    "must be >= 0", reason=Reason.SEGMENT_ID_OUT_OF_RANGE)
    if num_segments is None:  # beyond the last id: the ids decrease somewhere after it
        return InvalidArgumentError(
            f"segment_ids[{i}] = {s} is greater than the last segment id {int(segment_ids[-1])}; "
            "segment_ids must be sorted (non-decreasing)", reason=Reason.SEGMENT_IDS_UNSORTED)
    return InvalidArgumentError(f"segment_ids[{i}] = {s} is out of range for num_segments = "
                                f"{num_segments} (valid: 0 to {num_segments - 1})",
                                reason=Reason.SEGMENT_ID_OUT_OF_RANGE)


def _segment(op: str, data: np.ndarray, indices: np.ndarray, segment_ids: np.ndarray,
             num_segments: int | None) -> np.ndarray:
    indices = np.asarray(indices).astype(np.int64, copy=False)  # int32 is widened
    segment_ids = np.asarray(segment_ids).astype(np.int64, copy=False)
    n_out = _n_out(segment_ids, num_segments)
    n_data = data.shape[0]
    width = prod(data.shape[1:])
    dtype = data.dtype.newbyteorder("=")
    data2d = np.ascontiguousarray(data, dtype=dtype).reshape(n_data, width)
    if data.dtype == np.float16:  # reduced in float32, as TensorFlow's kernel does
        data2d = data2d.astype(np.float32)
    out, error = sk.segment_reduce(data2d, indices, segment_ids, n_out, MODES[op])
    if error >= 0:  # an index or segment id the entries got wrong: the kernel's pass found it
        raise _segment_error(error, indices, segment_ids, n_data, num_segments)
    return out.astype(dtype, copy=False).reshape(n_out, *data.shape[1:])


_SEGMENT_ARGS = [
    Arg("data", DENSE, "Dense tensor of rank >= 1 whose rows are gathered.", layouts=("dense",)),
    Arg("indices", DENSE, "int32/int64 vector: the rows of data to reduce, each in "
        "[0, data.shape[0]).", layouts=("dense",)),
    Arg("segment_ids", DENSE, "int32/int64 vector, one per index, sorted (non-decreasing), each "
        ">= 0: the output row each gathered row goes to.", layouts=("dense",)),
    Arg("num_segments", OPTIONAL_INT, "Rows of the output (every segment id must be below it); "
        "default: the last segment id + 1.", default=None),
]

_SEGMENT_DOC = """{what} of rows of data selected by indices, per segment (tf.sparse.{name}).
output[s] = {formula} over the i with segment_ids[i] == s, of data[indices[i]]; output has
num_segments rows (default: segment_ids[-1] + 1), the trailing dimensions of data, and data's
dtype. segment_ids must be sorted (non-decreasing) and >= 0, also with num_segments (as
TensorFlow's kernels); a segment no entry reaches is 0. Indices may repeat and come in any order.
An index outside [0, data.shape[0]), a negative, unsorted or too large (>= num_segments) segment
id is INVALID_ARGUMENT naming the position; indices and segment_ids must be int32 or int64 of
one length. {dtypes}"""


@REGISTRY.op(
    "segment_sum",
    doc=_SEGMENT_DOC.format(what="Sums", name="segment_sum", formula="sum",
                            dtypes="Integer and floating data (bool and complex are UNIMPLEMENTED, "
                                   "as in TensorFlow); integers wrap, float16 is summed in float32."),
    args=_SEGMENT_ARGS,
    outputs=[Output("output", "dense", "[num_segments, *data.shape[1:]], data's dtype.")],
    check=check_segment_sum,
    result_bytes=_segment_bytes,
)
def segment_sum(data, indices, segment_ids, num_segments=None):
    return _segment("segment_sum", data, indices, segment_ids, num_segments)


@REGISTRY.op(
    "segment_mean",
    doc=_SEGMENT_DOC.format(what="Means", name="segment_mean", formula="sum / count",
                            dtypes="float16, float32 and float64 data (others are UNIMPLEMENTED, as "
                                   "in TensorFlow); float16 is computed in float32."),
    args=_SEGMENT_ARGS,
    outputs=[Output("output", "dense", "[num_segments, *data.shape[1:]], data's dtype.")],
    check=check_segment_mean,
    result_bytes=_segment_bytes,
)
def segment_mean(data, indices, segment_ids, num_segments=None):
    return _segment("segment_mean", data, indices, segment_ids, num_segments)


@REGISTRY.op(
    "segment_sqrt_n",
    doc=_SEGMENT_DOC.format(what="Sums divided by sqrt(count)", name="segment_sqrt_n",
                            formula="sum / sqrt(count)",
                            dtypes="float16, float32 and float64 data (others are UNIMPLEMENTED, as "
                                   "in TensorFlow); float16 is computed in float32."),
    args=_SEGMENT_ARGS,
    outputs=[Output("output", "dense", "[num_segments, *data.shape[1:]], data's dtype.")],
    check=check_segment_sqrt_n,
    result_bytes=_segment_bytes,
)
def segment_sqrt_n(data, indices, segment_ids, num_segments=None):
    return _segment("segment_sqrt_n", data, indices, segment_ids, num_segments)


# ------------------------------------------------------------------ segment reductions on the GPU
# A gather of the rows, runs of equal (sorted) segment ids summed by ``arrays.segment_sum`` (a
# scatter-add: cupyx.scatter_add on CuPy, numpy.add.at on the stand-in), scaled by
# 1 / count or 1 / sqrt(count) in the work dtype, and placed into zeroed output rows. Every
# checked call runs here (every data dtype the ops take); the indices and ids are checked on the
# device (one scalar to the host), and a bad one falls back ("argument": the entries' fault), so
# the CPU kernel names it.
def _segment_gpu(be, op: str, data, indices, segment_ids, num_segments):
    from sparseserve.kernels import arrays as ka

    xp = be.xp
    k = int(indices.shape[0])
    idx = indices.astype(xp.int64)
    ids = segment_ids.astype(xp.int64)
    n_out = _n_out(ids, num_segments)
    n_data = int(data.shape[0])
    if k:
        bad = (idx < 0) | (idx >= n_data) | (ids < 0) | (ids >= n_out)
        if k > 1:
            bad[1:] |= ids[1:] < ids[:-1]
        if bool(xp.any(bad)):
            raise Fallback("argument")  # the CPU kernel names the first bad entry
    width = prod(data.shape[1:])
    work = np.float32 if data.dtype == np.float16 else data.dtype
    out = xp.zeros((n_out, width), dtype=work)
    if k and width:
        rows = data.reshape(n_data, width)[idx].astype(work)
        first, group, n_groups = ka.runs(xp, ids)
        sums = ka.segment_sum(xp, rows, first, group, n_groups, be.scatter_add)
        if MODES[op] != sk.SUM:
            counts = xp.bincount(group, minlength=n_groups).astype(xp.float64)
            if MODES[op] == sk.SQRT_N:
                counts = xp.sqrt(counts)
            sums = sums * (1 / counts.astype(work))[:, None]
        out[ids[first]] = sums
    return out.astype(data.dtype).reshape((n_out, *data.shape[1:]))


@REGISTRY.gpu("segment_sum")
@_gpu.quiet
def segment_sum_gpu(be, data, indices, segment_ids, num_segments=None):
    return _segment_gpu(be, "segment_sum", data, indices, segment_ids, num_segments)


@REGISTRY.gpu("segment_mean")
@_gpu.quiet
def segment_mean_gpu(be, data, indices, segment_ids, num_segments=None):
    return _segment_gpu(be, "segment_mean", data, indices, segment_ids, num_segments)


@REGISTRY.gpu("segment_sqrt_n")
@_gpu.quiet
def segment_sqrt_n_gpu(be, data, indices, segment_ids, num_segments=None):
    return _segment_gpu(be, "segment_sqrt_n", data, indices, segment_ids, num_segments)


# ------------------------------------------------------------------ bincount
BINCOUNT_LAYOUTS = ("dense", *SPARSE_LAYOUTS)


def _per_row(values, axis: int) -> bool:
    """Whether values are counted per row: axis -1 on values of rank >= 2 (values of rank 1
    count as with axis 0)."""
    return axis == -1 and len(shape_of(values)) >= 2


def _length(n: int | None) -> int:
    """minlength/maxlength as the kernels take them: -1 when not given (negative counts so)."""
    return -1 if n is None or n < 0 else int(n)


def _rows(values) -> int:
    """The output's rows when counting per row: values' leading dimension."""
    return shape_of(values)[0]


def _weights_mismatch() -> InvalidArgumentError:
    return InvalidArgumentError("weights must have the same dense_shape and indices as values "
                                "(entry by entry, in the same order)", reason=Reason.SHAPE_MISMATCH)


def _too_many_bins(n_batch: int, size: int) -> InvalidArgumentError | None:
    """The error when an output of ``n_batch`` rows of ``size`` bins has more elements than
    int64 holds (None when it fits)."""
    if size and n_batch > INT64_MAX // size:
        return InvalidArgumentError(f"the output shape [{n_batch}, {size}] has more elements than int64 holds",
                                    reason=Reason.SHAPE_OVERFLOW)
    return None


def _check_sparse_values(values: SparseTensor, weights) -> None:
    if values.dense_ndim:
        raise UnimplementedError("bincount does not take hybrid sparse values (dense dimensions in "
                                 "the values)", reason=Reason.UNSUPPORTED_HYBRID)
    if weights is None:
        return
    if not isinstance(weights, SparseTensor):
        raise InvalidArgumentError("values is sparse, so weights must be a sparse tensor with "
                                   "values' indices and shape", reason=Reason.SHAPE_MISMATCH)
    # The indices themselves are compared by the kernel (their values decide it).
    if shape_of(weights) != shape_of(values) or weights.dense_ndim or view_nnz(weights) != view_nnz(values):
        raise _weights_mismatch()


def _check_dense_values(values: np.ndarray, weights, axis: int) -> None:
    if isinstance(weights, SparseTensor):
        raise InvalidArgumentError("weights is sparse but values is dense; weights must be dense with "
                                   "values' shape", reason=Reason.SHAPE_MISMATCH)
    shape = shape_of(values)
    if axis == 0 or values.ndim == 1:
        if weights is not None and weights.size != values.size:
            raise InvalidArgumentError(f"weights has shape {shape_of(weights)} ({weights.size} elements) "
                                       f"and values has shape {shape} ({values.size}); they must "
                                       "have the same size", reason=Reason.SHAPE_MISMATCH)
        return
    if values.ndim != 2:
        raise InvalidArgumentError(f"with axis=-1 dense values must have rank 1 or 2, got shape {shape}",
                                   reason=Reason.RANK)
    if weights is not None and shape_of(weights) != shape:
        raise InvalidArgumentError(f"weights has shape {shape_of(weights)} and values has shape "
                                   f"{shape}; with axis=-1 they must be equal", reason=Reason.SHAPE_MISMATCH)


def check_bincount(values, weights=None, axis: int = 0, minlength=None, maxlength=None,
                   binary_output: bool = False) -> Plan:
    """Every rule metadata decides; the bins (and the shape) are known here only with maxlength,
    else the largest value decides them (the kernel's to check)."""
    if axis not in (0, -1):
        raise InvalidArgumentError(
            f"axis = {axis} is not supported for values of rank {len(shape_of(values))}; bincount takes "
            "axis 0 (count every value) or -1 (count per row)", reason=Reason.AXIS_OUT_OF_RANGE)
    if weights is not None and binary_output:
        raise InvalidArgumentError("weights and binary_output=true are mutually exclusive; pass one",
                                   reason=Reason.EXCLUSIVE_ARGUMENTS)
    if np.dtype(values.dtype).name not in ("int32", "int64"):
        raise UnimplementedError(f"bincount counts int32 or int64 values, not {np.dtype(values.dtype).name}, "
                                 "as TensorFlow's does", reason=Reason.UNSUPPORTED_DTYPE)
    if weights is not None and np.dtype(weights.dtype).name not in sk.WEIGHT_DTYPES:
        raise UnimplementedError(f"bincount takes int32, int64, float32 or float64 weights, not "
                                 f"{np.dtype(weights.dtype).name}, as TensorFlow's does",
                                 reason=Reason.UNSUPPORTED_DTYPE)
    if isinstance(values, SparseTensor):
        _check_sparse_values(values, weights)
    else:
        _check_dense_values(values, weights, axis)
    # At least this many bins, whatever the values: maxlength exactly, else minlength.
    fixed = _length(maxlength)
    bins = fixed if fixed >= 0 else max(_length(minlength), 0)
    if bins > INT64_MAX:
        raise InvalidArgumentError(f"{bins} bins (minlength or maxlength) do not fit int64",
                                   reason=Reason.SHAPE_OVERFLOW)
    per_row = _per_row(values, axis)
    overflow = _too_many_bins(_rows(values), bins) if per_row else None
    if overflow is not None:
        raise overflow
    dtype = np.dtype((values if weights is None else weights).dtype).newbyteorder("=")
    shape = None if fixed < 0 else ((_rows(values), fixed) if per_row else (fixed,))
    return Plan(dtype=dtype, layout="coo", shape=shape)


def _position(name: str, flat: int, shape) -> str:
    return f"{name}[{', '.join(str(int(i)) for i in np.unravel_index(flat, shape))}]"


def _counted(values, weights, axis: int):
    """(flat int values as given, flat weights or None, batch ids or None, row length, number of
    batches, position namer) of a checked call."""
    per_row = _per_row(values, axis)
    if isinstance(values, SparseTensor):
        t = as_coo(values)
        w = None
        if weights is not None:
            w = as_coo(weights)
            if not np.array_equal(w.indices, t.indices):  # the indices' values decide it
                raise _weights_mismatch()
            w = w.values
        namer = lambda i: f"values.values[{i}]"  # noqa: E731
        if not per_row:
            return t.values, w, None, 0, 1, namer
        return t.values, w, t.indices[:, 0], 0, _rows(values), namer
    shape = tuple(values.shape)
    flat_w = None if weights is None else weights.reshape(-1)
    namer = (lambda i: _position("values", i, shape)) if shape else (lambda i: "values")
    if not per_row:
        return values.reshape(-1), flat_w, None, 0, 1, namer
    return values.reshape(-1), flat_w, None, shape[1], shape[0], namer


def _bincount_bytes(values, weights=None, axis=0, binary_output=False, **_) -> int:
    n = values.nnz if isinstance(values, SparseTensor) else values.size
    rank = 2 if _per_row(values, axis) else 1
    return int(n) * (8 * rank + 8)  # at most one output entry per value


@REGISTRY.op(
    "bincount",
    doc="""Counts the integer values of a tensor per value, as a sparse tensor (tf.sparse.bincount).
values: int32 or int64, dense or sparse (COO; CSR, CSC, BSR and BSC are read as COO; stored
entries only); every value must be >= 0. axis=0 counts every value into one vector of bins;
axis=-1 counts per row: dense values of rank 2 give [rows, bins], sparse values of rank >= 2 are
batched by their first index; rank-1 values count as with axis 0. With weights (dense values: the
same shape, or with axis 0 the same size; sparse values: a sparse tensor with the same indices)
each bin holds the sum of its values' weights (int32, int64, float32 or float64; the result takes
that dtype), added in input order; otherwise counts in values' dtype, or 1 per reached bin with
binary_output (exclusive with weights). bins: maxlength when given (>= 0; values at or above it
are dropped), else max(largest value + 1, minlength, 1). Negative minlength/maxlength count as
not given. The output is coalesced COO, entries sorted by (row, value); bins no value reaches are
not stored.""",
    args=[Arg("values", TENSOR, "int32/int64 values to count (dense or sparse).", layouts=BINCOUNT_LAYOUTS),
          Arg("weights", TENSOR, "Optional weights, one per value (sparse with values' indices when "
              "values is sparse).", default=None, layouts=BINCOUNT_LAYOUTS),
          Arg("axis", INT, "0 (count every value) or -1 (count per row).", default=0),
          Arg("minlength", OPTIONAL_INT, "At least this many bins.", default=None),
          Arg("maxlength", OPTIONAL_INT, "Exactly this many bins; larger values are dropped.", default=None),
          Arg("binary_output", BOOL, "1 for each reached bin instead of counts.", default=False)],
    outputs=[Output("output", "sparse", "Coalesced COO: [bins] or [rows, bins].")],
    check=check_bincount,
    result_bytes=_bincount_bytes,
)
def bincount(values, weights=None, axis: int = 0, minlength=None, maxlength=None, binary_output: bool = False):
    flat, w, batch, row_len, n_batch, namer = _counted(values, weights, axis)
    maxlength, minlength = _length(maxlength), _length(minlength)
    flat64 = np.ascontiguousarray(flat, dtype=np.int64)
    bad, top, kept = sk.bincount_scan_values(flat64, maxlength)
    if bad >= 0:
        raise InvalidArgumentError(f"{namer(bad)} = {int(flat64[bad])} is negative; bincount counts "
                                   "values >= 0", reason=Reason.VALUE_OUT_OF_RANGE)
    if maxlength >= 0:
        size = maxlength
    else:  # the largest value decides the bins
        if top == INT64_MAX:
            raise InvalidArgumentError(f"values holds {top}, so the bins (largest value + 1) would not fit "
                                       "int64; pass maxlength", reason=Reason.SHAPE_OVERFLOW)
        size = max(top + 1, minlength)
    per_row = _per_row(values, axis)
    overflow = _too_many_bins(n_batch, size) if per_row else None
    if overflow is not None:
        raise overflow
    if w is not None:
        w = np.ascontiguousarray(w, dtype=w.dtype.newbyteorder("="))
    keys, sums = sk.bincount(flat64, None if batch is None else np.ascontiguousarray(batch, dtype=np.int64),
                             row_len, size, n_batch, maxlength, w, binary_output, kept)
    out_dtype = w.dtype if w is not None else np.dtype(values.dtype).newbyteorder("=")
    if not per_row:
        indices, shape = keys[:, None], [size]
    elif keys.size:
        indices, shape = np.stack([keys // size, keys % size], axis=1), [n_batch, size]
    else:
        indices, shape = np.zeros((0, 2), np.int64), [n_batch, size]
    return SparseTensor(indices=indices, values=sums.astype(out_dtype, copy=False), dense_shape=shape,
                        coalesced=True)
