"""The shared test helpers themselves: ``assert_eq`` fails on each difference it is meant to see,
the strategies draw what they say, and ``example`` finds tagged blocks and only those."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import find, given, settings

from helpers import assert_eq, example, examples
from sparseserve import SparseTensor
from strategies import coo_tensors, compressed_tensors, random_coo, random_values, sparse_tensors

COO = SparseTensor(indices=[[0, 1], [2, 0]], values=np.array([1.5, 2.0]), dense_shape=[3, 2], coalesced=True)
CSR = SparseTensor(layout="csr", compressed_indices=np.array([0, 1, 1, 2], np.int32),
                   plain_indices=np.array([1, 0], np.int32), values=np.array([1, 2], np.int16), dense_shape=[3, 2])


def replace(t: SparseTensor, **kw) -> SparseTensor:
    fields = dict(layout=t.layout, indices=t.indices, compressed_indices=t.compressed_indices,
                  plain_indices=t.plain_indices, values=t.values, dense_shape=t.dense_shape, blocksize=t.blocksize,
                  coalesced=t.coalesced)
    return SparseTensor(**{**fields, **kw})


def test_equal_results_pass():
    assert_eq(COO, replace(COO), coalesced=True, bitwise=True, same_type=True)
    assert_eq(CSR, replace(CSR), exact=True)
    assert_eq(np.array([1.0, np.nan]), np.array([1.0 + 1e-9, np.nan]))
    assert_eq(replace(COO, values=COO.values + 1e-3), COO, rtol={"float64": 1e-2}, atol=0)


@pytest.mark.parametrize("got, kw", [
    (replace(COO, indices=[[2, 0], [0, 1]], values=np.array([2.0, 1.5])), {}),  # the same entries, another order
    (replace(COO, dense_shape=[3, 3]), {}),
    (replace(COO, values=np.array([1.5, 2.0], np.float32)), {}),
    (replace(COO, values=np.array([1.5, 2.001])), {}),
    (replace(COO, values=np.array([1.5, 2.0 + 1e-12])), {"exact": True}),
    (replace(COO, values=np.array([1.5, 2.0 + 1e-12])), {"rtol": {"float64": 0.0}, "atol": 0}),
    (replace(COO, coalesced=False), {"coalesced": True}),
    (COO.to_dense(), {}),
    (replace(COO, values=np.array([[1.5], [2.0]]), dense_shape=[3, 2, 1]), {}),
    (COO, {"layout": "csr"}),
    (CSR, {}),
])
def test_each_difference_fails(got, kw):
    with pytest.raises(AssertionError):
        assert_eq(got, COO, **kw)


@pytest.mark.parametrize("got, kw", [
    (replace(CSR, layout="csc"), {}),
    (replace(CSR, compressed_indices=CSR.compressed_indices.astype(np.int64),
             plain_indices=CSR.plain_indices.astype(np.int64)), {}),
    (replace(CSR, plain_indices=np.array([0, 1], np.int32)), {"index_dtype": False}),
    (replace(CSR, values=np.array([1, 3], np.int16)), {"rtol": 1.0, "atol": 1.0}),  # integers: exact
    (replace(CSR, values=np.array([1, 2], np.int32)), {"values": True}),
    (replace(CSR, layout="bsr", values=CSR.values.reshape(2, 1, 1), blocksize=[1, 1]), {}),
])
def test_each_compressed_difference_fails(got, kw):
    with pytest.raises(AssertionError):
        assert_eq(got, CSR, **kw)


def test_options_relax_only_what_they_name():
    assert_eq(replace(CSR, compressed_indices=CSR.compressed_indices.astype(np.int64)), CSR, index_dtype=False)
    assert_eq(replace(CSR, values=np.array([7, 8], np.int16)), CSR, values=False)
    assert_eq(np.float64(2.0), np.array(2.0).astype(np.float64)[()])
    with pytest.raises(AssertionError):
        assert_eq(np.float64(2.0), np.array(2.0))  # an ndarray wanted
    with pytest.raises(AssertionError):
        assert_eq(np.array([-0.0]), np.array([0.0]), bitwise=True)
    with pytest.raises(AssertionError):
        assert_eq(np.array([0.5], np.float16), np.array([0.5], np.float16) + 1e-3, rtol={"float32": 1.0})


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_torch_results_compare_as_ours():
    torch = pytest.importorskip("torch")
    want = torch.tensor([[0.0, 1.5], [0.0, 0.0], [2.0, 0.0]]).to_sparse_csr()
    got = SparseTensor(layout="csr", compressed_indices=np.array([0, 1, 1, 2]), plain_indices=np.array([1, 0]),
                       values=np.array([1.5, 2.0], np.float32), dense_shape=[3, 2])
    assert_eq(got, want)
    with pytest.raises(AssertionError):
        assert_eq(replace(got, values=got.values.astype(np.float64)), want)


# ------------------------------------------------------------------ strategies
def structure_ok(t: SparseTensor) -> None:
    assert t.values.shape[0 if t.layout == "coo" else t.batch_ndim] == t.nnz
    if t.coalesced or t.layout != "coo":
        t.validate()


@settings(max_examples=60, deadline=None)
@given(t=sparse_tensors())
def test_sparse_tensors_are_well_formed(t):
    structure_ok(t)


@settings(max_examples=40, deadline=None)
@given(t=coo_tensors(coalesced=True), u=compressed_tensors(canonical=True))
def test_canonical_draws_validate_as_canonical(t, u):
    assert t.coalesced
    keys = np.ravel_multi_index(t.indices.T, t.dense_shape[:t.sparse_ndim]) if t.nnz else np.zeros(0)
    assert np.all(np.diff(keys) > 0)
    u.validate()


def unsorted_or_repeated(t: SparseTensor) -> bool:
    keys = np.ravel_multi_index(t.indices.T, t.dense_shape[:t.sparse_ndim]) if t.nnz else np.zeros(0)
    return bool(np.any(np.diff(keys) <= 0))


def within_segments(t: SparseTensor, test) -> bool:
    ci = t.compressed_indices.reshape(-1, t.compressed_indices.shape[-1])
    pi = t.plain_indices.reshape(ci.shape[0], -1)
    return any(test(np.diff(pi[b, ci[b, k]:ci[b, k + 1]])) for b in range(ci.shape[0]) for k in range(ci.shape[1] - 1))


@pytest.mark.parametrize("strategy, condition", [
    (coo_tensors(), lambda t: t.nnz > 2 and unsorted_or_repeated(t) and (t.indices[-1] == t.indices[0]).all()),
    (coo_tensors(), lambda t: t.nnz > 2 and bool(np.any(np.diff(t.indices[:, 0]) < 0))),
    (coo_tensors(), lambda t: t.nnz > 0 and t.sparse_ndim < t.ndim and t.ndim == 5),
    (coo_tensors(), lambda t: 0 in t.dense_shape),
    (coo_tensors(coalesced=None), lambda t: t.coalesced and t.nnz > 1),
    (compressed_tensors(), lambda t: t.batch_ndim == 2 and t.dense_ndim == 1 and t.nnz > 0),
    (compressed_tensors(), lambda t: within_segments(t, lambda d: np.any(d == 0))),
    (compressed_tensors(), lambda t: within_segments(t, lambda d: np.any(d < 0))),
    (compressed_tensors(layouts=("bsc",)), lambda t: tuple(t.blocksize) == (2, 3) and t.nnz > 0),
    (compressed_tensors(), lambda t: t.compressed_indices.dtype == np.int32 and t.dtype == np.complex128),
    (sparse_tensors(), lambda t: t.layout == "bsr" and t.nnz > 0),
], ids=["coo-repeat", "coo-unsorted", "coo-hybrid", "coo-empty-dim", "coo-coalesced", "batch-and-dense",
        "segment-repeat", "segment-disorder", "blocks", "int32-complex", "any-layout"])
def test_strategies_reach_every_case_they_promise(strategy, condition):
    """Repeats, disorder, hybrid, batch and dense dimensions, blocks, index dtypes are all drawn
    (else a test using the strategy would never see them)."""
    find(strategy, condition, settings=settings(max_examples=1000, database=None, deadline=None))


def test_builders_cover_what_they_promise():
    rng = np.random.default_rng(0)
    t = random_coo(rng, (4, 5, 2), 10, "int8", 2)
    assert (t.indices[-1] == t.indices[0]).all() and t.values.shape == (10, 2) and not t.coalesced
    u = random_coo(rng, (4, 5), 30, coalesced=True)
    assert u.nnz == 20 and u.coalesced
    u.validate()
    assert random_coo(rng, (0, 5), 10).nnz == 0
    assert random_values(rng, (50,), "bool", low=1).all()
    assert (random_values(rng, (50,), "uint8") >= 0).all()
    assert set(np.unique(random_values(rng, (200,), "float16") * 2)) <= set(range(-5, 6))


# ------------------------------------------------------------------ documentation examples
def test_example_finds_a_tagged_block_and_refuses_missing_or_repeated_tags(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("text\n\n<!-- example: one -->\n```python\nprint(1)\n```\n\n```python\nprint(2)\n```\n")
    assert example(doc, "one") == "print(1)\n"
    with pytest.raises(AssertionError, match="no code block is tagged <!-- example: two -->"):
        example(doc, "two")
    doc.write_text(doc.read_text() + "<!-- example: one -->\n```text\n1\n```\n")
    with pytest.raises(AssertionError, match="marks a second block"):
        examples(doc)
    doc.write_text("<!-- example: three -->\n\n```python\nx\n```\n")
    with pytest.raises(AssertionError, match="no ``` code block"):
        examples(doc)
