"""Linear algebra: matmul (SpMV, SpMM, dense @ sparse, SpGEMM) and sampled_addmm (SDDMM).

Worked examples, hypothesis properties against plain numpy references (every
sparse layout, int32 and int64 indices, several dtypes, adjoint flags, empty
and zero-size inputs, batches), the parallel paths past PARALLEL_MIN against
scipy, the error cases (class and reason), the result-size refusal through a
server, and both ops over every wire."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from sparseserve import InvalidArgumentError, ResourceExhaustedError, SparseTensor, UnimplementedError
from sparseserve.kernels import PARALLEL_MIN
from conftest import ServerProcess, make_client, op_raises, run_op
from helpers import assert_eq
from strategies import random_values

SETTINGS = settings(max_examples=60, deadline=None)
LAYOUTS = ("coo", "csr", "csc", "bsr", "bsc")
DTYPES = ("float64", "float32", "int32", "int8", "uint64", "complex64", "complex128", "float16")
# Products summed in another order than numpy's; integers exactly.
TOL = {"float16": 2e-2, "float32": 1e-4, "complex64": 1e-4, "float64": 1e-10, "complex128": 1e-10}


# ------------------------------------------------------------------ building inputs
def random_dense(rng, shape, dtype, density=0.4) -> np.ndarray:
    """Small exact values (``strategies.random_values``), each kept with probability ``density``."""
    values = random_values(rng, shape, dtype, low=-4, high=4)
    return np.where(rng.random(shape) < density, values, np.zeros((), values.dtype))


def _compress(mask: np.ndarray, index_dtype):
    ptr = np.concatenate([[0], np.cumsum(mask.sum(axis=1))]).astype(index_dtype)
    return ptr, np.nonzero(mask)[1].astype(index_dtype)


def sparse_of(dense: np.ndarray, layout: str, index_dtype="int64", blocksize=(1, 1)) -> SparseTensor:
    """``dense`` (2-D, or 3-D for a batch with equal entries per batch) in ``layout``."""
    if layout == "coo":
        idx = np.argwhere(dense != 0)
        return SparseTensor(indices=idx, values=dense[tuple(idx.T)], dense_shape=dense.shape)
    if dense.ndim == 3:
        parts = [sparse_of(d, layout, index_dtype, blocksize) for d in dense]
        return SparseTensor(layout=layout, compressed_indices=np.stack([p.compressed_indices for p in parts]),
                            plain_indices=np.stack([p.plain_indices for p in parts]),
                            values=np.stack([p.values for p in parts]), dense_shape=dense.shape,
                            blocksize=parts[0].blocksize)
    if layout in ("csr", "csc"):
        d = dense if layout == "csr" else dense.T
        ptr, idx = _compress(d != 0, index_dtype)
        return SparseTensor(layout=layout, compressed_indices=ptr, plain_indices=idx, values=d[d != 0],
                            dense_shape=dense.shape)
    br, bc = blocksize
    m, n = dense.shape
    blocks = dense.reshape(m // br, br, n // bc, bc).transpose(0, 2, 1, 3)  # [block row, block col, br, bc]
    mask = (blocks != 0).any(axis=(2, 3))
    if layout == "bsc":
        blocks, mask = blocks.transpose(1, 0, 2, 3), mask.T
    ptr, idx = _compress(mask, index_dtype)
    return SparseTensor(layout=layout, compressed_indices=ptr, plain_indices=idx, values=blocks[mask],
                        dense_shape=dense.shape, blocksize=blocksize)


def op(x: np.ndarray, adjoint: bool) -> np.ndarray:
    return np.conj(np.swapaxes(x, -1, -2)) if adjoint else x


def reference(a, b, adjoint_a=False, adjoint_b=False) -> np.ndarray:
    """numpy's product in the operands' dtype (integers wrap, as ours do)."""
    if a.dtype == np.float16:
        return (op(a, adjoint_a).astype(np.float32) @ op(b, adjoint_b).astype(np.float32)).astype(np.float16)
    with np.errstate(all="ignore"):
        return np.matmul(op(a, adjoint_a), op(b, adjoint_b))


# ------------------------------------------------------------------ worked examples
def test_spmv_and_spmm_examples():
    a = SparseTensor(layout="csr", compressed_indices=[0, 2, 2, 3], plain_indices=[0, 2, 1],
                     values=[1.0, 2.0, 3.0], dense_shape=[3, 3])
    # [[1, 0, 2], [0, 0, 0], [0, 3, 0]]
    assert run_op("matmul", a=a, b=np.array([1.0, 10.0, 100.0])).tolist() == [201.0, 0.0, 30.0]
    assert run_op("matmul", a=a, b=np.array([1.0, 10.0, 100.0]), adjoint_a=True).tolist() == [1.0, 300.0, 2.0]
    assert run_op("matmul", a=a, b=np.eye(3)).tolist() == [[1, 0, 2], [0, 0, 0], [0, 3, 0]]
    # dense @ sparse: a row vector on the left
    assert run_op("matmul", a=np.array([1.0, 10.0, 100.0]), b=a).tolist() == [1.0, 300.0, 2.0]


def test_tf_sparse_dense_matmul_example():
    # tf.sparse.sparse_dense_matmul's docstring: A = [[0, 0, 1], [2, 0, 0]] (COO), B = ones(3, 2) * [1, 2]
    a = SparseTensor(indices=[[0, 2], [1, 0]], values=[1, 2], dense_shape=[2, 3])
    b = np.array([[1, 2], [1, 2], [1, 2]], np.int32)
    out = run_op("matmul", a=SparseTensor(indices=a.indices, values=a.values.astype(np.int32),
                                          dense_shape=a.dense_shape), b=b)
    assert out.dtype == np.int32 and out.tolist() == [[1, 2], [2, 4]]


def test_adjoint_conjugates_complex_values():
    a = SparseTensor(indices=[[0, 1]], values=np.array([1 + 2j]), dense_shape=[2, 2])
    out = run_op("matmul", a=a, b=np.array([1 + 0j, 1 + 0j]), adjoint_a=True)
    assert out.tolist() == [0, 1 - 2j]
    out = run_op("matmul", a=np.array([[1j], [0]]), b=a, adjoint_a=True)  # [[-1j, 0]] @ a
    assert out.tolist() == [[0, 2 - 1j]]


def test_spgemm_example_and_output_layouts():
    a = sparse_of(np.array([[1.0, 2.0], [0.0, 3.0]]), "csr", "int32")
    b = sparse_of(np.array([[0.0, 4.0], [5.0, 0.0]]), "csc")
    out = run_op("matmul", a=a, b=b)
    assert out.layout == "csr" and out.compressed_indices.dtype == np.int64  # b's indices are int64
    assert out.to_dense().tolist() == [[10.0, 4.0], [15.0, 0.0]]
    out = run_op("matmul", a=a, b=a)
    assert out.layout == "csr" and out.plain_indices.dtype == np.int32
    out = run_op("matmul", a=sparse_of(np.array([[1.0, 2.0], [0.0, 3.0]]), "coo"), b=b)
    assert out.layout == "coo" and out.coalesced
    assert out.indices.tolist() == [[0, 0], [0, 1], [1, 0]] and out.values.tolist() == [10.0, 4.0, 15.0]


def test_spgemm_keeps_cancellation_zeros_and_sorts_columns():
    a = sparse_of(np.array([[1.0, 1.0]]), "csr")
    b = sparse_of(np.array([[0.0, 0.0, 2.0, 1.0], [7.0, 0.0, -2.0, 0.0]]), "csr")
    out = run_op("matmul", a=a, b=b)
    assert out.plain_indices.tolist() == [0, 2, 3] and out.values.tolist() == [7.0, 0.0, 1.0]


def test_sampled_addmm_example():
    # torch.sparse.sampled_addmm's example shape: input CSR 3x3 eye, mat1 3x5, mat2 5x3
    rng = np.random.default_rng(0)
    mat1, mat2 = rng.standard_normal((3, 5)), rng.standard_normal((5, 3))
    eye = sparse_of(np.eye(3), "csr")
    out = run_op("sampled_addmm", input=eye, mat1=mat1, mat2=mat2)
    assert out.layout == "csr" and out.plain_indices.tolist() == [0, 1, 2]
    np.testing.assert_allclose(out.values, 1 + np.diag(mat1 @ mat2))
    out = run_op("sampled_addmm", input=eye, mat1=mat1, mat2=mat2, beta=0, alpha=2)
    np.testing.assert_allclose(out.values, 2 * np.diag(mat1 @ mat2))


def test_sampled_addmm_beta_zero_ignores_nan_and_keeps_repeats():
    a = SparseTensor(indices=[[1, 0], [0, 1], [1, 0]], values=[np.nan, 1.0, 2.0], dense_shape=[2, 2])
    mat1, mat2 = np.array([[1.0], [2.0]]), np.array([[3.0, 4.0]])
    out = run_op("sampled_addmm", input=a, mat1=mat1, mat2=mat2, beta=0.0)
    assert out.indices.tolist() == a.indices.tolist() and out.values.tolist() == [6.0, 4.0, 6.0]
    out = run_op("sampled_addmm", input=a, mat1=mat1, mat2=mat2, beta=1.0, alpha=-1.0)
    assert np.isnan(out.values[0]) and out.values[1:].tolist() == [-3.0, -4.0]


# ------------------------------------------------------------------ properties
@st.composite
def matmul_cases(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    layout = draw(st.sampled_from(LAYOUTS))
    dtype = draw(st.sampled_from(DTYPES))
    blocksize = (draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2]))) if layout in ("bsr", "bsc") \
        else (1, 1)
    m, n = (draw(st.integers(0, 4)) * blocksize[0], draw(st.integers(0, 4)) * blocksize[1])
    k = draw(st.integers(0, 4))
    adjoint_a, adjoint_b = draw(st.booleans()), draw(st.booleans())
    sparse = random_dense(rng, (m, n), dtype, draw(st.sampled_from([0.0, 0.3, 0.8])))
    tensor = sparse_of(sparse, layout, draw(st.sampled_from(["int32", "int64"])), blocksize)
    kind = draw(st.sampled_from(["sparse@dense", "sparse@vector", "dense@sparse", "vector@sparse",
                                 "sparse@sparse"]))
    return rng, kind, sparse, tensor, dtype, k, adjoint_a, adjoint_b


@SETTINGS
@given(matmul_cases())
def test_matmul_matches_numpy(case):
    rng, kind, s, t, dtype, k, adjoint_a, adjoint_b = case
    m, n = s.shape
    if kind == "sparse@dense":
        inner = m if adjoint_a else n
        d = random_dense(rng, (k, inner) if adjoint_b else (inner, k), dtype, 1.0)
        assert_eq(run_op("matmul", a=t, b=d, adjoint_a=adjoint_a, adjoint_b=adjoint_b),
                  reference(s, d, adjoint_a, adjoint_b), rtol=TOL, atol=TOL)
    elif kind == "sparse@vector":
        d = random_dense(rng, (m if adjoint_a else n,), dtype, 1.0)
        assert_eq(run_op("matmul", a=t, b=d, adjoint_a=adjoint_a), reference(s, d, adjoint_a), rtol=TOL, atol=TOL)
    elif kind == "dense@sparse":
        inner = n if adjoint_b else m
        d = random_dense(rng, (inner, k) if adjoint_a else (k, inner), dtype, 1.0)
        assert_eq(run_op("matmul", a=d, b=t, adjoint_a=adjoint_a, adjoint_b=adjoint_b),
                  reference(d, s, adjoint_a, adjoint_b), rtol=TOL, atol=TOL)
    elif kind == "vector@sparse":
        d = random_dense(rng, (n if adjoint_b else m,), dtype, 1.0)
        assert_eq(run_op("matmul", a=d, b=t, adjoint_b=adjoint_b), reference(d, s, False, adjoint_b),
                  rtol=TOL, atol=TOL)
    else:
        inner = m if adjoint_a else n
        other_dense = random_dense(rng, (k, inner) if adjoint_b else (inner, k), dtype, 0.5)
        other = sparse_of(other_dense, rng.choice(["coo", "csr", "csc"]), rng.choice(["int32", "int64"]))
        out = run_op("matmul", a=t, b=other, adjoint_a=adjoint_a, adjoint_b=adjoint_b)
        assert out.layout == ("csr" if t.layout == "csr" else "coo")
        if out.layout == "coo":
            keys = out.indices[:, 0] * max(out.dense_shape[1], 1) + out.indices[:, 1]
            assert out.coalesced and np.all(np.diff(keys) > 0)
        assert_eq(out.to_dense(), reference(s, other_dense, adjoint_a, adjoint_b), rtol=TOL, atol=TOL)


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.sampled_from(["coo", "csr", "csc"]), st.sampled_from(DTYPES),
       st.integers(0, 3), st.booleans())
def test_sampled_addmm_matches_numpy(seed, layout, dtype, d, batched):
    rng = np.random.default_rng(seed)
    shape = (2, 3, 4) if batched else (3, 4)
    pattern = rng.random(shape) < 0.5
    if batched:
        pattern[1] = pattern[0]  # compressed batches hold the same number of entries
    s = np.where(pattern, random_dense(rng, shape, dtype, 1.0), np.zeros((), dtype))
    s = np.where(pattern & (s == 0), np.ones((), dtype), s)  # every pattern entry stored
    t = sparse_of(s, layout, rng.choice(["int32", "int64"]))
    mat1 = random_dense(rng, (*shape[:-2], 3, d), dtype, 1.0)
    mat2 = random_dense(rng, (*shape[:-2], d, 4), dtype, 1.0)
    alpha, beta = (2, -1) if np.dtype(dtype).kind != "u" else (2, 3)
    out = run_op("sampled_addmm", input=t, mat1=mat1, mat2=mat2, alpha=alpha, beta=beta)
    assert out.layout == layout and out.dtype == np.dtype(dtype)
    with np.errstate(all="ignore"):
        prod = reference(mat1, mat2)
        want = np.where(pattern, (np.asarray(alpha, dtype) * prod + np.asarray(beta, dtype) * s).astype(dtype),
                        np.zeros((), dtype))
    assert_eq(out.to_dense(), want, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("layout", ["coo", "csr", "csc", "bsr"])
@pytest.mark.parametrize("adjoint_a", [False, True])
def test_batched_sparse_times_batched_dense(layout, adjoint_a):
    rng = np.random.default_rng(3)
    s = np.zeros((2, 4, 6))
    rows, cols = np.array([0, 1, 2, 3]), np.array([0, 3, 4, 1])  # one pattern: equal entries per batch
    s[:, rows, cols] = rng.uniform(1, 2, (2, 4))
    t = sparse_of(s, layout, blocksize=(2, 2) if layout == "bsr" else (1, 1))
    d = rng.standard_normal((2, 4 if adjoint_a else 6, 3))
    assert_eq(run_op("matmul", a=t, b=d, adjoint_a=adjoint_a), reference(s, d, adjoint_a), rtol=TOL, atol=TOL)
    left = rng.standard_normal((2, 5, 6 if adjoint_a else 4))
    assert_eq(run_op("matmul", a=left, b=t, adjoint_b=adjoint_a), reference(left, s, False, adjoint_a),
              rtol=TOL, atol=TOL)


def test_empty_and_zero_size_inputs():
    zero_nnz = SparseTensor(layout="csr", compressed_indices=[0, 0, 0], plain_indices=np.zeros(0, np.int64),
                            values=np.zeros(0), dense_shape=[2, 3])
    assert run_op("matmul", a=zero_nnz, b=np.ones(3)).tolist() == [0.0, 0.0]
    assert run_op("matmul", a=zero_nnz, b=np.ones((2, 4)), adjoint_a=True).tolist() == np.zeros((3, 4)).tolist()
    assert run_op("matmul", a=zero_nnz, b=zero_nnz, adjoint_b=True).nnz == 0
    no_rows = SparseTensor(indices=np.zeros((0, 2), np.int64), values=np.zeros(0), dense_shape=[0, 3])
    assert run_op("matmul", a=no_rows, b=np.ones((3, 2))).shape == (0, 2)
    assert run_op("matmul", a=np.ones((2, 0)), b=no_rows).tolist() == [[0.0] * 3] * 2
    assert run_op("matmul", a=no_rows, b=no_rows, adjoint_a=True).dense_shape == (3, 3)
    out = run_op("sampled_addmm", input=zero_nnz, mat1=np.ones((2, 5)), mat2=np.ones((5, 3)))
    assert out.nnz == 0 and out.layout == "csr"
    empty_batch = SparseTensor(layout="csr", compressed_indices=np.zeros((0, 3), np.int64),
                               plain_indices=np.zeros((0, 0), np.int64), values=np.zeros((0, 0)),
                               dense_shape=[0, 2, 3])
    assert run_op("matmul", a=empty_batch, b=np.ones((0, 3, 4))).shape == (0, 2, 4)


# ------------------------------------------------------------------ parallel paths
def big_csr(rng, m, n, nnz, index_dtype=np.int32):
    a = sp.random(m, n, density=nnz / (m * n), format="csr", random_state=rng, dtype=np.float64)
    return a, SparseTensor(layout="csr", compressed_indices=a.indptr.astype(index_dtype),
                           plain_indices=a.indices.astype(index_dtype), values=a.data, dense_shape=a.shape)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_parallel_products_match_scipy(index_dtype):
    rng = np.random.default_rng(11)
    a, t = big_csr(rng, 3000, 2000, 3 * PARALLEL_MIN, index_dtype)
    assert t.nnz > PARALLEL_MIN
    x, xt = rng.standard_normal(2000), rng.standard_normal(3000)
    np.testing.assert_allclose(run_op("matmul", a=t, b=x), a @ x, rtol=1e-10)
    np.testing.assert_allclose(run_op("matmul", a=t, b=xt, adjoint_a=True), a.T @ xt, rtol=1e-10)
    X, Xt = rng.standard_normal((2000, 5)), rng.standard_normal((3000, 64))
    np.testing.assert_allclose(run_op("matmul", a=t, b=X), a @ X, rtol=1e-10)
    # 64 columns: per-thread outputs would outweigh a transpose, so this one transposes first
    np.testing.assert_allclose(run_op("matmul", a=t, b=Xt, adjoint_a=True), a.T @ Xt, rtol=1e-10)
    np.testing.assert_allclose(run_op("matmul", a=t, b=Xt[:, :2], adjoint_a=True), a.T @ Xt[:, :2], rtol=1e-10)
    csc = a.tocsc()
    tc = SparseTensor(layout="csc", compressed_indices=csc.indptr, plain_indices=csc.indices, values=csc.data,
                      dense_shape=csc.shape)
    np.testing.assert_allclose(run_op("matmul", a=tc, b=x), a @ x, rtol=1e-10)
    np.testing.assert_allclose(run_op("matmul", a=X.T, b=t, adjoint_b=True), X.T @ a.T, rtol=1e-10)


def test_parallel_spgemm_and_sddmm_match_scipy():
    rng = np.random.default_rng(12)
    a, ta = big_csr(rng, 20000, 20000, 4 * 20000)
    b, tb = big_csr(rng, 20000, 20000, 4 * 20000)
    assert ta.nnz > PARALLEL_MIN
    out = run_op("matmul", a=ta, b=tb)
    want = (a @ b).tocsr()
    want.sort_indices()
    assert out.layout == "csr" and out.compressed_indices.tolist() == want.indptr.tolist()
    np.testing.assert_array_equal(out.plain_indices, want.indices)
    np.testing.assert_allclose(out.values, want.data, rtol=1e-12)
    out = run_op("matmul", a=ta, b=tb, adjoint_a=True)
    # The first 200 rows, cut from both sides while sparse: made dense whole, each would be 3.2 GB.
    assert out.layout == "csr", out.layout
    end = int(out.compressed_indices[200])
    top = SparseTensor(layout="csr", compressed_indices=out.compressed_indices[:201],
                       plain_indices=out.plain_indices[:end], values=out.values[:end], dense_shape=[200, 20000])
    np.testing.assert_allclose(top.to_dense(), (a.T @ b).tocsr()[:200].toarray(), rtol=1e-12, atol=1e-12)
    mat1, mat2 = rng.standard_normal((20000, 4)), rng.standard_normal((4, 20000))
    out = run_op("sampled_addmm", input=ta, mat1=mat1, mat2=mat2, beta=0.5)
    rows = np.repeat(np.arange(20000), np.diff(a.indptr))
    want = 0.5 * a.data + np.einsum("ij,ji->i", mat1[rows], mat2[:, a.indices])
    np.testing.assert_allclose(out.values, want, rtol=1e-10)


def test_spgemm_orders_short_and_long_rows_alike():
    """Rows of A @ B come out sorted by two routes: a walk of the column bitmap (rows with many
    products) and a merge of runs (rows too short for a walk over 200,000 columns to pay)."""
    rng = np.random.default_rng(13)
    a = sp.random(3000, 5000, density=2 / 5000, format="csr", random_state=rng)
    a = sp.vstack([a, sp.random(100, 5000, density=0.5, format="csr", random_state=rng)]).tocsr()
    b = sp.random(5000, 200_000, density=3 / 200_000, format="csr", random_state=rng)
    ta, tb = (SparseTensor(layout="csr", compressed_indices=m.indptr, plain_indices=m.indices, values=m.data,
                           dense_shape=m.shape) for m in (a, b))
    out = run_op("matmul", a=ta, b=tb)
    want = (a @ b).tocsr()
    want.sort_indices()
    np.testing.assert_array_equal(out.compressed_indices, want.indptr)
    np.testing.assert_array_equal(out.plain_indices, want.indices)
    np.testing.assert_allclose(out.values, want.data, rtol=1e-12)


# ------------------------------------------------------------------ errors
def test_errors():
    csr = sparse_of(np.eye(3), "csr")
    raises = op_raises
    e = raises(InvalidArgumentError, "DTYPE_MISMATCH", "matmul", a=csr, b=np.ones(3, np.float32))
    assert "float64" in str(e) and "float32" in str(e)
    e = raises(InvalidArgumentError, "SHAPE_MISMATCH", "matmul", a=csr, b=np.ones((4, 2)))
    assert "[3, 3]" in str(e) and "[4, 2]" in str(e)
    raises(InvalidArgumentError, "SHAPE_MISMATCH", "matmul", a=np.ones((2, 4)), b=csr)
    raises(InvalidArgumentError, "SHAPE_MISMATCH", "matmul", a=csr, b=sparse_of(np.eye(4), "coo"))
    raises(InvalidArgumentError, "SHAPE_MISMATCH", "matmul", a=sparse_of(np.ones((2, 3, 3)), "csr"),
           b=np.ones((3, 3, 1)))
    raises(InvalidArgumentError, "SHAPE_MISMATCH", "matmul", a=sparse_of(np.ones((2, 3, 3)), "csr"), b=np.ones(3))
    raises(InvalidArgumentError, "RANK", "matmul", a=csr, b=np.ones(3), adjoint_b=True)
    raises(InvalidArgumentError, "RANK", "matmul", a=csr, b=np.float64(1.0))
    raises(InvalidArgumentError, "RANK", "matmul",
           a=SparseTensor(indices=[[1]], values=[1.0], dense_shape=[3]), b=np.ones(3))
    raises(UnimplementedError, "UNSUPPORTED_DTYPE", "matmul", a=sparse_of(np.eye(2, dtype=bool), "coo"),
           b=np.ones(2, bool))
    raises(UnimplementedError, "UNSUPPORTED_LAYOUT", "matmul", a=np.ones((2, 2)), b=np.ones((2, 2)))
    hybrid = SparseTensor(indices=[[0, 1]], values=[[1.0, 2.0]], dense_shape=[2, 2, 2])
    raises(UnimplementedError, "UNSUPPORTED_HYBRID", "matmul", a=hybrid, b=np.ones((2, 2)))
    batched = sparse_of(np.ones((2, 3, 3)), "coo")
    raises(UnimplementedError, "UNSUPPORTED_BATCH", "matmul", a=batched, b=batched)
    raises(UnimplementedError, "UNSUPPORTED_LAYOUT", "sampled_addmm", input=sparse_of(np.eye(2), "bsr"),
           mat1=np.ones((2, 1)), mat2=np.ones((1, 2)))
    e = raises(InvalidArgumentError, "SHAPE_MISMATCH", "sampled_addmm", input=csr, mat1=np.ones((3, 2)),
               mat2=np.ones((3, 3)))
    assert "[3, 2]" in str(e)
    raises(InvalidArgumentError, "DTYPE_MISMATCH", "sampled_addmm", input=csr, mat1=np.ones((3, 1), np.float32),
           mat2=np.ones((1, 3)))
    raises(InvalidArgumentError, "SCALAR_DTYPE", "sampled_addmm", input=sparse_of(np.eye(2, dtype=np.int32), "csr"),
           mat1=np.ones((2, 1), np.int32), mat2=np.ones((1, 2), np.int32), alpha=0.5)


def test_result_bytes_are_known_before_the_kernel():
    from sparseserve.server.ops import REGISTRY

    matmul = REGISTRY.get("matmul")
    csr = sparse_of(np.eye(1000), "csr")
    bound = matmul.bind({"a": csr, "b": np.ones((1000, 7))})
    assert matmul.result_bytes(**bound) == 1000 * 7 * 8
    bound = matmul.bind({"a": np.ones((5, 1000)), "b": csr, "adjoint_b": True})
    assert matmul.result_bytes(**bound) == 5 * 1000 * 8
    # SpGEMM: the bound is the number of products (here exact: a diagonal times a diagonal)
    bound = matmul.bind({"a": csr, "b": sparse_of(np.eye(1000), "coo")})
    assert matmul.result_bytes(**bound) == 1000 * (8 + 16) + 8 * 1001


def test_server_refuses_big_results_before_computing():
    srv = ServerProcess("--max-result-bytes", "100000")
    try:
        with make_client(srv, "grpc") as c:
            a = sparse_of(np.eye(2000), "csr")
            with pytest.raises(ResourceExhaustedError) as info:
                c.matmul(a, np.ones((2000, 10)))
            assert info.value.reason == "RESULT_TOO_LARGE"
            dense_row = SparseTensor(indices=np.stack([np.zeros(2000, np.int64), np.arange(2000)], 1),
                                     values=np.ones(2000), dense_shape=[2000, 2000])
            with pytest.raises(ResourceExhaustedError):  # 2000 x 2000 products: refused uncomputed
                c.matmul(SparseTensor(indices=dense_row.indices[:, ::-1].copy(), values=dense_row.values,
                                      dense_shape=[2000, 2000]), dense_row)
            assert c.matmul(a, np.ones(2000)).shape == (2000,)
    finally:
        assert srv.stop() == 0


# ------------------------------------------------------------------ wires
def test_every_op_over_every_wire(client):
    csr = sparse_of(np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]]), "csr")
    assert client.matmul(csr, np.array([1.0, 1.0, 1.0])).tolist() == [3.0, 3.0]
    assert client.matmul(csr, np.ones((2, 1)), adjoint_a=True).tolist() == [[1.0], [3.0], [2.0]]
    assert client.matmul(np.array([[1.0, 1.0]]), csr).tolist() == [[1.0, 3.0, 2.0]]
    out = client.matmul(csr, csr, adjoint_b=True)
    assert out.layout == "csr" and out.to_dense().tolist() == [[5.0, 0.0], [0.0, 9.0]]
    out = client.sampled_addmm(csr, np.ones((2, 2)), np.ones((2, 3)), beta=0.0, alpha=0.5)
    assert out.layout == "csr" and out.values.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(InvalidArgumentError) as info:
        client.matmul(csr, np.ones(4))
    assert info.value.reason == "SHAPE_MISMATCH"


def test_matrix_held_by_handle(client):
    csr = sparse_of(np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]]), "csr", "int32")
    h = client.put(csr)
    try:
        assert client.matmul(h, np.array([1.0, 2.0, 3.0])).tolist() == [7.0, 6.0]
        assert client.matmul(h, h, adjoint_a=True).to_dense().tolist() == [[1, 0, 2], [0, 9, 0], [2, 0, 4]]
    finally:
        client.delete(h)
