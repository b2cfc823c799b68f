"""reorder, coalesce, to_dense and from_dense held to TensorFlow 2.21 and PyTorch 2.13 running the same inputs.

TensorFlow: tf.sparse.reorder, to_dense (validated, or not on unsorted input), from_dense, and
these ops over the three wires. PyTorch: coalesce, the sum of repeats in to_dense, and to_dense of
CSR, CSC, BSR and BSC tensors torch itself makes (batch and dense dimensions too). reorder and
coalesce have no torch answer on those layouts (torch's coalesce refuses them): they are held to
our COO answer in tests/ops/test_ops_coo.py.

Deliberate differences (named where they are tested):
- to_dense without validate_indices: the contract says repeated indices are summed (as torch's
  to_dense); TensorFlow's kernel keeps the last one written. Held to torch's to_dense.
"""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _oracle import (COMPRESSED_SETTINGS, NUMBERS, TF_DTYPES, TF_SETTINGS, TORCH_DTYPES, TORCH_SETTINGS, check,
                     from_torch, run, scalars, shapes, tf, tf_scalar, to_tf, to_torch, torch, torch_sparse)
from helpers import assert_eq
from strategies import coo_tensors, random_values
from sparseserve import SparseTensor
from sparseserve.errors import InvalidArgumentError

# ====================================================================== reorder
@TF_SETTINGS
@given(coo_tensors(hybrid=False))
def test_reorder(t):
    want = tf().sparse.reorder(to_tf(t))
    assert_eq(run("reorder", sp_input=t), want)


# ===================================================================== to_dense
@TF_SETTINGS
@given(st.data(), coo_tensors(hybrid=False))
def test_to_dense_validated(data, t):
    """validate_indices=True: TensorFlow refuses unsorted or repeated indices; so must we."""
    default = data.draw(scalars(t.dtype))
    check("to_dense", dict(sp_input=t, default_value=default, validate_indices=True),
          lambda: tf().sparse.to_dense(to_tf(t), default_value=tf_scalar(default, t.dtype),
                                       validate_indices=True),
          assert_eq)


@TF_SETTINGS
@given(st.data(), coo_tensors(hybrid=False, duplicates=False))
def test_to_dense_unvalidated_unsorted(data, t):
    default = data.draw(scalars(t.dtype))
    want = tf().sparse.to_dense(to_tf(t), default_value=tf_scalar(default, t.dtype), validate_indices=False)
    assert_eq(run("to_dense", sp_input=t, default_value=default, validate_indices=False), want)


@settings(max_examples=30, deadline=None)
@given(coo_tensors(duplicates=False, hybrid=False))
def test_to_dense_matches_tf(t):
    want = tf().sparse.to_dense(tf().sparse.reorder(to_tf(t)), validate_indices=False).numpy()
    got = run("to_dense", sp_input=t, validate_indices=False)
    assert_eq(got, want)


TORCH_SUMS = ("int8", "int16", "int32", "int64", "uint8", "float32", "float64", "complex64", "complex128")


@TF_SETTINGS
@given(coo_tensors(TORCH_SUMS, hybrid=False))
def test_to_dense_unvalidated_repeats_are_summed_as_torch(t):
    """The contract: without validate_indices repeated indices are summed (torch's to_dense); TensorFlow's
    kernel keeps the last value written instead, so here torch is the oracle."""
    want = to_torch_coo(t).to_dense().numpy()
    assert_eq(run("to_dense", sp_input=t, validate_indices=False), want)


def to_torch_coo(t: SparseTensor):
    return torch().sparse_coo_tensor(torch().from_numpy(np.asarray(t.indices).T.copy()),
                                     torch().from_numpy(np.asarray(t.values).copy()), tuple(t.dense_shape),
                                     check_invariants=True)


# =================================================================== from_dense
@st.composite
def dense_arrays(draw, dtypes=TF_DTYPES):
    shape = draw(shapes())
    dtype = np.dtype(draw(st.sampled_from(dtypes)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    a = random_values(rng, shape, dtype)
    a[rng.random(shape) < 0.5] = 0  # mostly zeros
    if dtype.kind in "fc" and a.size:
        special = np.array([np.nan, np.inf, -np.inf, -0.0], dtype)
        pick = rng.random(shape) < 0.15
        a[pick] = special[rng.integers(0, 4, int(pick.sum()))]
    return a


@TF_SETTINGS
@given(dense_arrays())
def test_from_dense(a):
    """Every non-zero element kept (nan and inf too; -0.0 is zero), row-major."""
    want = tf().sparse.from_dense(tf().constant(a))
    assert_eq(run("from_dense", tensor=a), want)


# ================================================================== coalesce
@TORCH_SETTINGS
@given(t=coo_tensors(TORCH_DTYPES, max_rank=4))
def test_coalesce_matches_torch(t):
    got = run("coalesce", sp_input=t)
    want = from_torch(to_torch(t).coalesce())
    assert got.coalesced
    assert_eq(got, want, rtol=1e-3 if t.dtype == np.float16 else 1e-6)


# =========================================== to_dense of CSR, CSC, BSR and BSC
@COMPRESSED_SETTINGS
@given(x=torch_sparse(dtypes=NUMBERS + ("bool", "int8", "float16")))
def test_to_dense(x):
    t, ours, _ = x
    assert_eq(run("to_dense", sp_input=ours), t.to_dense().numpy())


# ================================================================== the wires
WIRE_T = SparseTensor(indices=[[3, 1], [0, 2], [3, 0], [0, 2], [1, 1]],
                      values=np.array([1.5, -2.0, 4.0, 0.5, -1.0], np.float32), dense_shape=[5, 3])


def test_wires_match_tensorflow(client):
    t = WIRE_T
    assert_eq(client.reorder(t), tf().sparse.reorder(to_tf(t)))
    out, empty = client.fill_empty_rows(t, -7.0)
    want, want_empty = tf().sparse.fill_empty_rows(to_tf(t), np.float32(-7.0))
    assert_eq(out, want)
    assert_eq(empty, want_empty)
    s = tf().sparse.reorder(to_tf(t))
    assert_eq(client.reduce_sum(t, axis=-1), tf().sparse.reduce_sum(s, axis=-1))
    assert_eq(client.reduce_max(t, axis=[0], keepdims=True, output_is_sparse=True),
                tf().sparse.reduce_max(s, axis=[0], keepdims=True, output_is_sparse=True))
    assert_eq(client.transpose(t, perm=[1, 0]), tf().sparse.transpose(to_tf(t), [1, 0]))
    assert_eq(client.slice(t, start=[0, 1], size=[4, 5]), tf().sparse.slice(to_tf(t), [0, 1], [4, 5]))
    dense = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert_eq(client.matmul(t, dense), tf().sparse.sparse_dense_matmul(to_tf(t), dense))
    with pytest.raises(InvalidArgumentError):  # TensorFlow refuses the unsorted input too
        client.to_dense(t)
    with pytest.raises(tf().errors.InvalidArgumentError):
        tf().sparse.to_dense(to_tf(t))
    coalesced = client.coalesce(t)
    assert_eq(client.to_dense(coalesced, default_value=9.0),
               tf().sparse.to_dense(to_tf(coalesced), default_value=9.0))
