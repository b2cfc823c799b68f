"""Reductions: reduce_sum, reduce_max, softmax, log_softmax, maximum, minimum.

TensorFlow's and PyTorch's documented examples as written, hypothesis properties against
plain numpy references (ranks 1 to 5, axes, keepdims, sparse and dense results, hybrid
values, duplicates, empty inputs) and against torch for softmax, every declared layout, the
error cases (class and reason), every op over every wire, and inputs large enough for the
parallel paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparseserve import InvalidArgumentError, SparseTensor, UnimplementedError
from sparseserve.core.convert import torch_to_tensor
from sparseserve.kernels import PARALLEL_MIN
from conftest import op_raises, run_op
from helpers import assert_eq
from strategies import coo_tensors, random_coo

SETTINGS = settings(max_examples=50, deadline=None)
SUM_DTYPES = ("int8", "int32", "int64", "uint8", "uint64", "float16", "float32", "float64",
              "complex64", "complex128")
MAX_DTYPES = ("int8", "int16", "int64", "uint16", "uint64", "float16", "float32", "float64")
FLOAT_DTYPES = ("float16", "float32", "float64")
# Sums in another order: float16 to 2e-3, the others to 1e-5, complex128 to 1e-12 (atol 1e-6).
RTOL = {"float16": 2e-3, "float32": 1e-5, "float64": 1e-5, "complex64": 1e-5, "complex128": 1e-12}

run, raises = run_op, op_raises


# ================================================================ helpers
@st.composite
def axes_for(draw, rank):
    """None, one int, or a list of distinct axes, each drawn as non-negative or negative."""
    kind = draw(st.sampled_from(["none", "int", "list"]))
    if kind == "none":
        return None
    pick = draw(st.lists(st.integers(0, rank - 1), unique=True, min_size=1 if kind == "int" else 0,
                         max_size=1 if kind == "int" else rank))
    pick = [a - rank if draw(st.booleans()) else a for a in pick]
    return pick[0] if kind == "int" else pick


def normalized(axis, rank):
    if axis is None:
        return tuple(range(rank))
    return tuple(sorted(a % rank for a in ([axis] if isinstance(axis, int) else axis)))


def acc_dtype(dtype):
    dtype = np.dtype(dtype)
    return {"i": np.int64, "u": np.uint64, "f": np.float64, "c": np.complex128}[dtype.kind]


def stored_dense(t: SparseTensor, op: str):
    """(values, stored): duplicates summed (sum) or the largest kept (max), and which
    positions hold a stored value."""
    acc = acc_dtype(t.dtype)
    out = np.zeros(t.dense_shape, acc) if op == "sum" else np.full(t.dense_shape, -np.inf)
    stored = np.zeros(t.dense_shape, bool)
    for i in range(t.nnz):
        key = tuple(t.indices[i])
        v = t.values[i].astype(acc if op == "sum" else np.float64)
        out[key] = out[key] + v if op == "sum" else np.maximum(out[key], v)
        stored[key] = True
    return out, stored


def reference_reduce(t: SparseTensor, op: str, axis, keepdims: bool) -> np.ndarray:
    axes = normalized(axis, len(t.dense_shape))
    values, stored = stored_dense(t, op)
    if op == "sum":
        with np.errstate(all="ignore"):
            return np.sum(values, axis=axes, keepdims=keepdims).astype(t.dtype)
    present = np.any(stored, axis=axes, keepdims=keepdims)
    best = np.max(np.where(stored, values, -np.inf), axis=axes, keepdims=keepdims, initial=-np.inf)
    return np.where(present, best, 0).astype(t.dtype)


def assert_coalesced(out: SparseTensor):
    idx = out.indices
    if idx.shape[0] > 1:
        keys = np.ravel_multi_index(tuple(idx.T), out.dense_shape[:idx.shape[1]])
        assert np.all(np.diff(keys) > 0), idx.tolist()


def to_torch(t: SparseTensor, dtype=None):
    values = torch.from_numpy(np.array(t.values, dtype=dtype or t.dtype))
    return torch.sparse_coo_tensor(torch.from_numpy(np.array(t.indices.T)), values,
                                   size=t.dense_shape, check_invariants=True).coalesce()


# ================================================================ seed examples
# TensorFlow's tf.sparse.reduce_sum / reduce_max docs: x = [[1, ?, 1], [?, 1, ?]] etc.
X_SUM = SparseTensor(indices=[[0, 0], [0, 2], [1, 1]], values=np.array([1, 1, 1], np.int32), dense_shape=[2, 3])
X_MAX = SparseTensor(indices=[[0, 0], [0, 2], [1, 1]], values=np.array([1, 2, 3], np.int32), dense_shape=[2, 3])
Y_MAX = SparseTensor(indices=[[0, 0], [1, 0], [1, 1]], values=np.array([-7, 4, 3], np.int32), dense_shape=[3, 2])


def test_seed_reduce_sum_examples():
    assert run("reduce_sum", sp_input=X_SUM) == 3
    assert run("reduce_sum", sp_input=X_SUM, axis=0).tolist() == [1, 1, 1]
    assert run("reduce_sum", sp_input=X_SUM, axis=1).tolist() == [2, 1]
    assert run("reduce_sum", sp_input=X_SUM, axis=-1).tolist() == [2, 1]
    assert run("reduce_sum", sp_input=X_SUM, axis=1, keepdims=True).tolist() == [[2], [1]]
    assert run("reduce_sum", sp_input=X_SUM, axis=[0, 1]) == 3
    assert run("reduce_sum", sp_input=X_SUM).dtype == np.int32


def test_seed_reduce_max_examples():
    assert run("reduce_max", sp_input=X_MAX) == 3
    assert run("reduce_max", sp_input=X_MAX, axis=0).tolist() == [1, 3, 2]
    assert run("reduce_max", sp_input=X_MAX, axis=1).tolist() == [2, 3]
    assert run("reduce_max", sp_input=X_MAX, axis=1, keepdims=True).tolist() == [[2], [3]]
    assert run("reduce_max", sp_input=X_MAX, axis=[0, 1]) == 3
    # Unstored entries take no part; a row without stored values is 0.
    assert run("reduce_max", sp_input=Y_MAX, axis=1).tolist() == [-7, 4, 0]


def test_seed_reduce_sparse_outputs():
    out = run("reduce_max", sp_input=Y_MAX, axis=1, output_is_sparse=True)
    assert out.indices.tolist() == [[0], [1]] and out.values.tolist() == [-7, 4]
    assert tuple(out.dense_shape) == (3,) and out.coalesced
    out = run("reduce_sum", sp_input=X_SUM, axis=0, keepdims=True, output_is_sparse=True)
    assert out.indices.tolist() == [[0, 0], [0, 1], [0, 2]] and out.values.tolist() == [1, 1, 1]
    assert tuple(out.dense_shape) == (1, 3)


def test_seed_maximum_example():
    sp_zero = SparseTensor(indices=[[0]], values=np.array([0], np.int32), dense_shape=[7])
    sp_one = SparseTensor(indices=[[1]], values=np.array([1], np.int32), dense_shape=[7])
    res = run("maximum", sp_a=sp_zero, sp_b=sp_one)
    assert res.indices.tolist() == [[0], [1]]
    assert res.values.tolist() == [0, 1] and res.values.dtype == np.int32
    assert tuple(res.dense_shape) == (7,)
    res = run("minimum", sp_a=sp_zero, sp_b=sp_one)
    assert res.indices.tolist() == [[0], [1]] and res.values.tolist() == [0, 0]


def test_seed_softmax_fill_is_minus_infinity():
    # torch.sparse.softmax "computes the softmax with the assumption that the fill value is
    # negative infinity": a row's unstored entries take no part.
    st_ = SparseTensor(indices=[[0, 0], [0, 2], [1, 1]], values=np.array([1.0, 2.0, 5.0]), dense_shape=[2, 3])
    out = run("softmax", sp_input=st_, axis=1)
    e = np.exp([1.0, 2.0])
    np.testing.assert_allclose(out.values, [*(e / e.sum()), 1.0])
    assert out.indices.tolist() == st_.indices.tolist()
    expected = torch.sparse.softmax(to_torch(st_), 1)
    np.testing.assert_allclose(out.values, expected.values().numpy())
    log = run("log_softmax", sp_input=st_, axis=0)
    np.testing.assert_allclose(log.values, torch.sparse.log_softmax(to_torch(st_), 0).values().numpy())


# ================================================================ properties: reductions
def check_sparse_result(out: SparseTensor, t: SparseTensor, op: str, axis, keepdims: bool):
    rank, s = len(t.dense_shape), t.sparse_ndim
    axes = normalized(axis, rank)
    expected = reference_reduce(t, op, axis, keepdims)
    assert isinstance(out, SparseTensor) and out.dtype == t.dtype and out.coalesced
    assert tuple(out.dense_shape) == expected.shape
    assert_eq(out.to_dense(), expected, rtol=RTOL, atol=1e-6)
    assert_coalesced(out)
    kept = [d for d in range(s) if d not in axes]
    empty_block = any(t.dense_shape[d] == 0 for d in axes if d >= s)
    groups = set() if empty_block else {tuple(i) for i in t.indices[:, kept].tolist()}
    if keepdims:
        assert out.sparse_ndim == s
        assert {tuple(i) for i in out.indices[:, kept].tolist()} == groups
        assert not out.indices[:, [d for d in range(s) if d in axes]].any()
    elif kept:
        assert {tuple(i) for i in out.indices.tolist()} == groups
    else:  # the leading kept dense axis became the sparse one
        assert out.nnz == (expected.shape[0] if groups else 0)


@SETTINGS
@given(data=st.data(), op=st.sampled_from(["sum", "max"]), keepdims=st.booleans(),
       output_is_sparse=st.booleans())
def test_reduce_matches_numpy(data, op, keepdims, output_is_sparse):
    t = data.draw(coo_tensors(SUM_DTYPES if op == "sum" else MAX_DTYPES))
    axis = data.draw(axes_for(len(t.dense_shape)))
    rank = len(t.dense_shape)
    if output_is_sparse and not keepdims and len(normalized(axis, rank)) == rank:
        raises(InvalidArgumentError, "RANK_TOO_LOW", f"reduce_{op}", sp_input=t, axis=axis,
               output_is_sparse=True)
        return
    out = run(f"reduce_{op}", sp_input=t, axis=axis, keepdims=keepdims, output_is_sparse=output_is_sparse)
    if output_is_sparse:
        check_sparse_result(out, t, op, axis, keepdims)
    else:
        assert_eq(out, reference_reduce(t, op, axis, keepdims), rtol=RTOL, atol=1e-6)


@SETTINGS
@given(t=coo_tensors(("int32", "float64"), min_dim=1))
def test_reduce_nothing_combines_duplicates(t):
    # axis=[] reduces no dimension (TensorFlow, numpy): duplicates summed, or the largest kept.
    assert_eq(run("reduce_sum", sp_input=t, axis=[]), reference_reduce(t, "sum", [], False), rtol=RTOL, atol=1e-6)
    out = run("reduce_max", sp_input=t, axis=[], output_is_sparse=True)
    assert_eq(out.to_dense(), reference_reduce(t, "max", [], False), rtol=RTOL, atol=1e-6)
    assert out.nnz == len({tuple(i) for i in t.indices.tolist()})


def test_reduce_max_duplicates_are_separate_values():
    t = SparseTensor(indices=[[0, 1], [0, 1], [1, 0]], values=np.array([3.0, 4.0, -2.0]), dense_shape=[2, 2])
    assert run("reduce_max", sp_input=t, axis=1).tolist() == [4.0, -2.0]
    assert run("reduce_sum", sp_input=t, axis=1).tolist() == [7.0, -2.0]


def test_reduce_hybrid_dense_axes():
    t = SparseTensor(indices=[[0], [2], [0]], values=np.array([[1, -4], [-2, -3], [5, 0]], np.int64),
                     dense_shape=[3, 2])
    assert run("reduce_sum", sp_input=t, axis=1).tolist() == [2, 0, -5]
    assert run("reduce_max", sp_input=t, axis=1).tolist() == [5, 0, -2]
    assert run("reduce_max", sp_input=t, axis=0).tolist() == [5, 0]
    out = run("reduce_sum", sp_input=t, axis=0, output_is_sparse=True)
    assert out.indices.tolist() == [[0], [1]] and out.values.tolist() == [4, -7]


def test_reduce_every_sparse_axis_of_hybrid_to_sparse():
    # No sparse axis left: the leading kept dense axis becomes the sparse one.
    t = SparseTensor(indices=[[1, 0], [0, 2]], values=np.arange(12.0).reshape(2, 3, 2), dense_shape=[2, 3, 3, 2])
    out = run("reduce_sum", sp_input=t, axis=[0, 1], output_is_sparse=True)
    assert out.sparse_ndim == 1 and tuple(out.dense_shape) == (3, 2)
    assert out.indices.tolist() == [[0], [1], [2]]
    np.testing.assert_array_equal(out.values, np.arange(12.0).reshape(2, 3, 2).sum(axis=0))
    empty = SparseTensor(indices=np.zeros((0, 2), np.int64), values=np.zeros((0, 3, 2)), dense_shape=[2, 3, 3, 2])
    for op in ("reduce_sum", "reduce_max"):
        out = run(op, sp_input=empty, axis=[0, 1], output_is_sparse=True)
        assert out.nnz == 0 and out.values.shape == (0, 2) and tuple(out.dense_shape) == (3, 2)


def test_reduce_wraps_and_keeps_dtype():
    t = SparseTensor(indices=[[0], [1]], values=np.array([100, 100], np.int8), dense_shape=[2])
    out = run("reduce_sum", sp_input=t)
    assert out.dtype == np.int8 and int(out) == np.int8(-56)
    big = SparseTensor(indices=[[0], [1]], values=np.array([2**64 - 1, 2], np.uint64), dense_shape=[2])
    assert int(run("reduce_sum", sp_input=big)) == 1
    assert int(run("reduce_max", sp_input=big)) == 2**64 - 1


def test_reduce_max_nan_propagates():
    t = SparseTensor(indices=[[0], [1], [2]], values=np.array([1.0, np.nan, 2.0]), dense_shape=[4])
    assert np.isnan(run("reduce_max", sp_input=t))


def test_reduce_empty_inputs():
    t = SparseTensor(indices=np.zeros((0, 2), np.int64), values=np.zeros(0, np.float32), dense_shape=[3, 0])
    assert run("reduce_sum", sp_input=t, axis=1).tolist() == [0, 0, 0]
    assert run("reduce_max", sp_input=t, axis=0).shape == (0,)
    out = run("reduce_max", sp_input=t, axis=1, output_is_sparse=True)
    assert out.nnz == 0 and tuple(out.dense_shape) == (3,)


def test_reduce_result_bytes_declared():
    from sparseserve.server.ops import REGISTRY

    op = REGISTRY.get("reduce_sum")
    t = SparseTensor(indices=[[0, 0, 0]], values=np.array([1.0]), dense_shape=[10, 20, 30])
    assert op.result_bytes(**op.bind({"sp_input": t, "axis": 0})) == 20 * 30 * 8
    assert op.result_bytes(**op.bind({"sp_input": t, "axis": [0, 2], "keepdims": True})) == 20 * 8
    assert op.result_bytes(**op.bind({"sp_input": t, "output_is_sparse": True})) == 0


# ================================================================ properties: softmax
@SETTINGS
@given(data=st.data(), log=st.booleans())
def test_softmax_matches_torch(data, log):
    t = data.draw(coo_tensors(FLOAT_DTYPES, min_dim=1, max_rank=4))
    axis = data.draw(st.integers(-len(t.dense_shape), len(t.dense_shape) - 1))
    name = "log_softmax" if log else "softmax"
    out = run(name, sp_input=t, axis=axis)
    compute = np.float32 if t.dtype == np.float16 else t.dtype
    expected = getattr(torch.sparse, name)(to_torch(t, compute), axis)
    assert out.dtype == t.dtype and out.coalesced and tuple(out.dense_shape) == tuple(t.dense_shape)
    np.testing.assert_array_equal(out.indices, expected.indices().numpy().T)
    assert_eq(out.values, expected.values().numpy().astype(t.dtype), rtol=RTOL, atol=1e-6)


def test_softmax_all_minus_inf_line_is_nan_like_torch():
    t = SparseTensor(indices=[[0, 0], [0, 1], [1, 0]], values=np.array([-np.inf, -np.inf, 1.0]),
                     dense_shape=[2, 2])
    out = run("softmax", sp_input=t, axis=1)
    expected = torch.sparse.softmax(to_torch(t), 1).values().numpy()
    np.testing.assert_array_equal(np.isnan(out.values), np.isnan(expected))
    assert out.values[-1] == 1.0


def test_softmax_empty_and_duplicates():
    empty = SparseTensor(indices=np.zeros((0, 2), np.int64), values=np.zeros(0), dense_shape=[2, 3])
    assert run("softmax", sp_input=empty).nnz == 0
    dup = SparseTensor(indices=[[0, 1], [0, 0], [0, 1]], values=np.array([1.0, 0.0, 1.0]), dense_shape=[1, 2])
    out = run("softmax", sp_input=dup, axis=-1)
    assert out.indices.tolist() == [[0, 0], [0, 1]]  # coalesced: [0, 1] holds 2.0
    np.testing.assert_allclose(out.values, np.exp([0.0, 2.0]) / np.exp([0.0, 2.0]).sum())


# ================================================================ properties: maximum / minimum
@st.composite
def operand_pairs(draw):
    a = draw(coo_tensors(MAX_DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    s, shape = a.sparse_ndim, a.dense_shape
    nnz = 0 if 0 in shape[:s] else draw(st.integers(0, 12))
    b = random_coo(rng, shape, nnz, a.dtype, s, repeat=False)
    if b.nnz and a.nnz and draw(st.booleans()):
        b.indices[0] = a.indices[0]  # a shared entry
    return a, b


@SETTINGS
@given(pair=operand_pairs(), take_max=st.booleans())
def test_maximum_minimum_match_numpy(pair, take_max):
    a, b = pair
    out = run("maximum" if take_max else "minimum", sp_a=a, sp_b=b)
    da, sa = stored_dense(a, "sum")
    db, sb = stored_dense(b, "sum")
    fn = np.maximum if take_max else np.minimum
    assert out.dtype == a.dtype and out.coalesced and tuple(out.dense_shape) == tuple(a.dense_shape)
    assert_coalesced(out)
    s = a.sparse_ndim
    union = {tuple(i) for i in a.indices.tolist()} | {tuple(i) for i in b.indices.tolist()}
    assert {tuple(i) for i in out.indices.tolist()} == union
    assert_eq(out.to_dense(), fn(da, db).astype(a.dtype), rtol=RTOL, atol=1e-6)
    assert out.indices.shape[1] == s


# ================================================================ layouts
def _dense_sample(shape, seed=0):
    rng = np.random.default_rng(seed)
    d = rng.integers(-4, 5, size=shape).astype(np.float64)
    d[rng.random(shape) < 0.5] = 0
    return d


def _compressed_inputs():
    mat = torch.from_numpy(_dense_sample((4, 6)))
    pattern = _dense_sample((4, 6), seed=1) != 0  # batches of one CSR share their nse
    batch = torch.from_numpy(np.stack([pattern * 1.5, pattern * -np.arange(24.0).reshape(4, 6)]))
    hybrid = torch.from_numpy(_dense_sample((4, 6, 2), seed=2))
    return {"csr": mat.to_sparse_csr(), "csc": mat.to_sparse_csc(), "bsr": mat.to_sparse_bsr((2, 3)),
            "bsc": mat.to_sparse_bsc((2, 2)), "csr-batched": batch.to_sparse_csr(),
            "csr-hybrid": hybrid.to_sparse_csr(dense_dim=1)}


@pytest.mark.parametrize("kind", ["csr", "csc", "bsr", "bsc", "csr-batched", "csr-hybrid"])
def test_compressed_layouts(kind):
    tt = _compressed_inputs()[kind]
    t = torch_to_tensor(tt)
    sparse_dim = tt.dim() - tt.dense_dim()  # batch dimensions count as sparse ones in COO
    tt_coo = tt.to_sparse_coo() if tt.dense_dim() == 0 else tt.to_sparse(sparse_dim=sparse_dim)
    coo = torch_to_tensor(tt_coo)
    for op in ("reduce_sum", "reduce_max"):
        for axis in (None, 0, -1, [0, 1]):
            assert_eq(run(op, sp_input=t, axis=axis), run(op, sp_input=coo, axis=axis), rtol=RTOL, atol=1e-6)
        sparse = run(op, sp_input=t, axis=0, output_is_sparse=True)
        assert_eq(sparse.to_dense(), run(op, sp_input=coo, axis=0), rtol=RTOL, atol=1e-6)
    for name in ("softmax", "log_softmax"):
        out = run(name, sp_input=t, axis=sparse_dim - 1)
        expected = getattr(torch.sparse, name)(tt_coo, sparse_dim - 1)
        assert out.layout == ("csr" if kind in ("csr", "csr-hybrid") else "coo")
        np.testing.assert_allclose(out.to_dense(), torch_to_tensor(expected).to_dense())
    both = run("maximum", sp_a=t, sp_b=coo)
    np.testing.assert_array_equal(both.to_dense(), np.maximum(coo.to_dense(), coo.to_dense()))


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_plain_csr_reduces_bit_for_bit_like_its_coo_form(index_dtype):
    """A 2-D CSR matrix is reduced from its own arrays (no COO expansion): same bits, including
    rows that repeat a column and empty rows, for every axis choice and output form."""
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 6, 40)
    counts[::7] = 0
    ptr = np.concatenate([[0], np.cumsum(counts)]).astype(index_dtype)
    plain = rng.integers(0, 9, ptr[-1]).astype(index_dtype)  # unsorted, repeats: not coalesced
    for dtype in (np.float32, np.float64, np.int32):
        csr = SparseTensor(layout="csr", compressed_indices=ptr, plain_indices=plain,
                           values=rng.standard_normal(ptr[-1]).astype(dtype) * 7, dense_shape=[40, 9])
        coo = run_op("convert", sp_input=csr, layout="coo")
        for op in ("reduce_sum", "reduce_max"):
            for axis in (None, [0], [1], [-1, 0]):
                for keepdims in (False, True):
                    for sparse_out in (False, True):
                        if sparse_out and axis in (None, [-1, 0]) and not keepdims:
                            continue  # a scalar cannot be sparse (tested above)
                        args = dict(axis=axis, keepdims=keepdims, output_is_sparse=sparse_out)
                        got, want = run_op(op, sp_input=csr, **args), run_op(op, sp_input=coo, **args)
                        assert_eq(got, want, bitwise=True)


# ================================================================ errors
def test_reduce_axis_errors():
    for op in ("reduce_sum", "reduce_max"):
        raises(InvalidArgumentError, "AXIS_OUT_OF_RANGE", op, sp_input=X_MAX, axis=2)
        raises(InvalidArgumentError, "AXIS_OUT_OF_RANGE", op, sp_input=X_MAX, axis=[0, -3])
        # An axis named twice is reduced once, as tf.sparse.reduce_sum/reduce_max do.
        assert run_op(op, sp_input=X_MAX, axis=[0, -2]).tolist() == run_op(op, sp_input=X_MAX, axis=0).tolist()
        raises(InvalidArgumentError, "BAD_ARGUMENT_TYPE", op, sp_input=X_MAX, axis="rows")
        raises(InvalidArgumentError, "RANK_TOO_LOW", op, sp_input=X_MAX, output_is_sparse=True)


def test_dtype_errors():
    flags = SparseTensor(indices=[[0]], values=np.array([True]), dense_shape=[2])
    cplx = SparseTensor(indices=[[0]], values=np.array([1 + 1j]), dense_shape=[2])
    ints = SparseTensor(indices=[[0]], values=np.array([1], np.int32), dense_shape=[2])
    raises(UnimplementedError, "UNSUPPORTED_DTYPE", "reduce_sum", sp_input=flags)
    raises(UnimplementedError, "UNSUPPORTED_DTYPE", "reduce_max", sp_input=flags)
    raises(UnimplementedError, "UNSUPPORTED_DTYPE", "reduce_max", sp_input=cplx)
    raises(UnimplementedError, "UNSUPPORTED_DTYPE", "softmax", sp_input=ints)
    raises(UnimplementedError, "UNSUPPORTED_DTYPE", "log_softmax", sp_input=cplx)
    raises(UnimplementedError, "UNSUPPORTED_DTYPE", "maximum", sp_a=cplx, sp_b=cplx)
    raises(UnimplementedError, "UNSUPPORTED_DTYPE", "minimum", sp_a=flags, sp_b=flags)


def test_softmax_axis_error():
    t = SparseTensor(indices=[[0, 0]], values=np.array([1.0]), dense_shape=[2, 2])
    raises(InvalidArgumentError, "AXIS_OUT_OF_RANGE", "softmax", sp_input=t, axis=2)
    raises(InvalidArgumentError, "AXIS_OUT_OF_RANGE", "log_softmax", sp_input=t, axis=-3)


def test_maximum_mismatch_errors():
    a = SparseTensor(indices=[[0, 0]], values=np.array([1.0]), dense_shape=[2, 2])
    raises(InvalidArgumentError, "SHAPE_MISMATCH", "maximum", sp_a=a,
           sp_b=SparseTensor(indices=[[0, 0]], values=np.array([1.0]), dense_shape=[2, 3]))
    raises(InvalidArgumentError, "DTYPE_MISMATCH", "minimum", sp_a=a,
           sp_b=SparseTensor(indices=[[0, 0]], values=np.array([1.0], np.float32), dense_shape=[2, 2]))
    raises(InvalidArgumentError, "SPARSE_DIM_MISMATCH", "maximum", sp_a=a,
           sp_b=SparseTensor(indices=[[0]], values=np.array([[1.0, 2.0]]), dense_shape=[2, 2]))


# ================================================================ wires
def test_every_op_over_every_wire(client):
    assert client.reduce_sum(X_SUM) == 3
    assert client.reduce_sum(X_SUM, axis=[1], keepdims=True).tolist() == [[2], [1]]
    assert client.reduce_max(Y_MAX, 1).tolist() == [-7, 4, 0]
    out = client.reduce_max(Y_MAX, axis=-1, output_is_sparse=True)
    assert out.indices.tolist() == [[0], [1]] and out.values.tolist() == [-7, 4]
    t = SparseTensor(indices=[[0, 0], [0, 2], [1, 1]], values=np.array([1.0, 2.0, 5.0]), dense_shape=[2, 3])
    np.testing.assert_allclose(client.softmax(t).values, run("softmax", sp_input=t).values)
    np.testing.assert_allclose(client.log_softmax(t, axis=0).values, run("log_softmax", sp_input=t, axis=0).values)
    a = SparseTensor(indices=[[0]], values=np.array([0], np.int32), dense_shape=[7])
    b = SparseTensor(indices=[[1]], values=np.array([1], np.int32), dense_shape=[7])
    assert client.maximum(a, b).values.tolist() == [0, 1]
    assert client.minimum(a, b).values.tolist() == [0, 0]
    assert client.reduce_sum(X_SUM, axis=[0, 0]).tolist() == client.reduce_sum(X_SUM, axis=0).tolist()
    with pytest.raises(UnimplementedError) as info:
        client.softmax(X_SUM)
    assert info.value.reason == "UNSUPPORTED_DTYPE"


# ================================================================ large inputs (parallel paths)
def _large(rows, cols, n, dtype, seed=0):
    return random_coo(np.random.default_rng(seed), (rows, cols), n, dtype, repeat=False)


def _dense_of(t, op):
    out = np.zeros(t.dense_shape, acc_dtype(t.dtype)) if op == "sum" else np.full(t.dense_shape, -np.inf)
    (np.add if op == "sum" else np.maximum).at(out, tuple(t.indices.T), t.values)
    return out


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_large_reductions_take_parallel_paths(dtype):
    n = 2 * PARALLEL_MIN
    narrow = _large(300, 40, n, dtype)              # few output rows: private copies per thread
    wide = _large(200_000, 3, n, dtype, seed=1)     # many output rows: sorted runs
    for t in (narrow, wide):
        sums, best = _dense_of(t, "sum"), _dense_of(t, "max")
        stored = np.zeros(t.dense_shape, bool)
        stored[tuple(t.indices.T)] = True
        for axis in (0, 1):
            assert_eq(run("reduce_sum", sp_input=t, axis=axis), sums.sum(axis=axis).astype(dtype), rtol=RTOL, atol=1e-6)
            expected_max = np.where(stored.any(axis=axis), best.max(axis=axis), 0).astype(dtype)
            assert_eq(run("reduce_max", sp_input=t, axis=axis), expected_max, rtol=RTOL, atol=1e-6)
            out = run("reduce_max", sp_input=t, axis=axis, output_is_sparse=True)
            assert out.nnz == int(stored.any(axis=axis).sum())
            assert_eq(out.to_dense(), expected_max, rtol=RTOL, atol=1e-6)
        assert_eq(run("reduce_sum", sp_input=t), np.asarray(sums.sum()).astype(dtype), rtol=RTOL, atol=1e-6)


def test_large_softmax_and_maximum():
    n = 2 * PARALLEL_MIN
    t = _large(5000, 300, n, "float64")
    for axis in (0, 1):
        out = run("softmax", sp_input=t, axis=axis)
        expected = torch.sparse.softmax(to_torch(t), axis)
        np.testing.assert_array_equal(out.indices, expected.indices().numpy().T)
        np.testing.assert_allclose(out.values, expected.values().numpy(), rtol=1e-10)
    u = _large(5000, 300, n, "float64", seed=3)
    out = run("maximum", sp_a=t, sp_b=u)
    da, db = _dense_of(t, "sum"), _dense_of(u, "sum")
    np.testing.assert_array_equal(out.to_dense(), np.maximum(da, db))
    stored = np.zeros(t.dense_shape, bool)
    stored[tuple(t.indices.T)] = True
    stored[tuple(u.indices.T)] = True
    assert out.nnz == int(stored.sum())
    assert_coalesced(out)
