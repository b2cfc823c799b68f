"""Element-wise ops: with_values, retain, mul, div, add, map_values.

Arguments follow TensorFlow (tf.SparseTensor.with_values, tf.sparse.retain,
SparseDenseCwiseMul/Div behind SparseTensor.__mul__/__div__, tf.sparse.add,
tf.sparse.map_values). Each op's ``check`` makes its refusals from metadata
(shapes, dtypes, layouts, arguments) before any kernel, on every device; the
kernels raise only what the entries decide (a zero divisor at a stored entry,
batches a retain or a compressed sum would leave unequal). Result dtypes of
two-operand ops are numpy's ``result_type`` of the two operands' dtypes
(TensorFlow requires equal dtypes; with equal dtypes the result is that dtype).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from sparseserve import kernels
from sparseserve.core.tensor import SparseTensor
from sparseserve.core.errors import InvalidArgumentError, UnimplementedError
from sparseserve.core.reasons import Reason
from sparseserve.kernels import arrays as ka
from sparseserve.kernels import elementwise as ek

from ..argtypes import DENSE, FLOAT, SPARSE, TENSOR, choice
from ..device import Fallback
from ..partition import Rowwise
from ..registry import REGISTRY, Arg, Output, Plan
from . import _gpu
from ._sputils import shape_of
from ._layouts import (SPARSE_LAYOUTS, BatchNseError, coo_view, entry_indices, entry_values, keep_entries,
                       like, view_nnz, view_sparse_ndim, with_entry_values)

SP_INPUT = Arg("sp_input", SPARSE, "The input sparse tensor (any sparse layout).", layouts=SPARSE_LAYOUTS)

# How the ops here take the compressed layouts (CSR, CSC, BSR, BSC, batch and dense dims too).
_LAYOUTS_DOC = """
CSR, CSC, BSR, BSC: the result keeps the input's layout and structure (indices, blocksize), as
torch's do; "stored entries" are the values array's in storage order (every element of a stored
block is one)."""


def _same_structure(sp_input: SparseTensor, values: np.ndarray) -> SparseTensor:
    """``sp_input``'s structure, in its layout, with new values (its values' shape)."""
    return with_entry_values(sp_input, values)


# ------------------------------------------------------------------ with_values
def check_with_values(sp_input: SparseTensor, new_values: np.ndarray) -> Plan:
    want = tuple(sp_input.values.shape)
    if tuple(new_values.shape) != want:
        raise InvalidArgumentError(
            f"new_values has shape {shape_of(new_values)}, but sp_input.values has shape "
            f"{list(want)}; they must be equal", reason=Reason.VALUES_SHAPE_MISMATCH)
    return Plan(dtype=new_values.dtype, layout=sp_input.layout, shape=sp_input.dense_shape)


@REGISTRY.op(
    "with_values",
    doc="""Returns sp_input with its values replaced by new_values (tf.SparseTensor.with_values).
Indices and dense_shape are unchanged; new_values must have exactly the shape of sp_input.values,
[nnz, *dense_shape[sparse_ndim:]], and may have any dtype (the result takes it).
CSR, CSC, BSR, BSC: new_values has the shape of sp_input.values ([*batch, nse, *blocksize, *dense
dims]), in storage order (torch's values()); the layout and structure are kept.""",
    args=[SP_INPUT,
          Arg("new_values", DENSE, "The new values, shape [nnz, *dense dims].", layouts=("dense",))],
    outputs=[Output("output", "sparse", "Same indices and shape, new values.")],
    check=check_with_values,
)
def with_values(sp_input: SparseTensor, new_values: np.ndarray) -> SparseTensor:
    return _same_structure(sp_input, np.array(new_values, copy=True))


@REGISTRY.gpu("with_values", layouts={"sp_input": ("coo",)})
@_gpu.quiet
def with_values_gpu(be, sp_input: SparseTensor, new_values) -> SparseTensor:
    return _gpu.same_structure(sp_input, be.xp.array(new_values, copy=True))


# ----------------------------------------------------------------------- retain
def check_retain(sp_input: SparseTensor, to_retain: np.ndarray) -> Plan:
    if to_retain.dtype != np.bool_:
        raise InvalidArgumentError(f"to_retain has dtype {to_retain.dtype}; it must be bool",
                                   reason=Reason.BAD_DTYPE)
    if sp_input.layout != "coo":
        want = list(sp_input.values.shape[:sp_input.batch_ndim + 1])
        if shape_of(to_retain) != want:
            raise InvalidArgumentError(
                f"to_retain has shape {shape_of(to_retain)}; it must be {want}, one flag per stored entry of "
                f"sp_input ({sp_input.layout}: [*batch, nse])", reason=Reason.SHAPE_MISMATCH)
    elif to_retain.ndim != 1 or to_retain.shape[0] != sp_input.nnz:
        raise InvalidArgumentError(
            f"to_retain has shape {shape_of(to_retain)}; it must be [{sp_input.nnz}], one flag per "
            "entry of sp_input", reason=Reason.SHAPE_MISMATCH)
    return Plan(dtype=sp_input.dtype, layout=sp_input.layout, shape=sp_input.dense_shape)


@REGISTRY.op(
    "retain",
    doc="""Keeps the entries of sp_input where to_retain is true (tf.sparse.retain).
to_retain is a bool vector with one element per stored entry (length nnz); the kept entries keep
their order, so a coalesced input stays coalesced. The shape is unchanged.
CSR, CSC, BSR, BSC: to_retain has one flag per stored entry (block) in storage order (torch's
values()), shape [*batch, nse]; the result keeps the layout, blocksize and index dtype. Every
batch must keep the same number of entries (INVALID_ARGUMENT, BATCH_NSE_MISMATCH, otherwise).""",
    args=[SP_INPUT,
          Arg("to_retain", DENSE, "bool [nnz]: which entries to keep.", layouts=("dense",))],
    outputs=[Output("output", "sparse", "The retained entries, same dense_shape.")],
    check=check_retain,
)
def retain(sp_input: SparseTensor, to_retain: np.ndarray) -> SparseTensor:
    if sp_input.layout != "coo":
        try:
            return keep_entries(sp_input, to_retain)
        except BatchNseError as exc:  # which entries are kept decides it: the kernel's to say
            raise InvalidArgumentError(f"retain: to_retain keeps a different number of entries in "
                                       f"the batches of sp_input: {exc}", reason=Reason.BATCH_NSE_MISMATCH) from None
    keep = np.flatnonzero(to_retain)
    return SparseTensor(indices=sp_input.indices[keep], values=sp_input.values[keep],
                        dense_shape=sp_input.dense_shape, coalesced=sp_input.coalesced)


# -------------------------------------------------------------------- mul / div
def check_mul(sp_input: SparseTensor, dense: np.ndarray) -> Plan:
    """dense broadcasts to sp_input's shape; the result dtype (the kernels' ``dtype``)."""
    shape = tuple(sp_input.dense_shape)
    # As TensorFlow's SparseDenseCwise ops: a dense dimension of 1 does not stretch to an empty one.
    ok = dense.ndim <= len(shape) and all(
        d == s or (d == 1 and s != 0) for d, s in zip(reversed(dense.shape), reversed(shape)))
    if not ok:
        raise InvalidArgumentError(
            f"dense has shape {shape_of(dense)}, which does not broadcast to sp_input.dense_shape "
            f"{list(shape)} (only the dense side is broadcast; a 1 does not broadcast to a 0)",
            reason=Reason.SHAPE_MISMATCH)
    dtype = np.result_type(sp_input.dtype, dense.dtype)
    return Plan(args={"dtype": dtype}, dtype=dtype, layout=sp_input.layout, shape=shape)


def check_div(sp_input: SparseTensor, dense: np.ndarray) -> Plan:
    if np.result_type(sp_input.dtype, dense.dtype) == np.bool_:
        raise UnimplementedError("div does not support bool / bool; cast the values to a number type",
                                 reason=Reason.UNSUPPORTED_DTYPE)
    return check_mul(sp_input, dense)


_CWISE_DOC = """The dense operand is broadcast (numpy rules) to sp_input's shape, never the other way
(a dense that would enlarge the result is INVALID_ARGUMENT, as is a dense dimension of 1 against an
empty one, as in TensorFlow). Only stored entries are computed: the
result has sp_input's indices (unsorted or repeated ones included, each computed on its own), and
implicit zeros stay implicit whatever the dense holds (inf, nan). Hybrid values broadcast over their
dense dimensions too. Result dtype: numpy's result_type of the two dtypes.""" + _LAYOUTS_DOC


@REGISTRY.op(
    "mul",
    doc="Multiplies the stored entries of sp_input by a dense tensor (SparseDenseCwiseMul, "
        "SparseTensor.__mul__).\n" + _CWISE_DOC + "\nFor bool the product is logical and; "
        "integers wrap as numpy's do.",
    args=[SP_INPUT,
          Arg("dense", DENSE, "Dense operand, broadcastable to sp_input.dense_shape.",
              layouts=("dense",))],
    outputs=[Output("output", "sparse", "sp_input's indices with the products.")],
    check=check_mul,
)
def mul(sp_input: SparseTensor, dense: np.ndarray, dtype: np.dtype) -> SparseTensor:
    indices, values = entry_indices(sp_input), entry_values(sp_input)
    fused = ek.multiply_stored(indices, values, dense, sp_input.ndim)
    if fused is not None:
        return _same_structure(sp_input, fused)
    operand = ek.gather_operand(indices, dense, sp_input.ndim)  # dense at each stored element
    return _same_structure(sp_input, ek.multiply(values, operand, dtype))


@REGISTRY.op(
    "div",
    doc="Divides the stored entries of sp_input by a dense tensor (SparseDenseCwiseDiv, "
        "SparseTensor.__div__).\n" + _CWISE_DOC + "\nA zero divisor (0 or -0.0) at a stored entry is "
        "INVALID_ARGUMENT (DIVISION_BY_ZERO) for every dtype, as TensorFlow's SparseDenseCwiseDiv "
        "refuses it; a zero where sp_input stores nothing is fine. Otherwise floating and complex "
        "division follow IEEE (a NaN divisor gives NaN). Integer division truncates toward zero (C and "
        "TensorFlow, not numpy's floor; INT_MIN / -1 wraps). bool / bool is UNIMPLEMENTED.",
    args=[SP_INPUT,
          Arg("dense", DENSE, "Dense divisor, broadcastable to sp_input.dense_shape.",
              layouts=("dense",))],
    outputs=[Output("output", "sparse", "sp_input's indices with the quotients.")],
    check=check_div,
)
def div(sp_input: SparseTensor, dense: np.ndarray, dtype: np.dtype) -> SparseTensor:
    indices, values = entry_indices(sp_input), entry_values(sp_input)
    operand = ek.gather_operand(indices, dense, sp_input.ndim)  # dense at each stored element
    pos = ek.first_zero(operand, values.shape)  # every dtype, as TensorFlow's SparseDenseCwiseDiv
    if pos is not None:
        entry, inner = pos[0], pos[1:]
        index = indices[entry].tolist() + list(inner)
        where = (f"sp_input.indices[{entry}] = {indices[entry].tolist()}" if sp_input.layout == "coo" else
                 f"element {entry} of sp_input.values in storage order, at {indices[entry].tolist()}")
        raise InvalidArgumentError(
            f"division by zero: dense (broadcast to sp_input.dense_shape) is 0 at {index} (stored entry "
            f"{where})", reason=Reason.DIVISION_BY_ZERO)
    return _same_structure(sp_input, ek.divide(values, operand, dtype))


# mul and div on the GPU: the dense operand's row for each entry is gathered by its broadcast
# key (the CPU's gather_operand), then numpy's arithmetic rules over the device arrays. Complex
# division runs on the CPU (CUDA's complex quotient rounds and treats inf/nan differently from
# numpy's), as do divisions by zero (the CPU kernel names the entry).
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


@REGISTRY.gpu("mul", layouts={"sp_input": ("coo",)})
@_gpu.quiet
def mul_gpu(be, sp_input: SparseTensor, dense, dtype: np.dtype) -> SparseTensor:
    xp = be.xp
    operand = _gather_operand_gpu(xp, sp_input, dense)
    if dtype == np.bool_:
        out = xp.logical_and(sp_input.values, operand)
    else:
        out = xp.multiply(sp_input.values, operand, dtype=dtype)
    return _gpu.same_structure(sp_input, out)


def _div_declines(plan: Plan) -> str | None:
    """Complex quotients (CUDA's round and treat inf/nan otherwise)."""
    return "dtype" if plan.args["dtype"].kind == "c" else None


@REGISTRY.gpu("div", layouts={"sp_input": ("coo",)}, declines=_div_declines)
@_gpu.quiet
def div_gpu(be, sp_input: SparseTensor, dense, dtype: np.dtype) -> SparseTensor:
    xp = be.xp
    operand = _gather_operand_gpu(xp, sp_input, dense)
    values = sp_input.values
    a, b = values.astype(dtype), operand.astype(dtype)
    zero = xp.broadcast_to(b == 0, np.broadcast_shapes(a.shape, b.shape))
    if zero.size and bool(xp.any(zero)):
        raise Fallback("division_by_zero")  # the CPU kernel names the entry
    if dtype.kind == "f":
        return _gpu.same_structure(sp_input, xp.true_divide(values, operand, dtype=dtype))
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
def check_add(a, b, threshold: float = 0.0) -> Plan:
    """Shapes equal, at least one operand sparse, sparse operands in one layout (blocksize) and
    with one sparse_ndim; the result dtype (the kernels' ``dtype``) and layout."""
    a_sparse, b_sparse = isinstance(a, SparseTensor), isinstance(b, SparseTensor)
    if not a_sparse and not b_sparse:
        raise UnimplementedError("add needs at least one sparse operand; for dense + dense use a "
                                 "dense library", reason=Reason.UNSUPPORTED_LAYOUT)
    if math.isnan(threshold) or threshold < 0:
        raise InvalidArgumentError(f"threshold = {threshold} must be a non-negative magnitude",
                                   reason=Reason.VALUE_OUT_OF_RANGE)
    if shape_of(a) != shape_of(b):
        raise InvalidArgumentError(
            f"a has shape {shape_of(a)} and b has shape {shape_of(b)}; add needs equal shapes "
            "(no broadcasting)", reason=Reason.SHAPE_MISMATCH)
    dtype = np.result_type(a.dtype, b.dtype)
    if a_sparse and b_sparse:
        if a.layout != b.layout or tuple(a.blocksize or ()) != tuple(b.blocksize or ()):
            what = {t.layout if t.layout not in ("bsr", "bsc") else f"{t.layout} (blocksize "
                    f"{list(t.blocksize)})" for t in (a, b)}
            raise UnimplementedError(
                f"add does not support a {' + '.join(sorted(what))} sum: a is {a.layout} and b is "
                f"{b.layout}; sparse operands must share one layout (and blocksize)",
                reason=Reason.UNSUPPORTED_LAYOUT)
        s_a, s_b = view_sparse_ndim(a), view_sparse_ndim(b)
        if s_a != s_b:
            raise InvalidArgumentError(
                f"a has {s_a} sparse dimensions and b has {s_b}; they must be "
                "equal", reason=Reason.SPARSE_DIM_MISMATCH)
    layout = a.layout if a_sparse and b_sparse else "dense"
    return Plan(args={"dtype": dtype}, dtype=dtype, layout=layout, shape=shape_of(a))


def _add_bytes(a, b, dtype: np.dtype, threshold=0, **_) -> int:
    if isinstance(a, SparseTensor) and isinstance(b, SparseTensor):
        s = view_sparse_ndim(a)
        inner = int(np.prod(a.dense_shape[s:], dtype=object))
        return (view_nnz(a) + view_nnz(b)) * (inner * dtype.itemsize + 8 * s)
    dense = b if isinstance(a, SparseTensor) else a
    return int(np.prod(dense.shape, dtype=object)) * dtype.itemsize


@REGISTRY.op(
    "add",
    doc="""Adds two tensors, at least one sparse (tf.sparse.add).
Shapes must be equal (no broadcasting). Result dtype: numpy's result_type of the two (bool + bool
is logical or; integers wrap).
sparse + sparse (same sparse_ndim): exactly TensorFlow's SparseAdd kernel. The operands' entries
are merged in one pass as given: the row-major smaller of a's current and b's current entry is
taken alone, equal indices are paired and summed, the leftovers follow. For coalesced operands
(sorted, unique) that is their coalesced sum; unsorted operands or repeated indices are not
sorted or summed first (an index repeated in a pairs once per repeat of it in the other operand,
the rest are kept as they are), as in TensorFlow, and the order of the operands then matters.
threshold applies only to paired sums: such a sum is kept when threshold <= |sum| (compared in
the values' real dtype for floating types, as TensorFlow casts thresh; NaN sums are dropped even
at threshold 0; a hybrid sum when some element of its block reaches threshold). An entry of one
operand alone is kept whatever its magnitude, and threshold = 0 keeps exact zeros from
cancellation. The result is marked coalesced when its indices strictly increase.
sparse + dense: a dense result, repeated indices summed (threshold does not apply).
dense + dense is UNIMPLEMENTED.
CSR, CSC, BSR, BSC: sparse + sparse needs both operands in one layout (one blocksize) and
answers in it (torch's csr + csr), index dtype int32 only when both are and it holds the result;
the sum is that of the operands' COO views (every element of a stored block an entry), converted
back (a batched result whose batches would hold different numbers of entries is INVALID_ARGUMENT,
BATCH_NSE_MISMATCH). Mixed sparse layouts are UNIMPLEMENTED (no library adds them). A compressed
operand plus a dense one gives a dense result.""",
    args=[Arg("a", TENSOR, "First operand (sparse in any layout, or dense).", layouts=(*SPARSE_LAYOUTS, "dense")),
          Arg("b", TENSOR, "Second operand (sparse in any layout, or dense).", layouts=(*SPARSE_LAYOUTS, "dense")),
          Arg("threshold", FLOAT, "Magnitude a sum of two entries must reach to be kept "
              "(non-negative; entries of one operand alone are always kept).", default=0.0)],
    outputs=[Output("output", "sparse", "Sparse for sparse + sparse, dense when an operand is dense.")],
    check=check_add,
    result_bytes=_add_bytes,
)
def add(a, b, dtype: np.dtype, threshold: float = 0.0):
    if isinstance(a, SparseTensor) and isinstance(b, SparseTensor):
        va, vb = coo_view(a), coo_view(b)
        indices, values = _sparse_add(va, vb, dtype, threshold)
        out = SparseTensor(indices=indices, values=values, dense_shape=a.dense_shape,
                           coalesced=indices.shape[0] < 2 or kernels.first_disorder(indices, a.dense_shape)[0] < 0)
        if a.layout == "coo":
            return out
        ref = a if a.compressed_indices.dtype.itemsize >= b.compressed_indices.dtype.itemsize else b
        try:
            return like(out, ref)
        except BatchNseError as exc:  # where the entries fall decides it: the kernel's to say
            raise InvalidArgumentError(f"add: the sum of a and b cannot be {a.layout}: {exc}",
                                       reason=Reason.BATCH_NSE_MISMATCH) from None
    sp, dense = (a, b) if isinstance(a, SparseTensor) else (b, a)
    sp = coo_view(sp)
    return ek.add_dense(sp.indices, sp.values, sp.dense_shape, dense, dtype)


def _reaches(xp, sums2d, threshold: float):
    """Per row of ``[n, inner]`` sums: whether TensorFlow's SparseAdd keeps it, thresh <= |sum|
    (NaN never does), for some element of the row. Floating sums compare in their real dtype
    (TensorFlow casts thresh to it); integers and bools exactly, as float64 magnitudes."""
    n, inner = int(sums2d.shape[0]), int(sums2d.shape[1])
    if inner == 0:
        return xp.full(n, threshold <= 0, dtype=bool)
    kind = sums2d.dtype.kind
    mag = xp.abs(sums2d) if kind in "fc" else xp.abs(sums2d.astype(np.float64))
    thr = np.asarray(threshold).astype(mag.dtype)[()]
    return xp.any(thr <= mag, axis=1)


def _sparse_add(a: SparseTensor, b: SparseTensor, dtype: np.dtype, threshold: float):
    """(indices, values) of TensorFlow's SparseAdd on two COO tensors of one shape (``add``'s doc)."""
    side, ia, ib = ek.merge(a.indices, b.indices)
    n, s = side.size, a.indices.shape[1]
    block = tuple(a.dense_shape[s:])
    inner = int(np.prod(block, dtype=np.int64))
    av = a.values.astype(dtype, copy=False).reshape(a.nnz, inner)
    bv = b.values.astype(dtype, copy=False).reshape(b.nnz, inner)
    from_b = side == ek.B_ONLY
    from_a = ~from_b
    indices = np.empty((n, s), np.int64)
    indices[from_a] = a.indices[ia[from_a]]
    indices[from_b] = b.indices[ib[from_b]]
    values = np.empty((n, inner), dtype)
    values[from_a] = av[ia[from_a]]
    values[from_b] = bv[ib[from_b]]
    both = np.flatnonzero(side == ek.BOTH)
    if both.size:
        with np.errstate(all="ignore"):
            x, y = av[ia[both]], bv[ib[both]]
            sums = x | y if dtype == np.bool_ else np.add(x, y, dtype=dtype)
        values[both] = sums
        drop = both[~_reaches(np, sums, threshold)]
        if drop.size:
            keep = np.ones(n, bool)
            keep[drop] = False
            indices, values = indices[keep], values[keep]
    return indices, values.reshape(indices.shape[0], *block)


# add on the GPU: for operands each sorted with unique indices (others run on the CPU: TensorFlow's
# merge of unsorted operands is one sequential pass) TensorFlow's merge is the coalesced union,
# found by concatenating and coalescing (``arrays.coalesce``); a coalesced count of the entries
# tells which sums had both operands, and only those meet the threshold. sparse + dense adds the
# coalesced entries into a copy of the dense operand. Complex sums with a threshold run on the
# CPU (|z| is rounded differently by CUDA, and the threshold is a sharp edge). Compressed
# operands run on the CPU.
def _add_declines(plan: Plan) -> str | None:
    """A complex sparse + sparse sum with a threshold (CUDA rounds the magnitude otherwise)."""
    a, b, threshold = plan.args["a"], plan.args["b"], plan.args["threshold"]
    both = isinstance(a, SparseTensor) and isinstance(b, SparseTensor)
    return "dtype" if both and plan.args["dtype"].kind == "c" and threshold > 0 else None


@REGISTRY.gpu("add", layouts={"a": ("coo", "dense"), "b": ("coo", "dense")}, declines=_add_declines)
@_gpu.quiet
def add_gpu(be, a, b, dtype: np.dtype, threshold: float = 0.0):
    xp = be.xp
    if isinstance(a, SparseTensor) and isinstance(b, SparseTensor):
        s = a.sparse_ndim
        for t in (a, b):
            if int(t.indices.shape[0]) > 1 and not ka.is_strictly_increasing(
                    xp, ka.linearize(xp, t.indices, a.dense_shape[:s])):
                raise Fallback("unordered")
        cat = xp.concatenate([a.indices, b.indices])
        values = xp.concatenate([a.values.astype(dtype), b.values.astype(dtype)])
        indices, values = ka.coalesce(xp, cat, values, a.dense_shape, be.scatter_add)
        n = int(indices.shape[0])
        if n:
            _, counts = ka.coalesce(xp, cat, xp.ones(int(cat.shape[0]), dtype=xp.int32), a.dense_shape,
                                    be.scatter_add)
            inner = int(np.prod(a.dense_shape[s:], dtype=np.int64))
            keep = (counts == 1) | _reaches(xp, values.reshape(n, inner), threshold)
            if not bool(xp.all(keep)):
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
# The function table. Each group shares its dtype rules (``_map`` applies them); the groups
# after _ANGLE are PyTorch's zero-preserving unary functions for sparse tensors (torch.sgn,
# torch.signbit, torch.isnan, torch.erf, ...). The group functions of _SPECIAL, _PREDICATES and
# _TORCH are written over an array namespace ``xp`` (numpy here, CuPy in the GPU kernel) so both
# devices compute them one way.
_Unary = Callable[[np.ndarray], np.ndarray]
_ROUNDING: dict[str, _Unary] = {"ceil": np.ceil, "floor": np.floor, "round": np.round, "trunc": np.trunc}
_ANALYTIC: dict[str, _Unary] = {"sqrt": np.sqrt, "sin": np.sin, "tan": np.tan, "tanh": np.tanh, "asin": np.arcsin,
                                "atan": np.arctan, "sinh": np.sinh, "asinh": np.arcsinh, "atanh": np.arctanh,
                                "expm1": np.expm1, "log1p": np.log1p}
_ANGLE: dict[str, _Unary] = {"deg2rad": np.deg2rad, "rad2deg": np.rad2deg}
# Real analytic functions from scipy.special (cupyx.scipy.special on a GPU).
_SPECIAL = ("erf", "erfinv")
# Predicates: bool results.
_PREDICATES = ("isnan", "isinf", "isposinf", "isneginf", "signbit")
_TORCH = ("sgn", "frac", "angle", "relu", "positive", "nan_to_num", "pow")
_ALIASES = {"negative": "neg", "absolute": "abs", "arcsin": "asin", "arctan": "atan",
            "arcsinh": "asinh", "arctanh": "atanh", "rint": "round", "fix": "trunc",
            "conj_physical": "conj", "special_erf": "erf", "special_erfinv": "erfinv",
            "power": "pow"}
_BASIC = ("neg", "abs", "sign", "square", "conj")
MAP_FUNCTIONS = (*_BASIC, *_ROUNDING, *_ANALYTIC, *_ANGLE, *_SPECIAL, *_PREDICATES, *_TORCH)
# Functions users ask for that move zero: what f(0) is, for the error message.
_NOT_ZERO_PRESERVING = {
    "cos": "1", "cosh": "1", "exp": "1", "exp2": "1", "acos": "pi/2", "arccos": "pi/2",
    "acosh": "nan", "arccosh": "nan", "log": "-inf", "log2": "-inf", "log10": "-inf",
    "rsqrt": "inf", "reciprocal": "inf", "inv": "inf", "sigmoid": "0.5", "logistic": "0.5",
    "sinc": "1", "logical_not": "true", "invert": "-1", "bitwise_not": "-1", "softplus": "log(2)",
    "erfc": "1", "lgamma": "inf", "digamma": "nan", "reciprocal_no_nan": "inf", "cot": "inf",
    "sec": "1", "csc": "inf", "isfinite": "true", "isreal": "true", "i0": "1",
}
# Integers and bools under an analytic function: float32, PyTorch's default dtype (torch.sqrt of
# an int tensor is float32; TensorFlow refuses integers there).
_INT_TO_FLOAT = np.float32


def _not_zero_preserving(fn: str, name: str) -> InvalidArgumentError | None:
    """The error for a function users ask for that moves zero (cos, exp, ...)."""
    key = fn.lower()
    if key not in _NOT_ZERO_PRESERVING:
        return None
    return InvalidArgumentError(
        f"{name} = {fn!r}: {key}(0) = {_NOT_ZERO_PRESERVING[key]} != 0, so map_values({key}) would change "
        "every implicit zero; densify with to_dense first and apply it to the dense tensor",
        reason=Reason.NOT_ZERO_PRESERVING)


MAP_FUNCTION = choice(*MAP_FUNCTIONS, reason=Reason.UNKNOWN_FUNCTION, aliases=_ALIASES, fold_case=True,
                      hint="for other functions densify with to_dense first", explain=_not_zero_preserving)


def _check_exponent(name: str, exponent) -> None:
    """exponent is pow's alone, and positive (0 ** e is 0 only for e > 0)."""
    if name != "pow":
        if exponent is not None:
            raise InvalidArgumentError(f"exponent is only for fn = 'pow', not {name!r}",
                                       reason=Reason.UNEXPECTED_ARGUMENT)
        return
    if exponent is None:
        raise InvalidArgumentError("map_values(pow) needs exponent, a positive number",
                                   reason=Reason.MISSING_ARGUMENT)
    if not exponent > 0:  # NaN too
        raise InvalidArgumentError(
            f"exponent = {exponent} must be positive: 0 ** exponent is {'1' if exponent == 0 else 'not 0'}, "
            "so pow would change every implicit zero; densify with to_dense first",
            reason=Reason.NOT_ZERO_PRESERVING)


def _int_power(xp, values, e: int):
    """values ** e by squaring, wrapping as integer multiplication does. Modulo 2**64 the odd
    numbers have multiplicative order dividing 2**62 and an even number's 64th power is 0, so e
    past 64 is folded into [64, 64 + 2**62) first: at most 63 squarings."""
    if e >= 64:
        e = 64 + (e - 64) % 2 ** 62
    out = xp.ones_like(values)
    base = values.copy()
    while e:
        if e & 1:
            out = out * base
        e >>= 1
        if e:
            base = base * base
    return out


def _torch_map(xp, special, name: str, values, exponent=None):
    """The functions of _SPECIAL, _PREDICATES and _TORCH over ``xp``; dtype checks done by
    ``_map_refusal``."""
    kind = values.dtype.kind
    if name in _PREDICATES:
        if kind in "biu":
            if name == "signbit" and kind == "i":
                return values < 0
            return xp.zeros(values.shape, dtype=bool)
        if name == "isnan":
            return xp.isnan(values)
        if name == "isinf":
            return xp.isinf(values)
        if name == "isposinf":
            return values == xp.inf
        if name == "isneginf":
            return values == -xp.inf
        return xp.signbit(values)
    if name in _SPECIAL:
        work = values.astype(_INT_TO_FLOAT) if kind in "biu" else values
        out = getattr(special, name)(work.astype(np.float32) if work.dtype == np.float16 else work)
        return out.astype(work.dtype)
    if name == "positive" or (kind == "b" and name in ("sgn", "relu")):
        return values.copy()
    if name == "sgn":  # torch.sgn: sign for reals with sgn(nan) = 0, z / |z| for complex (0 at 0)
        if kind == "c":
            mag = xp.abs(values)
            safe = xp.where(mag == 0, 1, mag).astype(values.dtype)
            return xp.where(mag == 0, 0, values / safe).astype(values.dtype)
        out = xp.sign(values)
        return xp.where(xp.isnan(values), 0, out).astype(values.dtype) if kind == "f" else out
    if name == "frac":
        return xp.zeros_like(values) if kind in "iu" else values - xp.trunc(values)
    if name == "angle":  # torch.angle: pi for negative reals, 0 otherwise (-0.0 too), nan kept
        if kind == "c":
            return xp.angle(values)
        work = values.astype(_INT_TO_FLOAT) if kind in "biu" else values
        pi = xp.asarray(np.pi, dtype=work.dtype)
        return xp.where(work < 0, pi, xp.where(xp.isnan(work), work, 0)).astype(work.dtype)
    if name == "relu":
        if kind == "u":
            return values.copy()
        return xp.where(values < 0, 0, values).astype(values.dtype)  # nan stays nan
    if name == "nan_to_num":
        return xp.nan_to_num(values) if kind in "fc" else values.copy()
    # pow: exponent checked positive by _check_exponent
    integral = math.isfinite(exponent) and float(exponent).is_integer()
    if kind == "b":
        return values.copy() if integral else values.astype(_INT_TO_FLOAT)
    if kind in "iu":
        if integral:
            return _int_power(xp, values, int(exponent))
        values = values.astype(_INT_TO_FLOAT)
    dtype = values.dtype
    if dtype == np.float16:  # computed in float32, as torch's half kernels do
        values = values.astype(np.float32)
    # torch.pow's special exponents (x * x, x * x * x, sqrt): they differ from a general power at
    # infinities and signed zeros
    if exponent == 2:
        out = values * values
    elif exponent == 3:
        out = values * values * values
    elif exponent == 0.5:
        out = xp.sqrt(values)
        if dtype == np.float16:  # torch's half kernel calls C's pow: pow(-inf, 0.5) = inf, pow(-0, 0.5) = 0
            out = xp.where(values == -xp.inf, xp.inf, out) + np.float32(0)
    else:
        out = xp.power(values, values.dtype.type(exponent))
    return out.astype(dtype)


def _map_refusal(name: str, dtype: np.dtype) -> str | None:
    """Why map_values(name) refuses values of ``dtype`` (None when it takes them)."""
    kind = dtype.kind
    if name == "neg" and kind == "b":
        return "negating a bool is not defined; cast to a number type"
    if name in _ROUNDING and kind == "c":
        return "complex numbers have no rounding order"
    if kind == "c" and name in (*_ANGLE, *_SPECIAL):
        return f"{name} is defined for real numbers only"
    if kind == "c" and name in ("isposinf", "isneginf", "signbit", "frac", "relu"):
        return f"{name} needs an ordered (real) dtype"
    if kind == "b" and name == "frac":
        return "cast to a number type first"
    return None


def check_map_values(sp_input: SparseTensor, fn: str, exponent: float | None = None) -> Plan:
    """fn (a canonical name: the argument type resolved aliases and case) takes the values'
    dtype, and exponent is pow's alone."""
    _check_exponent(fn, exponent)
    why = _map_refusal(fn, sp_input.dtype)
    if why is not None:
        raise UnimplementedError(f"map_values({fn}) does not support {sp_input.dtype.name} values: {why}",
                                 reason=Reason.UNSUPPORTED_DTYPE)
    return Plan(layout=sp_input.layout, shape=sp_input.dense_shape)


def _map(fn: str, values: np.ndarray, exponent=None) -> np.ndarray:
    kind = values.dtype.kind
    with np.errstate(all="ignore"):
        if fn in _SPECIAL or fn in _PREDICATES or fn in _TORCH:
            import scipy.special

            return _torch_map(np, scipy.special, fn, values, exponent)
        if fn in ("abs", "sign", "square", "conj") + tuple(_ROUNDING) and kind == "b":
            return values.copy()  # identity on {false, true}
        if fn == "neg":
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
            return _ROUNDING[fn](values)
        work = values.astype(_INT_TO_FLOAT) if kind in "biu" else values
        return (_ANALYTIC.get(fn) or _ANGLE[fn])(work)


@REGISTRY.op(
    "map_values",
    doc=f"""Applies a zero-preserving function to the stored values (tf.sparse.map_values).
fn is one of {', '.join(MAP_FUNCTIONS)} (aliases: {', '.join(sorted(_ALIASES))}): TensorFlow's
zero-preserving math functions and every zero-preserving unary function PyTorch applies to sparse
tensors (sgn, signbit, isnan, isinf, isposinf, isneginf, erf, erfinv, angle, frac, relu,
positive, nan_to_num, conj_physical, pow). Since f(0) = 0 (false for the predicates), the implicit
zeros stay valid and the indices are unchanged; repeated entries are mapped one by one, as
tf.sparse.map_values does (torch's functions coalesce an uncoalesced COO input first: coalesce
first to map their sums). Any other function (cos, exp, log, ...) is INVALID_ARGUMENT: densify
with to_dense and apply it to the dense tensor.
pow takes exponent, a positive number (exponent <= 0 or NaN is INVALID_ARGUMENT: 0 ** 0 = 1);
exponent is refused with any other fn. An integral exponent keeps integer values integer
(wrapping as torch.pow does) and bool values bool; a fractional one makes them float32.
dtypes follow PyTorch: float and complex keep their dtype (abs and angle of complex give the real
dtype; sign and sgn of complex are z/|z|). Integers: neg, abs, square wrap as torch's do, relu
is max(x, 0); ceil, floor, round, trunc, positive, nan_to_num are the identity, frac is 0; sign
and sgn stay integer;
the analytic functions (sqrt ... log1p, deg2rad, rad2deg, erf, erfinv, angle) return float32, as
torch's do (bool too). The predicates (isnan, isinf, isposinf, isneginf, signbit) return bool.
bool: abs, sign, sgn, square, conj, relu, positive, nan_to_num and the rounding functions are the
identity; neg and frac are UNIMPLEMENTED, as are ceil, floor, round, trunc, deg2rad, rad2deg, erf, erfinv, frac, relu,
signbit, isposinf and isneginf on complex. round is half to even. Out-of-domain inputs follow
IEEE (sqrt(-1) = nan, atanh(1) = inf, erfinv(1) = inf). Where TensorFlow and PyTorch disagree
the function's own library decides: sign(nan) is nan (tf.math.sign; torch.sign gives 0), and
sgn(nan) is 0 (torch.sgn). PyTorch's pow accepts a negative exponent on sparse tensors (x ** -1
at the stored entries only); here it is refused, as it is not zero-preserving.""" + _LAYOUTS_DOC,
    args=[SP_INPUT, Arg("fn", MAP_FUNCTION, "Name of a zero-preserving function."),
          Arg("exponent", FLOAT, "The exponent of fn = 'pow' (positive); only for pow.", default=None)],
    outputs=[Output("output", "sparse", "Same indices and shape, mapped values.")],
    check=check_map_values,
)
def map_values(sp_input: SparseTensor, fn: str, exponent: float | None = None) -> SparseTensor:
    return _same_structure(sp_input, _map(fn, sp_input.values, exponent))


# map_values on the GPU: the same numpy ufuncs from the device namespace, and the same
# _torch_map (erf and erfinv from cupyx.scipy.special). Complex values under sign, sgn, pow and
# the analytic functions run on the CPU (CUDA's complex functions round and handle branch cuts
# and inf/nan differently, and CuPy's complex sign is not numpy 2's z/|z|).
_GPU_MAP = {"neg": "negative", "abs": "abs", "sign": "sign", "square": "square", "conj": "conj", "ceil": "ceil",
            "floor": "floor", "round": "rint", "trunc": "trunc", "sqrt": "sqrt", "sin": "sin", "tan": "tan",
            "tanh": "tanh", "asin": "arcsin", "atan": "arctan", "sinh": "sinh", "asinh": "arcsinh",
            "atanh": "arctanh", "expm1": "expm1", "log1p": "log1p", "deg2rad": "deg2rad", "rad2deg": "rad2deg"}


def _map_values_declines(plan: Plan) -> str | None:
    """Complex values under sign, sgn, pow, angle and the analytic functions (CUDA rounds and
    cuts branches otherwise)."""
    complex_values = plan.args["sp_input"].dtype.kind == "c"
    return "dtype" if complex_values and plan.args["fn"] in ("sign", "sgn", "pow", "angle", *_ANALYTIC) else None


@REGISTRY.gpu("map_values", layouts={"sp_input": ("coo",)}, declines=_map_values_declines)
@_gpu.quiet
def map_values_gpu(be, sp_input: SparseTensor, fn: str, exponent: float | None = None) -> SparseTensor:
    xp = be.xp
    name = fn
    values = sp_input.values
    kind = values.dtype.kind
    if name in _SPECIAL or name in _PREDICATES or name in _TORCH:
        return _gpu.same_structure(sp_input, _torch_map(xp, be.special, name, values, exponent))
    identity = (kind == "b" and name in ("abs", "sign", "square", "conj", *_ROUNDING)) or \
        (kind in "iu" and name in _ROUNDING)
    if identity:
        return _gpu.same_structure(sp_input, values.copy())
    if kind in "biu" and (name in _ANALYTIC or name in _ANGLE):
        values = values.astype(_INT_TO_FLOAT)
    out = getattr(xp, _GPU_MAP[name])(values)
    if name == "sign" and kind == "f":
        out = xp.where(xp.isnan(values), values, out)  # numpy's sign(nan) is nan; some CuPy versions give 0
    return _gpu.same_structure(sp_input, out)


# ----------------------------------------------------------- partitioned tensors
def _dense_has_rows(dense, sp_input) -> bool:
    """A dense operand with the tensor's rank and leading size (not broadcast along it) is cut
    with the blocks; any other shape broadcasts the same to every block."""
    return np.ndim(dense) == sp_input.ndim and np.shape(dense)[0] == sp_input.dense_shape[0] != 1


REGISTRY.partitioned("mul", Rowwise("sp_input", rows=("dense",), slice_rows=_dense_has_rows))
REGISTRY.partitioned("div", Rowwise("sp_input", rows=("dense",), slice_rows=_dense_has_rows))
REGISTRY.partitioned("map_values", Rowwise("sp_input"))
REGISTRY.partitioned("with_values", Rowwise("sp_input", entries=("new_values",)))
REGISTRY.partitioned("retain", Rowwise("sp_input", entries=("to_retain",)))
