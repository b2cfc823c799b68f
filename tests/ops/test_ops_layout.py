"""Layouts: the ``convert`` op, the server's ``as_coo``/``as_csr`` and the SDK's
scipy/torch conversions.

Results are compared with PyTorch's own conversions (``to_sparse_csr`` and
friends, from sparse COO where torch has the pair and from the dense tensor
where it does not, e.g. batches), on random tensors of every dtype with
batches, dense dimensions, duplicates, unsorted and empty inputs and both
index dtypes; then the error cases (class and reason), every wire, and a large
input that takes the parallel kernels.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparseserve import InvalidArgumentError, ResourceExhaustedError, SparseTensor
from sparseserve.core.convert import as_tensor, torch_to_tensor
from sparseserve.core.dtypes import DTYPE_NAMES
from sparseserve.kernels import PARALLEL_MIN
from sparseserve.server.ops._layouts import as_coo, as_csr
from sparseserve.server.ops.layout import _convert_bytes
from conftest import op_raises, run_op
from helpers import assert_eq
from strategies import random_values

warnings.filterwarnings("ignore", message=".*Sparse.*")
SETTINGS = settings(max_examples=40, deadline=None)
LAYOUTS = ("coo", "csr", "csc", "bsr", "bsc")
COMPRESSED = ("csr", "csc", "bsr", "bsc")
# torch lacks sparse kernels for the wide unsigned types: their structure is checked
# against torch through int64 values.
TORCH_PROXY = {"uint16": "int64", "uint32": "int64", "uint64": "int64"}
# Values 1..3 (bools all True, complex with positive parts): they never sum to zero, so the dense
# reference keeps exactly the stored positions (torch's dense conversion drops zeros).
POSITIVE = {"low": 1, "high": 3, "halves": False}


# ------------------------------------------------------------------ references
def reference_dense(t: SparseTensor) -> np.ndarray:
    """Plain numpy: every stored element added at its position (logical or for bool)."""
    coo = t.to_coo()  # the SDK's numpy expansion, independent of the server kernels
    out = np.zeros(coo.dense_shape, coo.values.dtype)
    for i in range(coo.nnz):
        key = tuple(coo.indices[i])
        out[key] = (out[key] | coo.values[i]) if out.dtype == np.bool_ else out[key] + coo.values[i]
    return out


def torch_reference(dense: np.ndarray, layout: str, blocksize, dense_dim: int):
    """torch's conversion of the dense tensor (torch converts batches only from dense)."""
    proxy = TORCH_PROXY.get(dense.dtype.name)
    t = torch.from_numpy(np.ascontiguousarray(dense.astype(proxy) if proxy else dense))
    if layout == "coo":
        return t.to_sparse(t.ndim - dense_dim).coalesce()
    fn = getattr(t, f"to_sparse_{layout}")
    return fn(tuple(blocksize), dense_dim=dense_dim) if layout in ("bsr", "bsc") else fn(dense_dim=dense_dim)


def assert_matches_torch(out: SparseTensor, ref, flag_carried: bool = True) -> None:
    """``out`` is torch's ``ref`` exactly, but for index dtypes (an int32 input keeps them) and
    the values' dtype (torch's through TORCH_PROXY for the wide unsigned types); a COO ``out``
    carries torch's coalesced flag (True) unless ``flag_carried`` is False."""
    want = torch_to_tensor(ref)
    want = SparseTensor(layout=want.layout, indices=want.indices, compressed_indices=want.compressed_indices,
                        plain_indices=want.plain_indices, values=want.values.astype(out.dtype),
                        dense_shape=want.dense_shape, blocksize=want.blocksize, coalesced=want.coalesced)
    assert_eq(out, want, exact=True, index_dtype=False, coalesced=flag_carried and out.layout == "coo")


@st.composite
def batched_coo(draw, dtypes=DTYPE_NAMES, max_batch_dims=2):
    """COO tensors whose batches hold the same number of distinct positions: batch dims,
    then two sparse dims whose sizes a drawn blocksize divides, then dense dims; with
    duplicates and in any order sometimes. Returns (tensor, blocksize)."""
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=max_batch_dims)))
    block = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    rows, cols = block[0] * draw(st.integers(0, 3)), block[1] * draw(st.integers(0, 3))
    dense = tuple(draw(st.lists(st.integers(1, 3), max_size=1)))
    dtype = draw(st.sampled_from(dtypes))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    k = draw(st.integers(0, rows * cols))
    n_batch = int(np.prod(batch, dtype=np.int64))
    parts = []
    for b in range(n_batch):
        flat = rng.choice(rows * cols, size=k, replace=False)
        parts.append(np.stack([*(np.full(k, c) for c in np.unravel_index(b, batch)), flat // max(cols, 1),
                               flat % max(cols, 1)], axis=1) if k else np.zeros((0, len(batch) + 2), np.int64))
    indices = np.concatenate(parts).astype(np.int64) if parts else np.zeros((0, len(batch) + 2), np.int64)
    if indices.shape[0] > 1 and draw(st.booleans()):
        indices = np.concatenate([indices, indices[rng.integers(0, indices.shape[0], 3)]])  # duplicates
    if draw(st.booleans()):
        indices = indices[rng.permutation(indices.shape[0])]
    values = random_values(rng, (indices.shape[0], *dense), dtype, **POSITIVE)
    return SparseTensor(indices=indices, values=values, dense_shape=(*batch, rows, cols, *dense)), block


def compressed_from_dense(dense: np.ndarray, layout: str, blocksize=None, dense_dim=0,
                          index_dtype=np.int64) -> SparseTensor:
    """A valid compressed SparseTensor of ``dense`` (through torch), with the given index dtype."""
    t = as_tensor(torch_reference(dense, layout, blocksize, dense_dim))
    return SparseTensor(layout=layout, compressed_indices=t.compressed_indices.astype(index_dtype),
                        plain_indices=t.plain_indices.astype(index_dtype),
                        values=t.values.astype(dense.dtype), dense_shape=t.dense_shape,
                        blocksize=t.blocksize)


def with_ones(t: SparseTensor) -> SparseTensor:
    """The same structure with every stored element 1: its dense form is the stored mask."""
    return SparseTensor(layout=t.layout, indices=t.indices, compressed_indices=t.compressed_indices,
                        plain_indices=t.plain_indices, values=np.ones_like(t.values, np.int8),
                        dense_shape=t.dense_shape, blocksize=t.blocksize, coalesced=t.coalesced)


def torch_or_unequal_batches(dense, layout, blocksize, dense_dim, t):
    """torch's conversion; where torch refuses because batches would hold different
    numbers of blocks, ``convert`` of ``t`` must refuse too (then None)."""
    try:
        return torch_reference(dense, layout, blocksize, dense_dim)
    except RuntimeError as exc:
        if "non-zero" in str(exc):  # torch has no compressed tensor without batches: dense check
            out = convert(t, layout, blocksize)
            np.testing.assert_array_equal(reference_dense(out), dense)
            return None
        assert "per batch" in str(exc), exc
    op_raises(InvalidArgumentError, "BATCH_NSE_MISMATCH", "convert", sp_input=t, layout=layout,
              blocksize=list(blocksize) if layout in ("bsr", "bsc") else None)
    return None


def convert(t, layout, blocksize=None, dense_dim=None) -> SparseTensor:
    out = run_op("convert", sp_input=t, layout=layout,
                 blocksize=blocksize if isinstance(blocksize, int) else
                 list(blocksize) if blocksize is not None and layout in ("bsr", "bsc") else None,
                 dense_dim=dense_dim)
    out.validate("output")
    return out


# ------------------------------------------------------------------ worked examples
def test_pytorch_doc_examples():
    # The CSR and BSR examples of the PyTorch seed document.
    dense = np.array([[1, 2], [3, 4]], np.float64)
    csr = convert(SparseTensor.from_dense(dense), "csr")
    assert csr.compressed_indices.tolist() == [0, 2, 4] and csr.plain_indices.tolist() == [0, 1, 0, 1]
    assert csr.values.tolist() == [1, 2, 3, 4]
    dense = np.arange(24, dtype=np.float64).reshape(4, 6)  # one zero at [0, 0]: its block is stored
    bsr = convert(SparseTensor.from_dense(dense), "bsr", blocksize=(2, 3))
    assert bsr.compressed_indices.tolist() == [0, 2, 4] and bsr.plain_indices.tolist() == [0, 1, 0, 1]
    np.testing.assert_array_equal(bsr.values, dense.reshape(2, 2, 2, 3).transpose(0, 2, 1, 3).reshape(4, 2, 3))
    csc = convert(bsr, "csc")
    np.testing.assert_array_equal(reference_dense(csc), dense)
    # Every element of a stored block stays stored (torch's bsr -> coo does the same): the
    # zero at [0, 0] too.
    assert csc.compressed_indices.tolist() == [0, 4, 8, 12, 16, 20, 24]


def test_duplicates_are_summed_and_block_zeros_filled():
    t = SparseTensor(indices=[[1, 1], [0, 3], [1, 1]], values=[1.0, 2.0, 5.0], dense_shape=[2, 4])
    csr = convert(t, "csr")
    assert csr.compressed_indices.tolist() == [0, 1, 2] and csr.plain_indices.tolist() == [3, 1]
    assert csr.values.tolist() == [2.0, 6.0]
    bsc = convert(t, "bsc", blocksize=(2, 2))
    assert bsc.compressed_indices.tolist() == [0, 1, 2] and bsc.plain_indices.tolist() == [0, 0]
    np.testing.assert_array_equal(bsc.values, [[[0, 0], [0, 6]], [[0, 2], [0, 0]]])
    coo = convert(t, "coo")
    assert coo.coalesced and coo.indices.tolist() == [[0, 3], [1, 1]] and coo.values.tolist() == [2.0, 6.0]


# ------------------------------------------------------------------ against torch
@SETTINGS
@given(batched_coo(), st.sampled_from(LAYOUTS))
def test_coo_to_every_layout_matches_torch(case, layout):
    t, block = case
    dense = reference_dense(t)
    ref = torch_or_unequal_batches(dense, layout, block, t.dense_ndim, t)
    if ref is None:
        return
    out = convert(t, layout, block)
    assert_matches_torch(out, ref)
    if layout != "coo":
        assert out.compressed_indices.dtype == np.int64  # from COO


@SETTINGS
@given(batched_coo(max_batch_dims=0, dtypes=["float32", "int16", "complex64", "bool"]), st.sampled_from(COMPRESSED))
def test_coo_matches_torch_sparse_conversion(case, layout):
    # torch converts unbatched COO itself (coalescing first): the same result.
    t, block = case
    ref_coo = torch.sparse_coo_tensor(torch.from_numpy(t.indices.T.copy()), torch.from_numpy(t.values),
                                      t.dense_shape)
    fn = getattr(ref_coo, f"to_sparse_{layout}")
    ref = fn(block) if layout in ("bsr", "bsc") else fn()
    assert_matches_torch(convert(t, layout, block), ref)


@SETTINGS
@given(batched_coo(), st.sampled_from(COMPRESSED), st.sampled_from(LAYOUTS),
       st.sampled_from([np.int32, np.int64]))
def test_every_pair_matches_torch(case, src_layout, dst_layout, index_dtype):
    t, block = case
    dense = reference_dense(t)
    if torch_or_unequal_batches(dense, src_layout, block, t.dense_ndim, t) is None:
        return
    src = compressed_from_dense(dense, src_layout, block, t.dense_ndim, index_dtype)
    if torch_or_unequal_batches(dense, dst_layout, block, t.dense_ndim, src) is None:
        return
    out = convert(src, dst_layout, block)
    if src_layout in ("bsr", "bsc") and dst_layout not in ("bsr", "bsc"):
        # Every element of a stored block stays stored, zeros too: torch's structure of the
        # stored-element mask, and the values through the dense reference.
        ref = torch_reference(reference_dense(with_ones(src)), dst_layout, block, t.dense_ndim)
        assert_matches_torch(with_ones(out), ref)
        np.testing.assert_array_equal(reference_dense(out), dense)
    else:
        assert_matches_torch(out, torch_reference(dense, dst_layout, block, t.dense_ndim))
    if dst_layout != "coo":
        assert out.compressed_indices.dtype == index_dtype  # kept from the compressed input
    if dst_layout in ("bsr", "bsc") and src_layout not in ("bsr", "bsc"):
        return  # the zeros around entries in their blocks are stored from here on
    back = convert(out, src_layout, block)  # and the round trip gives the input back
    np.testing.assert_array_equal(back.compressed_indices, src.compressed_indices)
    np.testing.assert_array_equal(back.plain_indices, src.plain_indices)
    np.testing.assert_array_equal(back.values, src.values)


@SETTINGS
@given(batched_coo(dtypes=["float64", "int32", "uint8"], max_batch_dims=1),
       st.sampled_from(LAYOUTS), st.integers(0, 2))
def test_dense_dim_matches_torch(case, layout, dense_dim):
    # More dense dims merge entries into dense values (zeros around); fewer split them.
    t, block = case
    dense = reference_dense(t)
    sparse_left = t.ndim - dense_dim
    if sparse_left < (1 if layout == "coo" else 2):
        op_raises(InvalidArgumentError, "DENSE_DIM", "convert", sp_input=t, layout=layout,
                  blocksize=list(block) if layout in ("bsr", "bsc") else None, dense_dim=dense_dim)
        return
    rows, cols = t.dense_shape[sparse_left - 2:sparse_left] if sparse_left >= 2 else (1, 1)
    if layout in ("bsr", "bsc") and (rows % block[0] or cols % block[1]):
        block = (1, 1)
    # Stored values have no zero element, so torch's conversion from dense stores the same.
    try:
        ref = torch_reference(dense, layout, block, dense_dim)
    except RuntimeError as exc:
        if "non-zero" in str(exc):  # torch has no compressed tensor without batches: dense check
            np.testing.assert_array_equal(reference_dense(convert(t, layout, block, dense_dim)), dense)
            return
        assert "per batch" in str(exc), exc
        op_raises(InvalidArgumentError, "BATCH_NSE_MISMATCH", "convert", sp_input=t, layout=layout,
                  blocksize=list(block) if layout in ("bsr", "bsc") else None, dense_dim=dense_dim)
        return
    out = convert(t, layout, block, dense_dim)
    assert out.dense_ndim == dense_dim
    np.testing.assert_array_equal(reference_dense(out), dense)
    assert_matches_torch(out, ref)


def test_empty_inputs():
    for shape in [(0, 4), (3, 0), (2, 0, 4), (0, 2, 2), (4, 6)]:
        t = SparseTensor(indices=np.zeros((0, len(shape)), np.int64), values=np.zeros(0, np.float32),
                         dense_shape=shape)
        for layout in LAYOUTS:
            out = convert(t, layout, (1, 2))
            assert out.nnz == 0 and out.dense_shape == shape
            for back in LAYOUTS:
                assert convert(out, back, (1, 2)).nnz == 0


def test_same_layout_returns_input_and_coo_is_coalesced():
    csr = compressed_from_dense(np.eye(3, dtype=np.float32), "csr", index_dtype=np.int32)
    assert run_op("convert", sp_input=csr, layout="csr").compressed_indices.dtype == np.int32
    bsr = compressed_from_dense(np.ones((4, 4), np.float32), "bsr", (2, 2))
    other = convert(bsr, "bsr", (4, 1))  # a new blocksize goes through the elements
    assert other.blocksize == (4, 1) and other.nnz == 4
    np.testing.assert_array_equal(reference_dense(other), np.ones((4, 4)))
    csc = compressed_from_dense(np.arange(12.0).reshape(3, 4), "csc")
    coo = convert(csc, "coo")
    assert coo.coalesced and coo.indices.tolist() == sorted(coo.indices.tolist())


def test_repeated_plain_indices_kept_in_coo():
    # A compressed input may repeat a plain index within a segment: kept, not claimed coalesced.
    t = SparseTensor(layout="csr", compressed_indices=[0, 2, 2], plain_indices=[1, 1], values=[1.0, 2.0],
                     dense_shape=[2, 3])
    coo = convert(t, "coo")
    assert not coo.coalesced and coo.indices.tolist() == [[0, 1], [0, 1]]
    bsr = convert(t, "bsr", (1, 3))  # blocks cannot repeat: summed
    assert bsr.values.tolist() == [[[0.0, 3.0, 0.0]]]


def test_int32_promoted_only_when_it_cannot_hold_the_result():
    bsr = SparseTensor(layout="bsr", compressed_indices=np.array([0, 1], np.int32),
                       plain_indices=np.array([0], np.int32), values=np.ones((1, 2, 2)), dense_shape=[2, 2],
                       blocksize=[2, 2])
    assert convert(bsr, "csr").compressed_indices.dtype == np.int32
    assert convert(bsr, "bsc", (2, 2)).plain_indices.dtype == np.int32


# ------------------------------------------------------------------ errors
def test_errors():
    t = SparseTensor(indices=[[0, 0, 0], [1, 0, 1], [1, 1, 1]], values=[1.0, 2.0, 3.0], dense_shape=[2, 2, 2])
    op_raises(InvalidArgumentError, "BATCH_NSE_MISMATCH", "convert", sp_input=t, layout="csr")
    op_raises(InvalidArgumentError, "BATCH_NSE_MISMATCH", "convert", sp_input=t, layout="bsc", blocksize=[1, 2])
    flat = SparseTensor(indices=[[0, 1]], values=[1.0], dense_shape=[4, 6])
    for bs in ([3, 2], [2, 4], [0, 2], [1, 2, 3]):
        op_raises(InvalidArgumentError, "BLOCKSIZE", "convert", sp_input=flat, layout="bsr", blocksize=bs)
    op_raises(InvalidArgumentError, "BLOCKSIZE", "convert", sp_input=flat, layout="bsc")
    op_raises(InvalidArgumentError, "BLOCKSIZE", "convert", sp_input=flat, layout="csr", blocksize=[2, 2])
    for layout in ("dense", "CSR", "ell"):
        op_raises(InvalidArgumentError, "BAD_LAYOUT", "convert", sp_input=flat, layout=layout)
    op_raises(InvalidArgumentError, "DENSE_DIM", "convert", sp_input=flat, layout="csr", dense_dim=1)
    op_raises(InvalidArgumentError, "DENSE_DIM", "convert", sp_input=flat, layout="coo", dense_dim=-1)
    hybrid = SparseTensor(indices=[[0]], values=[[1.0, 2.0]], dense_shape=[3, 2])
    op_raises(InvalidArgumentError, "DENSE_DIM", "convert", sp_input=hybrid, layout="csc")
    assert convert(hybrid, "csc", dense_dim=0).nnz == 2
    assert convert(flat, "bsr", 2).blocksize == (2, 2)  # one int: square blocks


def test_result_bytes_counts_block_zeros():
    one = SparseTensor(indices=[[0, 0]], values=np.ones(1), dense_shape=[100_000, 100_000])
    assert _convert_bytes(one, "bsr", [50_000, 50_000]) >= 50_000 * 50_000 * 8
    assert _convert_bytes(one, "csr") < 1_000_000


# ------------------------------------------------------------------ server helpers
@SETTINGS
@given(batched_coo(max_batch_dims=0, dtypes=["float64", "int8"]), st.sampled_from(COMPRESSED))
def test_as_csr_and_as_coo(case, layout):
    t, block = case
    dense = reference_dense(t)
    csr = as_csr(t)  # duplicates kept, rows sorted, columns ascending within rows
    assert csr.compressed_indices.dtype == np.int64 and csr.plain_indices.size == t.nnz
    for r in range(csr.dense_shape[0]):
        cols = csr.plain_indices[csr.compressed_indices[r]:csr.compressed_indices[r + 1]]
        assert np.all(np.diff(cols) >= 0)
    np.testing.assert_array_equal(reference_dense(csr), dense)
    src = compressed_from_dense(dense, layout, block, t.dense_ndim, np.int32)
    np.testing.assert_array_equal(reference_dense(as_csr(src) if layout != "csr" else src), dense)
    coo = as_coo(src)
    assert coo.coalesced and coo.indices.shape[1] == 2
    np.testing.assert_array_equal(reference_dense(coo), dense)


# ------------------------------------------------------------------ large: parallel kernels
def test_large_input_takes_the_parallel_path():
    rng = np.random.default_rng(7)
    n, nnz = 2_000, 4 * PARALLEL_MIN
    keys = rng.choice(n * n, size=nnz, replace=False)
    rows, cols = keys // n, keys % n
    values = rng.random(nnz)
    t = SparseTensor(indices=np.stack([rows, cols], axis=1), values=values, dense_shape=(n, n))
    ref = sp.coo_array((values, (rows, cols)), shape=(n, n))
    csr, csc = convert(t, "csr"), convert(t, "csc")
    for out, m in ((csr, ref.tocsr()), (csc, ref.tocsc())):
        m.sort_indices()
        np.testing.assert_array_equal(out.compressed_indices, m.indptr)
        np.testing.assert_array_equal(out.plain_indices, m.indices)
        np.testing.assert_array_equal(out.values, m.data)
    bsr = convert(csc, "bsr", (4, 5))
    m = ref.tocsr().tobsr((4, 5))
    m.sort_indices()
    np.testing.assert_array_equal(bsr.compressed_indices, m.indptr)
    np.testing.assert_array_equal(bsr.values, m.data)
    back = convert(convert(bsr, "bsc", (4, 5)), "coo")
    order = np.lexsort((cols, rows))
    stored = back.values != 0  # the zeros around the entries in their blocks
    np.testing.assert_array_equal(back.indices[stored], np.stack([rows, cols], 1)[order])
    np.testing.assert_array_equal(back.values[stored], values[order])
    batched = SparseTensor(indices=np.concatenate([np.stack([np.full(nnz, b), rows, cols], 1) for b in (0, 1)]),
                           values=np.concatenate([values, 2 * values]), dense_shape=(2, n, n))
    bcsc = convert(batched, "csc")
    np.testing.assert_array_equal(bcsc.compressed_indices, np.stack([m.indptr for m in (ref.tocsc(),) * 2]))
    np.testing.assert_array_equal(convert(bcsc, "coo").values[:nnz], values[np.lexsort((cols, rows))])


# ------------------------------------------------------------------ every wire
def test_convert_over_every_wire(client):
    dense = np.arange(1, 25, dtype=np.float32).reshape(2, 3, 4) * (np.arange(24).reshape(2, 3, 4) % 3 == 0)
    dense[1] = dense[0] * 2  # equal nse per batch
    t = SparseTensor.from_dense(dense)
    for layout in LAYOUTS:
        out = client.convert(t, layout=layout, blocksize=[1, 2] if layout in ("bsr", "bsc") else None)
        assert out.layout == layout
        np.testing.assert_array_equal(out.to_dense(), dense)
        assert_matches_torch(out, torch_reference(dense, layout, (1, 2), 0), flag_carried=False)
    csr32 = compressed_from_dense(dense[0], "csr", index_dtype=np.int32)
    csc = client.convert(csr32, "csc")
    assert csc.compressed_indices.dtype == np.int32
    with pytest.raises(InvalidArgumentError) as info:
        client.convert(t, layout="bsr", blocksize=[2, 2])
    assert info.value.reason == "BLOCKSIZE"
    huge = SparseTensor(indices=[[0, 0]], values=[1.0], dense_shape=[100_000, 100_000])
    with pytest.raises(ResourceExhaustedError):
        client.convert(huge, layout="bsr", blocksize=[50_000, 50_000])


# ------------------------------------------------------------------ SDK conversions
@pytest.mark.parametrize("fmt", ["csr", "csc", "bsr", "coo"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_scipy_round_trip(fmt, index_dtype):
    rng = np.random.default_rng(3)
    dense = (rng.random((6, 8)) < 0.3) * rng.integers(1, 9, (6, 8)).astype(np.float64)
    m = sp.bsr_array(dense, blocksize=(2, 4)) if fmt == "bsr" else sp.csr_array(dense).asformat(fmt)
    if fmt != "coo":
        m.indptr, m.indices = m.indptr.astype(index_dtype), m.indices.astype(index_dtype)
    t = as_tensor(m).validate()
    assert t.layout == fmt and (fmt == "coo" or t.compressed_indices.dtype == index_dtype)
    back = t.to_scipy()
    assert back.format == fmt
    np.testing.assert_array_equal(back.toarray(), dense)
    np.testing.assert_array_equal(t.to_dense(), dense)
    empty = as_tensor(sp.csr_array((0, 3)) if fmt != "bsr" else sp.bsr_array((0, 4), blocksize=(2, 2)))
    assert empty.validate().nnz == 0 and empty.to_scipy().shape == empty.dense_shape


def test_scipy_refuses_what_it_cannot_hold():
    bsc = compressed_from_dense(np.ones((2, 2), np.float32), "bsc", (1, 1))
    with pytest.raises(ValueError, match="no BSC"):
        bsc.to_scipy()
    batched = compressed_from_dense(np.ones((2, 2, 2), np.float32), "csr")
    with pytest.raises(ValueError, match="batch"):
        batched.to_scipy()
    hybrid = compressed_from_dense(np.ones((2, 2, 3), np.float32), "csr", dense_dim=1)
    with pytest.raises(ValueError, match="dense dimensions"):
        hybrid.to_scipy()


@pytest.mark.parametrize("layout", COMPRESSED)
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("shape,dense_dim", [((4, 6), 0), ((2, 4, 6), 0), ((3, 2, 4, 6, 2), 1)])
def test_torch_round_trip(layout, index_dtype, shape, dense_dim):
    rng = np.random.default_rng(5)
    dense = np.broadcast_to((rng.random(shape[-2 - dense_dim:]) < 0.4) * 1.5, shape).astype(np.float32)
    t = compressed_from_dense(dense, layout, (2, 3), dense_dim, index_dtype).validate()
    assert t.batch_ndim == len(shape) - 2 - dense_dim and t.dense_ndim == dense_dim
    back = t.to_torch()
    assert back.layout == getattr(torch, f"sparse_{layout}")
    assert back.values().numpy().tobytes() == t.values.tobytes()
    np.testing.assert_array_equal(back.to_dense().numpy(), dense)
    again = as_tensor(back)
    np.testing.assert_array_equal(again.compressed_indices, t.compressed_indices)
    assert again.compressed_indices.dtype == index_dtype and again.blocksize == t.blocksize
    np.testing.assert_array_equal(again.to_dense(), dense)


def test_torch_empty_batch():
    t = SparseTensor(layout="csr", compressed_indices=np.zeros((0, 5), np.int32),
                     plain_indices=np.zeros((0, 0), np.int32), values=np.zeros((0, 0)), dense_shape=(0, 4, 6))
    t.validate()  # (torch refuses compressed tensors with no batch at all)
    assert t.to_coo().indices.shape == (0, 3) and t.to_dense().shape == (0, 4, 6)
    for layout in LAYOUTS:
        assert convert(t, layout, (2, 3)).dense_shape == (0, 4, 6)
