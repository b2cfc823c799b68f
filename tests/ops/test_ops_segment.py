"""Segment reductions (segment_sum, segment_mean, segment_sqrt_n) and bincount.

TensorFlow's documented examples as written, edge cases (empty segments, leading empty rows,
num_segments, empty inputs, repeated indices, higher-rank data, integer wrap-around, float16
summed in float32), inputs large enough for the parallel path (against numpy references, and
bad entries in several chunks: the first is named), every error (class, reason, the position in
the message), the --max-result-bytes bound, and every op over every wire. The differential tests
against TensorFlow itself are in tests/oracle/test_oracle_segment.py."""

from __future__ import annotations

import numpy as np
import pytest

from sparseserve import (InvalidArgumentError, ResourceExhaustedError, SparseTensor,
                         UnimplementedError)
from sparseserve.kernels import PARALLEL_MIN
from conftest import op_raises, run_op

run, raises = run_op, op_raises
SEGMENT_OPS = ("segment_sum", "segment_mean", "segment_sqrt_n")
C = np.array([[1, 2, 3, 4], [-1, -2, -3, -4], [5, 6, 7, 8]], np.float32)


def reference(op, data, indices, ids, num_segments=None):
    """The definition, one entry at a time, in float64."""
    n_out = num_segments if num_segments is not None else (int(ids[-1]) + 1 if len(ids) else 0)
    acc = np.zeros((n_out, *data.shape[1:]), np.float64)
    count = np.zeros(n_out, np.int64)
    for x, s in zip(indices, ids):
        acc[s] += data[x]
        count[s] += 1
    shape = (n_out,) + (1,) * (data.ndim - 1)
    if op == "segment_mean":
        acc = np.where(count.reshape(shape) > 0, acc / np.maximum(count, 1).reshape(shape), 0)
    elif op == "segment_sqrt_n":
        acc = np.where(count.reshape(shape) > 0, acc / np.sqrt(np.maximum(count, 1)).reshape(shape), 0)
    return acc


# ================================================================ segment reductions
def test_tensorflow_documented_examples():
    assert run("segment_sum", data=C, indices=[0, 1], segment_ids=[0, 0]).tolist() == [[0, 0, 0, 0]]
    assert run("segment_sum", data=C, indices=[0, 1], segment_ids=[0, 1]).tolist() == \
        [[1, 2, 3, 4], [-1, -2, -3, -4]]
    assert run("segment_sum", data=C, indices=[0, 1], segment_ids=[0, 2], num_segments=4).tolist() == \
        [[1, 2, 3, 4], [0, 0, 0, 0], [-1, -2, -3, -4], [0, 0, 0, 0]]
    assert run("segment_sum", data=C, indices=[0, 2], segment_ids=[0, 0]).tolist() == [[6, 8, 10, 12]]
    assert run("segment_mean", data=C, indices=[0, 2], segment_ids=[0, 0]).tolist() == [[3, 4, 5, 6]]
    out = run("segment_sqrt_n", data=C, indices=[0, 2], segment_ids=[0, 0])
    np.testing.assert_allclose(out, [[6 / np.sqrt(2), 8 / np.sqrt(2), 10 / np.sqrt(2), 12 / np.sqrt(2)]],
                               rtol=1e-6)
    assert out.dtype == np.float32


@pytest.mark.parametrize("op", SEGMENT_OPS)
def test_empty_segments_leading_rows_and_num_segments(op):
    data = np.arange(12, dtype=np.float64).reshape(4, 3)
    out = run(op, data=data, indices=[3, 0, 1], segment_ids=[1, 1, 3])
    assert out.shape == (4, 3)
    np.testing.assert_allclose(out, reference(op, data, [3, 0, 1], [1, 1, 3]))
    assert out[0].tolist() == [0, 0, 0] and out[2].tolist() == [0, 0, 0]  # empty segments are 0
    out = run(op, data=data, indices=[3, 0, 1], segment_ids=[1, 1, 3], num_segments=7)
    np.testing.assert_allclose(out, reference(op, data, [3, 0, 1], [1, 1, 3], 7))
    assert out.shape == (7, 3) and not out[4:].any()


@pytest.mark.parametrize("op", SEGMENT_OPS)
def test_empty_inputs(op):
    data = np.ones((3, 2), np.float32)
    empty = np.zeros(0, np.int64)
    assert run(op, data=data, indices=empty, segment_ids=empty).shape == (0, 2)
    assert run(op, data=data, indices=[], segment_ids=[]).shape == (0, 2)  # JSON's [] decodes as float
    out = run(op, data=data, indices=empty, segment_ids=empty, num_segments=3)
    assert out.tolist() == [[0, 0]] * 3 and out.dtype == np.float32
    assert run(op, data=data, indices=empty, segment_ids=empty, num_segments=0).shape == (0, 2)
    assert run(op, data=np.ones((0, 2)), indices=empty, segment_ids=empty).shape == (0, 2)
    assert run(op, data=np.ones((3, 0)), indices=[0, 1], segment_ids=[0, 2]).shape == (3, 0)


@pytest.mark.parametrize("op", SEGMENT_OPS)
def test_repeated_indices_higher_rank_and_vectors(op):
    rng = np.random.default_rng(0)
    data = rng.integers(-5, 6, (5, 2, 3)).astype(np.float64)
    indices, ids = [4, 4, 0, 2, 4], [0, 0, 0, 3, 3]
    out = run(op, data=data, indices=indices, segment_ids=ids)
    assert out.shape == (4, 2, 3)
    np.testing.assert_allclose(out, reference(op, data, indices, ids))
    vector = np.array([1.0, 2.0, 4.0, 8.0])
    np.testing.assert_allclose(run(op, data=vector, indices=[3, 3, 0], segment_ids=[0, 0, 1]),
                               reference(op, vector, [3, 3, 0], [0, 0, 1]))


@pytest.mark.parametrize("index_dtypes", [("int32", "int32"), ("int64", "int64"), ("int32", "int64"),
                                          ("int64", "int32")])
def test_index_dtypes(index_dtypes):
    a, b = index_dtypes
    out = run("segment_sum", data=C, indices=np.array([0, 2, 1], a), segment_ids=np.array([0, 0, 1], b))
    assert out.tolist() == [[6, 8, 10, 12], [-1, -2, -3, -4]]


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                                   "float16", "float32", "float64"])
def test_segment_sum_dtypes(dtype):
    data = np.arange(12).reshape(4, 3).astype(dtype)
    out = run("segment_sum", data=data, indices=[0, 1, 2], segment_ids=[0, 0, 2])
    assert out.dtype == np.dtype(dtype)
    assert out.tolist() == [[3, 5, 7], [0, 0, 0], [6, 7, 8]]


def test_integers_wrap_and_float16_sums_in_float32():
    # As TensorFlow: int8 100 + 100 + 100 = 44; 3000 float16 ones sum to 3000 (2048 + 1 == 2048 in float16).
    out = run("segment_sum", data=np.full((3, 1), 100, np.int8), indices=[0, 1, 2], segment_ids=[0, 0, 0])
    assert out.tolist() == [[44]]
    big = np.iinfo(np.uint64).max
    out = run("segment_sum", data=np.array([big, 2], np.uint64), indices=[0, 1], segment_ids=[0, 0])
    assert out.tolist() == [1]
    ones = np.ones((3000, 1), np.float16)
    ids = np.zeros(3000, np.int64)
    assert run("segment_sum", data=ones, indices=np.arange(3000), segment_ids=ids).tolist() == [[3000]]
    assert run("segment_mean", data=ones, indices=np.arange(3000), segment_ids=ids).tolist() == [[1]]


def test_mean_and_sqrt_n_keep_a_single_value_exactly():
    data = np.array([[-0.0, 0.1, np.inf]], np.float64)
    for op in ("segment_mean", "segment_sqrt_n"):
        out = run(op, data=data, indices=[0], segment_ids=[0])
        assert np.signbit(out[0, 0]) and out[0, 1] == 0.1 and out[0, 2] == np.inf


@pytest.mark.parametrize("op", SEGMENT_OPS)
@pytest.mark.parametrize("pattern", ["arange", "permutation", "repeats"])
def test_parallel_path_against_reference(op, pattern):
    rng = np.random.default_rng(1)
    k = 3 * PARALLEL_MIN
    data = rng.integers(-8, 9, (k, 3)).astype(np.float64) / 2
    indices = {"arange": np.arange(k), "permutation": rng.permutation(k),
               "repeats": rng.integers(0, 50, k)}[pattern]
    ids = np.sort(rng.integers(0, k // 7, k))
    ids[: k // 3] = ids[0]  # one long segment across chunk boundaries
    out = run(op, data=data, indices=indices, segment_ids=ids, num_segments=k // 7 + 5)
    want = np.zeros((k // 7 + 5, 3))
    counts = np.bincount(ids, minlength=k // 7 + 5)
    np.add.at(want, ids, data[indices])
    if op == "segment_mean":
        want = np.where(counts[:, None] > 0, want / np.maximum(counts, 1)[:, None], 0)
    elif op == "segment_sqrt_n":
        want = np.where(counts[:, None] > 0, want / np.sqrt(np.maximum(counts, 1))[:, None], 0)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-9)


def test_parallel_path_names_the_first_bad_entry():
    k = 4 * PARALLEL_MIN
    data = np.ones((10, 2), np.float32)
    indices = np.arange(k) % 10
    ids = np.arange(k) // 4
    bad = indices.copy()
    bad[[k - 5, k // 2 + 3, 70_001]] = [10, -1, 12]
    err = raises(InvalidArgumentError, "INDEX_OUT_OF_RANGE", "segment_sum", data=data, indices=bad,
                 segment_ids=ids)
    assert "indices[70001] = 12" in err.message and "data.shape[0] = 10" in err.message
    unsorted = ids.copy()
    unsorted[k - 3] = 0
    unsorted[k // 2] = 5
    err = raises(InvalidArgumentError, "SEGMENT_IDS_UNSORTED", "segment_sum", data=data, indices=indices,
                 segment_ids=unsorted, num_segments=k)
    assert f"segment_ids[{k // 2}] = 5 is less than segment_ids[{k // 2 - 1}]" in err.message
    err = raises(InvalidArgumentError, "SEGMENT_ID_OUT_OF_RANGE", "segment_sum", data=data, indices=indices,
                 segment_ids=ids, num_segments=k // 8)
    assert f"segment_ids[{k // 2}] = {k // 8} is out of range for num_segments = {k // 8}" in err.message


@pytest.mark.parametrize("op", SEGMENT_OPS)
def test_errors(op):
    data = np.ones((4, 3), np.float32)
    err = raises(InvalidArgumentError, "INDEX_OUT_OF_RANGE", op, data=data, indices=[0, 1, 4], segment_ids=[0, 0, 1])
    assert "indices[2] = 4 is out of range for data.shape[0] = 4" in err.message
    err = raises(InvalidArgumentError, "INDEX_OUT_OF_RANGE", op, data=data, indices=[0, -1], segment_ids=[0, 0])
    assert "indices[1] = -1" in err.message
    err = raises(InvalidArgumentError, "SEGMENT_IDS_UNSORTED", op, data=data, indices=[0, 1, 2],
                 segment_ids=[1, 0, 1])
    assert "segment_ids[1] = 0 is less than segment_ids[0] = 1" in err.message and "sorted" in err.message
    raises(InvalidArgumentError, "SEGMENT_IDS_UNSORTED", op, data=data, indices=[0, 1, 2], segment_ids=[1, 0, 1],
           num_segments=3)  # sorted ids are required with num_segments too, as in TensorFlow
    err = raises(InvalidArgumentError, "SEGMENT_IDS_UNSORTED", op, data=data, indices=[0, 1, 2], segment_ids=[0, 5, 2])
    assert "segment_ids[1] = 5 is greater than the last segment id 2" in err.message
    err = raises(InvalidArgumentError, "SEGMENT_ID_OUT_OF_RANGE", op, data=data, indices=[0, 1],
                 segment_ids=[-1, 0])
    assert "segment_ids[0] = -1 is negative" in err.message
    err = raises(InvalidArgumentError, "SEGMENT_ID_OUT_OF_RANGE", op, data=data, indices=[0, 1, 2],
                 segment_ids=[0, 1, 2], num_segments=2)
    assert "segment_ids[2] = 2 is out of range for num_segments = 2" in err.message
    raises(InvalidArgumentError, "SEGMENT_ID_OUT_OF_RANGE", op, data=data, indices=[0], segment_ids=[0],
           num_segments=0)
    err = raises(InvalidArgumentError, "VALUE_OUT_OF_RANGE", op, data=data, indices=[0], segment_ids=[0],
                 num_segments=-1)
    assert "num_segments = -1" in err.message
    raises(InvalidArgumentError, "VALUE_OUT_OF_RANGE", op, data=data, indices=[0], segment_ids=[0],
           num_segments=2**64)
    err = raises(InvalidArgumentError, "SHAPE_MISMATCH", op, data=data, indices=[0, 1], segment_ids=[0, 0, 1])
    assert "indices has 2 elements and segment_ids has 3" in err.message
    raises(InvalidArgumentError, "RANK", op, data=data, indices=[[0, 1]], segment_ids=[[0, 0]])
    raises(InvalidArgumentError, "RANK", op, data=data, indices=[0], segment_ids=0)
    raises(InvalidArgumentError, "RANK_TOO_LOW", op, data=np.array(1, np.float32), indices=[0], segment_ids=[0])
    err = raises(InvalidArgumentError, "BAD_DTYPE", op, data=data, indices=np.array([0], np.int16),
                 segment_ids=[0])
    assert "indices has dtype int16" in err.message
    raises(InvalidArgumentError, "BAD_DTYPE", op, data=data, indices=[0], segment_ids=[0.5])
    raises(InvalidArgumentError, "INDEX_OUT_OF_RANGE", op, data=np.ones((0, 3)), indices=[0], segment_ids=[0])


def test_unsupported_dtypes():
    for dtype in ("bool", "complex64", "complex128"):
        err = raises(UnimplementedError, "UNSUPPORTED_DTYPE", "segment_sum", data=np.ones((2, 2), dtype),
                     indices=[0], segment_ids=[0])
        assert dtype in err.message
    for op in ("segment_mean", "segment_sqrt_n"):
        for dtype in ("int32", "int64", "uint8", "complex64", "bool"):
            raises(UnimplementedError, "UNSUPPORTED_DTYPE", op, data=np.ones((2, 2), dtype), indices=[0],
                   segment_ids=[0])


# ================================================================ bincount
V = np.array([[1, 2, 2], [0, 5, 1]], np.int32)


def sparse(t: SparseTensor):
    return t.indices.tolist(), t.values.tolist(), t.values.dtype.name, list(t.dense_shape)


def test_bincount_dense_as_tensorflow():
    # Every expected value below is what tf.sparse.bincount 2.21 returns for the same call.
    assert sparse(run("bincount", values=V)) == ([[0], [1], [2], [5]], [1, 2, 2, 1], "int32", [6])
    assert sparse(run("bincount", values=V, axis=-1)) == (
        [[0, 1], [0, 2], [1, 0], [1, 1], [1, 5]], [1, 2, 1, 1, 1], "int32", [2, 6])
    assert sparse(run("bincount", values=V.astype(np.int64)))[2] == "int64"
    assert sparse(run("bincount", values=V, minlength=8))[3] == [8]
    assert sparse(run("bincount", values=V, minlength=2))[3] == [6]
    assert sparse(run("bincount", values=V, maxlength=3)) == ([[0], [1], [2]], [1, 2, 2], "int32", [3])
    assert sparse(run("bincount", values=V, maxlength=10))[3] == [10]  # maxlength is the length
    assert sparse(run("bincount", values=V, maxlength=3, minlength=5))[3] == [3]
    assert sparse(run("bincount", values=V, maxlength=0)) == ([], [], "int32", [0])
    assert sparse(run("bincount", values=V, minlength=-1, maxlength=-1))[3] == [6]  # negative: not given
    assert sparse(run("bincount", values=V, maxlength=1, axis=-1)) == ([[1, 0]], [1], "int32", [2, 1])
    w = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    assert sparse(run("bincount", values=V, weights=w)) == ([[0], [1], [2], [5]], [4, 7, 5, 5], "float32", [6])
    assert sparse(run("bincount", values=V, weights=w.astype(np.float64), axis=-1)) == (
        [[0, 1], [0, 2], [1, 0], [1, 1], [1, 5]], [1, 5, 4, 6, 5], "float64", [2, 6])
    assert sparse(run("bincount", values=V, weights=w.astype(np.int64)))[1:3] == ([4, 7, 5, 5], "int64")
    assert sparse(run("bincount", values=V, weights=np.ones((3, 2), np.float32)))[1] == [1, 2, 2, 1]
    assert sparse(run("bincount", values=V, weights=np.zeros((2, 3))))[:2] == ([[0], [1], [2], [5]], [0, 0, 0, 0])
    assert sparse(run("bincount", values=V, binary_output=True, axis=-1)) == (
        [[0, 1], [0, 2], [1, 0], [1, 1], [1, 5]], [1, 1, 1, 1, 1], "int32", [2, 6])
    assert sparse(run("bincount", values=np.array([3, 1, 3, 0], np.int64), axis=-1)) == (
        [[0], [1], [3]], [1, 1, 2], "int64", [4])
    assert sparse(run("bincount", values=np.ones((2, 2, 2), np.int32))) == ([[1]], [8], "int32", [2])
    assert sparse(run("bincount", values=np.array(3, np.int32))) == ([[3]], [1], "int32", [4])


def test_bincount_empty_and_huge_values():
    assert sparse(run("bincount", values=np.zeros(0, np.int32))) == ([], [], "int32", [1])
    assert sparse(run("bincount", values=np.zeros(0, np.int32), minlength=4))[3] == [4]
    assert sparse(run("bincount", values=np.zeros((3, 0), np.int32), axis=-1, minlength=3)) == (
        [], [], "int32", [3, 3])
    assert sparse(run("bincount", values=np.zeros((0, 3), np.int32), axis=-1))[3] == [0, 1]
    # Huge values and lengths cost nothing: bins are keyed, never allocated.
    assert sparse(run("bincount", values=np.array([2**40, 3, 2**40], np.int64))) == (
        [[3], [2**40]], [1, 2], "int64", [2**40 + 1])
    assert sparse(run("bincount", values=np.array([1], np.int32), minlength=2**40))[3] == [2**40]
    assert sparse(run("bincount", values=np.array([[2**62, 1]], np.int64), axis=-1))[3] == [1, 2**62 + 1]
    err = raises(InvalidArgumentError, "SHAPE_OVERFLOW", "bincount", values=np.array([2**63 - 1], np.int64))
    assert "maxlength" in err.message
    assert sparse(run("bincount", values=np.array([2**63 - 1], np.int64), maxlength=5))[3] == [5]
    raises(InvalidArgumentError, "SHAPE_OVERFLOW", "bincount", values=np.array([[2**62, 1], [0, 1]], np.int64),
           axis=-1)
    raises(InvalidArgumentError, "SHAPE_OVERFLOW", "bincount", values=np.array([1], np.int32), minlength=2**64)


def test_bincount_sparse_values():
    sp = SparseTensor(indices=[[0, 1], [0, 3], [1, 0], [1, 2], [1, 4]], values=np.array([3, 1, 3, 2, 3], np.int64),
                      dense_shape=[3, 5])
    assert sparse(run("bincount", values=sp)) == ([[1], [2], [3]], [1, 1, 3], "int64", [4])
    assert sparse(run("bincount", values=sp, axis=-1)) == ([[0, 1], [0, 3], [1, 2], [1, 3]], [1, 1, 1, 2], "int64",
                                                            [3, 4])
    weights = SparseTensor(indices=sp.indices, values=np.array([1, 2, 3, 4, 5], np.float32), dense_shape=[3, 5])
    assert sparse(run("bincount", values=sp, weights=weights)) == ([[1], [2], [3]], [2, 4, 9], "float32", [4])
    assert sparse(run("bincount", values=sp, axis=-1, binary_output=True))[1] == [1, 1, 1, 1]
    assert sparse(run("bincount", values=sp, axis=-1, maxlength=3)) == ([[0, 1], [1, 2]], [1, 1], "int64", [3, 3])
    unsorted = SparseTensor(indices=[[1, 0], [0, 3], [0, 1], [1, 0]], values=np.array([3, 1, 3, 2], np.int64),
                            dense_shape=[3, 5])
    assert sparse(run("bincount", values=unsorted, axis=-1)) == (
        [[0, 1], [0, 3], [1, 2], [1, 3]], [1, 1, 1, 1], "int64", [3, 4])
    rank3 = SparseTensor(indices=[[0, 1, 0], [1, 0, 1]], values=np.array([3, 1], np.int64), dense_shape=[2, 2, 2])
    assert sparse(run("bincount", values=rank3, axis=-1)) == ([[0, 3], [1, 1]], [1, 1], "int64", [2, 4])
    vector = SparseTensor(indices=[[3], [0]], values=np.array([2, 1], np.int32), dense_shape=[4])
    assert sparse(run("bincount", values=vector, axis=-1)) == ([[1], [2]], [1, 1], "int32", [3])
    empty = SparseTensor(indices=np.zeros((0, 2), np.int64), values=np.zeros(0, np.int64), dense_shape=[3, 5])
    assert sparse(run("bincount", values=empty, axis=-1)) == ([], [], "int64", [3, 1])
    # Other layouts are read as COO (CSR's entries in row-major order).
    csr = run("convert", sp_input=sp, layout="csr")
    assert sparse(run("bincount", values=csr, axis=-1)) == sparse(run("bincount", values=sp, axis=-1))
    csr_w = run("convert", sp_input=weights, layout="csr")
    assert sparse(run("bincount", values=csr, weights=csr_w)) == sparse(run("bincount", values=sp, weights=weights))


def test_bincount_sort_path_sums_weights_in_input_order():
    rng = np.random.default_rng(2)
    values = rng.integers(0, 2**40, 5000)
    values[::3] = values[0]
    weights = rng.standard_normal(5000).astype(np.float32)
    out = run("bincount", values=values, weights=weights)
    keys, inverse = np.unique(values, return_inverse=True)
    want = np.zeros(keys.size, np.float32)
    for i, k in enumerate(inverse):  # sequential float32 sums, as TensorFlow adds them
        want[k] += weights[i]
    assert out.indices[:, 0].tolist() == keys.tolist()
    assert out.values.tobytes() == want.tobytes()
    small = run("bincount", values=values % 97, weights=weights)  # the dense accumulator path
    want = np.zeros(97, np.float32)
    for v, w in zip(values % 97, weights):
        want[v] += w
    assert small.values.tobytes() == want[np.unique(values % 97)].tobytes()


def test_bincount_errors():
    err = raises(InvalidArgumentError, "VALUE_OUT_OF_RANGE", "bincount", values=np.array([[1, 2], [-3, 1]], np.int32))
    assert "values[1, 0] = -3 is negative" in err.message
    raises(InvalidArgumentError, "VALUE_OUT_OF_RANGE", "bincount", values=np.array([5, -1], np.int32), maxlength=2)
    sp = SparseTensor(indices=[[0, 0], [0, 1]], values=np.array([1, -2], np.int64), dense_shape=[1, 2])
    err = raises(InvalidArgumentError, "VALUE_OUT_OF_RANGE", "bincount", values=sp, axis=-1)
    assert "values.values[1] = -2" in err.message
    raises(InvalidArgumentError, "AXIS_OUT_OF_RANGE", "bincount", values=V, axis=1)
    err = raises(InvalidArgumentError, "EXCLUSIVE_ARGUMENTS", "bincount", values=V, weights=np.ones((2, 3)),
                 binary_output=True)
    assert "mutually exclusive" in err.message
    raises(InvalidArgumentError, "RANK", "bincount", values=np.ones((2, 2, 2), np.int32), axis=-1)
    raises(InvalidArgumentError, "RANK", "bincount", values=np.array(1, np.int32), axis=-1)
    raises(InvalidArgumentError, "SHAPE_MISMATCH", "bincount", values=V, weights=np.ones(3))
    raises(InvalidArgumentError, "SHAPE_MISMATCH", "bincount", values=V, weights=np.ones((3, 2)), axis=-1)
    sp = SparseTensor(indices=[[0, 1], [0, 3]], values=np.array([3, 1], np.int64), dense_shape=[3, 5])
    raises(InvalidArgumentError, "SHAPE_MISMATCH", "bincount", values=sp, weights=np.ones(2))
    other = SparseTensor(indices=[[0, 1], [0, 4]], values=np.ones(2), dense_shape=[3, 5])
    err = raises(InvalidArgumentError, "SHAPE_MISMATCH", "bincount", values=sp, weights=other)
    assert "same dense_shape and indices" in err.message
    raises(InvalidArgumentError, "SHAPE_MISMATCH", "bincount", values=V, weights=sp)
    for dtype in ("int16", "uint8", "float32", "bool"):
        raises(UnimplementedError, "UNSUPPORTED_DTYPE", "bincount", values=V.astype(dtype))
    for dtype in ("float16", "int8", "uint32", "complex64", "bool"):
        raises(UnimplementedError, "UNSUPPORTED_DTYPE", "bincount", values=V, weights=np.ones((2, 3), dtype))
    hybrid = SparseTensor(indices=[[0], [1]], values=np.ones((2, 2), np.int64), dense_shape=[3, 2])
    raises(UnimplementedError, "UNSUPPORTED_HYBRID", "bincount", values=hybrid)


# ================================================================ over the wires
def test_every_op_over_every_wire(client):
    assert client.segment_sum(C, [0, 1], [0, 2], num_segments=4).tolist() == \
        [[1, 2, 3, 4], [0, 0, 0, 0], [-1, -2, -3, -4], [0, 0, 0, 0]]
    assert client.segment_mean(C, np.array([0, 2], np.int32), np.array([0, 0], np.int32)).tolist() == [[3, 4, 5, 6]]
    np.testing.assert_allclose(client.segment_sqrt_n(C, [0, 2], [1, 1]), [[0] * 4, [6 / 2**0.5, 8 / 2**0.5,
                                                                                      10 / 2**0.5, 12 / 2**0.5]],
                               rtol=1e-6)
    assert client.segment_sum(C, [], []).shape == (0, 4)
    out = client.bincount(V, axis=-1, minlength=7)
    assert sparse(out) == ([[0, 1], [0, 2], [1, 0], [1, 1], [1, 5]], [1, 2, 1, 1, 1], "int32", [2, 7])
    sp = SparseTensor(indices=[[0, 1], [0, 3], [1, 0]], values=np.array([3, 1, 3], np.int64), dense_shape=[3, 5])
    weights = SparseTensor(indices=sp.indices, values=np.array([0.5, 1, 2]), dense_shape=[3, 5])
    assert sparse(client.bincount(sp, weights=weights)) == ([[1], [3]], [1.0, 2.5], "float64", [4])
    with pytest.raises(InvalidArgumentError) as info:
        client.segment_sum(C, [0, 7], [0, 0])
    assert info.value.reason == "INDEX_OUT_OF_RANGE" and "indices[1] = 7" in info.value.message
    with pytest.raises(InvalidArgumentError) as info:
        client.bincount(np.array([1, -1], np.int32))
    assert info.value.reason == "VALUE_OUT_OF_RANGE"
    # Output rows come from num_segments or the last id: held to --max-result-bytes before allocating.
    with pytest.raises(ResourceExhaustedError):
        client.segment_sum(C, [0], [0], num_segments=10**12)
    with pytest.raises(ResourceExhaustedError):
        client.segment_mean(C, [0, 1], [0, 10**12])
    assert client.segment_sum(C, [2], [0]).tolist() == [[5, 6, 7, 8]]  # still serving
    # bincount's bins are keyed, never allocated: a huge largest value or minlength costs nothing.
    assert sparse(client.bincount(np.array([2**40, 3], np.int64), minlength=5)) == (
        [[3], [2**40]], [1, 1], "int64", [2**40 + 1])


# ================================================================ warm start
def test_common_calls_after_warm_up_compile_nothing_new():
    """After kernels.warm_up(), segment ops over float32/float64/int32/int64 data (int32 or int64
    indices, both paths) and bincount (every weight dtype, both accumulators) add no numba
    signature: no compile inside a request. A fresh process, so other tests' compiles hide nothing."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import numpy as np
        from numba.core.registry import CPUDispatcher
        from sparseserve import kernels, SparseTensor
        from sparseserve.kernels import segment
        from sparseserve.kernels import PARALLEL_MIN
        from sparseserve.server.ops import REGISTRY

        def signatures():
            return {n: len(d.signatures) for n, d in vars(segment).items() if isinstance(d, CPUDispatcher)}

        def run(op, **args):
            o = REGISTRY.get(op)
            return o.run("cpu", o.bind(args))

        kernels.warm_up()
        before = signatures()
        for k in (7, 2 * PARALLEL_MIN):
            for index in ("int32", "int64"):
                indices = (np.arange(k) % 5).astype(index)
                ids = (np.arange(k) // 2).astype(index)
                for dtype in ("float32", "float64", "int32", "int64"):
                    data = np.ones((5, 3), dtype)
                    run("segment_sum", data=data, indices=indices, segment_ids=ids)
                    if dtype.startswith("float"):
                        run("segment_mean", data=data, indices=indices, segment_ids=ids, num_segments=k)
                        run("segment_sqrt_n", data=data[:, 0], indices=indices, segment_ids=ids)
        for dtype in ("int32", "int64"):
            values = np.arange(12, dtype=dtype).reshape(3, 4) % 5
            sp = SparseTensor(indices=[[0, 1], [2, 0]], values=np.array([3, 1], dtype), dense_shape=[3, 4])
            for axis in (0, -1):
                run("bincount", values=values, axis=axis)
                run("bincount", values=values * 10**6, axis=axis)
                run("bincount", values=values, axis=axis, binary_output=True)
                run("bincount", values=sp, axis=axis)
                for w in ("int32", "int64", "float32", "float64"):
                    run("bincount", values=values, weights=np.ones((3, 4), w), axis=axis)
                    run("bincount", values=values * 10**6, weights=np.ones((3, 4), w), axis=axis)
        after = signatures()
        print({n: (before[n], after[n]) for n in after if after[n] != before[n]})
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "{}", out.stdout


def test_a_negative_last_segment_id_is_named_as_such():
    """TensorFlow's own tests (testSegmentsInvalid6/7): ids [0, 0, 0, -1] are refused for the
    negative id, not for the ids before it that exceed it."""
    for ids in ([0, 0, 0, -1], [0, 0, 0, -2]):
        err = raises(InvalidArgumentError, "SEGMENT_ID_OUT_OF_RANGE", "segment_sum", data=np.ones((4, 2)),
                     indices=[0, 1, 2, 3], segment_ids=ids)
        assert f"segment_ids[3] = {ids[-1]} is negative" in err.message
