"""Shape ops: transpose, reshape, slice.

TensorFlow's docstring examples as written, hypothesis properties against the
same operation on the dense equivalent in plain numpy (random ranks 1 to 5,
hybrid values, duplicates, unsorted and empty inputs), compressed inputs built
with torch, the error cases (class and reason), int64-sized shapes, the
parallel paths, and every op over every wire."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparseserve import InvalidArgumentError, SparseTensor, UnimplementedError
from sparseserve.core.convert import torch_to_tensor
from sparseserve.core.validate import check_sparse
from sparseserve.kernels import PARALLEL_MIN
from conftest import op_raises, run_op
from helpers import assert_eq
from strategies import coo_tensors

run, raises = run_op, op_raises
SETTINGS = settings(max_examples=60, deadline=None)
DTYPES = ("float64", "int32", "bool", "float16", "complex64", "uint8")
# Values 1..8, never zero: the dense comparison sees every stored entry (a dropped one shows).
VALUES = {"low": 1, "high": 8, "halves": False}


# ================================================================ helpers
def dense_of(t: SparseTensor) -> np.ndarray:
    """The dense equivalent, repeated indices summed (or-ed for bool): the reference's input."""
    t = t.to_coo() if t.layout != "coo" else t
    out = np.zeros(t.dense_shape, t.dtype)
    if t.nnz:
        where = tuple(t.indices.T)
        (np.logical_or.at if t.dtype == np.bool_ else np.add.at)(out, where, t.values)
    return out


def keys(t: SparseTensor) -> np.ndarray:
    """Row-major positions of the entries over the sparse dimensions (Python ints: no overflow)."""
    shape = t.dense_shape[:t.indices.shape[1]]
    out = []
    for row in t.indices.tolist():
        k = 0
        for i, d in zip(row, shape, strict=True):
            k = k * d + i
        out.append(k)
    return np.array(out, dtype=object)


def assert_row_major(t: SparseTensor):
    k = keys(t)
    assert all(k[1:] >= k[:-1]), t.indices.tolist()


def assert_valid_with_dense(out: SparseTensor, expected: np.ndarray):
    """A valid tensor whose dense equivalent is ``expected`` exactly."""
    check_sparse(out, "output")
    assert_eq(dense_of(out), expected, exact=True)


def _factor_into(rng, n: int, parts: int) -> list[int]:
    """``parts`` positive dims multiplying to ``n`` > 0, by handing out its prime factors at random."""
    dims = [1] * parts
    p, rest = 2, n
    while rest > 1:
        while rest % p == 0:
            dims[rng.integers(parts)] *= p
            rest //= p
        p += 1
    return dims


@st.composite
def new_shapes(draw, t: SparseTensor):
    """(shape, resolved): a valid reshape target of ``t``'s sparse dimensions, sometimes with a
    -1, dense dims kept; and the same with the -1 resolved from the sparse positions alone (a
    hybrid tensor with an empty dense dim has 0 elements but still some sparse positions)."""
    s = t.indices.shape[1]
    count = int(np.prod(t.dense_shape[:s], dtype=object))
    parts = draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if count:
        resolved = _factor_into(rng, count, parts)
    else:
        resolved = [int(d) for d in rng.integers(0, 5, parts)]
        resolved[draw(st.integers(0, parts - 1))] = 0
    lead = list(resolved)
    if count and draw(st.booleans()):
        lead[draw(st.integers(0, parts - 1))] = -1
    dense = list(t.dense_shape[s:])
    return [*lead, *dense], [*resolved, *dense]


def random_perm(draw, t: SparseTensor) -> list[int]:
    s, rank = t.indices.shape[1], t.ndim
    return list(draw(st.permutations(range(s)))) + list(draw(st.permutations(range(s, rank))))


# ================================================================ TensorFlow's examples
def test_tf_transpose_example():
    # tf.sparse.transpose: shape [4, 5], [0, 3]: b, [0, 1]: a, [3, 1]: d, [2, 0]: c ->
    # shape [5, 4], [0, 2]: c, [1, 0]: a, [1, 3]: d, [3, 0]: b
    # a, b, c, d are 1, 2, 3, 4.
    sp = SparseTensor(indices=[[0, 3], [0, 1], [3, 1], [2, 0]], values=np.array([2, 1, 4, 3]), dense_shape=[4, 5])
    out = run("transpose", sp_input=sp)
    assert tuple(out.dense_shape) == (5, 4)
    assert out.indices.tolist() == [[0, 2], [1, 0], [1, 3], [3, 0]]
    assert out.values.tolist() == [3, 1, 4, 2]  # c, a, d, b


def test_tf_reshape_example():
    # tf.sparse.reshape: shape [2, 3, 6], [0, 0, 0]: a, [0, 0, 1]: b, [0, 1, 0]: c, [1, 0, 0]: d,
    # [1, 2, 3]: e; shape [9, -1] -> shape [9, 4], [0, 0]: a, [0, 1]: b, [1, 2]: c, [4, 2]: d, [8, 1]: e
    sp = SparseTensor(indices=[[0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0], [1, 2, 3]],
                      values=np.array([1, 2, 3, 4, 5]), dense_shape=[2, 3, 6])
    out = run("reshape", sp_input=sp, shape=[9, -1])
    assert tuple(out.dense_shape) == (9, 4)
    assert out.indices.tolist() == [[0, 0], [0, 1], [1, 2], [4, 2], [8, 1]]
    assert out.values.tolist() == [1, 2, 3, 4, 5]


def test_tf_slice_example():
    # tf.sparse.slice: shape [2, 7], row 0: a at 2, d at 4, e at 5; row 1: b at 0, c at 1.
    # slice([0, 0], [2, 4]) = shape [2, 4] [[_ _ a _], [b c _ _]]; slice([0, 4], [2, 3]) = [[d e _], [_ _ _]]
    sp = SparseTensor(indices=[[0, 2], [0, 4], [0, 5], [1, 0], [1, 1]], values=np.array([1, 4, 5, 2, 3]),
                      dense_shape=[2, 7])
    out = run("slice", sp_input=sp, start=[0, 0], size=[2, 4])
    assert tuple(out.dense_shape) == (2, 4)
    assert out.indices.tolist() == [[0, 2], [1, 0], [1, 1]] and out.values.tolist() == [1, 2, 3]
    out = run("slice", sp_input=sp, start=[0, 4], size=[2, 3])
    assert tuple(out.dense_shape) == (2, 3)
    assert out.indices.tolist() == [[0, 0], [0, 1]] and out.values.tolist() == [4, 5]


# ================================================================ properties
@SETTINGS
@given(st.data())
def test_transpose_property(data):
    t = data.draw(coo_tensors(DTYPES, values=VALUES))
    perm = random_perm(data.draw, t)
    out = run("transpose", sp_input=t, perm=perm)
    assert out.layout == "coo" and out.nnz == t.nnz  # duplicates kept
    assert_valid_with_dense(out, dense_of(t).transpose(perm))
    assert_row_major(out)


@SETTINGS
@given(st.data())
def test_transpose_is_stable(data):
    """Entries at one index keep their input order (values tell them apart)."""
    t = data.draw(coo_tensors(DTYPES, min_rank=2, values=VALUES))
    s = t.indices.shape[1]
    t = SparseTensor(indices=t.indices, values=np.arange(t.nnz * int(np.prod(t.dense_shape[s:]))).reshape(
        t.values.shape), dense_shape=t.dense_shape)
    perm = random_perm(data.draw, t)
    out = run("transpose", sp_input=t, perm=perm)
    moved = t.indices[:, perm[:s]]
    order = sorted(range(t.nnz), key=lambda i: (tuple(moved[i]), i))
    assert out.indices.tolist() == moved[order].tolist()
    np.testing.assert_array_equal(out.values, t.values[order].transpose(0, *[p - s + 1 for p in perm[s:]]))


@SETTINGS
@given(coo_tensors(DTYPES, values=VALUES))
def test_transpose_default_reverses(t):
    if t.indices.shape[1] < t.ndim and t.ndim > 1:
        raises(InvalidArgumentError, "PERM_MIXES_SPARSE_AND_DENSE", "transpose", sp_input=t)
        return
    out = run("transpose", sp_input=t)
    assert_valid_with_dense(out, dense_of(t).transpose())


@SETTINGS
@given(st.data())
def test_reshape_property(data):
    t = data.draw(coo_tensors(DTYPES, values=VALUES))
    shape, resolved = data.draw(new_shapes(t))
    out = run("reshape", sp_input=t, shape=shape)
    assert_valid_with_dense(out, dense_of(t).reshape(resolved))
    # Entries keep their order: the same row-major positions, one for one.
    assert keys(out).tolist() == keys(t).tolist()
    np.testing.assert_array_equal(out.values, t.values)


@SETTINGS
@given(st.data())
def test_slice_property(data):
    t = data.draw(coo_tensors(DTYPES, values=VALUES))
    start = [data.draw(st.integers(0, d + 1)) for d in t.dense_shape]
    size = [data.draw(st.integers(0, d + 2)) for d in t.dense_shape]
    out = run("slice", sp_input=t, start=start, size=size)
    box = tuple(slice(b, b + n) for b, n in zip(start, size, strict=True))
    assert_valid_with_dense(out, dense_of(t)[box])
    # Entries keep their input order: the kept ones, shifted.
    s = t.indices.shape[1]
    inside = [i for i in range(t.nnz)
              if all(b <= x < b + n for x, b, n in zip(t.indices[i], start, size, strict=False))]
    assert out.indices.tolist() == (t.indices[inside] - np.array(start[:s])).tolist()


@SETTINGS
@given(coo_tensors(DTYPES, values=VALUES))
def test_round_trips(t):
    s = t.indices.shape[1]
    flat = run("reshape", sp_input=t, shape=[-1, *t.dense_shape[s:]]) if 0 not in t.dense_shape[:s] \
        else run("reshape", sp_input=t, shape=[0, *t.dense_shape[s:]])
    back = run("reshape", sp_input=flat, shape=list(t.dense_shape))
    np.testing.assert_array_equal(back.indices, t.indices)
    whole = run("slice", sp_input=t, start=[0] * t.ndim, size=list(t.dense_shape))
    assert_eq(whole, t, exact=True)


# ================================================================ edge cases
def test_zero_size_reshapes_as_tf():
    empty = SparseTensor(indices=np.zeros((0, 2), np.int64), values=np.zeros(0), dense_shape=[0, 3])
    assert run("reshape", sp_input=empty, shape=[-1, 3]).dense_shape == (0, 3)
    assert run("reshape", sp_input=empty, shape=[5, 0, 7]).dense_shape == (5, 0, 7)
    raises(InvalidArgumentError, "CANNOT_INFER_DIMENSION", "reshape", sp_input=empty, shape=[0, -1])
    raises(InvalidArgumentError, "SHAPE_SIZE_MISMATCH", "reshape", sp_input=empty, shape=[1, 3])
    full = SparseTensor(indices=[[1, 2]], values=[1.0], dense_shape=[2, 3])
    raises(InvalidArgumentError, "CANNOT_INFER_DIMENSION", "reshape", sp_input=full, shape=[-1, 0])
    out = run("reshape", sp_input=full, shape=[6])
    assert out.indices.tolist() == [[5]] and out.dense_shape == (6,)


def test_slice_past_the_end_is_clipped_not_an_error():
    sp = SparseTensor(indices=[[0, 1], [2, 3]], values=np.array([1.0, 2.0]), dense_shape=[3, 4])
    out = run("slice", sp_input=sp, start=[2, 3], size=[10, 10])
    assert out.dense_shape == (1, 1) and out.indices.tolist() == [[0, 0]] and out.values.tolist() == [2.0]
    out = run("slice", sp_input=sp, start=[5, 0], size=[1, 4])
    assert out.dense_shape == (0, 4) and out.nnz == 0
    out = run("slice", sp_input=sp, start=[0, 0], size=[0, 4])
    assert out.dense_shape == (0, 4) and out.nnz == 0



@SETTINGS
@given(st.data())
def test_slice_with_negative_starts_property(data):
    """Hybrid and compressed inputs too (TensorFlow has neither): the dense equivalent shifted by
    start, zeros where the box reaches before a dimension's start (value blocks included)."""
    t = data.draw(coo_tensors(DTYPES, values=VALUES))
    start = [data.draw(st.integers(-d - 2, d + 1)) for d in t.dense_shape]
    size = [data.draw(st.integers(0, 2 * d + 3)) for d in t.dense_shape]
    out = run("slice", sp_input=t, start=start, size=size)
    assert_valid_with_dense(out, shifted_box(dense_of(t), start, size))


def shifted_box(dense: np.ndarray, start: list[int], size: list[int]) -> np.ndarray:
    """dense[start:start + size] where out[j] = dense[j + start], 0 before a dimension's start,
    each dimension clipped at its end (TensorFlow's slice on the dense equivalent)."""
    hi = [min(b + n, d) for b, n, d in zip(start, size, dense.shape, strict=True)]
    lo = [min(b, d) for b, d in zip(start, dense.shape, strict=True)]
    out = np.zeros([h - b for b, h in zip(lo, hi, strict=True)], dense.dtype)
    src = tuple(slice(max(b, 0), max(h, 0)) for b, h in zip(lo, hi, strict=True))
    dst = tuple(slice(max(b, 0) - b, max(h, 0) - b) for b, h in zip(lo, hi, strict=True))
    out[dst] = dense[src]
    return out


def test_hybrid_rules():
    hy = SparseTensor(indices=[[1, 0], [0, 2], [1, 0]], values=np.arange(12.0).reshape(3, 2, 2),
                      dense_shape=[2, 3, 2, 2])
    dense = dense_of(hy)
    out = run("transpose", sp_input=hy, perm=[1, 0, 3, 2])
    assert out.indices.tolist() == [[0, 1], [0, 1], [2, 0]]  # stable: the duplicate stays in order
    assert_valid_with_dense(out, dense.transpose(1, 0, 3, 2))
    raises(InvalidArgumentError, "PERM_MIXES_SPARSE_AND_DENSE", "transpose", sp_input=hy, perm=[2, 1, 0, 3])
    out = run("reshape", sp_input=hy, shape=[3, -1, 2, 2])
    assert_valid_with_dense(out, dense.reshape(3, 2, 2, 2))
    raises(InvalidArgumentError, "DENSE_DIMS_CHANGED", "reshape", sp_input=hy, shape=[6, 4])
    raises(InvalidArgumentError, "RANK_TOO_LOW", "reshape", sp_input=hy, shape=[2, 2])
    out = run("slice", sp_input=hy, start=[1, 0, 1, 0], size=[1, 3, 1, 5])
    assert out.values.flags.c_contiguous
    assert_valid_with_dense(out, dense[1:2, :, 1:2, :])


def test_outputs_keep_coalesced_hint_only_when_true():
    sp = SparseTensor(indices=[[0, 1], [1, 0]], values=[1.0, 2.0], dense_shape=[2, 2], coalesced=True)
    assert run("transpose", sp_input=sp).coalesced
    assert run("reshape", sp_input=sp, shape=[4]).coalesced
    assert run("slice", sp_input=sp, start=[0, 0], size=[1, 2]).coalesced
    dup = SparseTensor(indices=[[0, 1], [0, 1]], values=[1.0, 2.0], dense_shape=[2, 2])
    assert not run("transpose", sp_input=dup).coalesced


# ================================================================ compressed layouts
def _dense_sample(shape, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    d = rng.integers(-4, 5, size=shape).astype(np.float64)
    d[rng.random(shape) < 0.5] = 0
    return d


def _compressed_inputs():
    mat = torch.from_numpy(_dense_sample((4, 6)))
    pattern = _dense_sample((4, 6), seed=1) != 0  # batches of one CSR share their nse
    batch = torch.from_numpy(np.stack([pattern * 1.5, pattern * -np.arange(24.0).reshape(4, 6)]))
    hybrid = torch.from_numpy(_dense_sample((4, 6, 2, 3), seed=2))
    return {"csr": mat.to_sparse_csr(), "csc": mat.to_sparse_csc(), "bsr": mat.to_sparse_bsr((2, 3)),
            "bsc": mat.to_sparse_bsc((2, 2)), "csr-batched": batch.to_sparse_csr(),
            "bsr-batched": batch.to_sparse_bsr((2, 1)), "csr-hybrid": hybrid.to_sparse_csr(dense_dim=2)}


KINDS = ["csr", "csc", "bsr", "bsc", "csr-batched", "bsr-batched", "csr-hybrid"]


@pytest.mark.parametrize("kind", KINDS)
def test_compressed_transpose_swaps_layout_without_moving_indices(kind):
    tt = _compressed_inputs()[kind]
    t = torch_to_tensor(tt)
    nb, rank = t.batch_ndim, t.ndim
    dense_perm = list(range(nb + 2, rank))[::-1]  # hybrid: the dense dims reversed too
    perm = [*range(nb), nb + 1, nb, *dense_perm]
    out = run("transpose", sp_input=t, perm=perm)
    swapped = {"csr": "csc", "csc": "csr", "bsr": "bsc", "bsc": "bsr"}[t.layout]
    assert out.layout == swapped
    assert np.shares_memory(out.compressed_indices, t.compressed_indices)
    assert np.shares_memory(out.plain_indices, t.plain_indices)
    if t.blocksize is not None:
        assert out.blocksize == t.blocksize[::-1]
    assert_valid_with_dense(out, dense_of(t).transpose(perm))
    # torch reads it back as the same matrix: the arrays are a valid tensor of the new layout.
    np.testing.assert_array_equal(out.to_torch().to_dense().numpy(), tt.to_dense().numpy().transpose(perm))
    same = run("transpose", sp_input=t, perm=[*range(nb + 2), *dense_perm])
    assert same.layout == t.layout
    assert_valid_with_dense(same, dense_of(t).transpose([*range(nb + 2), *dense_perm]))


@pytest.mark.parametrize("kind", KINDS)
def test_compressed_inputs_go_through_coo(kind):
    t = torch_to_tensor(_compressed_inputs()[kind])
    dense = dense_of(t)
    s = t.batch_ndim + 2
    if t.batch_ndim:  # moving a batch dimension needs COO
        perm = [1, 2, 0, *range(3, t.ndim)]
        out = run("transpose", sp_input=t, perm=perm)
        assert out.layout == "coo"
        assert_valid_with_dense(out, dense.transpose(perm))
        assert_row_major(out)
    count = int(np.prod(t.dense_shape[:s]))
    out = run("reshape", sp_input=t, shape=[2, -1, 3, *t.dense_shape[s:]])
    assert out.layout == "coo"
    assert_valid_with_dense(out, dense.reshape(2, count // 6, 3, *t.dense_shape[s:]))
    assert_row_major(out)
    start, size = [1] * t.ndim, [2] * t.ndim
    out = run("slice", sp_input=t, start=start, size=size)
    assert out.layout == "coo"
    assert_valid_with_dense(out, dense[tuple(slice(1, 3) for _ in range(t.ndim))])
    assert_row_major(out)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_compressed_property(data):
    """Random compressed tensors (batched, blocked) against the same op on the dense matrix."""
    layout = data.draw(st.sampled_from(["csr", "csc", "bsr", "bsc"]))
    batch = data.draw(st.sampled_from([(), (2,)]))
    block = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)))
    rows, cols = block[0] * data.draw(st.integers(1, 3)), block[1] * data.draw(st.integers(1, 3))
    pattern = _dense_sample((rows, cols), seed=data.draw(st.integers(0, 1000))) != 0
    # Batches of one compressed tensor share their nse: the same pattern, other values.
    dense = np.stack([pattern * 1.5, pattern * -2.0]) if batch else pattern * 3.0
    tt = torch.from_numpy(dense)
    tt = {"csr": tt.to_sparse_csr, "csc": tt.to_sparse_csc}[layout]() if layout in ("csr", "csc") else \
        {"bsr": tt.to_sparse_bsr, "bsc": tt.to_sparse_bsc}[layout](block)
    t = torch_to_tensor(tt)
    perm = list(data.draw(st.permutations(range(t.ndim))))
    assert_valid_with_dense(run("transpose", sp_input=t, perm=perm), dense.transpose(perm))
    flat = run("reshape", sp_input=t, shape=[-1])
    assert_valid_with_dense(flat, dense.reshape(-1))
    assert_row_major(flat)
    start = [data.draw(st.integers(0, d)) for d in t.dense_shape]
    size = [data.draw(st.integers(0, d)) for d in t.dense_shape]
    box = tuple(slice(b, b + n) for b, n in zip(start, size, strict=True))
    assert_valid_with_dense(run("slice", sp_input=t, start=start, size=size), dense[box])


@pytest.mark.parametrize("kind", KINDS)
def test_compressed_slice_with_a_negative_start(kind):
    t = torch_to_tensor(_compressed_inputs()[kind])
    start, size = [-1] * t.ndim, [3] * t.ndim
    out = run("slice", sp_input=t, start=start, size=size)
    assert out.layout == "coo"
    assert_valid_with_dense(out, shifted_box(dense_of(t), start, size))
    assert_row_major(out)


# ================================================================ errors
def test_errors():
    sp = SparseTensor(indices=[[0, 1], [2, 3]], values=np.array([1.0, 2.0]), dense_shape=[3, 4])
    for perm in ([0], [0, 0], [1, 2], [0, 1, 2], [-1, 0]):
        err = raises(InvalidArgumentError, "BAD_PERMUTATION", "transpose", sp_input=sp, perm=perm)
        assert "perm" in err.message
    raises(InvalidArgumentError, "BAD_ARGUMENT_TYPE", "transpose", sp_input=sp, perm="reverse")

    err = raises(InvalidArgumentError, "SHAPE_SIZE_MISMATCH", "reshape", sp_input=sp, shape=[5, 2])
    assert "[3, 4]" in err.message and "[5, 2]" in err.message
    raises(InvalidArgumentError, "SHAPE_SIZE_MISMATCH", "reshape", sp_input=sp, shape=[5, -1])
    err = raises(InvalidArgumentError, "MULTIPLE_INFERRED_DIMENSIONS", "reshape", sp_input=sp, shape=[-1, -1])
    assert "shape[0]" in err.message and "shape[1]" in err.message
    err = raises(InvalidArgumentError, "NEGATIVE_DIMENSION", "reshape", sp_input=sp, shape=[-2, -6])
    assert "shape[0] = -2" in err.message
    raises(InvalidArgumentError, "RANK_TOO_LOW", "reshape", sp_input=SparseTensor(
        indices=[[0]], values=[1.0], dense_shape=[1]), shape=[])

    raises(InvalidArgumentError, "RANK_MISMATCH", "slice", sp_input=sp, start=[0], size=[1, 1])
    raises(InvalidArgumentError, "RANK_MISMATCH", "slice", sp_input=sp, start=[0, 0], size=[1, 1, 1])
    # A negative start is TensorFlow's too (issue 35): the box [-1, 0) on dimension 1 holds nothing.
    out = run("slice", sp_input=sp, start=[0, -1], size=[1, 1])
    assert out.nnz == 0 and out.dense_shape == (1, 1)
    err = raises(InvalidArgumentError, "NEGATIVE_SLICE", "slice", sp_input=sp, start=[0, 0], size=[-1, 1])
    assert "size[0] = -1" in err.message

    bad = SparseTensor(indices=[[0, 9]], values=[1.0], dense_shape=[3, 4])
    for op, args in (("transpose", {}), ("reshape", {"shape": [12]}),
                     ("slice", {"start": [0, 0], "size": [3, 4]})):
        raises(InvalidArgumentError, "INDEX_OUT_OF_RANGE", op, sp_input=bad, **args)
        with pytest.raises(UnimplementedError):
            run(op, sp_input=np.ones((3, 4)), **args)


def test_int64_sized_shapes():
    big = 1 << 61
    sp = SparseTensor(indices=[[big - 1, 2], [5, 0], [big - 1, 2]], values=np.array([1, 2, 3]),
                      dense_shape=[big, 3])  # 3 * 2**61 positions: keys past 2**50
    out = run("reshape", sp_input=sp, shape=[3, -1])
    assert out.dense_shape == (3, big)
    assert out.indices.tolist() == [[2, big - 1], [0, 15], [2, big - 1]]
    back = run("reshape", sp_input=out, shape=[big, 3])
    assert back.indices.tolist() == sp.indices.tolist()
    out = run("transpose", sp_input=sp)
    assert out.dense_shape == (3, big) and out.indices.tolist() == [[0, 5], [2, big - 1], [2, big - 1]]
    assert out.values.tolist() == [2, 1, 3]
    out = run("slice", sp_input=sp, start=[big - 1, 1], size=[(1 << 63) + 5, 1 << 64])
    assert out.dense_shape == (1, 2) and out.indices.tolist() == [[0, 1], [0, 1]]

    # A new shape whose product or a dimension does not fit int64 is refused, never wrapped.
    raises(InvalidArgumentError, "SHAPE_OVERFLOW", "reshape", sp_input=sp, shape=[big, big])
    empty = SparseTensor(indices=np.zeros((0, 1), np.int64), values=np.zeros(0), dense_shape=[0])
    raises(InvalidArgumentError, "SHAPE_OVERFLOW", "reshape", sp_input=empty, shape=[1 << 63, 0])
    raises(InvalidArgumentError, "SHAPE_OVERFLOW", "reshape", sp_input=empty, shape=[0, 1 << 70])
    raises(InvalidArgumentError, "SHAPE_OVERFLOW", "reshape", sp_input=empty, shape=[-1, big, big])
    # Empty, but numpy cannot describe it (its other dimensions multiply past 2**63): refused too.
    raises(InvalidArgumentError, "SHAPE_OVERFLOW", "reshape", sp_input=empty, shape=[big, big, 0])
    assert run("reshape", sp_input=empty, shape=[1 << 58, 0]).dense_shape == (1 << 58, 0)


def test_result_bytes_are_declared():
    from sparseserve.server.ops import REGISTRY

    sp = SparseTensor(indices=[[0, 1], [2, 3]], values=np.array([1.0, 2.0]), dense_shape=[3, 4])
    ones = [1] * 1000 + [12]  # many unit dimensions make the indices 1000 times larger
    assert REGISTRY.get("reshape").result_bytes(sp_input=sp, shape=ones) == 2 * (8 * 1001 + 8)
    assert REGISTRY.get("transpose").result_bytes(sp_input=sp, perm=None) == 2 * (16 + 8)
    assert REGISTRY.get("slice").result_bytes(sp_input=sp, start=[0, 0], size=[1, 1]) == 2 * (16 + 8)
    # Every element of a stored 2 x 3 block becomes a COO entry: 8 bytes of index, 8 of value.
    bsr = torch_to_tensor(_compressed_inputs()["bsr"])
    assert REGISTRY.get("reshape").result_bytes(sp_input=bsr, shape=[-1]) == bsr.nnz * 6 * (8 + 8)


# ================================================================ parallel paths
@pytest.mark.parametrize("dense_dims", [(), (2,)])
def test_large_inputs_take_the_parallel_paths(dense_dims):
    n = 2 * PARALLEL_MIN + 7
    rng = np.random.default_rng(3)
    shape = (600, 500, 40)
    idx = np.stack([rng.integers(0, d, n) for d in shape], axis=1)
    values = rng.standard_normal((n, *dense_dims))
    sp = SparseTensor(indices=idx, values=values, dense_shape=(*shape, *dense_dims))

    out = run("transpose", sp_input=sp, perm=[2, 0, 1, *range(3, 3 + len(dense_dims))])
    moved = idx[:, [2, 0, 1]]
    order = np.lexsort(moved.T[::-1])  # stable: equal keys keep their input order
    np.testing.assert_array_equal(out.indices, moved[order])
    np.testing.assert_array_equal(out.values, values[order])

    out = run("reshape", sp_input=sp, shape=[1000, -1, 12, *dense_dims])
    flat = np.ravel_multi_index(tuple(idx.T), shape)
    np.testing.assert_array_equal(out.indices, np.stack(np.unravel_index(flat, (1000, 1000, 12)), axis=1))
    np.testing.assert_array_equal(out.values, values)

    start, size = [100, 50, 5], [400, 300, 30]
    out = run("slice", sp_input=sp, start=[*start, *[0] * len(dense_dims)], size=[*size, *dense_dims])
    keep = np.all((idx >= start) & (idx < np.add(start, size)), axis=1)
    np.testing.assert_array_equal(out.indices, idx[keep] - start)
    np.testing.assert_array_equal(out.values, values[keep])


# ================================================================ wires
def test_every_op_over_every_wire(client):
    sp = SparseTensor(indices=[[0, 3], [0, 1], [3, 1], [2, 0]], values=np.array([2.0, 1.0, 4.0, 3.0]),
                      dense_shape=[4, 5])
    out = client.transpose(sp)
    assert out.indices.tolist() == [[0, 2], [1, 0], [1, 3], [3, 0]] and out.values.tolist() == [3, 1, 4, 2]
    assert tuple(out.dense_shape) == (5, 4)
    out = client.transpose(sp, perm=[0, 1])
    assert out.indices.tolist() == [[0, 1], [0, 3], [2, 0], [3, 1]]
    out = client.reshape(sp, [2, -1])
    assert out.indices.tolist() == [[0, 3], [0, 1], [1, 6], [1, 0]] and tuple(out.dense_shape) == (2, 10)
    out = client.slice(sp, [0, 1], [3, 10])
    assert out.indices.tolist() == [[0, 2], [0, 0]] and tuple(out.dense_shape) == (3, 4)
    assert out.values.tolist() == [2.0, 1.0]

    csr = torch_to_tensor(torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]]).to_sparse_csr())
    out = client.transpose(csr)
    assert out.layout == "csc" and tuple(out.dense_shape) == (3, 2)
    np.testing.assert_array_equal(out.to_dense(), [[0, 2], [1, 0], [0, 3]])
    out = client.reshape(csr, [3, 2])
    assert out.layout == "coo" and out.indices.tolist() == [[0, 1], [1, 1], [2, 1]]

    with pytest.raises(InvalidArgumentError) as info:
        client.reshape(sp, [3, 3])
    assert info.value.reason == "SHAPE_SIZE_MISMATCH"
    with pytest.raises(InvalidArgumentError) as info:
        client.transpose(sp, perm=[1, 1])
    assert info.value.reason == "BAD_PERMUTATION"
