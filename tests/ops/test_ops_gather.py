"""index_select, sparse_mask and multiply: errors, edge cases, the result-size estimate, and every
op over the three wires (the oracle tests in tests/oracle hold the answers to PyTorch)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from conftest import op_raises, run_op
from sparseserve import SparseTensor
from sparseserve.errors import InvalidArgumentError, UnimplementedError

warnings.filterwarnings("ignore", message=".*[Ss]parse.*")

A = SparseTensor(indices=[[2, 1], [0, 0], [1, 2], [0, 0], [2, 1]],
                 values=np.array([1, 2, 3, 4, 5], np.float32), dense_shape=[3, 3])


def torch_mod():
    import torch

    return torch


def test_index_select_rows_as_torch():
    out = run_op("index_select", input=A, dim=0, index=np.array([2, 0, 2]))
    assert out.indices.tolist() == [[0, 1], [0, 1], [1, 0], [1, 0], [2, 1], [2, 1]]
    assert out.values.tolist() == [1, 5, 2, 4, 1, 5]
    assert out.dense_shape == (3, 3) and not out.coalesced


def test_index_select_negative_dim_and_index_and_int32():
    a = run_op("index_select", input=A, dim=-1, index=np.array([-1, 0], np.int32))
    b = run_op("index_select", input=A, dim=1, index=np.array([2, 0]))
    assert a.indices.tolist() == b.indices.tolist() and a.values.tolist() == b.values.tolist()


def test_index_select_empty_index_and_empty_input():
    out = run_op("index_select", input=A, dim=0, index=np.zeros(0, np.int64))
    assert out.nnz == 0 and out.dense_shape == (0, 3) and out.coalesced
    empty = SparseTensor(indices=np.zeros((0, 2), np.int64), values=np.zeros(0), dense_shape=[3, 3])
    out = run_op("index_select", input=empty, dim=1, index=np.array([1, 1]))
    assert out.nnz == 0 and out.dense_shape == (3, 2)


def test_index_select_dense_dim_keeps_indices():
    h = SparseTensor(indices=[[1], [0]], values=np.array([[1, 2, 3], [4, 5, 6]]), dense_shape=[2, 3])
    out = run_op("index_select", input=h, dim=1, index=np.array([2, 2, -3]))
    assert out.indices.tolist() == [[1], [0]]
    assert out.values.tolist() == [[3, 3, 1], [6, 6, 4]]


def test_index_select_one_entry_is_coalesced():
    out = run_op("index_select", input=A, dim=0, index=np.array([1]))
    assert out.nnz == 1 and out.coalesced


@pytest.mark.parametrize("index, message", [
    (np.array([0, 3]), "index[1] = 3 is out of range for input.dense_shape[0] = 3"),
    (np.array([0, 1, -4]), "index[2] = -4 is out of range"),
    (np.array([2**40]), "index[0] = 1099511627776"),
    (np.array([5], np.uint64), "index[0] = 5"),
])
def test_index_select_index_out_of_range(index, message):
    err = op_raises(InvalidArgumentError, "INDEX_OUT_OF_RANGE", "index_select", input=A, dim=0, index=index)
    assert message in str(err)


def test_index_select_bad_arguments():
    op_raises(InvalidArgumentError, "AXIS_OUT_OF_RANGE", "index_select", input=A, dim=2, index=np.array([0]))
    op_raises(InvalidArgumentError, "AXIS_OUT_OF_RANGE", "index_select", input=A, dim=-3, index=np.array([0]))
    op_raises(InvalidArgumentError, "INDICES_RANK", "index_select", input=A, dim=0, index=np.array([[0]]))
    op_raises(InvalidArgumentError, "INDEX_DTYPE", "index_select", input=A, dim=0, index=np.array([0.5]))
    op_raises(InvalidArgumentError, "INDEX_DTYPE", "index_select", input=A, dim=0, index=np.array([True]))
    csc = run_op("convert", sp_input=run_op("coalesce", sp_input=A), layout="csc")
    op_raises(UnimplementedError, "UNSUPPORTED_LAYOUT", "index_select", input=csc, dim=0, index=np.array([0]))


def _csr(indices, values, shape):
    return run_op("convert", sp_input=run_op("coalesce", sp_input=SparseTensor(
        indices=indices, values=values, dense_shape=shape)), layout="csr")


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_select_csr_is_coo_answer_converted(dim):
    torch = torch_mod()
    csr = _csr(A.indices, A.values, [3, 3])
    index = np.array([2, 0, 2, 1])
    got = run_op("index_select", input=csr, dim=dim, index=index)
    want = torch.index_select(csr.to_torch().to_sparse_coo(), dim, torch.from_numpy(index)).to_sparse_csr()
    assert got.layout == "csr"
    assert got.compressed_indices.tolist() == want.crow_indices().tolist()
    assert got.plain_indices.tolist() == want.col_indices().tolist()
    assert got.values.tolist() == want.values().tolist()


def test_index_select_csr_unsorted_rows_are_sorted_and_summed():
    # A CSR whose row 0 lists column 2, then 0, then 2 again (valid here, not in PyTorch).
    csr = SparseTensor(layout="csr", compressed_indices=np.array([0, 3, 4], np.int32),
                       plain_indices=np.array([2, 0, 2, 1], np.int32), values=np.array([1., 2., 3., 4.]),
                       dense_shape=[2, 3])
    out = run_op("index_select", input=csr, dim=0, index=np.array([0, 1, 0]))
    assert out.compressed_indices.tolist() == [0, 2, 3, 5]
    assert out.plain_indices.tolist() == [0, 2, 1, 0, 2]
    assert out.values.tolist() == [2., 4., 4., 2., 4.]
    assert out.compressed_indices.dtype == np.int32


def test_index_select_large_sorted_and_unsorted_paths_agree():
    """The pointer path (sorted column) and the matching path give the same answer."""
    rng = np.random.default_rng(0)
    n = 100_000
    keys = np.unique(rng.integers(0, 1000 * 50, n))
    t = SparseTensor(indices=np.stack([keys // 50, keys % 50], 1), values=rng.standard_normal(keys.size),
                     dense_shape=[1000, 50], coalesced=True)
    index = rng.integers(0, 1000, 300)
    fast = run_op("index_select", input=t, dim=0, index=index)
    perm = rng.permutation(keys.size)
    # Same entries, one pair swapped out of order: the matching path (entry order differs only there).
    shuffled = SparseTensor(indices=t.indices[perm], values=t.values[perm], dense_shape=t.dense_shape)
    slow = run_op("index_select", input=shuffled, dim=0, index=index)
    order_fast = np.lexsort((fast.indices[:, 1], fast.indices[:, 0]))
    order_slow = np.lexsort((slow.indices[:, 1], slow.indices[:, 0]))
    assert np.array_equal(fast.indices[order_fast], slow.indices[order_slow])
    assert np.array_equal(fast.values[order_fast], slow.values[order_slow])
    # index-major: the renumbered coordinate never decreases
    assert np.all(np.diff(fast.indices[:, 0]) >= 0) and np.all(np.diff(slow.indices[:, 0]) >= 0)


@pytest.mark.parametrize("dtype, dense", [(np.bool_, ()), (np.float16, (3,)), (np.complex128, ()),
                                          (np.int8, (0,)), (np.float32, (2, 2))])
def test_index_select_sorted_runs_move_every_dtype_whole(dtype, dense, monkeypatch):
    """The run copy moves values as words of their row's width (1-8 bytes, hybrid rows, empty
    rows), in the parallel path (over 65,536 entries): PyTorch's answer."""
    torch = torch_mod()
    from sparseserve.kernels import gather as gk

    copies = []
    copy = gk.copy_runs
    monkeypatch.setattr(gk, "copy_runs", lambda *a: copies.append(a) or copy(*a))
    rng = np.random.default_rng(3)
    keys = np.unique(rng.integers(0, 4000 * 60, 120_000))
    values = (rng.standard_normal((keys.size, *dense)) * 4).astype(dtype)
    t = SparseTensor(indices=np.stack([keys // 60, keys % 60], 1), values=values,
                     dense_shape=[4000, 60, *dense], coalesced=True)
    index = rng.integers(0, 4000, 3_000)
    out = run_op("index_select", input=t, dim=0, index=index)
    want = torch.index_select(t.to_torch(), 0, torch.from_numpy(index))
    assert copies, "the sorted-runs path was not taken"
    assert np.array_equal(out.indices, want._indices().numpy().T)
    assert out.values.dtype == dtype and np.array_equal(out.values, want._values().numpy())


def test_index_select_keeps_the_run_pointer_of_a_held_tensor(monkeypatch):
    """A bound (read-only) tensor's run pointer is built once and kept while the tensor lives;
    a tensor whose arrays can still change is not kept."""
    import gc

    from sparseserve.kernels import gather as gk
    from sparseserve.server.ops import REGISTRY
    from sparseserve.server.ops import gather as gather_op

    builds = []
    build = gk.sorted_column_ptr
    monkeypatch.setattr(gk, "sorted_column_ptr", lambda *a: builds.append(a) or build(*a))
    # 200 rows of 50 entries: a pointer of 1.6 kB beside 200 kB of tensor (kept under an eighth).
    keys = np.arange(0, 200 * 100, 2)
    t = SparseTensor(indices=np.stack([keys // 100, keys % 100], 1), values=np.ones(keys.size, np.float32),
                     dense_shape=[200, 100], coalesced=True)
    op = REGISTRY.get("index_select")
    bound = op.bind({"input": t, "dim": 0, "index": np.array([7, 0, 7])})
    answers = [op.run("cpu", bound)[0] for _ in range(3)]
    assert len(builds) == 1
    assert all(np.array_equal(a.indices, answers[0].indices) and np.array_equal(a.values, answers[0].values)
               for a in answers)
    assert answers[0].indices[:, 0].tolist() == [0] * 50 + [1] * 50 + [2] * 50
    assert answers[0].indices[:, 1].tolist() == list(range(0, 100, 2)) * 3
    held = bound["input"]
    assert held in gather_op._RUN_POINTERS
    del bound, held, answers
    gc.collect()
    assert len(gather_op._RUN_POINTERS) == 0
    writable = SparseTensor(indices=t.indices.copy(), values=t.values.copy(), dense_shape=t.dense_shape,
                            coalesced=True)
    gather_op._index_select_coo(writable, 0, np.array([1, 5]))
    gather_op._index_select_coo(writable, 0, np.array([1, 5]))
    assert len(builds) == 3 and writable not in gather_op._RUN_POINTERS


def test_index_select_result_bytes_bounds_the_result():
    from sparseserve.server.ops import REGISTRY

    op = REGISTRY.get("index_select")
    for index in (np.array([0, 2, 2, 1]), np.array([0] * 50)):
        bound = op.bind({"input": A, "dim": 0, "index": index})
        out = op.run("cpu", bound)[0]
        assert op.result_bytes(**bound) >= out.indices.nbytes + out.values.nbytes


# ------------------------------------------------------------------ sparse_mask
def test_sparse_mask_keeps_mask_order_and_takes_input_dtype():
    dense = np.arange(9, dtype=np.int16).reshape(3, 3)
    out = run_op("sparse_mask", input=dense, mask=A)
    assert out.indices.tolist() == A.indices.tolist()
    assert out.values.tolist() == [7, 0, 5, 0, 7] and out.values.dtype == np.int16
    assert not out.coalesced


def test_sparse_mask_csr_and_errors():
    dense = np.arange(9.).reshape(3, 3)
    csr = _csr(A.indices, A.values, [3, 3])
    out = run_op("sparse_mask", input=dense, mask=csr)
    assert out.layout == "csr" and out.plain_indices.tolist() == csr.plain_indices.tolist()
    assert out.values.tolist() == [0., 5., 7.]
    op_raises(InvalidArgumentError, "SHAPE_MISMATCH", "sparse_mask", input=np.ones(3), mask=A)


# ------------------------------------------------------------------ multiply
def test_multiply_errors():
    op_raises(UnimplementedError, "UNSUPPORTED_LAYOUT", "multiply", a=np.ones(3), b=np.ones(3))
    op_raises(InvalidArgumentError, "SHAPE_MISMATCH", "multiply", a=A, b=np.ones(4))
    other = SparseTensor(indices=[[0]], values=[1.], dense_shape=[3])
    op_raises(InvalidArgumentError, "SHAPE_MISMATCH", "multiply", a=A, b=other)
    csr = _csr(A.indices, A.values, [3, 3])
    op_raises(InvalidArgumentError, "SHAPE_MISMATCH", "multiply", a=csr, b=np.ones((2, 3, 3)))


def test_multiply_sparse_dense_both_orders_and_broadcast():
    row = np.array([1., 10., 100.])
    ab, ba = run_op("multiply", a=A, b=row), run_op("multiply", a=row, b=A)
    assert ab.indices.tolist() == ba.indices.tolist() == A.indices.tolist()
    assert ab.values.tolist() == ba.values.tolist() == [10., 2., 300., 4., 50.]
    assert ab.values.dtype == np.float64


def test_multiply_scalar_promotion_as_torch():
    i32 = SparseTensor(indices=A.indices, values=A.values.astype(np.int32), dense_shape=[3, 3])
    assert run_op("multiply", a=i32, b=np.array(2.5)).values.dtype == np.float64
    assert run_op("multiply", a=i32, b=np.array(2, np.int64)).values.dtype == np.int32
    assert run_op("multiply", a=A, b=np.array(2.0, np.float64)).values.dtype == np.float32
    f16 = SparseTensor(indices=A.indices, values=A.values.astype(np.float16), dense_shape=[3, 3])
    assert run_op("multiply", a=f16, b=np.ones((3, 3), np.int64)).values.dtype == np.float16


def test_multiply_sparse_sparse_intersection_and_bool():
    a = run_op("coalesce", sp_input=A)
    b = SparseTensor(indices=[[0, 0], [2, 1], [1, 1]], values=np.array([2., 3., 4.], np.float32),
                     dense_shape=[3, 3], coalesced=False)
    b = run_op("coalesce", sp_input=b)
    out = run_op("multiply", a=a, b=b)
    assert out.indices.tolist() == [[0, 0], [2, 1]] and out.values.tolist() == [12., 18.] and out.coalesced
    ba = SparseTensor(indices=a.indices, values=a.values > 2, dense_shape=[3, 3], coalesced=True)
    bb = SparseTensor(indices=b.indices, values=np.array([True, True, False]), dense_shape=[3, 3], coalesced=True)
    out = run_op("multiply", a=ba, b=bb)
    assert out.values.dtype == np.bool_ and out.values.tolist() == [True, False]  # logical and


# ------------------------------------------------------------------ over the wires
def test_ops_over_the_wire(client):
    out = client.index_select(A, 0, np.array([2, 0, 2]))
    assert out.indices.tolist() == [[0, 1], [0, 1], [1, 0], [1, 0], [2, 1], [2, 1]]
    csr = _csr(A.indices, A.values, [3, 3])
    out = client.index_select(csr, 1, np.array([2, 2]))
    assert out.layout == "csr" and out.dense_shape == (3, 2)
    out = client.sparse_mask(np.arange(9.).reshape(3, 3), A)
    assert out.values.tolist() == [7., 0., 5., 0., 7.]
    out = client.multiply(A, np.array([1., 10., 100.]))
    assert out.values.tolist() == [10., 2., 300., 4., 50.]
    out = client.multiply(csr, csr)
    assert out.layout == "csr" and out.values.tolist() == [36., 9., 36.]


def test_out_of_range_index_over_the_wire_then_still_serving(client):
    with pytest.raises(InvalidArgumentError) as info:
        client.index_select(A, 1, np.array([0, 1, 99]))
    assert info.value.reason == "INDEX_OUT_OF_RANGE" and "index[2] = 99" in info.value.message
    assert client.index_select(A, 1, np.array([0])).nnz == 2
