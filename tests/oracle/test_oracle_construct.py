"""split, expand_dims, eye, reset_shape against TensorFlow, and expand_dims on hybrid tensors
and spdiags against PyTorch: the same inputs, exact structure (indices, their order, shapes,
dtypes) and values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _oracle import TF_DTYPES, TORCH_DTYPES, from_tf, from_torch, in_layout, run, tf, to_tf, to_torch, torch
from helpers import assert_eq
from strategies import coo_tensors
from sparseserve import SparseTensor

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CS[RC] tensor support is in beta state")
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def split_cases(draw, dtypes=TF_DTYPES):
    t = draw(coo_tensors(dtypes, hybrid=False, min_dim=1, max_rank=4))
    axis = draw(st.integers(-t.ndim, t.ndim - 1))
    num_split = draw(st.integers(1, int(t.dense_shape[axis])))
    return t, num_split, axis


@SETTINGS
@given(split_cases())
def test_split_matches_tensorflow(case):
    t, num_split, axis = case
    got = run("split", sp_input=t, num_split=num_split, axis=axis)
    want = [from_tf(p) for p in tf().sparse.split(sp_input=to_tf(t), num_split=num_split, axis=axis)]
    assert len(got) == len(want) == num_split
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_eq(g, w, what=f"piece {i}")


@SETTINGS
@given(split_cases(dtypes=("float32", "int64", "complex64")), st.sampled_from(["csr", "csc"]))
def test_split_of_compressed_matches_tensorflow_on_its_coo_form(case, layout):
    t, num_split, axis = case
    if t.ndim != 2:
        t = SparseTensor(indices=np.zeros((0, 2), np.int64), values=np.zeros(0, t.dtype),
                         dense_shape=[int(t.dense_shape[0]), 3])
        axis = axis % 2
        num_split = min(num_split, int(t.dense_shape[axis]))
    compressed = in_layout(run("coalesce", sp_input=t), layout)
    got = run("split", sp_input=compressed, num_split=num_split, axis=axis)
    row_major = tf().sparse.reorder(to_tf(compressed.to_coo()))
    want = [from_tf(p) for p in tf().sparse.split(sp_input=row_major, num_split=num_split, axis=axis)]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_eq(g, w, what=f"piece {i}")


@SETTINGS
@given(coo_tensors(TF_DTYPES, hybrid=False, max_rank=4), st.data())
def test_expand_dims_matches_tensorflow(t, data):
    axis = data.draw(st.integers(-(t.ndim + 1), t.ndim))
    assert_eq(run("expand_dims", sp_input=t, axis=axis), from_tf(tf().sparse.expand_dims(to_tf(t), axis)))


@SETTINGS
@given(coo_tensors(TORCH_DTYPES, min_rank=2, max_rank=4), st.data())
def test_expand_dims_of_hybrid_matches_torch_unsqueeze(t, data):
    axis = data.draw(st.integers(-(t.ndim + 1), t.ndim))
    want = from_torch(to_torch(t).unsqueeze(axis))
    assert_eq(run("expand_dims", sp_input=t, axis=axis), want)


@SETTINGS
@given(st.integers(0, 6), st.one_of(st.none(), st.integers(0, 6)), st.sampled_from(TF_DTYPES))
def test_eye_matches_tensorflow(num_rows, num_columns, dtype):
    got = run("eye", num_rows=num_rows, num_columns=num_columns, dtype=dtype)
    want = from_tf(tf().sparse.eye(num_rows, num_columns, dtype=tf().as_dtype(dtype)))
    assert_eq(got, want)


@SETTINGS
@given(coo_tensors(TF_DTYPES, hybrid=False, max_rank=4), st.data())
def test_reset_shape_matches_tensorflow(t, data):
    if data.draw(st.booleans()):
        new_shape = None
    else:
        new_shape = [int(d) + data.draw(st.integers(0, 3)) for d in t.dense_shape]
    got = run("reset_shape", sp_input=t, new_shape=new_shape)
    want = from_tf(tf().sparse.reset_shape(to_tf(t), None if new_shape is None else np.array(new_shape, np.int64)))
    assert_eq(got, want)


@st.composite
def spdiags_cases(draw):
    rows, cols = draw(st.integers(0, 5)), draw(st.integers(0, 5))
    width = draw(st.integers(0, 7))
    # torch's CPU kernel corrupts memory on a diagonal whose length would be negative, so
    # only offsets with a length of at least 0 go to it (test_ops_construct covers the rest).
    valid = [k for k in range(-rows, cols + 1)
             if min(rows - max(-k, 0), cols - max(k, 0), width - max(k, 0)) >= 0]
    offsets = draw(st.lists(st.sampled_from(valid), max_size=4, unique=True)) if valid else []
    dtype = draw(st.sampled_from(TORCH_DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    diagonals = (rng.integers(-5, 6, size=(len(offsets), width))).astype(dtype)
    if dtype == "bool":
        diagonals = rng.integers(0, 2, size=(len(offsets), width)).astype(bool)
    return diagonals, np.array(offsets, np.int64), [rows, cols]


@SETTINGS
@given(spdiags_cases(), st.sampled_from([None, "coo", "csr", "csc"]))
def test_spdiags_matches_torch(case, layout):
    """Exactly torch's answer (entry order included). Where torch's CPU kernel writes entries
    past the matrix (a diagonal longer than the matrix holds, e.g. offset 1 on 1 x 3: it
    stores [1, 2]), the answer is torch's entries inside it, as scipy.sparse.spdiags says."""
    import scipy.sparse

    diagonals, offsets, shape = case
    T = torch()
    layouts = {None: None, "coo": T.sparse_coo, "csr": T.sparse_csr, "csc": T.sparse_csc}
    got = run("spdiags", diagonals=diagonals, offsets=offsets, shape=shape, layout=layout)
    coo = T.sparse.spdiags(T.from_numpy(diagonals), T.from_numpy(offsets), tuple(shape))
    indices, values = coo._indices().numpy().T, coo._values().numpy()
    inside = (indices[:, 0] < shape[0]) & (indices[:, 1] < shape[1])
    if inside.all():
        want = T.sparse.spdiags(T.from_numpy(diagonals), T.from_numpy(offsets), tuple(shape),
                                layout=layouts[layout])
        assert_eq(got, from_torch(want))
    elif layout in (None, "coo"):
        assert_eq(got, SparseTensor(indices=indices[inside], values=values[inside], dense_shape=shape))
    if diagonals.dtype not in (np.bool_, np.float16) and diagonals.size:
        dense = scipy.sparse.spdiags(diagonals, offsets, *shape).toarray()
        np.testing.assert_array_equal(run("to_dense", sp_input=got, validate_indices=False), dense)


def test_spdiags_vector_and_scalar_offset_match_torch():
    T = torch()
    got = run("spdiags", diagonals=np.arange(1.0, 4), offsets=np.array(1), shape=[3, 3])
    want = T.sparse.spdiags(T.from_numpy(np.arange(1.0, 4)), T.tensor(1), (3, 3))
    assert_eq(got, from_torch(want))
