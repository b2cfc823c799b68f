"""PyTorch's sparse @ dense family: ``mm`` with ``reduce`` (torch.sparse.mm), ``addmm``
(torch.sparse.addmm) and ``hspmm`` (torch.hspmm).

``mm``'s reductions are the GNN aggregations: row i of the result is the sum, mean, maximum or
minimum over the stored entries p of row i of the products ``mat1[i, j_p] * mat2[j_p, :]``.
PyTorch defines them for CSR only; the other layouts give the answer PyTorch gives for the CSR
its own conversion makes (``to_sparse_csr``): a COO is coalesced first (repeated indices summed
into one entry), a CSC keeps every stored entry, a BSR/BSC stores every element of its stored
blocks (``to_sparse_coo().to_sparse_csr()``). The sum is the plain product (``matmul``) in
every layout and every number dtype; the mean, maximum and minimum take float16, float32 and
float64, as PyTorch does (float16 computed in float32).

Each op's ``check`` (``_check_product`` at its heart) makes every refusal from metadata before
any kernel runs, on every device; the kernels raise nothing of their own (no rule of theirs
depends on the entries). The products run on ``matmul`` (called through the registry, so its
own check guards its kernels) and ``kernels/linalg.py``, the reductions on
``kernels/aggregate.py``; values in a dtype the kernels are not compiled for are computed in
a wider one and cast back (integers wrap as a native product would).
"""

from __future__ import annotations

import numpy as np

from sparseserve.core.tensor import SparseTensor
from sparseserve.core.errors import InvalidArgumentError, UnimplementedError
from sparseserve.core.reasons import Reason
from sparseserve.kernels import aggregate as agk
from sparseserve.kernels import arrays as ka
from sparseserve.kernels import linalg as lk

from ..argtypes import DENSE, SCALAR, SPARSE, choice
from ..registry import REGISTRY, Arg, Output, Plan
from . import _gpu
from ._common import cast_scalar
from ._layouts import SPARSE_LAYOUTS, as_coo, as_csr, coalesced_coo
from ._sputils import INT32_MAX, as_product_dtype, product_dtype, shape_of

REDUCES = tuple(agk.REDUCES)
REDUCE_DTYPES = ("float16", "float32", "float64")
REDUCE = choice(*REDUCES, reason=Reason.BAD_REDUCE)


# ------------------------------------------------------------------ checks
def _check_product(op: str, mat1: SparseTensor, mat2: np.ndarray, *, reduce: str = "sum") -> tuple[int, int, int]:
    """(m, n, k) of mat1 [m, n] @ mat2 [n, k], or the error naming the argument and the rule:
    mm's, addmm's and hspmm's refusals (``reduce``, a choice, is one of REDUCES already)."""
    if mat1.dense_ndim:
        raise UnimplementedError(f"{op} does not support hybrid tensors: mat1 has {mat1.dense_ndim} dense "
                                 "dimensions; convert it with dense_dim=0 first", reason=Reason.UNSUPPORTED_HYBRID)
    if mat1.ndim != 2:
        raise InvalidArgumentError(f"mat1 has shape {shape_of(mat1)}; {op} needs a sparse matrix (rank 2)",
                                   reason=Reason.RANK)
    if mat2.ndim != 2:
        raise InvalidArgumentError(f"mat2 has shape {shape_of(mat2)}; {op} needs a dense matrix (rank 2)",
                                   reason=Reason.RANK)
    m, n = (int(d) for d in mat1.dense_shape)
    if mat2.shape[0] != n:
        raise InvalidArgumentError(f"mat1 has shape {[m, n]} and mat2 has shape {shape_of(mat2)}: mat2 must have "
                                   f"{n} rows (mat1's columns)", reason=Reason.SHAPE_MISMATCH)
    _check_dtype(op, mat1, "mat1", mat2, "mat2")
    if reduce != "sum" and mat1.dtype.name not in REDUCE_DTYPES:
        raise UnimplementedError(f"{op} with reduce = {reduce!r} takes {', '.join(REDUCE_DTYPES)} values (as "
                                 f"PyTorch), not {mat1.dtype}; reduce = 'sum' takes every number dtype",
                                 reason=Reason.UNSUPPORTED_DTYPE)
    return m, n, int(mat2.shape[1])


def _check_dtype(op: str, x, x_name: str, y, y_name: str) -> None:
    if x.dtype != y.dtype:
        raise InvalidArgumentError(f"{x_name} has dtype {x.dtype} and {y_name} has dtype {y.dtype}; {op} needs "
                                   "one dtype (cast one of them)", reason=Reason.DTYPE_MISMATCH)
    if x.dtype == np.bool_:
        raise UnimplementedError(f"{op} does not support bool; cast the values to a number type",
                                 reason=Reason.UNSUPPORTED_DTYPE)


def _dense_bytes(mat1, mat2, **_) -> int:
    try:
        return int(mat1.dense_shape[0]) * int(mat2.shape[-1]) * mat1.dtype.itemsize
    except (AttributeError, TypeError, IndexError):
        return 0  # arguments the check refuses


def _product(mat1: SparseTensor, mat2: np.ndarray) -> np.ndarray:
    """mat1 @ mat2 by ``matmul``, called through the registry: its own check guards its kernel
    (our check has refused whatever it would refuse), so no rule of matmul's is copied here."""
    op = REGISTRY.get("matmul")
    bound = {arg.name: arg.default for arg in op.args if not arg.required}
    return op.run("cpu", {**bound, "a": mat1, "b": mat2})[0]


# ------------------------------------------------------------------ mm
def check_mm(mat1: SparseTensor, mat2: np.ndarray, reduce: str = "sum") -> Plan:
    m, _, k = _check_product("mm", mat1, mat2, reduce=reduce)
    return Plan(dtype=mat1.dtype, layout="dense", shape=(m, k))


def _reduce_csr(mat1: SparseTensor) -> SparseTensor:
    """The CSR whose rows PyTorch reduces for ``mat1`` (its own conversion's)."""
    if mat1.layout == "csr":
        return mat1
    if mat1.layout == "csc":
        return as_csr(mat1)  # every stored entry kept, as torch's to_sparse_csr
    return as_csr(coalesced_coo(mat1))  # COO (and BSR/BSC through COO): repeated indices summed


@REGISTRY.op(
    "mm",
    doc="""torch.sparse.mm(mat1, mat2, reduce): sparse mat1 [m, n] times dense mat2 [n, k] -> dense [m, k],
row i of the result being the reduce over row i's stored entries p of mat1[i, j_p] * mat2[j_p, :]:
sum (the matrix product), mean (the sum divided by the number of stored entries, explicit zeros
counted), amax or amin (column by column; a NaN product makes them NaN). A row without stored
entries is 0 for every reduce. PyTorch reduces CSR only; every layout here gives the answer PyTorch
gives for its CSR conversion: COO is coalesced first (repeated indices summed into one entry), CSC
keeps each stored entry, BSR/BSC stores every element of a stored block. mat1 and mat2 have one
dtype: sum takes every number dtype (integers wrap; bool is UNIMPLEMENTED), mean/amax/amin take
float16, float32 and float64 (UNIMPLEMENTED otherwise, as in PyTorch). mat1 has no batch or dense
dimensions. The GNN aggregation: mm(adjacency, features, reduce="mean").""",
    args=[Arg("mat1", SPARSE, "Sparse matrix [m, n] (COO, CSR, CSC, BSR or BSC).", layouts=SPARSE_LAYOUTS),
          Arg("mat2", DENSE, "Dense matrix [n, k].", layouts=("dense",)),
          Arg("reduce", REDUCE, "sum, mean, amax or amin.", default="sum")],
    outputs=[Output("output", "dense", "Dense [m, k].")],
    check=check_mm,
    result_bytes=_dense_bytes,
)
def mm(mat1: SparseTensor, mat2: np.ndarray, reduce: str = "sum") -> np.ndarray:
    if reduce == "sum":
        return _product(mat1, mat2)
    dtype = mat1.dtype
    m, k = int(mat1.dense_shape[0]), int(mat2.shape[1])
    compute = np.float32 if dtype == np.float16 else dtype
    if m * k == 0 or mat1.nnz == 0:
        return np.zeros((m, k), dtype)
    csr = _reduce_csr(mat1)
    y = agk.mm_reduce(csr.compressed_indices, csr.plain_indices, csr.values.astype(compute, copy=False),
                      mat2.astype(compute, copy=False), reduce)
    return y.astype(dtype, copy=False)


# ------------------------------------------------------------------ mm on the GPU
# sum through the backend's sparse matrix product (cuSPARSE); mean as that sum over the row
# counts; amax/amin as a per-row maximum of the entries' products (a sort, kernels/arrays.py's
# group_max). 2-D COO/CSR/CSC in float32/float64 (sum: complex too); the rest run on the CPU.
def _mm_declines(plan: Plan) -> str | None:
    """amax, amin and mean of dtypes other than float32/64; sizes past int32 indices."""
    mat1, mat2 = plan.args["mat1"], plan.args["mat2"]
    if plan.args["reduce"] != "sum" and mat1.dtype.name not in agk.COMPUTE_DTYPES:
        return "dtype"  # the sum takes cuSPARSE's dtypes (declared), the reductions only these
    if max(mat1.dense_shape) > INT32_MAX or mat1.nnz > INT32_MAX or mat2.shape[1] > INT32_MAX:
        return "size"
    return None


@REGISTRY.gpu("mm", layouts={"mat1": ("coo", "csr", "csc")}, dtypes=_gpu.CUSPARSE_DTYPES, matrices=("mat1",),
              declines=_mm_declines)
@_gpu.quiet
def mm_gpu(be, mat1, mat2, reduce: str = "sum"):
    xp = be.xp
    m, k = int(mat1.dense_shape[0]), int(mat2.shape[1])
    if mat1.nnz == 0 or m * k == 0:
        return xp.zeros((m, k), dtype=mat1.dtype)
    if reduce == "sum":
        if mat1.layout == "coo":
            mat = ka.matrix(xp, be.sparse, "coo", mat1.dense_shape, mat1.values, indices=mat1.indices)
        else:
            mat = ka.matrix(xp, be.sparse, mat1.layout, mat1.dense_shape, mat1.values,
                            ptr=mat1.compressed_indices, plain=mat1.plain_indices)
        return ka.spmm(xp, mat, mat2)
    if mat1.layout == "coo":  # torch's CSR conversion sums repeated indices
        indices, values = ka.coalesce(xp, mat1.indices, mat1.values, mat1.dense_shape, be.scatter_add)
        rows, cols = indices[:, 0], indices[:, 1]
    else:
        rows, cols, values = _gpu.coo_entries(xp, mat1)
    if reduce == "mean":
        mat = ka.matrix(xp, be.sparse, "coo", mat1.dense_shape, values, indices=xp.stack([rows, cols], axis=1))
        total = ka.spmm(xp, mat, mat2)
        counts = xp.bincount(rows, minlength=m)
        return total / xp.maximum(counts, 1).astype(total.dtype)[:, None]
    products = values[:, None] * mat2[cols]
    if reduce == "amax":
        return ka.group_max(xp, rows, products, m)
    out = -ka.group_max(xp, rows, -products, m)
    out += 0  # -0.0 (a row without entries) + 0.0 is 0.0, as the CPU kernel's
    return out


# ------------------------------------------------------------------ addmm
def check_addmm(input: np.ndarray, mat1: SparseTensor, mat2: np.ndarray, beta=1, alpha=1) -> Plan:
    """The product's rules, input of mat1's dtype broadcasting to [m, k], and beta and alpha
    representable in that dtype (the kernels take them cast)."""
    m, _, k = _check_product("addmm", mat1, mat2)
    _check_dtype("addmm", input, "input", mat1, "mat1")
    _check_input(input, m, k)
    dtype = mat1.dtype
    return Plan(args={"beta": cast_scalar(beta, dtype, "beta"), "alpha": cast_scalar(alpha, dtype, "alpha")},
                dtype=dtype, layout="dense", shape=(m, k))


def _check_input(input: np.ndarray, m: int, k: int) -> None:
    shape = shape_of(input)
    ok = len(shape) <= 2 and all(d in (1, want) for d, want in zip(shape[::-1], (k, m)))
    if not ok:
        raise InvalidArgumentError(f"input has shape {shape}, which does not broadcast to the product's "
                                   f"shape {[m, k]}", reason=Reason.SHAPE_MISMATCH)


@REGISTRY.op(
    "addmm",
    doc="""torch.sparse.addmm(input, mat1, mat2, beta, alpha): beta * input + alpha * (mat1 @ mat2), dense [m, k].
mat1 is sparse [m, n] (COO, CSR, CSC, BSR or BSC; no batch or dense dimensions), mat2 dense [n, k],
input dense and broadcast to [m, k] as PyTorch broadcasts it ([m, k], [k], [1, k], [m, 1], a scalar).
With beta = 0 input is not read (NaN and inf in it do not propagate), as in PyTorch. One dtype for all
three; every number dtype (integers wrap as a native product would; float16 is accumulated in
float32); bool is UNIMPLEMENTED. alpha and beta must be representable in that dtype
(INVALID_ARGUMENT otherwise: PyTorch would truncate 0.5 to 0 for integers).""",
    args=[Arg("input", DENSE, "Dense, broadcastable to [m, k].", layouts=("dense",)),
          Arg("mat1", SPARSE, "Sparse matrix [m, n] (COO, CSR, CSC, BSR or BSC).", layouts=SPARSE_LAYOUTS),
          Arg("mat2", DENSE, "Dense matrix [n, k].", layouts=("dense",)),
          Arg("beta", SCALAR, "Multiplier of input.", default=1),
          Arg("alpha", SCALAR, "Multiplier of mat1 @ mat2.", default=1)],
    outputs=[Output("output", "dense", "Dense [m, k].")],
    check=check_addmm,
    result_bytes=_dense_bytes,
)
def addmm(input: np.ndarray, mat1: SparseTensor, mat2: np.ndarray, beta=1, alpha=1) -> np.ndarray:
    """``beta`` and ``alpha`` come cast to mat1's dtype (the check)."""
    dtype = mat1.dtype
    product = _product(mat1, mat2)
    if dtype.kind in "iu" or dtype == np.float16:  # wrap (integers) or round (float16) once, at the end
        compute = np.float32 if dtype == np.float16 else (np.uint64 if dtype.kind == "u" else np.int64)
        with np.errstate(all="ignore"):
            out = _combine(product.astype(compute), input.astype(compute), compute(beta), compute(alpha))
            return out.astype(dtype)
    return _combine(product, input, beta, alpha)


def _combine(product: np.ndarray, input: np.ndarray, beta, alpha) -> np.ndarray:
    """alpha * product + beta * input (broadcast), written into ``product`` (a fresh array)."""
    with np.errstate(all="ignore"):
        if alpha != 1:
            np.multiply(product, alpha, out=product)
        if beta == 0:
            return product
        if beta == 1:
            np.add(product, input, out=product)
        else:
            np.add(product, beta * input, out=product)
    return product


# ------------------------------------------------------------------ hspmm
def check_hspmm(mat1: SparseTensor, mat2: np.ndarray) -> Plan:
    m, _, k = _check_product("hspmm", mat1, mat2)
    return Plan(dtype=mat1.dtype, layout="coo", shape=(m, k))


def _hspmm_bytes(mat1, mat2, **_) -> int:
    try:
        return int(mat1.dense_shape[0]) * (int(mat2.shape[-1]) * mat1.dtype.itemsize + 8)
    except (AttributeError, TypeError, IndexError):
        return 0  # arguments the check refuses


@REGISTRY.op(
    "hspmm",
    doc="""torch.hspmm(mat1, mat2): sparse mat1 [m, n] times dense mat2 [n, k] -> a hybrid COO tensor [m, k]
with one sparse and one dense dimension: its indices [r, 1] are the rows of mat1 that hold a stored
entry (explicit zeros count), ascending, and its values [r, k] those rows of the product. As in
PyTorch the result is flagged coalesced only when it holds fewer than two rows, though its indices
are always sorted and unique. PyTorch takes COO; CSR, CSC, BSR and BSC give the answer of their COO form. One dtype for
both; every number dtype (integers wrap; float16 accumulated in float32); bool is UNIMPLEMENTED.""",
    args=[Arg("mat1", SPARSE, "Sparse matrix [m, n] (COO, CSR, CSC, BSR or BSC).", layouts=SPARSE_LAYOUTS),
          Arg("mat2", DENSE, "Dense matrix [n, k].", layouts=("dense",))],
    outputs=[Output("output", "sparse", "Hybrid COO [m, k]: sparse rows, dense columns.")],
    check=check_hspmm,
    result_bytes=_hspmm_bytes,
)
def hspmm(mat1: SparseTensor, mat2: np.ndarray) -> SparseTensor:
    dtype = mat1.dtype
    m, k = int(mat1.dense_shape[0]), int(mat2.shape[1])
    csr = as_csr(mat1 if mat1.layout in ("coo", "csr", "csc") else as_coo(mat1))
    ptr = np.asarray(csr.compressed_indices, np.int64)
    rows = np.flatnonzero(ptr[1:] != ptr[:-1])
    r = rows.size
    if r == 0:
        return SparseTensor(indices=np.zeros((0, 1), np.int64), values=np.zeros((0, k), dtype),
                            dense_shape=[m, k], coalesced=True)
    idx = csr.plain_indices
    if idx.dtype != np.int64 and ptr[-1] > np.iinfo(idx.dtype).max:
        idx = idx.astype(np.int64)
    # the rows with entries, one after another; one index dtype, as matmul's kernels are warmed
    compact = np.append(ptr[rows], ptr[-1]).astype(idx.dtype)
    values = lk.spmm(compact, idx, as_product_dtype(csr.values), as_product_dtype(mat2), r, False)
    if product_dtype(dtype) != dtype:
        with np.errstate(all="ignore"):
            values = values.view(np.uint64) if dtype == np.uint64 else values.astype(dtype)
    # torch builds it with set_indices_and_values_unsafe, which flags nnz < 2 as coalesced
    return SparseTensor(indices=rows.astype(np.int64).reshape(r, 1), values=values, dense_shape=[m, k],
                        coalesced=r < 2)
