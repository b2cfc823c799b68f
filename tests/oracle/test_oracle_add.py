"""``add`` held to TensorFlow 2.21's tf.sparse.add on the same inputs.

sparse + sparse is TensorFlow's SparseAdd kernel exactly: the operands are merged in one pass as
given (unsorted operands and repeated indices are not sorted or summed first), and ``thresh``
applies only to sums of an entry of each operand (kept when thresh <= |sum|, so a NaN sum is
dropped even at threshold 0); an entry of one operand alone is kept whatever its magnitude.
Compared exactly: indices, their order, dtypes, values (allclose for floats). sparse + dense
(SparseTensorDenseAdd) gives the dense sum, repeated indices summed. Every dtype TensorFlow's
kernels take is drawn; TensorFlow's SparseAdd has no bool, unsigned or float16 kernel.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _oracle import from_tf, run, tf, to_tf
from helpers import assert_eq
from strategies import coo_tensors, random_values
from sparseserve import SparseTensor

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# The dtypes of TensorFlow's CPU SparseAdd kernel (tf.sparse.add refuses the others).
SPARSE_ADD_DTYPES = ("int8", "int16", "int32", "int64", "float32", "float64", "complex64", "complex128")
# SparseTensorDenseAdd's (sparse + dense).
DENSE_ADD_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                    "float32", "float64", "complex64", "complex128")


def tf_threshold(threshold: float, dtype):
    """tf.sparse.add's thresh in the values' real dtype (an integral one for integer values)."""
    real = np.dtype(dtype).type(0).real.dtype
    return np.asarray(threshold).astype(real)[()]


@st.composite
def sparse_pairs(draw, dtypes=SPARSE_ADD_DTYPES):
    """Two COO tensors of one shape and dtype: sorted or not, with repeats or not (each drawn),
    sharing some indices so that sums and their thresholds are exercised."""
    a = draw(coo_tensors(dtypes, hybrid=False, max_rank=3))
    dtype = a.dtype.name
    b = draw(coo_tensors((dtype,), hybrid=False, shape=tuple(a.dense_shape),
                         duplicates=draw(st.booleans()), unsorted=draw(st.booleans())))
    if a.nnz and b.nnz and draw(st.booleans()):  # b takes some of a's indices
        k = draw(st.integers(1, min(a.nnz, b.nnz)))
        indices = b.indices.copy()
        indices[:k] = a.indices[:k]
        if draw(st.booleans()):  # keep the pair sorted where both were
            order = np.lexsort(indices.T[::-1])
            indices, values = indices[order], b.values[order]
        else:
            values = b.values
        b = SparseTensor(indices=indices, values=values, dense_shape=b.dense_shape)
    if draw(st.booleans()) and a.nnz and b.nnz and dtype[0] in "fc":  # cancellation and NaN sums
        values = b.values.copy()
        same = [j for j in range(b.nnz) if j < a.nnz and (b.indices[j] == a.indices[j]).all()]
        for j in same[:1]:
            values[j] = -a.values[j]
        if dtype[0] == "f" and len(same) > 1:
            values[same[1]] = np.nan
        b = SparseTensor(indices=b.indices, values=values, dense_shape=b.dense_shape)
    return a, b


@SETTINGS
@given(ab=sparse_pairs(), threshold=st.sampled_from([0.0, 0.0, 1.0, 2.0, 2.5, 6.0]))
def test_sparse_sparse_matches_tf(ab, threshold):
    a, b = ab
    if a.dtype.kind in "iu" and threshold != int(threshold):
        threshold = float(int(threshold))  # TensorFlow takes an integral thresh for integer values
    want = from_tf(tf().sparse.add(to_tf(a), to_tf(b), tf_threshold(threshold, a.dtype)))
    got = run("add", a=a, b=b, threshold=threshold)
    assert_eq(got, want)
    # The order of the operands matters only for unsorted ones, as in TensorFlow.
    want_ba = from_tf(tf().sparse.add(to_tf(b), to_tf(a), tf_threshold(threshold, a.dtype)))
    assert_eq(run("add", a=b, b=a, threshold=threshold), want_ba)


@SETTINGS
@given(t=coo_tensors(DENSE_ADD_DTYPES, hybrid=False, max_rank=3), seed=st.integers(0, 99),
       swap=st.booleans())
def test_sparse_dense_matches_tf(t, seed, swap):
    dense = random_values(np.random.default_rng(seed), t.dense_shape, t.dtype)
    want = tf().sparse.add(dense, to_tf(t)) if swap else tf().sparse.add(to_tf(t), dense)
    got = run("add", a=dense, b=t) if swap else run("add", a=t, b=dense)
    assert_eq(got, np.asarray(want))


def test_tf_examples_written_out():
    """The cases the kernel's rule decides, each checked against TensorFlow as well."""
    cases = [
        # (a indices, a values, b indices, b values, shape, threshold)
        ([[0], [2]], [0.1, 5.0], [[2]], [1.0], [4], 0.5),         # a small entry alone is kept
        ([[1], [1]], [1.0, 2.0], [[1]], [10.0], [4], 0.0),        # a repeat pairs once
        ([[1], [1]], [1.0, 2.0], [[1]], [-1.0], [4], 0.5),        # the cancelled pair dropped
        ([[3], [1]], [1.0, 2.0], [[1], [2]], [10.0, 20.0], [4], 0.0),  # unsorted: merged as given
        ([[1]], [np.nan], [[1]], [1.0], [4], 0.0),                # a NaN sum dropped at 0
        ([[1]], [np.nan], [[2]], [1.0], [4], 0.5),                # a NaN alone kept
        ([[1]], [1.0], [[1]], [-1.0], [4], 0.0),                  # 0 kept at threshold 0
    ]
    for ai, av, bi, bv, shape, threshold in cases:
        a = SparseTensor(indices=ai, values=np.array(av), dense_shape=shape)
        b = SparseTensor(indices=bi, values=np.array(bv), dense_shape=shape)
        want = from_tf(tf().sparse.add(to_tf(a), to_tf(b), threshold))
        assert_eq(run("add", a=a, b=b, threshold=threshold), want)
