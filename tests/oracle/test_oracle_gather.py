"""index_select, sparse_mask and multiply held to PyTorch on the same inputs: structure, entry
order, coalesced flag and dtype exactly, floating values allclose."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _oracle import TORCH_DTYPES, in_layout, run, to_torch, torch
from helpers import assert_eq
from strategies import coo_tensors
from sparseserve import SparseTensor

warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
SETTINGS = settings(max_examples=30, deadline=None)


def assert_torch(got: SparseTensor, want_torch) -> None:
    """As torch's, a COO result's coalesced flag too."""
    assert_eq(got, want_torch, coalesced=got.layout == "coo")


@st.composite
def selections(draw, **kw):
    kw = {"min_rank": 1, "max_rank": 4, **kw}
    t = draw(coo_tensors(TORCH_DTYPES, **kw))
    dim = draw(st.integers(-t.ndim, t.ndim - 1))
    size = t.dense_shape[dim]
    index = draw(st.lists(st.integers(-size, size - 1), max_size=8)) if size else []
    return t, dim, np.asarray(index, np.int64)


@SETTINGS
@given(selections(), st.booleans())
def test_index_select_coo_matches_torch(case, coalesce):
    t, dim, index = case
    if coalesce:
        t = run("coalesce", sp_input=t)
    got = run("index_select", input=t, dim=dim, index=index)
    if dim % t.ndim >= t.sparse_ndim:  # PyTorch takes negative positions on sparse dimensions only
        index = np.where(index < 0, index + t.dense_shape[dim], index)
    want = torch().index_select(to_torch(t), dim, torch().from_numpy(index))
    assert_torch(got, want)


@pytest.mark.parametrize("nnz, size, n_index, coalesce", [
    (40_000, 100, 500, True),        # counting algorithm, index-major
    (40_000, 100, 60_000, False),    # counting algorithm, entry-major
    (20_000, 1_000_000, 3_000, True),  # binary search into the sorted coordinates
    (20_000, 1_000_000, 70_000, False),  # binary search (distinct coordinates: see below)
    (3_000, 5_000, 50, False),       # brute force
])
def test_index_select_large_branches_match_torch(nnz, size, n_index, coalesce):
    """Sizes past PyTorch's brute force, where it picks its algorithm and order by the sizes
    (run with the thread count the order rule follows). PyTorch's binary-search algorithm sorts
    with an unstable sort past a few thousand elements, which orders repeated coordinates (and
    repeated index values) arbitrarily; ours keeps input order there, so those inputs have none."""
    from sparseserve.server.ops.gather import TORCH_THREADS

    rng = np.random.default_rng(nnz + size + n_index)
    rows = rng.choice(size, nnz, replace=False) if nnz <= size else rng.integers(0, size, nnz)
    t = SparseTensor(indices=np.stack([rows, rng.integers(0, 7, nnz)], axis=1),
                     values=rng.standard_normal(nnz), dense_shape=[size, 7])
    if coalesce:
        t = run("coalesce", sp_input=t)
    index = rng.choice(np.arange(-size, size), n_index, replace=False) if nnz <= size else \
        rng.integers(-size, size, n_index)
    before = torch().get_num_threads()
    torch().set_num_threads(TORCH_THREADS)
    try:
        want = torch().index_select(to_torch(t), 0, torch().from_numpy(index))
    finally:
        torch().set_num_threads(before)
    assert_torch(run("index_select", input=t, dim=0, index=index), want)


@SETTINGS
@given(selections(min_rank=2, max_rank=2, hybrid=False, duplicates=False), st.sampled_from(["int32", "int64"]))
def test_index_select_csr_is_torch_coo_answer_converted(case, index_dtype):
    t, dim, index = case
    csr = in_layout(run("coalesce", sp_input=t), "csr")
    if index_dtype == "int32":
        csr = SparseTensor(layout="csr", compressed_indices=csr.compressed_indices.astype(np.int32),
                           plain_indices=csr.plain_indices.astype(np.int32), values=csr.values,
                           dense_shape=csr.dense_shape)
    got = run("index_select", input=csr, dim=dim, index=index.astype(index_dtype))
    want = torch().index_select(to_torch(csr).to_sparse_coo(), dim, torch().from_numpy(index)).to_sparse_csr()
    assert_eq(got, want, index_dtype=False)  # torch's COO -> CSR makes int64 indices; ours keeps the input's


@SETTINGS
@given(coo_tensors(TORCH_DTYPES, min_rank=1, max_rank=4), st.booleans(), st.sampled_from(TORCH_DTYPES))
def test_sparse_mask_coo_matches_torch(mask, coalesce, dtype):
    if coalesce:
        mask = run("coalesce", sp_input=mask)
    dense = np.random.default_rng(mask.nnz).integers(-5, 6, mask.dense_shape).astype(dtype)
    got = run("sparse_mask", input=dense, mask=mask)
    assert_torch(got, to_torch(dense).sparse_mask(to_torch(mask)))


@SETTINGS
@given(coo_tensors(("float32", "int64", "complex64"), min_rank=2, max_rank=2, hybrid=False))
def test_sparse_mask_csr_matches_torch(mask):
    csr = in_layout(run("coalesce", sp_input=mask), "csr")
    dense = np.random.default_rng(7).standard_normal(mask.dense_shape)
    assert_torch(run("sparse_mask", input=dense, mask=csr), to_torch(dense).sparse_mask(to_torch(csr)))


MUL_DTYPES = ("bool", "int8", "uint8", "int32", "int64", "float16", "float32", "float64", "complex64")


@SETTINGS
@given(st.data())
def test_multiply_sparse_sparse_matches_torch(data):
    # PyTorch's sparse * sparse of two coalesced bool tensors is NotImplemented (test_ops_gather has ours)
    a = data.draw(coo_tensors(MUL_DTYPES[1:], min_rank=1, max_rank=3, min_dim=1))
    same = data.draw(st.booleans())
    shape = a.dense_shape if same else a.dense_shape[:a.sparse_ndim] + tuple(
        data.draw(st.sampled_from([1, d])) for d in a.dense_shape[a.sparse_ndim:])
    b = data.draw(coo_tensors(MUL_DTYPES[1:], shape=shape, sparse_ndim=a.sparse_ndim))
    if data.draw(st.booleans()):
        a = run("coalesce", sp_input=a)
    if data.draw(st.booleans()):
        b = run("coalesce", sp_input=b)
    got = run("multiply", a=a, b=b)
    try:
        want = torch().mul(to_torch(a), to_torch(b))
    except RuntimeError:
        # torch 2.13 fails to broadcast dense dimensions against an empty operand ("setStorage: ...
        # out of bounds for storage of size 0"): the same product with both operands' values
        # broadcast beforehand.
        assert not same and 0 in (a.nnz, b.nnz)
        shape = np.broadcast_shapes(a.dense_shape, b.dense_shape)
        a, b = (SparseTensor(indices=t.indices, dense_shape=shape, coalesced=t.coalesced,
                             values=np.broadcast_to(t.values, (t.nnz, *shape[t.sparse_ndim:])).copy())
                for t in (a, b))
        want = torch().mul(to_torch(a), to_torch(b))
    assert_torch(got, want)


@SETTINGS
@given(st.data())
def test_multiply_sparse_dense_matches_torch(data):
    s = data.draw(coo_tensors(MUL_DTYPES, min_rank=1, max_rank=3))
    shape = list(s.dense_shape)
    kind = data.draw(st.sampled_from(["same", "suffix", "ones", "scalar", "lead"]))
    if kind == "suffix":
        shape = shape[data.draw(st.integers(0, len(shape))):]
    elif kind == "ones":
        shape = [data.draw(st.sampled_from([1, d])) for d in shape]
    elif kind == "scalar":
        shape = []
    elif kind == "lead":
        shape = [data.draw(st.integers(1, 3))] + shape
    dtype = data.draw(st.sampled_from(MUL_DTYPES))
    dense = np.random.default_rng(len(shape)).integers(-3, 4, shape).astype(dtype)
    dense_first = data.draw(st.booleans())
    a, b = (dense, s) if dense_first else (s, dense)
    got = run("multiply", a=a, b=b)
    want = torch().mul(to_torch(a), to_torch(b))
    if want.dtype == torch().complex32:
        # float16 times a complex 0-d tensor is complex32 in torch, which numpy (and docs/contract.md) lack:
        # ours is the nearest dtype there is, complex64, holding torch's values.
        assert got.dtype == np.complex64
        want = want.to(torch().complex64)
    assert_torch(got, want)


@SETTINGS
@given(coo_tensors(("float32", "int32", "float64"), min_rank=2, max_rank=2, hybrid=False, min_dim=1),
       st.sampled_from(["csr*dense", "dense*csr", "csr*scalar", "csr*csr", "csr*coo"]))
def test_multiply_csr_matches_torch(t, case):
    c = in_layout(run("coalesce", sp_input=t), "csr")
    dense = np.random.default_rng(3).integers(-3, 4, t.dense_shape).astype(np.float32)
    other = SparseTensor(indices=t.indices[::2], values=t.values[::2], dense_shape=t.dense_shape)
    a, b = {"csr*dense": (c, dense), "dense*csr": (dense, c), "csr*scalar": (c, np.array(2.5)),
            "csr*csr": (c, in_layout(run("coalesce", sp_input=other), "csr")),
            "csr*coo": (c, other)}[case]
    got = run("multiply", a=a, b=b)
    assert_torch(got, torch().mul(to_torch(a), to_torch(b)))
