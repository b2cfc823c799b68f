"""Making and cutting tensors: split, expand_dims, eye, reset_shape (tf.sparse's) and spdiags
(torch.sparse's).

split is the catalogue's first op with a list output (``Output(..., "sparse_list")``): its
kernel returns a Python list, one tensor per piece, and the wires carry it as
``server/registry.py``'s ``Output`` says.

Layouts: TensorFlow has COO only, and PyTorch splits, unsqueezes or resizes no compressed
tensor ("Sparse CSR tensors do not have strides"), so split, expand_dims and reset_shape take
a compressed tensor as ``shape.py``'s ops do: through its COO form (batch dimensions become
leading sparse dimensions, dense ones stay dense), answering COO in row-major order. Hybrid
tensors (TensorFlow has none) follow PyTorch: expand_dims at or before the last sparse
dimension adds a sparse one, after it a dense one (``unsqueeze``); split along a dense
dimension cuts every entry's values; reset_shape bounds the sparse dimensions and keeps
the dense ones.

All index work is a handful of vectorised numpy passes (a stable sort by piece for split):
no per-entry Python loop, so no numba kernel of its own. Each op's ``check`` makes every
refusal that metadata decides before any pass runs (axes are normalised when the call binds:
``axis_of``; eye's dtype and spdiags' layout are choices); only spdiags' kernel refuses, on what
its offsets hold. Every result's size is declared (``result_bytes``) so that
--max-result-bytes refuses an eye of 10^9 rows before anything is allocated.
"""

from __future__ import annotations

import numpy as np

from sparseserve import kernels
from sparseserve.core.dtypes import DTYPE_NAMES
from sparseserve.core.tensor import SparseTensor
from sparseserve.core.validate import INT64_MAX, check_shape
from sparseserve.core.errors import InvalidArgumentError, UnimplementedError
from sparseserve.core.reasons import Reason

from ..argtypes import DENSE, INT, INT_LIST, OPTIONAL_INT, SPARSE, axis_of, choice
from ..registry import REGISTRY, Arg, Output, Plan
from ._sputils import prod
from ._layouts import SPARSE_LAYOUTS, as_coo, convert_layout, view_nnz, view_sparse_ndim

SP_INPUT = Arg("sp_input", SPARSE, "The input sparse tensor (any sparse layout; compressed ones are "
               "worked on in their COO form).", layouts=SPARSE_LAYOUTS)

# What one more tensor of a list output costs beyond its arrays (the object, its array headers
# and its entry on the wire), counted in result_bytes so that a split into millions of pieces
# meets --max-result-bytes, not the server's memory.
PIECE_OVERHEAD_BYTES = 512


def _coo_bytes(t: SparseTensor, extra_sparse: int = 0) -> int:
    """Bytes of the tensor's COO form, with ``extra_sparse`` more index columns."""
    s = view_sparse_ndim(t)
    return view_nnz(t) * (8 * (s + extra_sparse) + prod(t.dense_shape[s:]) * t.dtype.itemsize)


def _coo_form(t: SparseTensor) -> SparseTensor:
    """COO as it is; a compressed tensor's COO form in row-major order (stable)."""
    if t.layout == "coo":
        return t
    c = as_coo(t)
    if c.coalesced:
        return c
    indices, values = kernels.reorder(c.indices, c.values, c.dense_shape)
    return SparseTensor(indices=indices, values=values, dense_shape=c.dense_shape, coalesced=False)


# ------------------------------------------------------------------------ split
def check_split(sp_input: SparseTensor, num_split: int, axis: int) -> Plan:
    """Between 1 and dense_shape[axis] pieces (axis made non-negative when the call binds)."""
    dim = int(sp_input.dense_shape[axis])
    if not 1 <= num_split <= dim:
        raise InvalidArgumentError(
            f"num_split = {num_split} must be between 1 and the size of the split dimension, "
            f"dense_shape[{axis}] = {dim}", reason=Reason.BAD_NUM_SPLIT)
    return Plan(dtype=sp_input.dtype, layout="coo")  # the pieces' shapes: one per piece


def _piece_sizes(dim: int, num_split: int) -> list[int]:
    """TensorFlow's sizes: the first ``dim % num_split`` pieces one longer than the rest."""
    size, extra = divmod(dim, num_split)
    return [size + 1 if i < extra else size for i in range(num_split)]


def _split_bytes(sp_input, num_split, **_) -> int:
    return _coo_bytes(sp_input) + num_split * (PIECE_OVERHEAD_BYTES + 8 * sp_input.ndim)


@REGISTRY.op(
    "split",
    doc="""Splits a sparse tensor into num_split tensors along axis (tf.sparse.split).
axis may be negative (counted from the end) and must be in [-rank, rank); num_split must be
between 1 and dense_shape[axis] (INVALID_ARGUMENT otherwise, an empty dimension included).
Piece i covers its stretch of the axis, the first dense_shape[axis] % num_split pieces one
longer than the others (5 split 3 ways: 2, 2, 1); its indices are shifted to start at 0 and
its entries are the input's in their input order (no order is required; duplicates are
kept). Hybrid tensors: a dense axis cuts every entry's values, each piece keeping every
index. Layouts: any in, COO out; a compressed input's pieces are cut from its COO form, in
row-major order. The output is a list: on the wire the entries output[] (the count) and
output[0], output[1], ...; in the SDK a Python list.""",
    args=[SP_INPUT,
          Arg("num_split", INT, "How many tensors to cut sp_input into."),
          Arg("axis", axis_of("sp_input"), "The dimension to split along (negative: counted from the end).")],
    outputs=[Output("output", "sparse_list", "The num_split pieces, in order along axis.")],
    check=check_split,
    result_bytes=_split_bytes,
)
def split(sp_input: SparseTensor, num_split: int, axis: int) -> list[SparseTensor]:
    sizes = _piece_sizes(int(sp_input.dense_shape[axis]), num_split)
    t = _coo_form(sp_input)
    s = t.indices.shape[1]
    shape = tuple(int(d) for d in t.dense_shape)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    pieces = []
    if axis >= s:  # a dense dimension: every piece keeps every entry, its values cut
        v_axis = 1 + axis - s
        for i, size in enumerate(sizes):
            cut = [slice(None)] * t.values.ndim
            cut[v_axis] = slice(int(starts[i]), int(starts[i + 1]))
            values = np.ascontiguousarray(t.values[tuple(cut)])
            pieces.append(SparseTensor(indices=t.indices, values=values,
                                       dense_shape=(*shape[:axis], size, *shape[axis + 1:]),
                                       coalesced=t.coalesced))
        return pieces
    column = t.indices[:, axis]
    big, extra = sizes[0], int(shape[axis]) % num_split  # the first `extra` pieces hold `big`
    small = sizes[-1]
    boundary = extra * big
    piece = np.where(column < boundary, column // max(big, 1),
                     extra + (column - boundary) // max(small, 1)).astype(np.int64)
    order = np.argsort(piece, kind="stable")
    counts = np.bincount(piece, minlength=num_split)
    ends = np.cumsum(counts)
    for i, size in enumerate(sizes):
        rows = order[ends[i] - counts[i]:ends[i]]
        indices = t.indices[rows]
        indices[:, axis] -= starts[i]
        pieces.append(SparseTensor(indices=indices, values=t.values[rows],
                                   dense_shape=(*shape[:axis], size, *shape[axis + 1:]),
                                   coalesced=t.coalesced))
    return pieces


# ------------------------------------------------------------------ expand_dims
def _expanded(shape, axis: int) -> tuple[int, ...]:
    return (*shape[:axis], 1, *shape[axis:])


def check_expand_dims(sp_input: SparseTensor, axis: int) -> Plan:
    """Nothing to refuse once the call binds (axis_of made axis a position in [0, rank])."""
    return Plan(dtype=sp_input.dtype, layout="coo", shape=_expanded(sp_input.dense_shape, axis))


def _expand_dims_bytes(sp_input, axis, **_) -> int:
    return _coo_bytes(sp_input, 1 if axis <= view_sparse_ndim(sp_input) else 0)


@REGISTRY.op(
    "expand_dims",
    doc="""Inserts a dimension of size 1 at axis (tf.sparse.expand_dims). axis is in
[-(rank + 1), rank]; a negative axis counts from the end, -1 appending the new dimension last
(INVALID_ARGUMENT outside). Entries keep their order; their new index is 0. Hybrid tensors
(torch.unsqueeze): an axis up to the number of sparse dimensions adds a sparse dimension,
a later one a dense dimension (the values gain an axis of length 1). Layouts: any in, COO out
(a compressed input's COO form, in row-major order).""",
    args=[SP_INPUT,
          Arg("axis", axis_of("sp_input", extra=1),
              "Where the new dimension goes (negative: counted from the end, -1 last).")],
    outputs=[Output("output", "sparse", "The tensor with one more dimension, entries in input order.")],
    check=check_expand_dims,
    result_bytes=_expand_dims_bytes,
)
def expand_dims(sp_input: SparseTensor, axis: int) -> SparseTensor:
    t = _coo_form(sp_input)
    s = t.indices.shape[1]
    out_shape = _expanded(tuple(int(d) for d in t.dense_shape), axis)
    if axis <= s:
        indices = np.insert(t.indices, axis, 0, axis=1)
        return SparseTensor(indices=np.ascontiguousarray(indices, dtype=np.int64), values=t.values,
                            dense_shape=out_shape, coalesced=t.coalesced)
    values = np.expand_dims(t.values, 1 + axis - s)
    return SparseTensor(indices=t.indices, values=values, dense_shape=out_shape, coalesced=t.coalesced)


# -------------------------------------------------------------------------- eye
def check_eye(num_rows: int, num_columns: int | None = None, dtype: str = "float32") -> Plan:
    """Two sizes whose element count fits int64; the kernels take num_columns resolved."""
    cols = num_rows if num_columns is None else num_columns
    for name, value in (("num_rows", num_rows), ("num_columns", cols)):
        if value < 0:
            raise InvalidArgumentError(f"{name} = {value} is negative", reason=Reason.NEGATIVE_DIMENSION)
    shape = check_shape((num_rows, cols), "[num_rows, num_columns]")
    return Plan(args={"num_columns": cols}, dtype=np.dtype(dtype), layout="coo", shape=shape)


def _eye_bytes(num_rows, num_columns=None, dtype="float32", **_) -> int:
    cols = num_rows if num_columns is None else num_columns
    return min(num_rows, cols) * (16 + np.dtype(dtype).itemsize)


@REGISTRY.op(
    "eye",
    doc="""A sparse identity matrix (tf.sparse.eye): num_rows x num_columns (num_columns
defaults to num_rows) with ones at [i, i] for i < min(num_rows, num_columns), coalesced. dtype
is any supported dtype name (bool gives True). A negative size, or one whose element count
does not fit int64, is INVALID_ARGUMENT; a result over --max-result-bytes is
RESOURCE_EXHAUSTED before anything is allocated.""",
    args=[Arg("num_rows", INT, "Rows of the matrix."),
          Arg("num_columns", OPTIONAL_INT, "Columns of the matrix (default: num_rows).", default=None),
          Arg("dtype", choice(*DTYPE_NAMES, reason=Reason.BAD_DTYPE), "The dtype of the values (a numpy name).",
              default="float32")],
    outputs=[Output("output", "sparse", "The identity matrix (COO, coalesced).")],
    check=check_eye,
    result_bytes=_eye_bytes,
)
def eye(num_rows: int, num_columns: int, dtype: str = "float32") -> SparseTensor:
    n = min(num_rows, num_columns)
    diagonal = np.arange(n, dtype=np.int64)
    return SparseTensor(indices=np.stack([diagonal, diagonal], axis=1), values=np.ones(n, np.dtype(dtype)),
                        dense_shape=(num_rows, num_columns), coalesced=True)


# ------------------------------------------------------------------ reset_shape
def check_reset_shape(sp_input: SparseTensor, new_shape: list[int] | None = None) -> Plan:
    """new_shape (when given) has sp_input's rank and dense dimensions, fits int64 and grows no
    dimension smaller; without it the indices decide the shape."""
    if new_shape is None:
        return Plan(dtype=sp_input.dtype, layout="coo")
    old = tuple(int(d) for d in sp_input.dense_shape)
    if len(new_shape) != len(old):
        raise InvalidArgumentError(
            f"new_shape = {list(new_shape)} has {len(new_shape)} dimensions but sp_input has rank "
            f"{len(old)}", reason=Reason.RANK_MISMATCH)
    for d, value in enumerate(new_shape):
        if value > INT64_MAX:
            raise InvalidArgumentError(f"new_shape[{d}] = {value} does not fit int64", reason=Reason.SHAPE_OVERFLOW)
    shape = check_shape(new_shape, "new_shape")
    for d, (new, was) in enumerate(zip(shape, old)):
        if new < was:
            raise InvalidArgumentError(
                f"new_shape[{d}] = {new} is smaller than sp_input.dense_shape[{d}] = {was}; new_shape "
                "may only grow the shape (pass no new_shape for the tightest one)", reason=Reason.SHAPE_TOO_SMALL)
    s = view_sparse_ndim(sp_input)
    if shape[s:] != old[s:]:
        raise InvalidArgumentError(
            f"new_shape = {list(shape)} changes the dense dimensions {list(old[s:])} of the hybrid "
            f"sp_input (dense_shape {list(old)}); only its {s} sparse dimensions may grow",
            reason=Reason.DENSE_DIMS_CHANGED)
    return Plan(dtype=sp_input.dtype, layout="coo", shape=shape)


def _reset_shape_bytes(sp_input, **_) -> int:
    return _coo_bytes(sp_input)


@REGISTRY.op(
    "reset_shape",
    doc="""Gives a sparse tensor a new dense_shape, indices and values unchanged
(tf.sparse.reset_shape). Without new_shape the shape is the tightest that holds the indices:
max(indices[:, d]) + 1 on each dimension (0 for a tensor with no entries). With it, new_shape
has one entry per dimension, each at least the corresponding dimension of sp_input's
dense_shape, as TensorFlow requires (another rank, a smaller dimension, a negative one or an
element count past int64 is INVALID_ARGUMENT). Hybrid tensors: the sparse dimensions are
reset, the dense ones kept (new_shape must repeat them). Layouts: any in, COO out (a
compressed input's COO form, in row-major order).""",
    args=[SP_INPUT,
          Arg("new_shape", INT_LIST, "The new dense shape (default: the tightest bounding shape).",
              default=None)],
    outputs=[Output("output", "sparse", "sp_input with the new dense_shape.")],
    check=check_reset_shape,
    result_bytes=_reset_shape_bytes,
)
def reset_shape(sp_input: SparseTensor, new_shape: list[int] | None = None) -> SparseTensor:
    t = _coo_form(sp_input)
    if new_shape is None:  # the tightest: what the indices reach
        s = t.indices.shape[1]
        tight = t.indices.max(axis=0) + 1 if t.nnz else np.zeros(s, np.int64)
        new_shape = [*(int(d) for d in tight), *(int(d) for d in t.dense_shape[s:])]
    return SparseTensor(indices=t.indices, values=t.values, dense_shape=new_shape, coalesced=t.coalesced)


# ---------------------------------------------------------------------- spdiags
def _block_layout(value: str, name: str) -> UnimplementedError | None:
    """BSR and BSC are layouts spdiags does not answer in (torch's neither), not unknown words."""
    if value not in ("bsr", "bsc"):
        return None
    return UnimplementedError(f"spdiags answers in layout coo, csr or csc, not {value} (as "
                              "torch.sparse.spdiags)", reason=Reason.UNSUPPORTED_LAYOUT)


SPDIAGS_LAYOUT = choice("coo", "csr", "csc", reason=Reason.BAD_LAYOUT, hint="null (the default) means coo",
                        explain=_block_layout)


def check_spdiags(diagonals: np.ndarray, offsets: np.ndarray, shape: list[int], layout: str | None = None) -> Plan:
    """diagonals a vector or a matrix, offsets an integer scalar or vector with one offset per
    diagonal, shape two sizes; the kernels take layout resolved (null is coo). What the offsets
    hold (repeats, uint64 past int64) is the kernel's to check."""
    if diagonals.ndim not in (1, 2):
        raise InvalidArgumentError(f"diagonals must be a vector or a matrix, not of rank {diagonals.ndim}",
                                   reason=Reason.BAD_DIAGONALS)
    if offsets.ndim > 1:
        raise InvalidArgumentError(f"offsets must be a scalar or a vector, not of rank {offsets.ndim}",
                                   reason=Reason.BAD_OFFSETS)
    if offsets.dtype.kind not in "iu":
        raise InvalidArgumentError(f"offsets must hold integers, not {offsets.dtype.name}",
                                   reason=Reason.BAD_OFFSETS)
    if len(shape) != 2:
        raise InvalidArgumentError(f"shape = {list(shape)} must have 2 entries: spdiags makes a matrix",
                                   reason=Reason.RANK_MISMATCH)
    out_shape = check_shape(shape, "shape")
    count = 1 if diagonals.ndim == 1 else diagonals.shape[0]
    if count != offsets.size:
        raise InvalidArgumentError(
            f"diagonals holds {count} diagonals (rows) but offsets has {offsets.size} entries",
            reason=Reason.SIZE_MISMATCH)
    layout = "coo" if layout is None else layout
    return Plan(args={"layout": layout}, dtype=diagonals.dtype, layout=layout, shape=out_shape)


def _spans(diagonals: np.ndarray, offsets: np.ndarray, shape: list[int]):
    """(diagonals as [n_diag, L], offsets as int64 [n_diag], and per diagonal its first row,
    first column and length)."""
    rows, cols = (int(d) for d in shape)
    diagonals = diagonals.reshape(1, -1) if diagonals.ndim == 1 else diagonals
    offsets = offsets.reshape(-1).astype(np.int64)
    # Diagonal k's element j (a column) lands at [j - k, j]: columns from max(k, 0), rows from
    # max(-k, 0), as many as the matrix and the row of diagonals hold (none past either).
    # Offsets are clipped to [-rows, cols] first (past those a diagonal is empty either way),
    # so that none near int64's ends overflows below.
    clipped = np.clip(offsets, -rows, cols)
    first_col = np.maximum(clipped, 0)
    first_row = np.maximum(-clipped, 0)
    length = np.minimum(np.minimum(rows - first_row, cols - first_col), diagonals.shape[1] - first_col)
    length = np.maximum(length, 0)
    return diagonals, offsets, first_row, first_col, length


def _spdiags_bytes(diagonals, offsets, shape, layout=None, **_) -> int:
    *_, length = _spans(diagonals, offsets, shape)
    rows, cols = shape
    pointers = 8 * ((rows if layout == "csr" else cols) + 1) if layout in ("csr", "csc") else 0
    return int(length.sum()) * (16 + diagonals.dtype.itemsize) + pointers


@REGISTRY.op(
    "spdiags",
    doc="""A sparse matrix from diagonals (torch.sparse.spdiags): row i of diagonals goes on the
diagonal offsets[i] (0 the main one, positive above, negative below) of a shape[0] x
shape[1] matrix, each element staying in its column: diagonals[i, j] lands at
[j - offsets[i], j], for the columns j where that is inside the matrix and j < the length of
diagonals' rows. diagonals is a matrix (a vector is one diagonal) of any dtype; offsets an
integer scalar or vector, one per row of diagonals, none repeated; shape two non-negative
sizes. Zeros on the diagonals are stored. A diagonal wholly outside the matrix stores nothing
(torch's CPU kernel fails on one). layout: null or "coo" gives COO with the diagonals' entries
in the order of offsets (each diagonal top-left first, not coalesced, as torch's), "csr" and
"csc" those layouts (int64 indices); bsr and bsc are UNIMPLEMENTED, as in torch.""",
    args=[Arg("diagonals", DENSE, "The diagonals, one per row (a vector: one diagonal).", layouts=("dense",)),
          Arg("offsets", DENSE, "The diagonal each row of diagonals goes on (integers; a scalar for one).",
              layouts=("dense",)),
          Arg("shape", INT_LIST, "[rows, columns] of the result."),
          Arg("layout", SPDIAGS_LAYOUT, "The result's layout: null (COO), coo, csr or csc.", default=None)],
    outputs=[Output("output", "sparse", "The matrix with those diagonals.")],
    check=check_spdiags,
    result_bytes=_spdiags_bytes,
)
def spdiags(diagonals: np.ndarray, offsets: np.ndarray, shape: list[int], layout: str) -> SparseTensor:
    # What the offsets hold decides these two: the kernel's to say.
    if offsets.dtype == np.uint64 and offsets.size and int(offsets.max()) > INT64_MAX:
        raise InvalidArgumentError("offsets must fit int64", reason=Reason.BAD_OFFSETS)
    diagonals, offsets, first_row, first_col, length = _spans(diagonals, offsets, shape)
    unique, counts = np.unique(offsets, return_counts=True)
    if np.any(counts > 1):
        raise InvalidArgumentError(f"offsets repeats {int(unique[np.argmax(counts > 1)])}; each diagonal "
                                   "may be given once", reason=Reason.DUPLICATE_OFFSETS)
    total = int(length.sum())
    which = np.repeat(np.arange(offsets.size, dtype=np.int64), length)
    starts = np.cumsum(length) - length
    position = np.arange(total, dtype=np.int64) - np.repeat(starts, length)
    rows = first_row[which] + position
    cols = first_col[which] + position
    values = np.ascontiguousarray(diagonals[which, cols]) if total else np.zeros(0, diagonals.dtype)
    coo = SparseTensor(indices=np.stack([rows, cols], axis=1), values=values, dense_shape=shape,
                       coalesced=offsets.size <= 1)
    if layout == "coo":
        return coo
    return convert_layout(coo, layout)
