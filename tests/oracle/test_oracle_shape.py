"""transpose, reshape and slice held to TensorFlow 2.21, and transpose of CSR, CSC, BSR and BSC to
PyTorch 2.13, running the same inputs.

Deliberate differences (named where they are tested):
- Inputs TensorFlow accepts but answers with an invalid tensor or garbage (slice with a negative
  size; transpose with perm [0, 0]): we refuse them, and they are not compared here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _oracle import (COMPRESSED, TF_SETTINGS, check, declared_layouts, from_torch, nonzero_values, run, tf, to_tf,
                     to_torch, torch_convert)
from conftest import op_raises as refused
from helpers import assert_eq
from strategies import coo_tensors
from sparseserve import InvalidArgumentError, SparseTensor

# ==================================================================== transpose
@TF_SETTINGS
@given(st.data(), coo_tensors(hybrid=False))
def test_transpose(data, t):
    perm = data.draw(st.none() | st.permutations(list(range(t.ndim))))
    want = tf().sparse.transpose(to_tf(t), perm)
    assert_eq(run("transpose", sp_input=t, perm=perm), want)


# ====================================================================== reshape
@st.composite
def reshape_args(draw):
    t = draw(coo_tensors(hybrid=False))
    size = math.prod(t.dense_shape)
    rank = draw(st.integers(1, 5))
    left, new = size, []
    for _ in range(rank - 1):
        if left == 0:
            d = draw(st.integers(0, 3))
        else:
            d = draw(st.sampled_from([k for k in range(1, left + 1) if left % k == 0]))
        new.append(d)
        left = left // d if d else left
    new.append(left if 0 not in new else draw(st.integers(0, 3)))
    if draw(st.booleans()):
        new[draw(st.integers(0, rank - 1))] = -1
    if draw(st.integers(0, 6)) == 0:
        new[draw(st.integers(0, rank - 1))] += 1  # a size that no longer matches: refused
    return t, new


@TF_SETTINGS
@given(reshape_args())
def test_reshape(args):
    t, shape = args
    check("reshape", dict(sp_input=t, shape=shape), lambda: tf().sparse.reshape(to_tf(t), shape), assert_eq)


# ======================================================================== slice
@TF_SETTINGS
@given(st.data(), coo_tensors(hybrid=False))
def test_slice(data, t):
    start = [data.draw(st.integers(0, d + 1)) for d in t.dense_shape]
    size = [data.draw(st.integers(0, d + 1)) for d in t.dense_shape]
    within = [d for d in range(t.ndim) if start[d] < t.dense_shape[d]]
    if within and data.draw(st.integers(0, 6)) == 0:
        # A negative size is refused by both (TensorFlow checks it only where start is inside
        # the dimension: past it TensorFlow returns an empty slice; we refuse it everywhere).
        size[data.draw(st.sampled_from(within))] = -1
    check("slice", dict(sp_input=t, start=start, size=size),
          lambda: tf().sparse.slice(to_tf(t), start, size), assert_eq)


# ================================================================== transpose of compressed layouts
@pytest.mark.parametrize("layout", COMPRESSED)
def test_transpose_compressed_matches_torch(layout):
    if layout not in declared_layouts("transpose", "sp_input"):
        pytest.fail(f"transpose does not declare {layout}")  # its doc says it takes them
    rng = np.random.default_rng(10)
    for shape, dense_dim in (((4, 6), 0), ((4, 6, 2), 1), ((2, 4, 6), 0)):
        p = len(shape) - dense_dim
        mask = rng.random(shape[p - 2:p] + (1,) * dense_dim) < 0.5  # the same in each batch: one nse
        dense = np.where(mask, nonzero_values(rng, shape, "float64"), 0)
        x = to_torch(dense)
        bs = (2, 2) if layout in ("bsr", "bsc") else None
        tx = torch_convert(x, layout, bs, dense_dim)
        ours = from_torch(tx)
        nb = len(shape) - dense_dim - 2
        d0, d1 = nb, nb + 1
        perm = list(range(len(shape)))
        perm[d0], perm[d1] = d1, d0
        got = run("transpose", sp_input=ours, perm=perm)
        if dense_dim:  # torch: "transpose(): hybrid sparse compressed tensors ... are not supported"
            with pytest.raises(RuntimeError):
                tx.transpose(d0, d1)
            assert got.layout == {"csr": "csc", "csc": "csr", "bsr": "bsc", "bsc": "bsr"}[layout]
            assert_eq(run("to_dense", sp_input=run("convert", sp_input=got, layout="coo")),
                              np.ascontiguousarray(np.swapaxes(dense, d0, d1)))
            continue
        want = from_torch(tx.transpose(d0, d1))
        assert_eq(got, want, what=f"transpose {layout} {shape}")


# ================================ found by TensorFlow's own tests (issue 35)
def test_slice_with_a_negative_start_as_tensorflow():
    """Issue 35, found by TensorFlow's own tests: entries are shifted by start, a negative one
    included, and the box is clipped at the end of each dimension only."""
    one = SparseTensor(indices=[[0, 0]], values=np.array([1.0]), dense_shape=[1, 1])
    out = run("slice", sp_input=one, start=[0, -1], size=[1, 2])
    assert out.indices.tolist() == [[0, 1]] and out.dense_shape == (1, 2) and out.values.tolist() == [1.0]
    assert_eq(out, tf().sparse.slice(to_tf(one), [0, -1], [1, 2]), exact=True)
    sp = SparseTensor(indices=[[0, 1], [2, 3], [0, 1]], values=np.array([1.0, 2.0, 3.0]), dense_shape=[3, 4])
    for start, size in [([-1, -1], [3, 3]), ([-5, -5], [3, 3]), ([-5, -5], [100, 100]), ([0, -3], [1, 2]),
                        ([0, -3], [3, 6]), ([7, -2], [3, 4]), ([-2, 0], [0, 4]), ([2, -1], [9, 0])]:
        want = tf().sparse.slice(to_tf(sp), start, size)
        assert_eq(run("slice", sp_input=sp, start=start, size=size), want, exact=True)


@settings(max_examples=40, deadline=None)
@given(st.data(), coo_tensors(hybrid=False))
def test_slice_with_negative_starts_matches_tensorflow(data, t):
    """Random starts from before the first index to past the end, sizes from 0 to past the end."""
    start = [data.draw(st.integers(-d - 3, d + 2)) for d in t.dense_shape]
    size = [data.draw(st.integers(0, 2 * d + 4)) for d in t.dense_shape]
    want = tf().sparse.slice(to_tf(t), start, size)
    assert_eq(run("slice", sp_input=t, start=start, size=size), want, exact=True)


def test_slice_whose_shape_overflows_is_refused_as_by_tensorflow():
    sp = SparseTensor(indices=[[0, 1], [2, 3]], values=np.array([1.0, 2.0]), dense_shape=[3, 4])
    start, size = [-(1 << 62), 0], [(1 << 62) + 2, 4]  # a slice of [2**62 + 2, 4]: past int64
    with pytest.raises(tf().errors.InvalidArgumentError):
        tf().sparse.slice(to_tf(sp), start, size)
    refused(InvalidArgumentError, "SHAPE_OVERFLOW", "slice", sp_input=sp, start=start, size=size)
    # Far before the first index and within int64: every entry is outside the box.
    out = run("slice", sp_input=sp, start=[-(1 << 70), 0], size=[5, 4])
    assert out.nnz == 0 and out.dense_shape == (5, 4)
