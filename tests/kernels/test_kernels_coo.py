"""The numba COO kernels against plain numpy references: every dtype, ranks 1
to 5, hybrid values, empty tensors, zero-size dimensions, duplicates and
unsorted input; plus the worked examples of the seed documents."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import assert_eq
from sparseserve import kernels
from sparseserve.core.dtypes import DTYPE_NAMES
from strategies import coo_tensors, random_coo

VALUES = {"low": -4, "high": 4, "halves": False}  # integers, for floats too: sums exact in float16


# ------------------------------------------------------------------ references
def ref_reorder(indices, values):
    order = np.lexsort(indices.T[::-1]) if indices.shape[0] else np.zeros(0, np.int64)
    return indices[order], values[order]


def ref_dense(indices, values, shape, default=0):
    out = np.zeros(shape, dtype=values.dtype)
    hit = np.zeros(shape[:indices.shape[1]], dtype=bool)
    for i in range(indices.shape[0]):
        key = tuple(indices[i])
        if values.dtype == np.bool_:
            out[key] = out[key] | values[i]
        elif values.dtype == np.float16:
            out[key] = (out[key].astype(np.float32) + values[i].astype(np.float32)).astype(np.float16)
        else:
            out[key] = out[key] + values[i]
        hit[key] = True
    out[~hit] = default
    return out


def ref_coalesce(indices, values, shape):
    dense = ref_dense(indices, values, shape)
    keys = np.unique(np.ravel_multi_index(indices.T, shape[:indices.shape[1]])) if indices.shape[0] \
        else np.zeros(0, np.int64)
    out_idx = np.stack(np.unravel_index(keys, shape[:indices.shape[1]]), axis=1).astype(np.int64) \
        if keys.size else np.zeros((0, indices.shape[1]), np.int64)
    return out_idx, dense[tuple(out_idx.T)] if keys.size else values[:0]


def make(rng, dtype, shape, sparse_ndim, nnz):
    """The arrays of a random COO tensor with repeats, in any order (``strategies.random_coo``)."""
    t = random_coo(rng, shape, nnz, dtype, sparse_ndim, values=VALUES)
    return t.indices, t.values


def check_reorder_and_coalesce(idx, vals, shape):
    ri, rv = kernels.reorder(idx, vals, shape)
    ei, ev = ref_reorder(idx, vals)
    assert_eq(ri, ei, exact=True)
    assert_eq(rv, ev, exact=True)
    ci, cv = kernels.coalesce(idx, vals, shape)
    ei, ev = ref_coalesce(idx, vals, shape)
    assert_eq(ci, ei, exact=True)
    assert_eq(cv, ev, exact=True)
    return ci, cv


SHAPES = [((7,), 1), ((4, 5), 2), ((3, 4, 2), 2), ((2, 3, 2, 2), 3), ((2, 2, 3, 2, 2), 5),
          ((0, 3), 2), ((3, 0, 2), 1)]


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("shape, sparse_ndim", SHAPES)
@pytest.mark.parametrize("nnz", [0, 1, 9])
def test_against_numpy(dtype, shape, sparse_ndim, nnz):
    rng = np.random.default_rng(nnz + len(shape))
    idx, vals = make(rng, dtype, shape, sparse_ndim, nnz)
    ci, cv = check_reorder_and_coalesce(idx, vals, shape)
    dense = ref_dense(idx, vals, shape)
    assert_eq(kernels.to_dense(idx, vals, shape, vals.dtype.type(0), False), dense, exact=True)
    assert_eq(kernels.to_dense(ci, cv, shape, vals.dtype.type(1), True), ref_dense(ci, cv, shape, 1), exact=True)
    fi, fv = kernels.from_dense(dense, sparse_ndim)
    keep = np.any(dense.reshape(int(np.prod(shape[:sparse_ndim])), int(np.prod(shape[sparse_ndim:]))) != 0, axis=1)
    assert fi.shape[0] == int(keep.sum())
    assert_eq(ref_dense(fi, fv, shape), dense, exact=True)
    assert kernels.first_disorder(fi, shape) == (-1, False) or fi.shape[0] < 2


def test_reorder_is_stable_for_duplicates():
    idx = np.array([[1, 0], [0, 2], [1, 0], [0, 2], [1, 0]], np.int64)
    vals = np.array([10, 20, 30, 40, 50])
    ri, rv = kernels.reorder(idx, vals, (2, 3))
    assert ri.tolist() == [[0, 2], [0, 2], [1, 0], [1, 0], [1, 0]]
    assert rv.tolist() == [20, 40, 10, 30, 50]


def test_first_disorder():
    shape = (3, 3)
    assert kernels.first_disorder(np.array([[0, 1], [1, 0]], np.int64), shape) == (-1, False)
    assert kernels.first_disorder(np.array([[0, 1], [0, 1]], np.int64), shape) == (1, True)
    assert kernels.first_disorder(np.array([[0, 1], [2, 0], [1, 2]], np.int64), shape) == (2, False)


def test_from_dense_zero_conventions():
    a = np.array([-0.0, np.nan, 0.0, 1.0])
    i, v = kernels.from_dense(a, 1)
    assert i.ravel().tolist() == [1, 3]
    h = np.array([-0.0, 2.0], dtype=np.float16)
    assert kernels.from_dense(h, 1)[0].ravel().tolist() == [1]


def test_integer_sums_wrap_and_float16_sums_in_float32():
    idx = np.zeros((3, 1), np.int64)
    _, v = kernels.coalesce(idx, np.array([100, 100, 100], np.int8), (1,))
    assert v.tolist() == [np.int8(300 - 256)]
    _, h = kernels.coalesce(np.zeros((4, 1), np.int64), np.array([2048, 1, 1, 1], np.float16), (1,))
    assert h.dtype == np.float16 and float(h[0]) == 2052.0  # float16 adds one at a time would stay 2048


# ------------------------------------------------------------------ seed examples
def test_seed_torch_coalesce_example():
    # torch.sparse: s = sparse_coo_tensor([[1, 1]], [3, 4], (3,)); s.coalesce() -> [[1]], [7]
    i, v = kernels.coalesce(np.array([[1], [1]], np.int64), np.array([3, 4]), (3,))
    assert i.tolist() == [[1]] and v.tolist() == [7]


def test_seed_torch_to_sparse_examples():
    # a = [[0, 2.], [3, 0]]; a.to_sparse() -> indices [[0, 1], [1, 0]], values [2., 3.]
    i, v = kernels.from_dense(np.array([[0, 2.0], [3, 0]]), 2)
    assert i.T.tolist() == [[0, 1], [1, 0]] and v.tolist() == [2.0, 3.0]
    # t = [[[1., 0], [2., 3.]], [[0, 0], [0, 0]]]... to_sparse(sparse_dim=2) keeps rows with any nonzero
    t = np.array([[[1.0, 0], [2.0, 3.0]], [[0, 0], [3.0, 4.0]]])
    i, v = kernels.from_dense(t, 2)
    assert i.T.tolist() == [[0, 0, 1], [0, 1, 1]]
    assert v.tolist() == [[1.0, 0.0], [2.0, 3.0], [3.0, 4.0]]


def test_seed_tf_reorder_example():
    # tf.sparse_reorder: shape [4, 5], [0, 3]: b, [0, 1]: a, [3, 1]: d, [2, 0]: c
    idx = np.array([[0, 3], [0, 1], [3, 1], [2, 0]], np.int64)
    ri, rv = kernels.reorder(idx, np.array(list("badc")), (4, 5))
    assert ri.tolist() == [[0, 1], [0, 3], [2, 0], [3, 1]] and rv.tolist() == list("abcd")


def test_seed_tf_to_dense_example():
    # tf.sparse.to_dense of indices [[0, 0], [1, 2]], values [1, 2], shape [3, 4]
    d = kernels.to_dense(np.array([[0, 0], [1, 2]], np.int64), np.array([1, 2]), (3, 4), 0, True)
    assert d.tolist() == [[1, 0, 0, 0], [0, 0, 2, 0], [0, 0, 0, 0]]


# ------------------------------------------------------------------ properties
@settings(max_examples=150, deadline=None)
@given(st.data())
def test_properties(data):
    t = data.draw(coo_tensors(min_dim=1, max_dim=4, max_nnz=30, values=VALUES))
    idx, vals, shape = t.indices, t.values, t.dense_shape
    ci, cv = check_reorder_and_coalesce(idx, vals, shape)
    assert_eq(kernels.to_dense(idx, vals, shape, vals.dtype.type(0), False), ref_dense(idx, vals, shape), exact=True)


def test_radix_argsort_matches_numpy_on_wide_keys():
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 2**62, 50_000)
    keys[::7] = keys[0]  # ties must keep their order
    np.testing.assert_array_equal(kernels.argsort_stable(keys), np.argsort(keys, kind="stable"))


def test_warm_up_runs():
    kernels.warm_up()


def test_wide_keys_take_the_pair_sort_and_agree():
    """Keys of 2**40 x 2**22 need 62 bits: no room to pack a position, so (key, perm) pairs are sorted."""
    rng = np.random.default_rng(5)
    shape = (2**40, 2**22)
    idx = np.stack([rng.integers(0, 2**40, 5000), rng.integers(0, 2**22, 5000)], axis=1)
    idx[::3] = idx[0]
    vals = rng.standard_normal(5000)
    ri, rv = kernels.reorder(idx, vals, shape)
    ei, ev = ref_reorder(idx, vals)
    assert_eq(ri, ei, exact=True)
    assert_eq(rv, ev, exact=True)
    unique, inverse = np.unique(idx, axis=0, return_inverse=True)  # sorted row-major
    sums = np.zeros(len(unique))
    np.add.at(sums, inverse.ravel(), vals)
    ci, cv = kernels.coalesce(idx, vals, shape)
    assert_eq(ci, unique, exact=True)
    np.testing.assert_allclose(cv, sums)


def test_parallel_kernels_called_from_many_threads_at_once():
    """The server calls kernels from a thread pool: the threading layer must be thread-safe."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(6)
    shape = (1000, 1000)
    inputs = [make(rng, "float64", shape, 2, 200_000) for _ in range(8)]
    expected = [ref_coalesce(i, v, shape) for i, v in inputs[:2]] * 4
    inputs = inputs[:2] * 4
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda iv: kernels.coalesce(iv[0], iv[1], shape), inputs))
    for (ci, cv), (ei, ev) in zip(results, expected, strict=True):
        assert_eq(ci, ei, exact=True)
        np.testing.assert_allclose(cv, ev)


@pytest.mark.parametrize("dtype", ["float64", "complex64", "int32", "bool"])
def test_large_inputs_take_the_parallel_paths_and_agree(dtype):
    """Past PARALLEL_MIN entries: packed parallel sort; 8-byte values travel through it."""
    from sparseserve.kernels import PARALLEL_MIN

    rng = np.random.default_rng(11)
    shape = (700, 900)
    idx, vals = make(rng, dtype, shape, 2, 3 * PARALLEL_MIN)
    check_reorder_and_coalesce(idx, vals, shape)
    ci, cv = kernels.coalesce(idx, vals, shape)
    assert_eq(kernels.to_dense(ci, cv, shape, vals.dtype.type(0), True), ref_dense(idx, vals, shape), exact=True)


@pytest.mark.parametrize("shape", [(700, 900), (3, 131, 257), (70000, 1), (2, 40000)])
@pytest.mark.parametrize("dtype", ["float64", "float32", "int8", "complex128", "bool"])
def test_large_from_dense_compacts_in_order(shape, dtype):
    """The one-read compaction (rows split into 64-word bitmaps) against numpy's nonzero:
    row lengths off the block size, -0.0 dropped, NaN kept, empty and full rows."""
    rng = np.random.default_rng(5)
    dense = np.where(rng.random(shape) < 0.1, rng.integers(1, 5, shape), 0).astype(dtype)
    if dense.dtype.kind in "fc":
        dense.reshape(-1)[::97] = -0.0
        dense.reshape(-1)[5::101] = np.nan
    dense[0] = 1  # a full first row, then an empty one
    dense[1] = 0
    indices, values = kernels.from_dense(dense, len(shape))
    expect = np.argwhere(dense != 0) if dense.dtype.kind not in "fc" else \
        np.argwhere((dense != 0) | np.isnan(dense))
    assert_eq(indices, expect, exact=True)
    assert_eq(values, dense[tuple(expect.T)], exact=True)
