"""reduce_sum, reduce_max, softmax, log_softmax, maximum and minimum held to TensorFlow 2.21 and
PyTorch 2.13 running the same inputs.

TensorFlow: every op here (softmax on tensors in canonical order, which is what TensorFlow's op
requires). PyTorch: softmax and log_softmax on any axis, in every declared layout.

Deliberate differences (named where they are tested):
- Rank-0 results (reduce over every axis with output_is_sparse and no keepdims): TensorFlow makes
  a rank-0 SparseTensor, a COO tensor here has rank >= 1: we refuse it (INVALID_ARGUMENT).
- Inputs TensorFlow accepts but answers with an order-dependent result (maximum or softmax of
  unsorted input; NaN in reduce_max, where TensorFlow's answer depends on the entry order and ours
  is NaN): we refuse them or answer consistently, and they are not compared here.
- softmax follows torch where the two differ (see its doc); only canonical input is compared.
"""

from __future__ import annotations


import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from _oracle import (FLOATS, NUMBER, REAL, TF_SETTINGS, TORCH_SETTINGS, check, declared_layouts, from_torch, in_layout,
                     ours_refuse, run, shapes, tf, to_tf, to_torch, tol, torch)
from helpers import assert_eq
from strategies import coo_tensors, random_values
from sparseserve import SparseTensor


def sorted_unique(**kw):
    return coo_tensors(hybrid=False, duplicates=False, unsorted=False, **kw)


# ============================================================ reduce_sum / _max
@st.composite
def reduce_args(draw, dtypes):
    t = draw(coo_tensors(dtypes, hybrid=False))
    rank = t.ndim
    kind = draw(st.sampled_from(["none", "int", "list"]))
    if kind == "none":
        axis = None
    elif kind == "int":
        axis = draw(st.integers(-rank, rank - 1))
    else:
        axis = draw(st.lists(st.integers(-rank, rank - 1), max_size=rank + 1))
    return t, axis, draw(st.booleans()), draw(st.booleans())


def _every_axis(axis, rank: int) -> bool:
    if axis is None:
        return True
    axes = [axis] if isinstance(axis, int) else axis
    return {a % rank for a in axes} == set(range(rank))


def _reduce(op, t, axis, keepdims, sparse_out):
    fn = getattr(tf().sparse, op)
    kwargs = dict(sp_input=t, axis=axis, keepdims=keepdims, output_is_sparse=sparse_out)
    if sparse_out and not keepdims and _every_axis(axis, t.ndim):
        # TensorFlow answers with a rank-0 SparseTensor; a COO tensor has rank >= 1 here.
        assert fn(to_tf(t), axis=axis, output_is_sparse=True).dense_shape.shape[0] == 0
        ours_refuse(op, **kwargs)
        return
    compare = (lambda got, want: assert_eq(got, want, **tol(t.dtype))) if sparse_out else \
        (lambda got, want: assert_eq(got, want, **tol(t.dtype)))
    check(op, kwargs, lambda: fn(to_tf(t), axis=axis, keepdims=keepdims, output_is_sparse=sparse_out), compare)


@TF_SETTINGS
@given(reduce_args(NUMBER))
def test_reduce_sum(args):
    _reduce("reduce_sum", *args)


@TF_SETTINGS
@given(reduce_args(REAL))
def test_reduce_max(args):
    _reduce("reduce_max", *args)


# ====================================================================== softmax
@TF_SETTINGS
@given(sorted_unique(dtypes=FLOATS, min_rank=2))
def test_softmax(t):
    """tf.sparse.softmax (the innermost dimension) of a tensor in canonical order, which is what
    TensorFlow's op requires; torch.sparse.softmax agrees on it."""
    want = tf().sparse.softmax(to_tf(t))
    assert_eq(run("softmax", sp_input=t), want, **tol(t.dtype))
    assert_eq(run("softmax", sp_input=t, axis=t.ndim - 1), want, **tol(t.dtype))


# ============================================================ maximum, minimum
@st.composite
def operand_pairs(draw):
    shape = draw(shapes())
    dtype = draw(st.sampled_from(REAL))
    a = draw(sorted_unique(dtypes=(dtype,), shape=shape))
    if draw(st.integers(0, 6)) == 0:  # shapes that differ: refused
        shape = (*shape[:-1], shape[-1] + 1)
    b = draw(sorted_unique(dtypes=(dtype,), shape=shape))
    return a, b


@TF_SETTINGS
@given(operand_pairs(), st.sampled_from(["maximum", "minimum"]))
def test_maximum_minimum(pair, op):
    a, b = pair
    check(op, dict(sp_a=a, sp_b=b), lambda: getattr(tf().sparse, op)(to_tf(a), to_tf(b)), assert_eq)


# ================================================================== softmax, log_softmax
@TORCH_SETTINGS
@given(t=coo_tensors(("float32", "float64"), min_rank=1, max_rank=4, duplicates=False), data=st.data())
def test_log_softmax_and_softmax_match_torch(t, data):
    dim = data.draw(st.integers(-t.ndim, t.ndim - 1))
    for name, fn in (("log_softmax", torch().sparse.log_softmax), ("softmax", torch().sparse.softmax)):
        got = run(name, sp_input=t, axis=dim)
        want_t = fn(to_torch(t).coalesce(), dim)
        if t.values.size == 0 and t.nnz:
            # entries of zero elements (a dense dimension of size 0): torch drops them, ours keeps
            # the input's sparsity; both hold no number
            assert got.nnz == t.nnz and want_t._nnz() == 0
            continue
        assert_eq(got, from_torch(want_t), rtol=1e-5, atol=1e-5, what=f"{name} dim {dim}")


def test_softmax_last_axis_matches_tf_too():
    """tf.sparse.softmax (last axis, rank >= 2) agrees with torch there: unstored entries are -inf."""
    rng = np.random.default_rng(8)
    idx = np.argwhere(rng.random((3, 4, 5)) < 0.5)
    t = SparseTensor(indices=idx, values=random_values(rng, (idx.shape[0],), "float64"), dense_shape=[3, 4, 5])
    got = run("softmax", sp_input=t, axis=-1)
    want = tf().sparse.softmax(to_tf(t))
    np.testing.assert_allclose(got.values, want.values.numpy(), rtol=1e-6)


def test_softmax_in_declared_layouts():
    rng = np.random.default_rng(9)
    dense = np.where(rng.random((4, 6)) < 0.5, random_values(rng, (4, 6), "float64"), 0)
    x = SparseTensor.from_dense(dense)
    for layout in declared_layouts("log_softmax", "sp_input"):
        x_in = in_layout(x, layout, blocksize=[2, 2] if layout in ("bsr", "bsc") else None)
        got = run("log_softmax", sp_input=x_in, axis=1)
        # the stored positions of x_in (a block's zeros are stored entries) as torch's COO input
        want = from_torch(torch().sparse.log_softmax(to_torch(run("convert", sp_input=x_in, layout="coo")), 1))
        try:
            want_l = from_torch(torch().sparse.log_softmax(to_torch(x_in), 1))
        except (RuntimeError, NotImplementedError):
            want_l = None
        if want_l is not None and want_l.layout == got.layout:
            assert_eq(got, want_l, what=f"log_softmax {layout}")
        got_coo = run("convert", sp_input=got, layout="coo")
        want_d = run("to_dense", sp_input=want)
        got_d = run("to_dense", sp_input=got_coo)
        assert_eq(got_d, want_d, what=f"log_softmax {layout} (dense)")
