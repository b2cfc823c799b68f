"""Linear algebra: ``matmul`` (SpMV, SpMM, dense @ sparse, SpGEMM) and ``sampled_addmm`` (SDDMM).

Arguments follow TensorFlow (tf.sparse.sparse_dense_matmul, tf.linalg.matmul's
adjoint_a/adjoint_b) and PyTorch (torch.sparse.sampled_addmm). Every layout is
reduced here to the CSR arrays of a matrix or of its transpose (a CSC is the
CSR of the transpose, so it is read as it is); batches become one
block-diagonal matrix, so the kernels in ``kernels/linalg.py`` see 2-D CSR only.
Values are computed in a wider dtype where the kernels are not compiled for
the input's (``_sputils.product_dtype``: small integers in int64, float16 in
float32) and cast back, which wraps integers exactly as a native product would.
Each op's ``check`` makes its refusals (layouts, dtypes, shapes) from metadata
before any kernel; the kernels, CPU and GPU, only compute. ``matrix_rep`` and
``csr_arrays`` are the seam the solvers and the Dask blocks read matrices through.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sparseserve.core.tensor import SparseTensor
from sparseserve.core.errors import InvalidArgumentError, UnimplementedError
from sparseserve.core.reasons import Reason
from sparseserve.kernels import arrays as ka
from sparseserve.kernels import compressed as ck
from sparseserve.kernels import linalg as lk

from ..argtypes import BOOL, SCALAR, TENSOR
from ..partition import Rowwise
from ..registry import REGISTRY, Arg, Output, Plan
from . import _gpu
from ._common import cast_scalar
from ._layouts import SPARSE_LAYOUTS, as_coo, as_csr
from ._sputils import INT32_MAX, as_product_dtype, prod, shape_of

__all__ = ["MatrixRep", "matrix_dims", "matrix_rep", "csr_arrays", "check_matmul", "matmul",
           "check_sampled_addmm", "sampled_addmm"]


# ------------------------------------------------------------------ dtypes
def _from_compute(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if a.dtype == dtype:
        return a
    if dtype == np.uint64:
        return a.view(np.uint64)
    with np.errstate(all="ignore"):
        return a.astype(dtype)


def _conj(a: np.ndarray) -> np.ndarray:
    return np.conj(a) if a.dtype.kind == "c" else a


def _check_dtypes(x, y, x_name: str, y_name: str, op: str) -> np.dtype:
    if x.dtype != y.dtype:
        raise InvalidArgumentError(f"{x_name} has dtype {x.dtype} and {y_name} has dtype {y.dtype}; "
                                   f"{op} needs one dtype (cast one of them)", reason=Reason.DTYPE_MISMATCH)
    if x.dtype == np.bool_:
        raise UnimplementedError(f"{op} does not support bool; cast the values to a number type",
                                 reason=Reason.UNSUPPORTED_DTYPE)
    return x.dtype


# ------------------------------------------------------------------ sparse operands
class MatrixRep(NamedTuple):
    """CSR arrays of the block-diagonal matrix of a (batched) sparse matrix, or of its
    transpose (``transposed``: the arrays are a CSC's); ``m`` x ``n`` is one batch's matrix.
    The values are in the product kernels' dtype (``_sputils.product_dtype``)."""

    ptr: np.ndarray
    idx: np.ndarray
    vals: np.ndarray
    transposed: bool
    batch: tuple[int, ...]
    m: int
    n: int


def matrix_dims(t: SparseTensor, name: str, op: str) -> tuple[tuple[int, ...], int, int]:
    """(batch dimensions, m, n) of the sparse matrix or batch of matrices ``t`` [*batch, m, n],
    the check every op that reads ``t`` as matrices makes: hybrid tensors are UNIMPLEMENTED and a
    rank under 2 INVALID_ARGUMENT, each naming ``name`` and ``op``."""
    if t.dense_ndim:
        raise UnimplementedError(f"{op} does not support hybrid tensors: {name} has {t.dense_ndim} dense "
                                 "dimensions; convert it with dense_dim=0 first", reason=Reason.UNSUPPORTED_HYBRID)
    if t.ndim < 2:
        raise InvalidArgumentError(f"{name} has shape {shape_of(t)}; {op} needs a matrix or a batch of "
                                   "matrices (rank 2 or more)", reason=Reason.RANK)
    return _dims(t)


def _dims(t: SparseTensor) -> tuple[tuple[int, ...], int, int]:
    shape = t.dense_shape
    return tuple(int(d) for d in shape[:-2]), int(shape[-2]), int(shape[-1])


def _flat_compressed(t: SparseTensor, n_plain: int):
    """(ptr, idx, vals) of a CSR/CSC's batches as one block-diagonal matrix; an unbatched
    tensor's arrays as they are (int32 stays int32)."""
    n_batch = prod(t.dense_shape[:t.batch_ndim])
    ci = t.compressed_indices.reshape(n_batch, t.compressed_indices.shape[-1])
    pi = t.plain_indices.reshape(n_batch, t.plain_indices.shape[-1])
    vals = t.values.reshape(-1)
    if t.batch_ndim == 0:
        return ci[0], pi[0], vals
    nse = pi.shape[1]
    offsets = np.arange(n_batch, dtype=np.int64)[:, None]
    ptr = np.empty(n_batch * (ci.shape[1] - 1) + 1, np.int64)
    ptr[:-1] = (ci[:, :-1] + offsets * nse).ravel()
    ptr[-1] = n_batch * nse
    return ptr, (pi + offsets * n_plain).ravel(), vals


def _flat_coo(t: SparseTensor, batch, m: int, n: int) -> SparseTensor:
    """A batched COO [*batch, m, n] as its 2-D block-diagonal matrix."""
    indices = t.indices
    b = np.ravel_multi_index(tuple(indices[:, :-2].T), batch) if indices.shape[0] else \
        np.zeros(0, np.int64)
    n_batch = prod(batch)
    flat = np.stack([b * m + indices[:, -2], b * n + indices[:, -1]], axis=1).astype(np.int64)
    return SparseTensor(indices=flat, values=t.values, dense_shape=[n_batch * m, n_batch * n])


def matrix_rep(t: SparseTensor) -> MatrixRep:
    """A checked sparse matrix or batch of matrices (``matrix_dims``), any layout, as the CSR
    arrays of its block-diagonal matrix or of its transpose: a CSC is read as it is, block
    layouts and COO are converted (every element of a stored block a stored entry)."""
    batch, m, n = _dims(t)
    if t.layout in ("bsr", "bsc"):
        t = as_coo(t)  # every element of a stored block is a stored entry; batches lead
    if t.layout == "coo":
        csr = as_csr(_flat_coo(t, batch, m, n) if batch else t)
        ptr, idx, vals = csr.compressed_indices, csr.plain_indices, csr.values
        return MatrixRep(ptr, idx, as_product_dtype(vals), False, batch, m, n)
    transposed = t.layout == "csc"
    ptr, idx, vals = _flat_compressed(t, m if transposed else n)
    return MatrixRep(ptr, idx, as_product_dtype(vals), transposed, batch, m, n)


def _transpose_arrays(ptr, idx, vals, n_plain: int):
    """CSR arrays of the transpose (a counting sort; index dtype kept)."""
    ci, pi, perm = ck.transpose(ptr.reshape(1, -1), idx.reshape(1, -1), n_plain)
    return ci.reshape(-1), pi.reshape(-1), vals[perm]


def csr_arrays(rep: MatrixRep, adjoint: bool = False):
    """(ptr, idx, vals) of the 2-D (block-diagonal) matrix op(M): M, or M^H with ``adjoint``,
    transposed by a counting sort where ``rep`` holds the other one."""
    ptr, idx, vals = rep.ptr, rep.idx, rep.vals
    if rep.transposed != adjoint:
        ptr, idx, vals = _transpose_arrays(ptr, idx, vals, rep.n if not rep.transposed else rep.m)
    return ptr, idx, (_conj(vals) if adjoint else vals)


# ------------------------------------------------------------------ sparse @ dense
def _sparse_dense(rep: MatrixRep, want_t: bool, conj: bool, x: np.ndarray) -> np.ndarray:
    """op(M) @ x with op(M) = M, M^T, conj(M) or M^H; x [*batch, inner, k] or [inner] (checked)."""
    rows, inner = (rep.n, rep.m) if want_t else (rep.m, rep.n)
    n_batch = prod(rep.batch)
    vals = _conj(rep.vals) if conj else rep.vals
    ptr, idx = rep.ptr, rep.idx
    gather = rep.transposed == want_t
    n_out = n_batch * rows
    k = 1 if x.ndim == 1 else int(x.shape[-1])
    if not gather and not lk.scatter_pays(vals.size, n_out, k, vals.itemsize, idx.itemsize):
        ptr, idx, vals = _transpose_arrays(ptr, idx, vals, n_out)
        gather = True
    if x.ndim == 1:
        return lk.spmv(ptr, idx, vals, x, n_out, not gather)
    y = lk.spmm(ptr, idx, vals, x.reshape(n_batch * inner, k), n_out, not gather)
    return y.reshape(*rep.batch, rows, k)


def _check_dense_operand(x: np.ndarray, x_name: str, inner: int, batch, s_name: str, s_shape,
                         x_adjoint: bool, op_desc: str) -> None:
    """x must be [inner] (no batch, no adjoint) or [*batch, inner, k] after its own adjoint."""
    if x.ndim == 0:
        raise InvalidArgumentError(f"{x_name} is a scalar; matmul needs a vector or a matrix", reason=Reason.RANK)
    if x.ndim == 1:
        if x_adjoint:
            raise InvalidArgumentError(f"{x_name} is a vector (shape {shape_of(x)}); adjoint needs a matrix",
                                       reason=Reason.RANK)
        if batch:
            raise InvalidArgumentError(f"{x_name} is a vector but {s_name} is batched (shape {list(s_shape)}); "
                                       f"give {x_name} the batch dimensions {list(batch)}",
                                       reason=Reason.SHAPE_MISMATCH)
        got_batch: tuple[int, ...] = ()
        got_inner = x.shape[0]
    else:
        got_batch = tuple(int(d) for d in x.shape[:-2])
        got_inner = x.shape[-1] if x_adjoint else x.shape[-2]
    if got_batch != tuple(batch) or got_inner != inner:
        raise InvalidArgumentError(
            f"{op_desc}: {s_name} has shape {list(s_shape)} and {x_name} has shape {shape_of(x)}, which do not "
            "multiply (inner dimensions must agree and batch dimensions be equal)", reason=Reason.SHAPE_MISMATCH)


def _sparse_times_dense(a: SparseTensor, b: np.ndarray, adjoint_a: bool, adjoint_b: bool) -> np.ndarray:
    rep = matrix_rep(a)
    x = np.conj(np.swapaxes(b, -1, -2)) if adjoint_b else b
    y = _sparse_dense(rep, adjoint_a, adjoint_a, as_product_dtype(x))
    return _from_compute(y, a.dtype)


def _dense_times_sparse(a: np.ndarray, b: SparseTensor, adjoint_a: bool, adjoint_b: bool) -> np.ndarray:
    """op(a) @ op(b) computed as (op(b)^T @ op(a)^T)^T: op(b)^T is b^T, or conj(b) when adjoint_b."""
    rep = matrix_rep(b)
    if a.ndim == 1:  # a row vector: op(b)^T @ a
        return _from_compute(_sparse_dense(rep, not adjoint_b, adjoint_b, as_product_dtype(a)), a.dtype)
    # op(a)^T [*batch, inner, rows]: a's last two dims swapped, or conj(a) when adjoint_a.
    at = np.conj(a) if adjoint_a else np.swapaxes(a, -1, -2)
    yt = _sparse_dense(rep, not adjoint_b, adjoint_b, as_product_dtype(at))
    return _from_compute(np.ascontiguousarray(np.swapaxes(yt, -1, -2)), a.dtype)


# ------------------------------------------------------------------ sparse @ sparse
def _sparse_times_sparse(a: SparseTensor, b: SparseTensor, adjoint_a: bool, adjoint_b: bool) -> SparseTensor:
    ra, rb = matrix_rep(a), matrix_rep(b)
    p = ra.n if adjoint_a else ra.m
    r = rb.m if adjoint_b else rb.n
    a_ptr, a_idx, a_vals = csr_arrays(ra, adjoint_a)
    b_ptr, b_idx, b_vals = csr_arrays(rb, adjoint_b)
    index = np.result_type(a_idx.dtype, b_idx.dtype)  # one index dtype: one compiled signature
    a_ptr, a_idx, b_ptr, b_idx = (v.astype(index, copy=False) for v in (a_ptr, a_idx, b_ptr, b_idx))
    c_ptr, c_idx, c_vals = lk.spgemm(a_ptr, a_idx, a_vals, b_ptr, b_idx, b_vals, r, index)
    values = _from_compute(c_vals, a.dtype)
    if a.layout == "csr":
        return SparseTensor(layout="csr", compressed_indices=c_ptr, plain_indices=c_idx, values=values,
                            dense_shape=[p, r], coalesced=True)
    rows = np.repeat(np.arange(p, dtype=np.int64), np.diff(c_ptr))
    indices = np.stack([rows, c_idx.astype(np.int64, copy=False)], axis=1)
    return SparseTensor(indices=indices, values=values, dense_shape=[p, r], coalesced=True)


# ------------------------------------------------------------------ result sizes
def _axis_counts(t: SparseTensor, axis: int) -> np.ndarray:
    """Stored entries of a 2-D sparse matrix per row (axis 0) or per column (axis 1)."""
    dim = int(t.dense_shape[axis])
    if t.layout == "coo":
        return np.bincount(t.indices[:, axis], minlength=dim)
    block = tuple(int(v) for v in t.blocksize) if t.blocksize is not None else (1, 1)
    compressed_axis = 0 if t.layout in ("csr", "bsr") else 1
    if axis == compressed_axis:
        per_group = np.diff(t.compressed_indices.astype(np.int64))
    else:
        per_group = np.bincount(t.plain_indices, minlength=dim // block[axis])
    # each stored block holds block[1 - axis] elements of each of its block[axis] lines
    return np.repeat(per_group * block[1 - axis], block[axis])


def _op_dims(shape, adjoint: bool) -> tuple[int, int]:
    return (shape[-1], shape[-2]) if adjoint else (shape[-2], shape[-1])


def _matmul_bytes(a, b, adjoint_a=False, adjoint_b=False, **_) -> int:
    """Output bytes: exact for a dense result; for sparse @ sparse an upper bound, the products
    sum_j nnz(op(a)[:, j]) * nnz(op(b)[j, :]) capped at the dense size, plus the indices."""
    try:
        a_sparse, b_sparse = isinstance(a, SparseTensor), isinstance(b, SparseTensor)
        itemsize = a.dtype.itemsize
        sa, sb = shape_of(a), shape_of(b)
        if a_sparse and b_sparse:
            if len(sa) != 2 or len(sb) != 2 or a.dense_ndim or b.dense_ndim:
                return 0  # refused by the check
            p, r = (sa[1] if adjoint_a else sa[0]), (sb[0] if adjoint_b else sb[1])
            inner_a = _axis_counts(a, 0 if adjoint_a else 1).astype(np.float64)
            inner_b = _axis_counts(b, 1 if adjoint_b else 0).astype(np.float64)
            if inner_a.size != inner_b.size:
                return 0
            bound = min(float(inner_a @ inner_b), float(p) * float(r))
            return int(bound) * (itemsize + 16) + 8 * (p + 1)
        sparse_shape, dense_shape = (sa, sb) if a_sparse else (sb, sa)
        if len(sparse_shape) < 2 or len(dense_shape) < 1:
            return 0
        rows = _op_dims(sa, adjoint_a)[0] if len(sa) > 1 else 1  # a vector contributes no dimension
        cols = _op_dims(sb, adjoint_b)[1] if len(sb) > 1 else 1
        return prod(sparse_shape[:-2]) * rows * cols * itemsize
    except (AttributeError, TypeError, ValueError, IndexError):
        return 0


# ------------------------------------------------------------------ matmul
def _spgemm_shape(a: SparseTensor, b: SparseTensor, adjoint_a: bool, adjoint_b: bool) -> tuple[int, int]:
    (a_batch, am, an), (b_batch, bm, bn) = matrix_dims(a, "a", "matmul"), matrix_dims(b, "b", "matmul")
    if a_batch or b_batch:
        raise UnimplementedError(f"matmul of two sparse tensors needs 2-D matrices; a has shape "
                                 f"{shape_of(a)} and b has shape {shape_of(b)}", reason=Reason.UNSUPPORTED_BATCH)
    p, q = (an, am) if adjoint_a else (am, an)
    q2, r = (bn, bm) if adjoint_b else (bm, bn)
    if q != q2:
        raise InvalidArgumentError(
            f"op(a) @ op(b): a has shape {shape_of(a)} and b has shape {shape_of(b)}, which do not multiply "
            f"(op(a) has {q} columns, op(b) has {q2} rows)", reason=Reason.SHAPE_MISMATCH)
    return p, r


def _sparse_dense_shape(a: SparseTensor, b: np.ndarray, adjoint_a: bool, adjoint_b: bool) -> tuple[int, ...]:
    batch, m, n = matrix_dims(a, "a", "matmul")
    _check_dense_operand(b, "b", m if adjoint_a else n, batch, "a", a.dense_shape, adjoint_b, "op(a) @ op(b)")
    rows = n if adjoint_a else m
    if b.ndim == 1:
        return (rows,)
    return (*batch, rows, int(b.shape[-2] if adjoint_b else b.shape[-1]))


def _dense_sparse_shape(a: np.ndarray, b: SparseTensor, adjoint_a: bool, adjoint_b: bool) -> tuple[int, ...]:
    batch, m, n = matrix_dims(b, "b", "matmul")
    inner, cols = (n, m) if adjoint_b else (m, n)
    if a.ndim == 1:  # a row vector
        _check_dense_operand(a, "a", inner, batch, "b", b.dense_shape, adjoint_a, "op(a) @ op(b)")
        return (cols,)
    # op(a) must be [*batch, rows, inner]: its transpose is checked as the operand.
    _check_dense_operand(a, "a", inner, batch, "b", b.dense_shape, not adjoint_a, "op(a) @ op(b)")
    return (*batch, int(a.shape[-1] if adjoint_a else a.shape[-2]), cols)


def check_matmul(a, b, adjoint_a: bool = False, adjoint_b: bool = False) -> Plan:
    """At least one operand sparse, one dtype (not bool), sparse operands plain or batched
    matrices (no hybrid; two sparse ones 2-D), shapes that multiply; the result's dtype, layout
    and shape."""
    a_sparse, b_sparse = isinstance(a, SparseTensor), isinstance(b, SparseTensor)
    if not a_sparse and not b_sparse:
        raise UnimplementedError("matmul needs at least one sparse operand; for dense @ dense use a dense "
                                 "library", reason=Reason.UNSUPPORTED_LAYOUT)
    dtype = _check_dtypes(a, b, "a", "b", "matmul")
    if a_sparse and b_sparse:
        shape: tuple[int, ...] = _spgemm_shape(a, b, adjoint_a, adjoint_b)
        return Plan(dtype=dtype, layout="csr" if a.layout == "csr" else "coo", shape=shape)
    if a_sparse:
        shape = _sparse_dense_shape(a, b, adjoint_a, adjoint_b)
    else:
        shape = _dense_sparse_shape(a, b, adjoint_a, adjoint_b)
    return Plan(dtype=dtype, layout="dense", shape=shape)


@REGISTRY.op(
    "matmul",
    doc="""Matrix product op(a) @ op(b) with at least one sparse operand (tf.sparse.sparse_dense_matmul,
tf.linalg.matmul's adjoint flags, torch.sparse.mm). op(x) is x, or with adjoint_x its conjugate transpose
(complex values conjugated). Either side may be sparse (COO, CSR, CSC, BSR, BSC; no hybrid dimensions).
sparse @ dense vector [n] -> dense vector (SpMV); sparse @ dense matrix [n, k] -> dense [m, k] (SpMM);
dense @ sparse likewise (a dense vector on the left is a row vector).
Batched: a sparse [*batch, m, n] (compressed layouts with batch dimensions, or COO with leading sparse
dimensions) times a dense [*batch, n, k] with the same batch dimensions -> dense [*batch, m, k].
sparse @ sparse -> sparse (SpGEMM, 2-D only): CSR when a is CSR (int32 indices when both operands'
indices are int32 and the result fits, else int64), otherwise coalesced COO; columns ascend in each
row and explicit zeros from cancellation are kept. Its size is bounded before anything is allocated
(the sum over the inner dimension of the entry counts' products, at most the dense size) and refused
past --max-result-bytes.
Both operands must have one dtype; every number dtype works except bool (UNIMPLEMENTED); integers wrap
as numpy's matmul does, float16 is accumulated in float32. dense @ dense is UNIMPLEMENTED (not sparse work).""",
    args=[Arg("a", TENSOR, "Left operand: sparse [*batch, m, n], or dense [m, n] / [*batch, m, n] / [n].",
              layouts=(*SPARSE_LAYOUTS, "dense")),
          Arg("b", TENSOR, "Right operand: dense [n] / [n, k] / [*batch, n, k], or sparse [n, k].",
              layouts=(*SPARSE_LAYOUTS, "dense")),
          Arg("adjoint_a", BOOL, "Use the conjugate transpose of a (its last two dimensions).", default=False),
          Arg("adjoint_b", BOOL, "Use the conjugate transpose of b (its last two dimensions).", default=False)],
    outputs=[Output("output", "sparse", "Dense for sparse @ dense and dense @ sparse; sparse (CSR or COO) "
                    "for sparse @ sparse.")],
    check=check_matmul,
    result_bytes=_matmul_bytes,
)
def matmul(a, b, adjoint_a: bool = False, adjoint_b: bool = False):
    if isinstance(a, SparseTensor) and isinstance(b, SparseTensor):
        return _sparse_times_sparse(a, b, adjoint_a, adjoint_b)
    if isinstance(a, SparseTensor):
        return _sparse_times_dense(a, b, adjoint_a, adjoint_b)
    return _dense_times_sparse(a, b, adjoint_a, adjoint_b)


# ------------------------------------------------------------------ matmul on the GPU
# SpMV/SpMM and SpGEMM through the backend's sparse matrices (cuSPARSE on a GPU host), for 2-D
# COO/CSR/CSC operands in the dtypes cuSPARSE multiplies (the check made them one dtype).
# Batched, hybrid and block operands, other dtypes and sizes past int32 indices (CuPy's sparse
# matrices) run on the CPU kernel.
def _matmul_declines(plan: Plan) -> str | None:
    """Sizes past int32 indices (a dimension or an entry count: CuPy's sparse matrices)."""
    for t in (plan.args["a"], plan.args["b"]):
        count = t.nnz if isinstance(t, SparseTensor) else 0
        if max(shape_of(t), default=0) > INT32_MAX or count > INT32_MAX:
            return "size"
    return None


def _gpu_conj(xp, x):
    return xp.conj(x) if x.dtype.kind == "c" else x


def _gpu_matrix(be, t: SparseTensor, conj: bool):
    """t (2-D COO/CSR/CSC on the device) as a matrix of ``be.sparse``, values conjugated with ``conj``."""
    values = _gpu_conj(be.xp, t.values) if conj else t.values
    if t.layout == "coo":
        return ka.matrix(be.xp, be.sparse, "coo", t.dense_shape, values, indices=t.indices)
    return ka.matrix(be.xp, be.sparse, t.layout, t.dense_shape, values, ptr=t.compressed_indices,
                     plain=t.plain_indices)


def _gpu_entries(be, t: SparseTensor, adjoint: bool):
    """(rows, cols, values) of op(t)."""
    rows, cols, values = _gpu.coo_entries(be.xp, t)
    return (cols, rows, _gpu_conj(be.xp, values)) if adjoint else (rows, cols, values)


def _gpu_index_dtype(t: SparseTensor) -> np.dtype:
    """The index dtype the CPU kernel multiplies ``t`` in (its plain indices', int64 from COO)."""
    return np.dtype(np.int64) if t.layout == "coo" else np.dtype(t.plain_indices.dtype)


def _spgemm_gpu(be, a: SparseTensor, b: SparseTensor, adjoint_a: bool, adjoint_b: bool):
    xp = be.xp
    p, q = _op_dims(a.dense_shape, adjoint_a)
    r = _op_dims(b.dense_shape, adjoint_b)[1]
    if a.nnz == 0 or b.nnz == 0 or p == 0 or r == 0:
        ptr = xp.zeros(p + 1, dtype=xp.int64)
        cols, values = xp.zeros(0, dtype=xp.int64), xp.zeros(0, dtype=a.dtype)
    else:
        ptr, cols, values = ka.spgemm(xp, be.sparse, _gpu_entries(be, a, adjoint_a), _gpu_entries(be, b, adjoint_b),
                                      p, q, r, a.dtype, be.scatter_add)
    nnz = int(cols.shape[0])
    if a.layout == "csr":
        index = np.result_type(_gpu_index_dtype(a), _gpu_index_dtype(b))
        if index == np.int32 and max(nnz, r) > INT32_MAX:
            index = np.dtype(np.int64)
        return _gpu.compressed("csr", (p, r), ptr.astype(index), cols.astype(index), values, coalesced=True)
    rows = ka.expand_pointers(xp, ptr, nnz)
    return _gpu.coo((p, r), xp.stack([rows, cols], axis=1), values, coalesced=True)


@REGISTRY.gpu("matmul", layouts={"a": ("coo", "csr", "csc", "dense"), "b": ("coo", "csr", "csc", "dense")},
              dtypes=_gpu.CUSPARSE_DTYPES, matrices=("a", "b"), declines=_matmul_declines)
@_gpu.quiet
def matmul_gpu(be, a, b, adjoint_a: bool = False, adjoint_b: bool = False):
    xp = be.xp
    if isinstance(a, SparseTensor) and isinstance(b, SparseTensor):
        return _spgemm_gpu(be, a, b, adjoint_a, adjoint_b)
    if isinstance(a, SparseTensor):  # op(a) @ op(b)
        x = _gpu_conj(xp, xp.swapaxes(b, -1, -2)) if adjoint_b else b
        rows = _op_dims(a.dense_shape, adjoint_a)[0]
        out_shape = (rows,) if x.ndim == 1 else (rows, int(x.shape[1]))
        if a.nnz == 0 or prod(out_shape) == 0:
            return xp.zeros(out_shape, dtype=a.dtype)
        mat = _gpu_matrix(be, a, conj=adjoint_a)
        return ka.spmm(xp, mat.T if adjoint_a else mat, x)
    # op(a) @ op(b) = (op(b)^T @ op(a)^T)^T; op(b)^T is b^T, or conj(b) with adjoint_b.
    cols = _op_dims(b.dense_shape, adjoint_b)[1]
    if a.ndim == 1:  # a row vector
        x, out_shape = a, (cols,)
    else:
        x = _gpu_conj(xp, a) if adjoint_a else xp.swapaxes(a, -1, -2)
        out_shape = (int(x.shape[1]), cols)
    if b.nnz == 0 or prod(out_shape) == 0:
        return xp.zeros(out_shape, dtype=b.dtype)
    mat = _gpu_matrix(be, b, conj=adjoint_b)
    y = ka.spmm(xp, mat if adjoint_b else mat.T, x)
    return y if a.ndim == 1 else xp.ascontiguousarray(y.T)


# ------------------------------------------------------------------ sampled_addmm
def _entries(t: SparseTensor, batch, m: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column of every stored entry in the block-diagonal matrix of the batches
    (int64, in storage order)."""
    if t.layout == "coo":
        indices = t.indices
        b = np.ravel_multi_index(tuple(indices[:, :-2].T), batch) if batch and indices.shape[0] else 0
        return (b * m + indices[:, -2]).astype(np.int64), (b * n + indices[:, -1]).astype(np.int64)
    transposed = t.layout == "csc"
    ptr, idx, _ = _flat_compressed(t, m if transposed else n)
    n_compressed = ptr.size - 1
    major = np.repeat(np.arange(n_compressed, dtype=np.int64), np.diff(ptr.astype(np.int64)))
    minor = idx.astype(np.int64)
    if transposed:  # global column b * n + j from the compressed side; rows from the plain side
        return minor, major
    return major, minor


def _sddmm_bytes(input, **_) -> int:
    return int(input.nbytes) if isinstance(input, SparseTensor) else 0


def check_sampled_addmm(input: SparseTensor, mat1: np.ndarray, mat2: np.ndarray, beta=1, alpha=1) -> Plan:
    """One dtype for the three (not bool), input a plain or batched matrix (no hybrid), shapes
    [*batch, m, n], [*batch, m, d], [*batch, d, n]; alpha and beta as scalars of that dtype (the
    kernel's ``alpha`` and ``beta``), refused where the cast would change them."""
    dtype = _check_dtypes(input, mat1, "input", "mat1", "sampled_addmm")
    _check_dtypes(input, mat2, "input", "mat2", "sampled_addmm")
    batch, m, n = matrix_dims(input, "input", "sampled_addmm")
    ok = mat1.ndim == mat2.ndim == input.ndim and tuple(mat1.shape[:-2]) == batch == tuple(mat2.shape[:-2]) \
        and mat1.shape[-2] == m and mat2.shape[-1] == n and mat1.shape[-1] == mat2.shape[-2]
    if not ok:
        raise InvalidArgumentError(
            f"input has shape {shape_of(input)}, mat1 {shape_of(mat1)} and mat2 {shape_of(mat2)}; they must be "
            "[*batch, m, n], [*batch, m, d] and [*batch, d, n]", reason=Reason.SHAPE_MISMATCH)
    alpha_c = cast_scalar(alpha, dtype, "alpha")
    beta_c = cast_scalar(beta, dtype, "beta")
    return Plan(args={"alpha": alpha_c, "beta": beta_c}, dtype=dtype, layout=input.layout, shape=input.dense_shape)


@REGISTRY.op(
    "sampled_addmm",
    doc="""beta * input + alpha * (mat1 @ mat2) at input's stored entries only (torch.sparse.sampled_addmm,
SDDMM): the result has input's layout, indices and order, every stored entry (a repeated one too)
computed on its own. input is CSR, CSC or COO [*batch, m, n] (no hybrid dimensions); mat1 is dense
[*batch, m, d] and mat2 dense [*batch, d, n] with the same batch dimensions. With beta = 0, input's values
are not read (nan and inf in them do not propagate), as in PyTorch. One dtype for all three; bool is
UNIMPLEMENTED. alpha and beta must be representable in that dtype (INVALID_ARGUMENT otherwise).""",
    args=[Arg("input", TENSOR, "The sparse matrix whose entries are sampled and added.",
              layouts=("coo", "csr", "csc")),
          Arg("mat1", TENSOR, "Dense [*batch, m, d].", layouts=("dense",)),
          Arg("mat2", TENSOR, "Dense [*batch, d, n].", layouts=("dense",)),
          Arg("beta", SCALAR, "Multiplier of input.", default=1),
          Arg("alpha", SCALAR, "Multiplier of mat1 @ mat2.", default=1)],
    outputs=[Output("output", "sparse", "input's structure with the new values.")],
    check=check_sampled_addmm,
    result_bytes=_sddmm_bytes,
)
def sampled_addmm(input: SparseTensor, mat1: np.ndarray, mat2: np.ndarray, beta=1, alpha=1) -> SparseTensor:
    dtype = input.dtype
    alpha_c = as_product_dtype(np.asarray([alpha], dtype))[0]
    beta_c = as_product_dtype(np.asarray([beta], dtype))[0]
    batch, m, n = _dims(input)
    rows, cols = _entries(input, batch, m, n)
    d = int(mat1.shape[-1])
    n_batch = prod(batch)
    m1 = as_product_dtype(mat1).reshape(n_batch * m, d)
    m2t = as_product_dtype(np.swapaxes(mat2, -1, -2)).reshape(n_batch * n, d)
    vals = as_product_dtype(input.values).reshape(-1)
    out = _from_compute(lk.sddmm(rows, cols, vals, m1, m2t, alpha_c, beta_c, bool(beta_c != 0)), dtype)
    out = out.reshape(input.values.shape)
    if input.layout == "coo":
        return SparseTensor(indices=input.indices, values=out, dense_shape=input.dense_shape,
                            coalesced=input.coalesced)
    return SparseTensor(layout=input.layout, compressed_indices=input.compressed_indices,
                        plain_indices=input.plain_indices, values=out, dense_shape=input.dense_shape,
                        coalesced=input.coalesced)


# ----------------------------------------------------------- partitioned tensors
# Sparse @ dense by row blocks of the sparse side (of its batch, when batched); the dense side
# goes whole to each block unless it is batched like it. Others (adjoint_a, sparse or
# partitioned right sides) gather.
REGISTRY.partitioned("matmul", Rowwise(
    "a", rows=("b",),
    slice_rows=lambda b, a: a.ndim >= 3 and np.ndim(b) == a.ndim and np.shape(b)[0] == a.dense_shape[0] != 1,
    applies=lambda a, b, adjoint_a=False, **_: isinstance(a, SparseTensor) and isinstance(b, np.ndarray)
    and not adjoint_a))
