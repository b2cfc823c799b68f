"""Structure ops: sparse_to_dense, to_indicator, concat, fill_empty_rows, select.

The seed documents' worked examples as written, hypothesis properties against
plain numpy references, the error cases (class and reason), and every op over
every wire. The last section: each op on CSR, CSC, BSR and BSC against its
answer on the tensor's COO view (``_compressed.py``)."""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparseserve import (InvalidArgumentError, ResourceExhaustedError, SparseTensor,
                         UnimplementedError)
from sparseserve.core.dtypes import DTYPE_NAMES
from sparseserve.server.ops import REGISTRY
from conftest import op_raises, run_op
from helpers import assert_eq
from strategies import compressed_tensors, coo_tensors, layout_specs, random_values
from _compressed import DTYPES, assert_same_or_error, back, coo_view, expect, op_raises_any

INT_DTYPES = [d for d in DTYPE_NAMES if np.dtype(d).kind in "iu"]
# Values 0..4 (integers for floats too): ids that to_indicator's vocabularies of 5 to 7 take.
VALUES = {"low": 0, "high": 4, "halves": False}


run, raises = run_op, op_raises


def coo(indices, values, shape, dtype=None):
    return SparseTensor(indices=np.asarray(indices, np.int64).reshape(-1, len(shape)) if not len(indices)
                        else indices, values=values, dense_shape=shape, dtype=dtype)


def reference_dense(t: SparseTensor) -> np.ndarray:
    out = np.zeros(t.dense_shape, dtype=t.dtype)
    for i in range(t.nnz):
        key = tuple(t.indices[i])
        out[key] = (out[key] | t.values[i]) if t.dtype == np.bool_ else out[key] + t.values[i]
    return out


def keys_of(t: SparseTensor) -> np.ndarray:
    return np.ravel_multi_index(t.indices.T, t.dense_shape[:t.sparse_ndim]) if t.nnz else np.zeros(0, np.int64)


# ================================================================ seed examples
def test_seed_sparse_to_dense_forms():
    # 0-D: dense[i] = (i == sparse_indices ? sparse_values : default_value)
    np.testing.assert_array_equal(
        run("sparse_to_dense", sparse_indices=np.array(2), output_shape=[5], sparse_values=np.array(7),
            default_value=-1), [-1, -1, 7, -1, -1])
    # 1-D: dense[sparse_indices[i]] = sparse_values[i]
    np.testing.assert_array_equal(
        run("sparse_to_dense", sparse_indices=np.array([0, 3]), output_shape=[5],
            sparse_values=np.array([1.5, 2.5])), [1.5, 0, 0, 2.5, 0])
    # 2-D: dense[sparse_indices[i][0], ..., sparse_indices[i][d-1]] = sparse_values[i]
    np.testing.assert_array_equal(
        run("sparse_to_dense", sparse_indices=np.array([[0, 1], [2, 0]], np.int32), output_shape=[3, 2],
            sparse_values=np.array([4, 5])), [[0, 4], [0, 0], [5, 0]])
    # a scalar sparse_values is used for every index
    np.testing.assert_array_equal(
        run("sparse_to_dense", sparse_indices=np.array([[0, 1], [2, 0]]), output_shape=[3, 2],
            sparse_values=np.array(True), default_value=False), [[False, True], [False, False], [True, False]])


def test_seed_sparse_tensor_to_dense_example_as_sparse_to_dense():
    # tf.sparse_tensor_to_dense is a wrapper around sparse_to_dense; strings become numbers here.
    out = run("sparse_to_dense", sparse_indices=np.array([[0, 1], [0, 3], [2, 0]]), output_shape=[3, 5],
              sparse_values=np.array([1, 2, 3]), default_value=9)
    np.testing.assert_array_equal(out, [[9, 1, 9, 2, 9], [9, 9, 9, 9, 9], [3, 9, 9, 9, 9]])


def test_seed_sparse_to_indicator():
    sp = SparseTensor(indices=[[0, 0, 0], [0, 1, 0], [1, 0, 3], [1, 1, 2], [1, 1, 3], [1, 2, 1]],
                      values=np.array([0, 10, 103, 112, 113, 121], np.int64), dense_shape=[2, 3, 4])
    out = run("to_indicator", sp_input=sp, vocab_size=200)
    assert out.dtype == np.bool_ and out.shape == (2, 3, 200)
    assert [tuple(p) for p in np.argwhere(out)] == [(0, 0, 0), (0, 1, 10), (1, 0, 103), (1, 1, 112),
                                                    (1, 1, 113), (1, 2, 121)]


def test_seed_sparse_concat():
    # "a".."e" become 1..5
    a = SparseTensor(indices=[[0, 2], [1, 0], [1, 1]], values=np.array([1, 2, 3]), dense_shape=[2, 3])
    b = SparseTensor(indices=[[0, 1], [0, 2]], values=np.array([4, 5]), dense_shape=[2, 4])
    out = run("concat", axis=1, sp_inputs=[a, b])
    assert out.dense_shape == (2, 7)
    assert out.indices.tolist() == [[0, 2], [0, 4], [0, 5], [1, 0], [1, 1]]
    assert out.values.tolist() == [1, 4, 5, 2, 3]


def test_seed_fill_empty_rows():
    # a, b, c, d become 1..4; default_value -1
    sp = SparseTensor(indices=[[0, 1], [0, 3], [2, 0], [3, 1]], values=np.array([1.0, 2, 3, 4]),
                      dense_shape=[5, 6])
    out, empty = run("fill_empty_rows", sp_input=sp, default_value=-1.0)
    assert out.dense_shape == (5, 6)
    assert out.indices.tolist() == [[0, 1], [0, 3], [1, 0], [2, 0], [3, 1], [4, 0]]
    assert out.values.tolist() == [1, 2, -1, 3, 4, -1]
    assert empty.dtype == np.bool_ and empty.tolist() == [False, True, False, False, True]


# =========================================================== sparse_to_dense
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_sparse_to_dense_matches_reference(data):
    rank = data.draw(st.integers(1, 5))
    shape = data.draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    dtype = data.draw(st.sampled_from(DTYPE_NAMES))
    n = data.draw(st.integers(0, 8))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    idx = np.stack([rng.integers(0, d, n) for d in shape], axis=1).reshape(n, rank)
    validate = data.draw(st.booleans())
    keys = np.ravel_multi_index(idx.T, shape) if n else np.zeros(0, np.int64)
    if validate:
        keys, first = np.unique(keys, return_index=True)
        idx = idx[first]
        n = idx.shape[0]
    scalar = data.draw(st.booleans())
    values = random_values(rng, () if scalar else n, dtype, **VALUES)
    default = 1 if dtype != "bool" else True
    ref = np.full(shape, default, dtype)
    touched = np.zeros(shape, bool)
    for i in range(n):
        v = values if scalar else values[i]
        k = tuple(idx[i])
        if touched[k]:
            ref[k] = (ref[k] | v) if dtype == "bool" else ref[k] + v
        else:
            ref[k] = v
            touched[k] = True
    sparse_indices = idx[:, 0].copy() if rank == 1 and data.draw(st.booleans()) else idx
    out = run("sparse_to_dense", sparse_indices=sparse_indices, output_shape=shape, sparse_values=values,
              default_value=default, validate_indices=validate)
    assert out.dtype == np.dtype(dtype) and out.shape == tuple(shape)
    np.testing.assert_array_equal(out, ref)


def test_sparse_to_dense_sums_repeats_without_validation():
    out = run("sparse_to_dense", sparse_indices=np.array([[1, 1], [0, 0], [1, 1]]), output_shape=[2, 2],
              sparse_values=np.array([1, 2, 3], np.int8), validate_indices=False)
    assert out.dtype == np.int8
    np.testing.assert_array_equal(out, [[2, 0], [0, 4]])


def test_sparse_to_dense_empty_and_uint_indices():
    out = run("sparse_to_dense", sparse_indices=np.zeros((0, 2), np.int64), output_shape=[2, 3],
              sparse_values=np.zeros(0, np.complex64), default_value=0)
    assert out.dtype == np.complex64 and not out.any()
    out = run("sparse_to_dense", sparse_indices=np.array([1, 2], np.uint64), output_shape=[3],
              sparse_values=np.array(5.0, np.float16))
    assert out.dtype == np.float16 and out.tolist() == [0, 5, 5]


@pytest.mark.parametrize("kwargs, reason", [
    (dict(sparse_indices=np.array([[0, 1], [5, 1]]), output_shape=[4, 4]), "INDEX_OUT_OF_RANGE"),
    (dict(sparse_indices=np.array([[0, 1], [-1, 1]]), output_shape=[4, 4]), "INDEX_OUT_OF_RANGE"),
    (dict(sparse_indices=np.array([2**64 - 1, 1], np.uint64), output_shape=[4]), "INDEX_OUT_OF_RANGE"),
    (dict(sparse_indices=np.array([[1, 1], [0, 1]]), output_shape=[4, 4]), "INDICES_UNSORTED"),
    (dict(sparse_indices=np.array([[1, 1], [1, 1]]), output_shape=[4, 4]), "INDICES_REPEATED"),
    (dict(sparse_indices=np.array([[1, 1], [2, 1]]), output_shape=[4, 4, 4]), "RANK_MISMATCH"),
    (dict(sparse_indices=np.array([[0.0, 1.0]]), output_shape=[4, 4]), "INDEX_DTYPE"),
    (dict(sparse_indices=np.zeros((1, 1, 1), np.int64), output_shape=[4]), "INDICES_RANK"),
    (dict(sparse_indices=np.array([[1, 1], [2, 1]]), output_shape=[4, -4]), "NEGATIVE_DIMENSION"),
    (dict(sparse_indices=np.array([[1, 1], [2, 1]]), output_shape=[2**40, 2**40]), "SHAPE_OVERFLOW"),
])
def test_sparse_to_dense_errors(kwargs, reason):
    values = np.array([1.0, 2.0])
    op = REGISTRY.get("sparse_to_dense")
    bound = op.bind({"sparse_values": values, **kwargs})
    with pytest.raises(InvalidArgumentError) as info:
        op.result_bytes(**bound)
        op.run("cpu", bound)
    assert info.value.reason == reason


def test_sparse_to_dense_value_errors():
    raises(InvalidArgumentError, "VALUES_SHAPE_MISMATCH", "sparse_to_dense",
           sparse_indices=np.array([[1, 1], [2, 1]]), output_shape=[4, 4], sparse_values=np.array([1, 2, 3]))
    raises(InvalidArgumentError, "SCALAR_DTYPE", "sparse_to_dense", sparse_indices=np.array([1]),
           output_shape=[4], sparse_values=np.array([1], np.int8), default_value=0.5)
    # validation runs even with validate_indices=false for the range
    raises(InvalidArgumentError, "INDEX_OUT_OF_RANGE", "sparse_to_dense", sparse_indices=np.array(4),
           output_shape=[4], sparse_values=np.array(1), validate_indices=False)


# ================================================================ to_indicator
@settings(max_examples=60, deadline=None)
@given(t=coo_tensors(INT_DTYPES, min_dim=1, values=VALUES), vocab=st.integers(5, 7))
def test_to_indicator_matches_reference(t, vocab):
    out = run("to_indicator", sp_input=t, vocab_size=vocab)
    ref = np.zeros((*t.dense_shape[:-1], vocab), bool)
    dense_block = t.dense_shape[t.sparse_ndim:]
    for i in range(t.nnz):
        for j in np.ndindex(*dense_block):
            full = (*t.indices[i], *j)
            ref[(*full[:-1], int(t.values[(i, *j)]))] = True
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("dtype", [d for d in DTYPE_NAMES if d not in INT_DTYPES])
def test_to_indicator_needs_integer_ids(dtype):
    t = SparseTensor(indices=[[0, 1]], values=np.ones(1, dtype), dense_shape=[2, 3])
    raises(UnimplementedError, "UNSUPPORTED_DTYPE", "to_indicator", sp_input=t, vocab_size=4)


@pytest.mark.parametrize("value", [-1, 4, 100])
def test_to_indicator_ids_out_of_range(value):
    t = SparseTensor(indices=[[0, 0], [0, 1]], values=np.array([1, value]), dense_shape=[2, 3])
    err = raises(InvalidArgumentError, "VALUE_OUT_OF_RANGE", "to_indicator", sp_input=t, vocab_size=4)
    assert "sp_input.values[1]" in err.message


def test_to_indicator_edges():
    t = SparseTensor(indices=[[0, 1]], values=np.array([2**64 - 1], np.uint64), dense_shape=[2, 3])
    raises(InvalidArgumentError, "VALUE_OUT_OF_RANGE", "to_indicator", sp_input=t, vocab_size=4)
    raises(InvalidArgumentError, "NEGATIVE_DIMENSION", "to_indicator", sp_input=t, vocab_size=-1)
    # rank 1: the output is [vocab_size]; repeated ids and unsorted entries are fine
    t = SparseTensor(indices=[[2], [0], [1]], values=np.array([3, 1, 3], np.uint8), dense_shape=[5])
    assert run("to_indicator", sp_input=t, vocab_size=5).tolist() == [False, True, False, True, False]
    empty = SparseTensor(indices=np.zeros((0, 2), np.int64), values=np.zeros(0, np.int32), dense_shape=[3, 4])
    out = run("to_indicator", sp_input=empty, vocab_size=0)
    assert out.shape == (3, 0)


# ====================================================================== concat
@st.composite
def concat_cases(draw):
    rank = draw(st.integers(1, 5))
    sparse_ndim = draw(st.integers(1, rank))
    dtype = draw(st.sampled_from(DTYPE_NAMES))
    axis = draw(st.integers(-rank, rank - 1))
    expand = draw(st.booleans())
    base = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    count = draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    tensors = []
    for _ in range(count):
        shape = [draw(st.integers(0 if d == axis % rank else 1, 3)) if (d == axis % rank or expand) else base[d]
                 for d in range(rank)]
        nnz = 0 if 0 in shape[:sparse_ndim] else draw(st.integers(0, 6))
        idx = np.stack([rng.integers(0, d, nnz) for d in shape[:sparse_ndim]], axis=1).reshape(nnz, sparse_ndim)
        if nnz > 2:
            idx[-1] = idx[0]
        values = random_values(rng, (nnz, *shape[sparse_ndim:]), dtype, **VALUES)
        tensors.append(SparseTensor(indices=idx.astype(np.int64), values=values, dense_shape=shape))
    return axis, tensors, expand


@settings(max_examples=80, deadline=None)
@given(case=concat_cases())
def test_concat_matches_reference(case):
    axis, tensors, expand = case
    out = run("concat", axis=axis, sp_inputs=tensors, expand_nonconcat_dims=expand)
    rank = tensors[0].ndim
    ax = axis % rank
    shape = [max(t.dense_shape[d] for t in tensors) for d in range(rank)]
    shape[ax] = sum(t.dense_shape[ax] for t in tensors)
    assert out.dense_shape == tuple(shape) and out.dtype == tensors[0].dtype
    parts = []
    for t in tensors:
        dense = reference_dense(t)
        pad = [(0, 0 if d == ax else shape[d] - t.dense_shape[d]) for d in range(rank)]
        parts.append(np.pad(dense, pad))
    np.testing.assert_array_equal(reference_dense(out), np.concatenate(parts, axis=ax))
    assert out.nnz == sum(t.nnz for t in tensors)
    if len(tensors) > 1:  # one input comes back as it is, as from tf.sparse.concat
        assert np.all(np.diff(keys_of(out)) >= 0)  # row-major


def test_concat_is_stable_with_duplicates_and_unsorted_input():
    a = SparseTensor(indices=[[1, 0], [0, 1], [1, 0]], values=np.array([1.0, 2, 3]), dense_shape=[2, 2])
    b = SparseTensor(indices=[[0, 0]], values=np.array([4.0]), dense_shape=[1, 2])
    out = run("concat", axis=0, sp_inputs=[a, b])
    assert out.indices.tolist() == [[0, 1], [1, 0], [1, 0], [2, 0]]
    assert out.values.tolist() == [2, 1, 3, 4]


def test_concat_hybrid_along_dense_axis():
    a = SparseTensor(indices=[[0], [1]], values=np.array([[1, 2], [3, 4]]), dense_shape=[2, 2])
    b = SparseTensor(indices=[[1]], values=np.array([[5]]), dense_shape=[2, 1])
    out = run("concat", axis=-1, sp_inputs=[a, b])
    assert out.dense_shape == (2, 3)
    np.testing.assert_array_equal(reference_dense(out), [[1, 2, 0], [3, 4, 5]])


@pytest.mark.parametrize("inputs, axis, reason", [
    ([], 0, "EMPTY_LIST"),
    ([((2, 3), "float64"), ((2, 3), "float32")], 0, "DTYPE_MISMATCH"),
    ([((2, 3), "float64"), ((2, 3, 1), "float64")], 0, "RANK_MISMATCH"),
    ([((2, 3), "float64"), ((2, 4), "float64")], 0, "SHAPE_MISMATCH"),
    ([((2, 3), "float64"), ((2, 3), "float64")], 2, "AXIS_OUT_OF_RANGE"),
    ([((2, 3), "float64"), ((2, 3), "float64")], -3, "AXIS_OUT_OF_RANGE"),
    ([((2**62, 3), "float64"), ((2**62, 3), "float64")], 0, "SHAPE_OVERFLOW"),
])
def test_concat_errors(inputs, axis, reason):
    tensors = [SparseTensor(indices=np.zeros((0, len(s)), np.int64), values=np.zeros(0, d), dense_shape=s)
               for s, d in inputs]
    raises(InvalidArgumentError, reason, "concat", axis=axis, sp_inputs=tensors)



def test_concat_sparse_key_overflow_with_empty_dense_dim():
    t = SparseTensor(indices=np.zeros((0, 2), np.int64), values=np.zeros((0, 0)), dense_shape=[2**32, 2**30, 0])
    raises(InvalidArgumentError, "SHAPE_OVERFLOW", "concat", axis=0, sp_inputs=[t, t])


def test_concat_sparse_dim_mismatch():
    a = SparseTensor(indices=[[0, 0]], values=np.array([1.0]), dense_shape=[2, 2])
    b = SparseTensor(indices=[[0]], values=np.array([[1.0, 2.0]]), dense_shape=[2, 2])
    raises(InvalidArgumentError, "SPARSE_DIM_MISMATCH", "concat", axis=0, sp_inputs=[a, b])


# ============================================================= fill_empty_rows
@settings(max_examples=80, deadline=None)
@given(t=coo_tensors(min_dim=1, values=VALUES))
def test_fill_empty_rows_matches_reference(t):
    default = True if t.dtype == np.bool_ else 7
    out, empty = run("fill_empty_rows", sp_input=t, default_value=default)
    rows = t.dense_shape[0]
    ref_empty = np.ones(rows, bool)
    ref_empty[t.indices[:, 0]] = False
    np.testing.assert_array_equal(empty, ref_empty)
    entries = [(tuple(t.indices[i]), t.values[i]) for i in range(t.nnz)]
    block = t.dense_shape[t.sparse_ndim:]
    entries += [((r,) + (0,) * (t.sparse_ndim - 1), np.full(block, default, t.dtype))
                for r in np.flatnonzero(ref_empty)]
    entries.sort(key=lambda e: e[0][0])  # by row only, stable: a row keeps its input order (TensorFlow's)
    assert out.dense_shape == t.dense_shape and out.dtype == t.dtype
    assert out.indices.tolist() == [list(e[0]) for e in entries]
    np.testing.assert_array_equal(out.values, np.array([e[1] for e in entries], t.dtype).reshape(
        (len(entries), *block)))


def test_fill_empty_rows_edges():
    t = SparseTensor(indices=np.zeros((0, 1), np.int64), values=np.zeros(0, np.complex128), dense_shape=[3])
    out, empty = run("fill_empty_rows", sp_input=t, default_value=1j)
    assert out.indices.tolist() == [[0], [1], [2]] and out.values.tolist() == [1j] * 3
    assert empty.tolist() == [True] * 3
    t = SparseTensor(indices=np.zeros((0, 2), np.int64), values=np.zeros(0), dense_shape=[0, 4])
    out, empty = run("fill_empty_rows", sp_input=t, default_value=0.0)
    assert out.nnz == 0 and empty.shape == (0,)
    t = SparseTensor(indices=np.zeros((0, 2), np.int64), values=np.zeros(0), dense_shape=[2, 0])
    raises(InvalidArgumentError, "EMPTY_DIMENSION", "fill_empty_rows", sp_input=t, default_value=0.0)
    t = SparseTensor(indices=[[0, 0]], values=np.array([1], np.uint8), dense_shape=[2, 2])
    raises(InvalidArgumentError, "SCALAR_DTYPE", "fill_empty_rows", sp_input=t, default_value=-1)


# ====================================================================== select
@st.composite
def select_cases(draw):
    t = draw(coo_tensors(min_dim=1, values=VALUES))
    n = draw(st.integers(0, t.ndim))
    index = []
    for d in range(n):
        dim = t.dense_shape[d]
        if draw(st.booleans()):
            index.append(draw(st.integers(-dim, dim - 1)))
        else:
            bound = st.one_of(st.none(), st.integers(-dim - 2, dim + 2))
            index.append(slice(draw(bound), draw(bound), draw(st.one_of(st.none(), st.integers(1, 3)))))
    return t, index


def wire_index(index):
    return [[i.start, i.stop, i.step] if isinstance(i, slice) else i for i in index]


@settings(max_examples=100, deadline=None)
@given(case=select_cases())
def test_select_matches_reference(case):
    t, index = case
    out = run("select", sp_input=t, index=wire_index(index))
    ref = reference_dense(t)[tuple(index)]
    if all(isinstance(i, int) for i in index[:t.sparse_ndim]) and len(index) >= t.sparse_ndim:
        assert isinstance(out, np.ndarray)
        assert out.dtype == t.dtype and out.shape == ref.shape
        np.testing.assert_array_equal(out, ref)
    else:
        assert isinstance(out, SparseTensor) and out.dtype == t.dtype
        assert out.dense_shape == ref.shape
        np.testing.assert_array_equal(reference_dense(out), ref)
        kept = sum(1 for i in index[:t.sparse_ndim] if isinstance(i, slice)) + max(0, t.sparse_ndim - len(index))
        assert out.sparse_ndim == kept


def test_select_keeps_order_and_duplicates():
    t = SparseTensor(indices=[[2, 1], [0, 1], [2, 1], [1, 3]], values=np.array([1, 2, 3, 4], np.int16),
                     dense_shape=[3, 4])
    out = run("select", sp_input=t, index=[[None, None, None], 1])
    assert out.indices.tolist() == [[2], [0], [2]] and out.values.tolist() == [1, 2, 3]
    assert run("select", sp_input=t, index=[2, 1]).tolist() == 4  # repeats summed in the dense result
    out = run("select", sp_input=t, index=[[-2, None, None]])
    assert out.indices.tolist() == [[1, 1], [1, 1], [0, 3]] and out.values.tolist() == [1, 3, 4]
    assert out.dense_shape == (2, 4)


def test_select_huge_slice_bounds():
    t = SparseTensor(indices=[[0, 1], [2, 3]], values=np.array([1.0, 2.0]), dense_shape=[3, 4])
    out = run("select", sp_input=t, index=[[-10**30, 10**30, 10**30]])
    assert out.indices.tolist() == [[0, 1]] and out.dense_shape == (1, 4)


def test_sparse_to_dense_scalar_output():
    out = run("sparse_to_dense", sparse_indices=np.zeros((1, 0), np.int64), output_shape=[],
              sparse_values=np.array([3.0]), default_value=1.0)
    assert out.shape == () and out.tolist() == 3.0


def test_select_hybrid_dense_dims():
    t = SparseTensor(indices=[[0], [2]], values=np.arange(12.0).reshape(2, 2, 3), dense_shape=[3, 2, 3])
    out = run("select", sp_input=t, index=[[None, None, None], 1, [0, None, 2]])
    assert out.dense_shape == (3, 2) and out.indices.tolist() == [[0], [2]]
    assert out.values.tolist() == [[3, 5], [9, 11]]
    np.testing.assert_array_equal(run("select", sp_input=t, index=[1]), np.zeros((2, 3)))


@pytest.mark.parametrize("index, reason", [
    ([[0, None, 0]], "BAD_SLICE_STEP"),
    ([[None, None, -1]], "BAD_SLICE_STEP"),
    ([3], "INDEX_OUT_OF_RANGE"),
    ([-4], "INDEX_OUT_OF_RANGE"),
    ([0, 4], "INDEX_OUT_OF_RANGE"),
    ([0, 0, 0], "TOO_MANY_INDICES"),
    ([10**30], "INDEX_OUT_OF_RANGE"),
])
def test_select_errors(index, reason):
    t = SparseTensor(indices=[[0, 1]], values=np.array([1.0]), dense_shape=[3, 4])
    raises(InvalidArgumentError, reason, "select", sp_input=t, index=index)


# ================================================================ over the wires
def test_every_op_over_every_wire(client):
    st_ = SparseTensor(indices=[[0, 1], [0, 3], [2, 0], [3, 1]], values=np.array([1.0, 2, 3, 4]),
                       dense_shape=[5, 6])
    out, empty = client.fill_empty_rows(st_, 0.0)
    assert out.indices.tolist() == [[0, 1], [0, 3], [1, 0], [2, 0], [3, 1], [4, 0]]
    assert np.asarray(empty).tolist() == [False, True, False, False, True]

    a = SparseTensor(indices=[[0, 2], [1, 0], [1, 1]], values=np.array([1, 2, 3]), dense_shape=[2, 3])
    b = SparseTensor(indices=[[0, 1], [0, 2]], values=np.array([4, 5]), dense_shape=[2, 4])
    out = client.concat(axis=1, sp_inputs=[a, b])
    assert out.indices.tolist() == [[0, 2], [0, 4], [0, 5], [1, 0], [1, 1]]
    assert out.values.tolist() == [1, 4, 5, 2, 3] and tuple(out.dense_shape) == (2, 7)

    out = client.select(st_, [0, slice(1, 4)])
    assert out.indices.tolist() == [[0], [2]] and out.values.tolist() == [1.0, 2.0]
    assert np.asarray(client.select(st_, [2, 0])).tolist() == 3.0

    ids = SparseTensor(indices=[[0, 0], [1, 1]], values=np.array([2, 0], np.int64), dense_shape=[2, 2])
    ind = client.to_indicator(ids, 3)
    assert ind.dtype == np.bool_ and ind.tolist() == [[False, False, True], [True, False, False]]

    dense = client.sparse_to_dense(sparse_indices=np.array([[0, 1], [1, 0]]), output_shape=[2, 2],
                                   sparse_values=np.array([5.0, 6.0]), default_value=-1.0)
    np.testing.assert_array_equal(dense, [[-1, 5], [6, -1]])
    dense = client.sparse_to_dense(sparse_indices=np.array(2), output_shape=[4], sparse_values=np.array(True),
                                   default_value=False)
    assert dense.dtype == np.bool_ and dense.tolist() == [False, False, True, False]

    with pytest.raises(InvalidArgumentError) as info:
        client.select(st_, [slice(None, None, -1)])
    assert info.value.reason == "BAD_SLICE_STEP"
    with pytest.raises(UnimplementedError) as info:
        client.to_indicator(st_, 3)
    assert info.value.reason == "UNSUPPORTED_DTYPE"
    with pytest.raises(ResourceExhaustedError) as info:
        client.sparse_to_dense(sparse_indices=np.array([[0, 0]]), output_shape=[10**6, 10**6],
                               sparse_values=np.array(1.0))
    assert info.value.reason == "RESULT_TOO_LARGE"


def test_handle_inputs(client):
    a = SparseTensor(indices=[[1, 0]], values=np.array([1.0]), dense_shape=[2, 2])
    b = SparseTensor(indices=[[0, 1]], values=np.array([2.0]), dense_shape=[1, 2])
    ha = client.put(a)
    try:
        out = client.concat(axis=0, sp_inputs=[ha, b])
        assert out.indices.tolist() == [[1, 0], [2, 1]] and out.values.tolist() == [1.0, 2.0]
        out, empty = client.fill_empty_rows(ha, 9.0)
        assert out.indices.tolist() == [[0, 0], [1, 0]] and out.values.tolist() == [9.0, 1.0]
    finally:
        client.delete(ha)


# ======================================================= CSR, CSC, BSR and BSC
SETTINGS = settings(max_examples=30, deadline=None)


@SETTINGS
@given(t=compressed_tensors(dtypes=("int8", "int64", "uint8")), vocab=st.integers(6, 8))
def test_to_indicator(t, vocab):
    t = SparseTensor(layout=t.layout, compressed_indices=t.compressed_indices, plain_indices=t.plain_indices,
                     values=np.abs(t.values.astype(np.int64)).astype(t.dtype), dense_shape=t.dense_shape,
                     blocksize=t.blocksize)
    assert_eq(run("to_indicator", sp_input=t, vocab_size=vocab),
              run("to_indicator", sp_input=coo_view(t), vocab_size=vocab), exact=True)
    if t.values.size and t.values.max() > 0:
        raises(InvalidArgumentError, "VALUE_OUT_OF_RANGE", "to_indicator", sp_input=t, vocab_size=int(t.values.max()))


@SETTINGS
@given(t=compressed_tensors(dtypes=DTYPES))
def test_fill_empty_rows(t):
    default = True if t.dtype == np.bool_ else 7

    def ours():
        return run("fill_empty_rows", sp_input=t, default_value=default)

    def want():
        out, empty = run("fill_empty_rows", sp_input=coo_view(t), default_value=default)
        return back(out, t), empty

    expected = expect(want)
    if isinstance(expected, InvalidArgumentError):
        assert op_raises_any(InvalidArgumentError, "fill_empty_rows", sp_input=t,
                             default_value=default).reason == expected.reason
        return
    out, empty = ours()
    assert_eq(out, expected[0], exact=True)
    assert_eq(empty, expected[1], exact=True)


@SETTINGS
@given(data=st.data())
def test_concat(data):
    spec = data.draw(layout_specs())
    tensors = [data.draw(compressed_tensors(spec, dtypes=("float64",))) for _ in range(data.draw(st.integers(1, 3)))]
    rank = tensors[0].ndim
    axis = data.draw(st.integers(-rank, rank - 1))
    if len(tensors) == 1:  # as tf.sparse.concat: one input comes back as it is
        assert_eq(run("concat", axis=axis, sp_inputs=tensors), tensors[0], exact=True)
        return
    assert_same_or_error(lambda: run("concat", axis=axis, sp_inputs=tensors),
                         lambda: back(run("concat", axis=axis, sp_inputs=[coo_view(t) for t in tensors]),
                                      tensors[0]))


def test_concat_mixed_layouts_is_unimplemented():
    coo = run("from_dense", tensor=np.eye(2))
    csr = run("convert", sp_input=coo, layout="csr")
    err = raises(UnimplementedError, "UNSUPPORTED_LAYOUT", "concat", axis=0, sp_inputs=[csr, coo])
    assert "coo" in err.message and "csr" in err.message


def draw_index(data, shape):
    index = []
    for d in shape[:data.draw(st.integers(0, len(shape)))]:
        if d and data.draw(st.booleans()):
            index.append(data.draw(st.integers(-d, d - 1)))
        else:
            index.append([data.draw(st.one_of(st.none(), st.integers(-d - 1, d + 1))),
                          data.draw(st.one_of(st.none(), st.integers(-d - 1, d + 1))),
                          data.draw(st.one_of(st.none(), st.integers(1, 3)))])
    return index


@SETTINGS
@given(t=compressed_tensors(dtypes=DTYPES, canonical=True), data=st.data())
def test_select(t, data):
    index = draw_index(data, t.dense_shape)
    nb = t.batch_ndim
    items = index + [[None, None, None]] * (t.ndim - len(index))
    keeps = not isinstance(items[nb], int) and not isinstance(items[nb + 1], int)
    want = run("select", sp_input=coo_view(t), index=index)
    if not keeps or not isinstance(want, SparseTensor):
        assert_eq(run("select", sp_input=t, index=index), want, exact=True)
        return
    rows, cols = want.dense_shape[want.indices.shape[1] - 2:want.indices.shape[1]]
    if t.blocksize is not None and (rows % t.blocksize[0] or cols % t.blocksize[1]):
        raises(InvalidArgumentError, "BLOCKSIZE", "select", sp_input=t, index=index)
        return
    assert_same_or_error(lambda: run("select", sp_input=t, index=index), lambda: back(want, t))


def test_select_examples_as_torch():
    d = np.array([[1.0, 0, 2, 0], [0, 0, 3, 0], [0, 0, 0, 0], [4, 5, 0, 6]])
    csr = run("convert", sp_input=run("from_dense", tensor=d), layout="csr")
    row = run("select", sp_input=csr, index=[0])  # torch: csr[0] is a sparse COO vector
    assert row.layout == "coo" and row.indices.tolist() == [[0], [2]] and row.values.tolist() == [1.0, 2.0]
    assert run("select", sp_input=csr, index=[3, 1]).tolist() == 5.0  # both fixed: dense
    part = run("select", sp_input=csr, index=[[1, 4, None]])
    assert part.layout == "csr" and part.to_dense().tolist() == d[1:].tolist()
