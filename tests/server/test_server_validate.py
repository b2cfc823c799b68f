"""docs/contract.md ("Tensors") invariants: every rule refused with its reason and a message
that names the argument; valid tensors pass untouched."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparseserve import SparseTensor
from sparseserve.core.validate import check_dense, check_sparse
from sparseserve.errors import InvalidArgumentError
from sparseserve.kernels import indices_in_range
from sparseserve.kernels import frozen


def coo(indices, values, shape, **kw):
    columns = len(indices[0]) if len(indices) else len(shape)
    return SparseTensor(indices=np.asarray(indices, dtype=np.int64).reshape(-1, columns),
                        values=values, dense_shape=shape, **kw)


# The SDK checks index ranges with numpy; the server passes its compiled check. Both must
# accept and refuse alike, with the same message.
RANGE_CHECKS = (None, indices_in_range)


def accepts(t):
    for in_range in RANGE_CHECKS:
        check_sparse(t, "sp_input", in_range)


def refuses(t, reason, message=None):
    errors = []
    for in_range in RANGE_CHECKS:
        with pytest.raises(InvalidArgumentError) as info:
            check_sparse(t, "sp_input", in_range)
        errors.append(info.value)
    assert errors[0].reason == reason, errors[0].message
    if message:
        assert message in errors[0].message, errors[0].message
    assert (errors[1].reason, errors[1].message) == (errors[0].reason, errors[0].message)
    return errors[0]


def test_spec_example_message():
    t = coo([[0, 0], [1, 2], [2, 3], [0, 7]], [1.0, 2.0, 3.0, 4.0], [3, 4])
    refuses(t, "INDEX_OUT_OF_RANGE", "sp_input.indices[3, 1] = 7 is out of range for sp_input.dense_shape[1] = 4")


@pytest.mark.parametrize("t, reason, message", [
    (coo([[0, -1]], [1.0], [3, 4]), "INDEX_OUT_OF_RANGE", "sp_input.indices[0, 1] = -1"),
    (coo([[0, -(1 << 63)]], [1.0], [3, 4]), "INDEX_OUT_OF_RANGE", f"sp_input.indices[0, 1] = {-(1 << 63)}"),
    (coo([[(1 << 63) - 1, 0]], [1.0], [(1 << 63) - 1, 1]), "INDEX_OUT_OF_RANGE",
     "dense_shape[0] = 9223372036854775807"),
    (coo([[3, 0]], [1.0], [3, 4]), "INDEX_OUT_OF_RANGE", "dense_shape[0] = 3"),
    (coo([[0, 0]], [1.0], [3, -4]), "NEGATIVE_DIMENSION", "sp_input.dense_shape[1] = -4 is negative"),
    (coo([[0, 0]], [1.0], [1 << 40, 1 << 40]), "SHAPE_OVERFLOW", "more than int64"),
    (SparseTensor(indices=np.zeros((0, 2), np.int64), values=np.zeros((0, 0)), dense_shape=[1 << 40, 1 << 40, 0]),
     "SHAPE_OVERFLOW", "sp_input.dense_shape = [1099511627776, 1099511627776, 0] is empty"),
    (coo([[0, 0]], [1.0, 2.0], [3, 4]), "VALUES_SHAPE_MISMATCH", "sp_input.values has shape [2]"),
    (coo([[0, 0, 0]], [1.0], [3, 4]), "RANK_MISMATCH", "3 columns"),
    (coo([[0]], [1.0], [3, 4]), "VALUES_SHAPE_MISMATCH", "imply [1, 4]"),
    (SparseTensor(indices=np.zeros((1, 2), np.int32), values=[1.0], dense_shape=[3, 4]), None, None),
    (SparseTensor(indices=np.zeros((1, 2), np.float64), values=[1.0], dense_shape=[3, 4]), "INDEX_DTYPE", "int64"),
    (SparseTensor(indices=np.zeros(2, np.int64), values=[1.0], dense_shape=[3, 4]), "INDICES_RANK", "rank 1"),
    (SparseTensor(indices=[[0, 0]], values=np.array(["a"]), dense_shape=[3, 4]), "BAD_DTYPE", "sp_input.values"),
])
def test_coo_rules(t, reason, message):
    if reason is None:  # int32 indices are widened to int64 at construction
        accepts(t)
        return
    refuses(t, reason, message)


def csr(ci, pi, values, shape, layout="csr", blocksize=None, index_dtype=np.int64):
    return SparseTensor(layout=layout, compressed_indices=np.asarray(ci, index_dtype),
                        plain_indices=np.asarray(pi, index_dtype), values=values, dense_shape=shape,
                        blocksize=blocksize)


@pytest.mark.parametrize("t, reason, message", [
    (csr([1, 1, 2], [0, 1], [1.0, 2.0], [2, 3]), "COMPRESSED_START", "start at 0"),
    (csr([0, 2, 1], [0, 1], [1.0, 2.0], [2, 3]), "COMPRESSED_DECREASING", "never decrease"),
    (csr([0, 0, 4], [0, 1, 2, 0], np.ones(4), [2, 3]), "COMPRESSED_STEP", "more than the plain dimension 3"),
    (csr([0, 1, 1], [0, 1], [1.0, 2.0], [2, 3]), "COMPRESSED_END", "nse = 2"),
    (csr([0, 1, 2], [0, 3], [1.0, 2.0], [2, 3]), "INDEX_OUT_OF_RANGE", "sp_input.plain_indices[1] = 3"),
    (csr([0, 1], [0], [1.0], [2, 3]), "COMPRESSED_LENGTH", "needs 3"),
    (csr([0, 1, 2], [0, 1], [1.0], [2, 3]), "VALUES_SHAPE_MISMATCH", None),
    (csr([0, 1], [0], np.ones((1, 2, 2)), [3, 4], layout="bsr", blocksize=[2, 2]), "BLOCKSIZE", "does not divide"),
    (csr([0, 1], [0], np.ones((1, 2, 2)), [2, 4], layout="bsr"), "BLOCKSIZE", "two positive"),
    (csr([0, 1, 1], [0], np.ones(1), [2, 3], blocksize=[1, 1]), "BLOCKSIZE", "only allowed"),
    (SparseTensor(layout="csr", compressed_indices=np.array([0, 1, 1], np.int32),
                  plain_indices=np.array([0], np.int64), values=[1.0], dense_shape=[2, 3]), "INDEX_DTYPE", "share"),
    (csr([[0, 1, 1]], [[0]], np.ones((1, 1)), [2, 2, 3]), "BATCH_MISMATCH", "batch shape"),
    (csr([0, 1, 1], [0], [1.0], [3]), "RANK_MISMATCH", None),
])
def test_compressed_rules(t, reason, message):
    refuses(t, reason, message)


def test_valid_compressed_layouts_pass():
    check_sparse(csr([0, 1, 1, 3], [2, 0, 1], np.ones(3), [3, 4], index_dtype=np.int32), "a")
    check_sparse(csr([[0, 1, 1], [0, 0, 1]], [[1], [0]], np.ones((2, 1, 2, 2, 3)), [2, 4, 4, 3],
                     layout="bsr", blocksize=[2, 2]), "a")
    check_sparse(csr([0, 1, 1, 1], [1], np.ones(1), [2, 3], layout="csc"), "a")
    check_sparse(csr([0], [], np.ones(0), [0, 0], index_dtype=np.int32), "a")
    check_sparse(csr([0, 0, 0], [], np.ones(0), [2, 0], index_dtype=np.int32), "a")


def test_dense_rules():
    check_dense(np.zeros((2, 3), np.float16), "x")
    with pytest.raises(InvalidArgumentError, match="x has dtype <U1"):
        check_dense(np.array(["a"]), "x")


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_random_coo_accepted_iff_every_index_in_range(data):
    ndim = data.draw(st.integers(1, 4))
    shape = data.draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim))
    nnz = data.draw(st.integers(0, 6))
    indices = np.array(data.draw(st.lists(st.lists(st.integers(-2, 7), min_size=ndim, max_size=ndim),
                                          min_size=nnz, max_size=nnz)), dtype=np.int64).reshape(nnz, ndim)
    t = SparseTensor(indices=indices, values=np.ones(nnz), dense_shape=shape)
    in_range = bool(np.all((indices >= 0) & (indices < np.array(shape)))) if nnz else True
    if in_range:
        accepts(t)
    else:
        error = refuses(t, "INDEX_OUT_OF_RANGE")
        # The message points at a real offender.
        pos = [int(x) for x in error.message.split("[", 1)[1].split("]", 1)[0].split(", ")]
        assert not 0 <= indices[pos[0], pos[1]] < shape[pos[1]]


@pytest.mark.parametrize("nnz", [100, 40_000])  # each side of the small-input path of the range check
@pytest.mark.parametrize("bad", [-1, 4])
def test_range_check_names_the_first_offender_at_any_size(nnz, bad):
    indices = np.zeros((nnz, 2), np.int64)
    indices[nnz // 2, 1] = indices[nnz - 1, 0] = bad
    refuses(coo(indices, np.ones(nnz), [4, 4]), "INDEX_OUT_OF_RANGE",
            f"sp_input.indices[{nnz // 2}, 1] = {bad} is out of range for sp_input.dense_shape[1] = 4")


@pytest.mark.parametrize("layout", ["writable", "strided", "fortran"])
def test_compiled_range_check_takes_any_int64_indices(layout):
    base = np.array([[0, 1], [2, 3], [1, 0], [3, 3]], np.int64)
    indices = {"writable": base, "strided": np.repeat(base, 2, axis=0)[::2], "fortran": np.asfortranarray(base)}[layout]
    limits = np.array([4, 4])
    assert indices_in_range(indices, limits)
    assert not indices_in_range(indices, np.array([4, 3]))
    assert not indices_in_range(-indices, limits)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_compiled_range_check_of_many_indices_finds_any_one_out_of_range(k):
    # Past PARALLEL_MIN rows the check runs in chunks, blocks of whole rows compared unsigned:
    # one bad value anywhere (first, last, a block's edge, the short last block) is found.
    from sparseserve.kernels import PARALLEL_MIN

    rng = np.random.default_rng(k)
    limits = rng.integers(5, 50, k)
    nnz = 3 * PARALLEL_MIN + 7  # not a whole number of blocks
    indices = rng.integers(0, limits, (nnz, k))
    assert indices_in_range(indices, limits)
    for flat in (0, 2047, 2048, nnz * k // 2, nnz * k - 1):
        row, col = divmod(flat, k)
        for bad in (limits[col], -1, np.iinfo(np.int64).min, np.iinfo(np.int64).max):
            spoiled = indices.copy()
            spoiled[row, col] = bad
            assert not indices_in_range(spoiled, limits), (row, col, bad)
    assert not indices_in_range(indices, np.where(np.arange(k) == k - 1, -limits, limits))
    tight = indices.max(axis=0) + 1
    assert indices_in_range(indices, tight)
    for col in range(k):
        assert not indices_in_range(indices, tight - (np.arange(k) == col))


def test_compiled_range_check_refuses_limits_that_do_not_match_the_columns():
    # Its loop reads limits[j] for every column j: fewer limits would read past them.
    with pytest.raises(ValueError, match="limits"):
        indices_in_range(np.zeros((3, 2), np.int64), np.array([4]))
    with pytest.raises(ValueError, match="limits"):
        indices_in_range(np.zeros(3, np.int64), np.array([4]))


def test_tensors_checked_into_the_store_are_not_checked_again():
    from sparseserve.server.argtypes import TENSOR
    from sparseserve.server.validated import validated
    from sparseserve.server.registry import Arg

    t = SparseTensor(indices=[[0, 1], [2, 0]], values=[1.0, 2.0], dense_shape=[3, 2])
    stored = validated(t, "tensor")
    assert not stored.values.flags.writeable and validated(stored, "tensor") is stored
    arg = Arg("sp_input", TENSOR, "", layouts=("coo",))
    assert TENSOR.coerce(stored, arg, "reorder") is stored  # bound as it is: no second pass
    assert TENSOR.coerce(t, arg, "reorder") is not t  # anything else is checked and frozen
    decoded = SparseTensor(indices=frozen(t.indices), values=frozen(t.values), dense_shape=t.dense_shape)
    assert TENSOR.coerce(decoded, arg, "reorder") is decoded  # read-only already (from bytes): checked only
    with pytest.raises(InvalidArgumentError):
        TENSOR.coerce(SparseTensor(indices=frozen(np.array([[0, 5]])), values=frozen(np.ones(1)),
                                   dense_shape=[3, 2]), arg, "reorder")
    with pytest.raises(InvalidArgumentError) as info:
        validated(SparseTensor(indices=[[0, 5]], values=[1.0], dense_shape=[3, 2]), "tensor")
    assert info.value.reason == "INDEX_OUT_OF_RANGE"
