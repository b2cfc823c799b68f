"""mm (torch.sparse.mm with reduce), addmm and hspmm: worked examples, PyTorch's edge-case
semantics (empty rows, explicit zeros, repeated entries, NaN and inf), the parallel kernel past
PARALLEL_MIN against PyTorch, every error (class and reason), and every op over every wire.
Hypothesis comparisons against PyTorch are in tests/oracle/test_oracle_aggregate.py."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from sparseserve import InvalidArgumentError, SparseTensor, UnimplementedError
from sparseserve.kernels import PARALLEL_MIN
from sparseserve.server.ops import REGISTRY
from conftest import op_raises, run_op

REDUCES = ("sum", "mean", "amax", "amin")
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def torch():
    import torch as _torch

    warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
    return _torch


def csr(ptr, cols, values, shape, index="int64") -> SparseTensor:
    return SparseTensor(layout="csr", compressed_indices=np.asarray(ptr, index),
                        plain_indices=np.asarray(cols, index), values=np.asarray(values), dense_shape=shape)


def coo(indices, values, shape) -> SparseTensor:
    return SparseTensor(indices=np.asarray(indices, np.int64).reshape(-1, 2), values=np.asarray(values),
                        dense_shape=shape)


def torch_mm(torch, t: SparseTensor, x: np.ndarray, reduce: str) -> np.ndarray:
    a = torch.sparse_csr_tensor(torch.from_numpy(t.compressed_indices.astype(np.int64)),
                                torch.from_numpy(t.plain_indices.astype(np.int64)), torch.from_numpy(t.values),
                                tuple(t.dense_shape), check_invariants=False)
    return torch.sparse.mm(a, torch.from_numpy(x), reduce=reduce).numpy()


# ------------------------------------------------------------------ mm: worked examples
# Row 0: entries (0, 1) = 2 and (0, 2) = 0 (an explicit zero); row 1: none; row 2: (2, 0) = -1.
A = csr([0, 2, 2, 3], [1, 2, 0], [2.0, 0.0, -1.0], [3, 3])
X = np.array([[1.0, 10.0], [2.0, -20.0], [3.0, 30.0]])


@pytest.mark.parametrize("reduce, want", [
    ("sum", [[4.0, -40.0], [0.0, 0.0], [-1.0, -10.0]]),
    ("mean", [[2.0, -20.0], [0.0, 0.0], [-1.0, -10.0]]),  # the explicit zero is counted
    ("amax", [[4.0, 0.0], [0.0, 0.0], [-1.0, -10.0]]),    # 0 * x[2] is a product like any other
    ("amin", [[0.0, -40.0], [0.0, 0.0], [-1.0, -10.0]]),
])
def test_mm_worked_example(reduce, want, torch):
    got = run_op("mm", mat1=A, mat2=X, reduce=reduce)
    assert got.dtype == np.float64 and got.tolist() == want
    np.testing.assert_array_equal(got, torch_mm(torch, A, X, reduce))


def test_mm_default_reduce_is_sum():
    np.testing.assert_array_equal(run_op("mm", mat1=A, mat2=X), run_op("mm", mat1=A, mat2=X, reduce="sum"))


@pytest.mark.parametrize("reduce", REDUCES)
def test_repeated_columns_of_a_csr_are_separate_entries(reduce, torch):
    t = csr([0, 3], [1, 1, 0], [1.0, 3.0, -2.0], [1, 3])  # a row holds at most 3 (validation)
    x = np.array([[1.0, -1.0], [2.0, 5.0], [7.0, 7.0]])
    got = run_op("mm", mat1=t, mat2=x, reduce=reduce)
    np.testing.assert_allclose(got, torch_mm(torch, t, x, reduce))
    if reduce == "mean":
        assert got.tolist() == [[(2 + 6 - 2) / 3, (5 + 15 + 2) / 3]]


@pytest.mark.parametrize("reduce", REDUCES)
def test_repeated_coo_indices_are_summed_first(reduce, torch):
    """torch reduces CSR only; a COO's answer is that of its to_sparse_csr(), which coalesces."""
    t = coo([[0, 1], [0, 0], [0, 1]], [1.0, -2.0, 3.0], [1, 2])
    x = np.array([[1.0, -1.0], [2.0, 5.0]])
    got = run_op("mm", mat1=t, mat2=x, reduce=reduce)
    summed = csr([0, 2], [0, 1], [-2.0, 4.0], [1, 2])
    np.testing.assert_array_equal(got, run_op("mm", mat1=summed, mat2=x, reduce=reduce))
    ta = torch.sparse_coo_tensor(torch.tensor(t.indices.T), torch.tensor(t.values), (1, 2))
    np.testing.assert_allclose(got, torch.sparse.mm(ta.to_sparse_csr(), torch.from_numpy(x), reduce=reduce).numpy())


@pytest.mark.parametrize("layout", ["coo", "csc", "bsr", "bsc"])
@pytest.mark.parametrize("reduce", REDUCES)
def test_every_layout_gives_the_csr_answer(layout, reduce):
    rng = np.random.default_rng(3)
    dense = np.where(rng.random((6, 4)) < 0.5, rng.integers(-4, 5, (6, 4)), 0).astype(np.float64)
    dense[1] = 0  # an empty row
    x = rng.standard_normal((4, 3))
    base = run_op("from_dense", tensor=dense)
    blocks = {"blocksize": [2, 2]} if layout in ("bsr", "bsc") else {}
    t = run_op("convert", sp_input=base, layout=layout, **blocks)
    # a stored block stores its zeros too: the mean counts them, as torch's to_sparse_coo().to_sparse_csr()
    want_csr = run_op("convert", sp_input=run_op("convert", sp_input=t, layout="coo"), layout="csr")
    np.testing.assert_allclose(run_op("mm", mat1=t, mat2=x, reduce=reduce),
                               run_op("mm", mat1=want_csr, mat2=x, reduce=reduce), rtol=1e-12)


@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("shape, k", [((3, 4), 2), ((0, 4), 2), ((3, 0), 2), ((3, 4), 0), ((0, 0), 0)])
def test_empty_rows_and_empty_matrices_give_zeros(reduce, shape, k, torch):
    t = csr(np.zeros(shape[0] + 1), [], np.zeros(0, np.float32), list(shape))
    x = np.ones((shape[1], k), np.float32)
    got = run_op("mm", mat1=t, mat2=x, reduce=reduce)
    assert got.dtype == np.float32 and got.shape == (shape[0], k) and not got.any()
    np.testing.assert_array_equal(got, torch_mm(torch, t, x, reduce))


@pytest.mark.parametrize("reduce", REDUCES)
def test_nan_and_inf_follow_torch(reduce, torch):
    t = csr([0, 2, 4, 6, 8], [0, 1, 1, 0, 0, 1, 0, 1],
            [1.0, NAN, 1.0, NAN, -INF, INF, -1.0, -2.0], [4, 2])
    x = np.array([[1.0, 2.0, -3.0], [3.0, NAN, 0.0]])
    got = run_op("mm", mat1=t, mat2=x, reduce=reduce)
    np.testing.assert_array_equal(got, torch_mm(torch, t, x, reduce))  # NaN where torch has NaN


@pytest.mark.parametrize("reduce", ("mean", "amax", "amin"))
def test_float16_is_computed_in_float32(reduce, torch):
    t = csr([0, 3, 3], [0, 1, 1], np.array([0.5, 1.5, -2.0], np.float16), [2, 3])
    x = np.array([[1000.0, 3.0], [-0.25, 7.0], [1.0, 1.0]], np.float16)
    got = run_op("mm", mat1=t, mat2=x, reduce=reduce)
    assert got.dtype == np.float16
    want = run_op("mm", mat1=csr(t.compressed_indices, t.plain_indices, t.values.astype(np.float32), [2, 3]),
                  mat2=x.astype(np.float32), reduce=reduce).astype(np.float16)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got.astype(np.float32), torch_mm(torch, t, x, reduce).astype(np.float32), rtol=2e-3)


@pytest.mark.parametrize("index", ["int32", "int64"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_parallel_path_matches_torch(index, dtype, torch):
    """Past PARALLEL_MIN entries, with skewed rows (one hub row holding a tenth of the edges)."""
    rng = np.random.default_rng(7)
    n, e, k = 20_000, 3 * PARALLEL_MIN, 5
    rows = np.where(rng.random(e) < 0.1, 17, rng.integers(0, n, e))
    cols = rng.integers(0, n, e)
    order = np.lexsort((cols, rows))
    ptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))])
    t = csr(ptr, cols[order], rng.standard_normal(e).astype(dtype), [n, n], index)
    x = rng.standard_normal((n, k)).astype(dtype)
    rtol = 1e-4 if dtype == "float32" else 1e-10
    for reduce in REDUCES:
        got = run_op("mm", mat1=t, mat2=x, reduce=reduce)
        np.testing.assert_allclose(got, torch_mm(torch, t, x, reduce), rtol=rtol, atol=rtol, err_msg=reduce)


@pytest.mark.parametrize("dtype", ["int8", "int64", "uint64", "complex64", "complex128"])
def test_sum_takes_every_number_dtype(dtype):
    t = csr([0, 2, 3], [0, 1, 1], np.array([3, 1, 2], dtype), [2, 2])
    x = np.array([[100, 1], [50, 2]], dtype)
    got = run_op("mm", mat1=t, mat2=x)
    assert got.dtype == np.dtype(dtype)
    with np.errstate(all="ignore"):
        want = (np.array([[3, 1], [0, 2]], dtype) @ x).astype(dtype)  # integers wrap, as numpy's
    np.testing.assert_array_equal(got, want)


def test_result_bytes_is_the_dense_output():
    op = REGISTRY.get("mm")
    assert op.result_bytes(**op.bind({"mat1": A, "mat2": X})) == 3 * 2 * 8
    op = REGISTRY.get("hspmm")
    assert op.result_bytes(**op.bind({"mat1": A, "mat2": X})) >= 3 * 2 * 8


# ------------------------------------------------------------------ addmm
def test_addmm_worked_example_and_broadcasts(torch):
    t = coo([[0, 1], [2, 0], [2, 0]], [2.0, 1.0, 3.0], [3, 2])
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    ta = torch.sparse_coo_tensor(torch.tensor(t.indices.T), torch.tensor(t.values), (3, 2))
    for shape in [(3, 2), (2,), (1, 2), (3, 1), (), (1, 1), (1,)]:
        input = np.arange(1, 1 + int(np.prod(shape)), dtype=np.float64).reshape(shape)
        got = run_op("addmm", input=input, mat1=t, mat2=x, beta=2.0, alpha=-0.5)
        want = torch.sparse.addmm(torch.from_numpy(input), ta, torch.from_numpy(x), beta=2.0, alpha=-0.5)
        assert got.shape == (3, 2)
        np.testing.assert_array_equal(got, want.numpy(), err_msg=str(shape))
    got = run_op("addmm", input=np.zeros((3, 2)), mat1=t, mat2=x)
    assert got.tolist() == [[6.0, 8.0], [0.0, 0.0], [4.0, 8.0]]


def test_addmm_beta_zero_does_not_read_input_and_alpha_zero_keeps_nan(torch):
    t = coo([[0, 0]], [1.0], [2, 2])
    x = np.array([[1.0, NAN], [2.0, 2.0]])
    got = run_op("addmm", input=np.full((2, 2), NAN), mat1=t, mat2=np.ones((2, 2)), beta=0)
    assert got.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    got = run_op("addmm", input=np.ones((2, 2)), mat1=t, mat2=x, alpha=0)
    ta = torch.sparse_coo_tensor(torch.tensor(t.indices.T), torch.tensor(t.values), (2, 2))
    want = torch.sparse.addmm(torch.ones(2, 2, dtype=torch.float64), ta, torch.from_numpy(x), alpha=0).numpy()
    np.testing.assert_array_equal(got, want)  # 0 * NaN is NaN; rows without entries stay 1


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int64", "float16", "complex128"])
def test_addmm_dtypes_wrap_and_round_as_torch(dtype, torch):
    t = coo([[0, 0], [1, 1], [1, 0]], np.array([100, 7, 3], dtype), [2, 2])
    x = np.array([[3, 1], [5, 2]], dtype)
    input = np.array([[9, 1], [2, 4]], dtype)
    got = run_op("addmm", input=input, mat1=t, mat2=x, beta=3, alpha=2)
    ta = torch.sparse_coo_tensor(torch.tensor(t.indices.T), torch.from_numpy(t.values), (2, 2))
    want = torch.sparse.addmm(torch.from_numpy(input), ta, torch.from_numpy(x), beta=3, alpha=2).numpy()
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------ hspmm
def test_hspmm_rows_with_entries_in_order(torch):
    # row 3 holds only an explicit zero: it is a row of the result; rows 1 and 4 are not
    t = coo([[3, 2], [2, 3], [0, 1], [2, 0], [2, 3]], [0.0, 1.0, 2.0, 4.0, 3.0], [5, 4])
    x = np.arange(1.0, 9.0).reshape(4, 2)
    got = run_op("hspmm", mat1=t, mat2=x)
    assert got.layout == "coo" and tuple(got.dense_shape) == (5, 2) and got.sparse_ndim == 1
    assert got.indices.tolist() == [[0], [2], [3]]
    assert got.values.tolist() == [[6.0, 8.0], [32.0, 40.0], [0.0, 0.0]]
    assert not got.coalesced  # as torch flags it
    want = torch.hspmm(torch.sparse_coo_tensor(torch.tensor(t.indices.T), torch.tensor(t.values), (5, 4)),
                       torch.from_numpy(x))
    assert want._indices().T.tolist() == got.indices.tolist() and not want.is_coalesced()


@pytest.mark.parametrize("nnz, coalesced", [(0, True), (1, True), (2, False)])
def test_hspmm_coalesced_flag_as_torch(nnz, coalesced, torch):
    t = coo([[1, 0], [0, 1]][:nnz], np.ones(nnz), [3, 2])
    got = run_op("hspmm", mat1=t, mat2=np.ones((2, 4)))
    want = torch.hspmm(torch.sparse_coo_tensor(torch.tensor(t.indices.T).reshape(2, nnz),
                                               torch.ones(nnz, dtype=torch.float64), (3, 2)),
                       torch.ones(2, 4, dtype=torch.float64))
    assert got.coalesced == want.is_coalesced() == coalesced
    assert got.nnz == want._nnz() and got.values.shape == tuple(want._values().shape)


def test_hspmm_of_csr_with_int32_indices_and_zero_width():
    t = csr([0, 1, 1, 3], [2, 0, 2], [1.0, 2.0, 3.0], [3, 3], "int32")
    got = run_op("hspmm", mat1=t, mat2=np.ones((3, 0)))
    assert got.indices.tolist() == [[0], [2]] and got.values.shape == (2, 0)
    got = run_op("hspmm", mat1=t, mat2=np.eye(3))
    assert got.values.tolist() == [[0.0, 0.0, 1.0], [2.0, 0.0, 3.0]]


# ------------------------------------------------------------------ errors
def test_errors_name_the_argument_and_the_rule():
    err = op_raises(InvalidArgumentError, "BAD_REDUCE", "mm", mat1=A, mat2=X, reduce="prod")
    assert "reduce" in str(err) and "amax" in str(err)
    err = op_raises(InvalidArgumentError, "SHAPE_MISMATCH", "mm", mat1=A, mat2=np.ones((4, 2)))
    assert "mat2" in str(err)
    op_raises(InvalidArgumentError, "RANK", "mm", mat1=A, mat2=np.ones(3))
    op_raises(InvalidArgumentError, "DTYPE_MISMATCH", "mm", mat1=A, mat2=X.astype(np.float32))
    ints = csr([0, 1, 1, 1], [0], np.array([1]), [3, 3])
    err = op_raises(UnimplementedError, "UNSUPPORTED_DTYPE", "mm", mat1=ints, mat2=np.ones((3, 2), np.int64),
                    reduce="mean")
    assert "float32" in str(err)
    bools = csr([0, 1, 1, 1], [0], np.array([True]), [3, 3])
    op_raises(UnimplementedError, "UNSUPPORTED_DTYPE", "mm", mat1=bools, mat2=np.ones((3, 2), bool))
    cube = SparseTensor(indices=[[0, 0, 0], [1, 1, 0]], values=[1.0, 2.0], dense_shape=[2, 2, 2])
    op_raises(InvalidArgumentError, "RANK", "mm", mat1=cube, mat2=np.ones((2, 2)))
    batched = run_op("convert", sp_input=cube, layout="csr")
    op_raises(InvalidArgumentError, "RANK", "mm", mat1=batched, mat2=np.ones((2, 2)), reduce="amax")
    hybrid = SparseTensor(indices=[[0, 0]], values=[[1.0, 2.0]], dense_shape=[2, 2, 2])
    op_raises(UnimplementedError, "UNSUPPORTED_HYBRID", "hspmm", mat1=hybrid, mat2=np.ones((2, 2)))
    op_raises(UnimplementedError, "UNSUPPORTED_LAYOUT", "mm", mat1=np.ones((2, 2)), mat2=np.ones((2, 2)))
    err = op_raises(InvalidArgumentError, "SHAPE_MISMATCH", "addmm", input=np.ones((2, 2)), mat1=A, mat2=X)
    assert "input" in str(err)
    op_raises(InvalidArgumentError, "SHAPE_MISMATCH", "addmm", input=np.ones((1, 3, 2)), mat1=A, mat2=X)
    op_raises(InvalidArgumentError, "DTYPE_MISMATCH", "addmm", input=np.ones(2, np.float32), mat1=A, mat2=X)
    ints = csr([0, 1, 1, 1], [0], np.array([1]), [3, 3])
    err = op_raises(InvalidArgumentError, "SCALAR_DTYPE", "addmm", input=np.ones(2, np.int64), mat1=ints,
                    mat2=np.ones((3, 2), np.int64), beta=0.5)
    assert "beta" in str(err)
    op_raises(InvalidArgumentError, "SHAPE_MISMATCH", "hspmm", mat1=A, mat2=np.ones((2, 2)))
    op_raises(InvalidArgumentError, "BAD_ARGUMENT_TYPE", "mm", mat1=A, mat2=X, reduce=3)


# ------------------------------------------------------------------ the wires
def test_every_op_over_every_wire(client):
    t = coo([[0, 1], [2, 0], [2, 2], [0, 1]], [2.0, 1.0, 0.0, 2.0], [3, 3])
    x = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    assert client.mm(t, x).tolist() == [[12.0, 16.0], [0.0, 0.0], [1.0, 2.0]]
    assert client.mm(t, x, reduce="mean").tolist() == [[12.0, 16.0], [0.0, 0.0], [0.5, 1.0]]
    c = run_op("convert", sp_input=t, layout="csr")
    assert client.mm(c, x, reduce="amax").tolist() == [[12.0, 16.0], [0.0, 0.0], [1.0, 2.0]]
    assert client.mm(c, x, reduce="amin").tolist() == [[12.0, 16.0], [0.0, 0.0], [0.0, 0.0]]
    out = client.addmm(np.ones(2), t, x, beta=2.0, alpha=0.5)
    assert out.tolist() == [[8.0, 10.0], [2.0, 2.0], [2.5, 3.0]]
    h = client.hspmm(t, x)
    assert h.indices.tolist() == [[0], [2]] and h.values.tolist() == [[12.0, 16.0], [1.0, 2.0]]
    assert tuple(h.dense_shape) == (3, 2) and not h.coalesced
    with pytest.raises(InvalidArgumentError) as info:
        client.mm(t, x, reduce="median")
    assert info.value.reason == "BAD_REDUCE"
    with pytest.raises(UnimplementedError) as info:
        client.mm(SparseTensor(indices=[[0, 0]], values=np.array([1], np.int32), dense_shape=[1, 1]),
                  np.ones((1, 1), np.int32), reduce="amax")
    assert info.value.reason == "UNSUPPORTED_DTYPE"
    assert client.mm(t, x, reduce="mean").shape == (3, 2)  # still serving


def test_ops_are_in_the_catalogue():
    for name in ("mm", "addmm", "hspmm"):
        entry = REGISTRY.get(name).describe()
        assert entry["doc"] and entry["outputs"]
    assert [a["name"] for a in REGISTRY.get("addmm").describe()["args"]] == ["input", "mat1", "mat2", "beta",
                                                                           "alpha"]
