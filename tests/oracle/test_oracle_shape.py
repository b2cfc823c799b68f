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
from hypothesis import given
from hypothesis import strategies as st

from _oracle import (COMPRESSED, TF_SETTINGS, check, declared_layouts, from_torch, nonzero_values, run, tf, to_tf,
                     to_torch, torch_convert)
from helpers import assert_eq
from strategies import coo_tensors

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
