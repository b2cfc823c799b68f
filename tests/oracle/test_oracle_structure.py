"""sparse_to_dense, to_indicator, concat, fill_empty_rows and select held to TensorFlow 2.21 and
PyTorch 2.13 running the same inputs.

TensorFlow: sparse_to_dense, to_indicator, concat and fill_empty_rows. PyTorch: select (torch's
select, and narrow_copy for slices), and indexing of CSR, CSC and BSR tensors torch itself makes
(``csr[i]`` a COO vector, ``hybrid.select`` of a dense dim CSR, ``batched[b]`` CSR/BSR,
``select_copy`` of a BSR a COO vector of every element of the stored blocks). concat,
to_indicator and fill_empty_rows have no torch answer on those layouts (torch.cat refuses them):
they are held to our COO answer in tests/ops/test_ops_structure.py.

Deliberate differences (named where they are tested):
- sparse_to_dense without validate_indices: the contract says repeated indices are summed (as
  torch's to_dense); TensorFlow's kernel keeps the last one written. Held to TensorFlow's own
  unsorted_segment_sum of the repeats.
- fill_empty_rows with an empty second dimension: TensorFlow accepts it but answers with an
  invalid tensor; we refuse it or answer consistently, and it is not compared here.
- TensorFlow's Reorder (behind concat) is std::sort, unstable past 16 entries: concat's values at
  one repeated index are compared as a multiset. Ours is stable.
- tf.sparse.to_indicator casts any values to int64; ours takes integer ids only (UNIMPLEMENTED
  otherwise), so integers are drawn.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from _oracle import (COMPRESSED_SETTINGS, INTS, TF_DTYPES, TF_SETTINGS, TORCH_DTYPES, TORCH_SETTINGS, check, from_tf,
                     from_torch, ours_refuse, run, scalars, shapes, tf, tf_scalar, to_tf, to_torch, torch, torch_sparse)
from conftest import op_raises as refused
from helpers import assert_eq
from strategies import coo_tensors, random_values
from sparseserve import InvalidArgumentError, SparseTensor


def same_sparse_up_to_ties(got, want, **kw):
    """As assert_eq, but the values at one repeated index may come in any order: TensorFlow's
    Reorder is std::sort, stable only up to 16 entries (its insertion-sort cut-off)."""
    want = from_tf(want)
    assert_eq(SparseTensor(indices=got.indices, values=_tie_sorted(got), dense_shape=got.dense_shape),
                SparseTensor(indices=want.indices, values=_tie_sorted(want), dense_shape=want.dense_shape), **kw)


def _tie_sorted(t: SparseTensor) -> np.ndarray:
    """The values with each run of equal indices sorted by their bytes."""
    values = np.array(t.values)
    idx = np.asarray(t.indices).reshape(t.nnz, -1) if t.nnz else np.zeros((0, 1))
    i = 0
    while i < t.nnz:
        j = i + 1
        while j < t.nnz and (idx[j] == idx[i]).all():
            j += 1
        values[i:j] = sorted(values[i:j], key=lambda v: np.asarray(v).tobytes())
        i = j
    return values


# ============================================================== sparse_to_dense
@st.composite
def sparse_to_dense_args(draw):
    """(sparse_indices, output_shape, sparse_values, default_value, validate_indices), in each of
    the index forms: 0-D (one index into a 1-D output), 1-D, 2-D [N, rank]; values a scalar or a
    vector; now and then an index out of range."""
    form = draw(st.sampled_from(["0d", "1d", "2d"]))
    if form == "2d":
        shape = draw(shapes(min_dim=1))
    else:
        shape = (draw(st.integers(1, 6)),)
    dtype = np.dtype(draw(st.sampled_from(TF_DTYPES)))
    index_dtype = draw(st.sampled_from([np.int32, np.int64]))
    n = 1 if form == "0d" else draw(st.integers(0, 8))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    idx = np.stack([rng.integers(0, d, n) for d in shape], axis=1) if n else np.zeros((0, len(shape)), np.int64)
    if n and draw(st.booleans()):
        idx = idx[np.lexsort(idx.T[::-1])]
    if n and draw(st.integers(0, 5)) == 0:
        idx[rng.integers(0, n), rng.integers(0, len(shape))] = draw(st.sampled_from([-1, 7]))
    idx = idx.astype(index_dtype)
    idx = np.asarray(idx[0, 0]) if form == "0d" else idx[:, 0] if form == "1d" else idx
    values = np.asarray(random_values(rng, (), dtype) if draw(st.booleans()) else random_values(rng, (n,), dtype))
    default = random_values(rng, (), dtype)[()]
    return idx, list(shape), values, default, draw(st.booleans())


@TF_SETTINGS
@given(sparse_to_dense_args())
def test_sparse_to_dense(args):
    idx, shape, values, default, validate = args
    flat = np.asarray(idx).reshape(-1, len(shape)) if np.ndim(idx) else np.asarray(idx).reshape(1, 1)
    if not validate and len(np.unique(flat, axis=0)) < len(flat):
        return _repeats_summed(args)
    check("sparse_to_dense", dict(sparse_indices=idx, output_shape=shape, sparse_values=values,
                                  default_value=default, validate_indices=validate),
          lambda: tf().raw_ops.SparseToDense(sparse_indices=idx, output_shape=np.asarray(shape, idx.dtype),
                                             sparse_values=values, default_value=default,
                                             validate_indices=validate),
          assert_eq)


def test_sparse_to_dense_repeats_are_summed():
    _repeats_summed((np.array([[2, 1], [0, 0], [2, 1]]), [3, 2], np.array([1.5, 2.0, 4.0]), 0.0, False))


def _repeats_summed(args):
    """Repeated indices without validate_indices add up, as to_dense's do (the contract; TensorFlow's
    kernel keeps the last). Checked against TensorFlow's own sum of the repeats (segment_sum)."""
    idx, shape, values, default, _ = args
    if np.asarray(values).dtype == np.bool_:
        return
    flat = np.asarray(idx).reshape(-1, len(shape)) if np.ndim(idx) else np.asarray(idx).reshape(1, 1)
    if ((flat < 0) | (flat >= np.asarray(shape))).any():
        ours_refuse("sparse_to_dense", sparse_indices=idx, output_shape=shape, sparse_values=values,
                    default_value=default, validate_indices=False)
        return
    keys = np.ravel_multi_index(flat.T, shape)
    vals = np.broadcast_to(values, (len(flat),))
    summed = tf().math.unsorted_segment_sum(vals, keys, int(np.prod(shape))).numpy()
    hit = np.zeros(int(np.prod(shape)), bool)
    hit[keys] = True
    want = np.where(hit, summed, np.asarray(default, vals.dtype)).reshape(shape)
    got = run("sparse_to_dense", sparse_indices=idx, output_shape=shape, sparse_values=values,
              default_value=default, validate_indices=False)
    assert_eq(got, want.astype(vals.dtype))


# ================================================================= to_indicator
@st.composite
def id_tensors(draw):
    t = draw(coo_tensors(INTS, hybrid=False))
    vocab = draw(st.integers(0, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ids = rng.integers(0, max(vocab, 1), t.nnz)
    if t.nnz and draw(st.integers(0, 4)) == 0:  # an id out of range: TensorFlow refuses it
        ids[rng.integers(0, t.nnz)] = draw(st.sampled_from([-1, vocab, vocab + 3]))
    if t.dtype.kind == "u":
        ids = np.abs(ids) + (ids < 0) * vocab  # unsigned: out of range only above
    values = ids.astype(t.dtype)
    return SparseTensor(indices=t.indices, values=values, dense_shape=t.dense_shape), vocab


@TF_SETTINGS
@given(id_tensors())
def test_to_indicator(arg):
    t, vocab = arg
    check("to_indicator", dict(sp_input=t, vocab_size=vocab),
          lambda: tf().sparse.to_indicator(to_tf(t), vocab), assert_eq)


# ======================================================================= concat
@st.composite
def concat_args(draw):
    base = draw(shapes(max_dim=3))
    rank = len(base)
    axis = draw(st.integers(-rank, rank - 1))
    expand = draw(st.booleans())
    dtype = draw(st.sampled_from(TF_DTYPES))
    mismatch = draw(st.integers(0, 5)) == 0  # other dims differ without expand: refused
    inputs = []
    for _ in range(draw(st.integers(1, 3))):
        shape = list(base)
        shape[axis] = draw(st.integers(0, 3))
        if expand or mismatch:
            for d in range(rank):
                if d != axis % rank and draw(st.booleans()):
                    shape[d] = draw(st.integers(0, 3))
        inputs.append(draw(coo_tensors((dtype,), hybrid=False, shape=tuple(shape))))
    return axis, inputs, expand


@TF_SETTINGS
@given(concat_args())
def test_concat(args):
    axis, inputs, expand = args
    check("concat", dict(axis=axis, sp_inputs=inputs, expand_nonconcat_dims=expand),
          lambda: tf().sparse.concat(axis, [to_tf(t) for t in inputs], expand_nonconcat_dims=expand),
          same_sparse_up_to_ties)


# ============================================================== fill_empty_rows
@st.composite
def fill_inputs(draw):
    shape = draw(shapes(min_dim=1))
    shape = (draw(st.integers(0, 4)), *shape[1:])  # no row, or rows; an index [row, 0, ...] exists
    return draw(coo_tensors(hybrid=False, shape=shape))


@TF_SETTINGS
@given(st.data(), fill_inputs())
def test_fill_empty_rows(data, t):
    default = data.draw(scalars(t.dtype))
    out, empty = tf().sparse.fill_empty_rows(to_tf(t), tf_scalar(default, t.dtype))
    got, got_empty = run("fill_empty_rows", sp_input=t, default_value=default)
    assert_eq(got, out, what="output")
    assert_eq(got_empty, empty, what="empty_row_indicator")


# ================================================================== select
@TORCH_SETTINGS
@given(t=coo_tensors(TORCH_DTYPES, min_rank=2, max_rank=4, min_dim=1), data=st.data())
def test_select_matches_torch(t, data):
    dim = data.draw(st.integers(0, t.ndim - 1))
    i = data.draw(st.integers(-t.dense_shape[dim], t.dense_shape[dim] - 1))
    index = [[None, None, None]] * dim + [i]
    got = run("select", sp_input=t, index=index)
    want_t = to_torch(t).select(dim, i)
    if isinstance(got, SparseTensor):
        want = from_torch(want_t)
        if want.layout == "coo":
            # torch's select keeps the surviving entries in their order, as ours
            assert_eq(got, want, what=f"select dim {dim} index {i}")
        else:
            assert_eq(run("to_dense", sp_input=got, validate_indices=False), want_t.to_dense().numpy())
    else:
        dense_want = want_t.to_dense().numpy() if want_t.layout != torch().strided else want_t.numpy()
        assert_eq(got, dense_want, what=f"select dim {dim} index {i} (dense)")


@TORCH_SETTINGS
@given(t=coo_tensors(TORCH_DTYPES, min_rank=1, max_rank=3, min_dim=1, hybrid=False), data=st.data())
def test_select_slices_match_torch_narrow(t, data):
    dim = data.draw(st.integers(0, t.ndim - 1))
    n = t.dense_shape[dim]
    start = data.draw(st.integers(0, n - 1))
    length = data.draw(st.integers(0, n - start))
    index = [[None, None, None]] * dim + [[start, start + length, 1]]
    got = run("select", sp_input=t, index=index)
    want = to_torch(t).narrow_copy(dim, start, length)
    assert_eq(run("to_dense", sp_input=got, validate_indices=False),
                      want.to_dense().numpy(), rtol=1e-3, atol=1e-3)
    want = from_torch(want)
    np.testing.assert_array_equal(np.sort(got.indices, axis=0), np.sort(want.indices, axis=0))


# ================================================== select of CSR, CSC and BSR
@COMPRESSED_SETTINGS
@given(x=torch_sparse(layouts=("csr", "csc"), batch=False), data=st.data())
def test_index_a_sparse_dim(x, data):
    t, ours, (shape, _, n_dense, _) = x
    dim = data.draw(st.integers(0, 1))
    assume(shape[dim] > 0)
    i = data.draw(st.integers(0, shape[dim] - 1))
    want = torch().select_copy(t, dim, i)  # torch: a sparse COO tensor (t[i] for CSR rows)
    got = run("select", sp_input=ours, index=[i] if dim == 0 else [[None, None, None], i])
    assert got.layout == "coo"
    assert_eq(got, from_torch(want.coalesce()))


@COMPRESSED_SETTINGS
@given(x=torch_sparse(layouts=("csr",), batch=False, dense=True), data=st.data())
def test_select_a_dense_dim_keeps_csr(x, data):
    t, ours, (shape, _, n_dense, _) = x
    assume(n_dense)
    k = data.draw(st.integers(0, shape[2] - 1))
    want = t.select(2, k)
    assert_eq(run("select", sp_input=ours, index=[[None, None, None], [None, None, None], k]), want)


@COMPRESSED_SETTINGS
@given(x=torch_sparse(layouts=("csr", "bsr"), batch=True, dense=False), data=st.data())
def test_index_a_batch_keeps_layout(x, data):
    t, ours, (shape, n_batch, _, _) = x
    assume(n_batch)
    b = data.draw(st.integers(0, shape[0] - 1))
    assert_eq(run("select", sp_input=ours, index=[b]), t[b])


@COMPRESSED_SETTINGS
@given(x=torch_sparse(layouts=("bsr",), batch=False, dense=False), data=st.data())
def test_select_copy_of_bsr(x, data):
    t, ours, (shape, *_rest) = x
    assume(0 not in shape)
    dim = data.draw(st.integers(0, 1))
    i = data.draw(st.integers(0, shape[dim] - 1))
    want = torch().select_copy(t, dim, i)  # every element of the stored blocks, zeros included
    index = [i] if dim == 0 else [[None, None, None], i]
    got = run("select", sp_input=ours, index=index)
    w = want.coalesce()
    assert_eq(got, from_torch(w))


# ================================ found by TensorFlow's own tests (issue 35)
def test_concat_of_one_input_comes_back_as_it_is_whatever_the_axis():
    """Issue 35, found by TensorFlow's own tests: tf.sparse.concat(2000, [st]) is st, with or
    without expand_nonconcat_dims; several inputs need an axis in range."""
    t = SparseTensor(indices=[[1, 2], [0, 1]], values=np.array([1.0, 2.0]), dense_shape=[3, 4])  # unsorted
    for axis in (2000, -2000, 2, -3, 1, -1, 0):
        for expand in (False, True):
            want = tf().sparse.concat(axis, [to_tf(t)], expand_nonconcat_dims=expand)
            got = run("concat", axis=axis, sp_inputs=[t], expand_nonconcat_dims=expand)
            assert_eq(got, want, exact=True)
            assert got.indices.tolist() == [[1, 2], [0, 1]]  # not re-sorted
    with pytest.raises(tf().errors.InvalidArgumentError):
        tf().sparse.concat(2000, [to_tf(t), to_tf(t)])
    refused(InvalidArgumentError, "AXIS_OUT_OF_RANGE", "concat", axis=2000, sp_inputs=[t, t])
    csr = SparseTensor(layout="csr", compressed_indices=[0, 1, 1], plain_indices=[2], values=np.array([5.0]),
                       dense_shape=[2, 3])
    assert_eq(run("concat", axis=7, sp_inputs=[csr]), csr, exact=True)
