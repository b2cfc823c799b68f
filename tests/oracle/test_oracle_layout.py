"""convert held to PyTorch 2.13 running the same inputs: to_sparse, to_sparse_csr/csc/bsr/bsc with
dense_dim, from the dense tensor (every layout, batches and dense dimensions included) and from
the sparse tensor itself where torch converts that pair; int32 compressed indices kept as torch
keeps them.
"""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from _oracle import (COMPRESSED, TORCH_SETTINGS, declared_layouts, from_torch, in_layout, _index_dtype_like,
                     nonzero_values, run, to_torch, torch, torch_convert)
from helpers import assert_eq
from sparseserve import SparseTensor
from sparseserve.errors import InvalidArgumentError


# ===================================================================== convert
@st.composite
def convertible(draw):
    """A coalesced COO tensor with nonzero values: batch dims 0-1, sparse 2, dense 0-1."""
    batch = draw(st.integers(0, 1))
    dense = draw(st.integers(0, 1))
    shape = [draw(st.integers(1, 3)) for _ in range(batch)] + \
        [draw(st.sampled_from([2, 4, 6])) for _ in range(2)] + [draw(st.integers(1, 3)) for _ in range(dense)]
    dtype = draw(st.sampled_from(("float32", "float64", "int32", "int64", "complex64", "bool", "float16")))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    s = batch + 2
    full = rng.random(shape[:s]) < draw(st.sampled_from([0.2, 0.5, 0.9]))
    if batch:  # torch needs one nse per batch: the same pattern in each
        full[:] = full[:1]
    idx = np.argwhere(full).astype(np.int64)
    values = nonzero_values(rng, (idx.shape[0], *shape[s:]), dtype)
    return SparseTensor(indices=idx, values=values, dense_shape=shape), batch, dense


@TORCH_SETTINGS
@given(case=convertible(), data=st.data())
def test_convert_matches_torch(case, data):
    t, batch, dense = case
    layouts = declared_layouts("convert", "sp_input")
    src = data.draw(st.sampled_from([lay for lay in layouts if lay == "coo" or batch == 0 or lay in COMPRESSED]))
    bs = data.draw(st.sampled_from([(1, 1), (2, 2), (2, 1)]))
    if src in ("bsr", "bsc"):
        t_in = run("convert", sp_input=t, layout=src, blocksize=list(bs))
    else:
        t_in = in_layout(t, src)
    compared = 0
    for target in ("coo", "csr", "csc", "bsr", "bsc"):
        blocksize = bs if target in ("bsr", "bsc") else None
        # dense_dim: the input's (None), or one given, which may move dimensions between the
        # sparse and the dense side
        dense_dim = data.draw(st.sampled_from([None, 0, 1]))
        target_dense = dense if dense_dim is None else dense_dim
        try:
            got = run("convert", sp_input=t_in, layout=target,
                      blocksize=None if blocksize is None else list(blocksize), dense_dim=dense_dim)
        except InvalidArgumentError as exc:
            if src not in ("bsr", "bsc") and exc.reason in ("BATCH_NSE_MISMATCH", "BLOCKSIZE"):
                # torch refuses the same tensor too
                dense_t = to_torch(np.asarray(run("to_dense", sp_input=t)))
                with pytest.raises(RuntimeError):
                    torch_convert(dense_t, target, blocksize, target_dense)
            continue
        if src not in ("bsr", "bsc"):
            # torch from the dense tensor: every layout, batches and dense dims included
            dense_t = to_torch(np.asarray(run("to_dense", sp_input=t)))
            want = from_torch(torch_convert(dense_t, target, blocksize, target_dense))
            if target != "coo":
                want = _index_dtype_like(want, got)
            assert_eq(got, want, what=f"{src}->{target} dense_dim={dense_dim} (through dense)")
            compared += 1
        if dense_dim is not None and dense_dim != t_in.dense_ndim:
            continue  # torch changes dense_dim only from a strided tensor
        # torch from the sparse tensor itself, where torch converts that pair
        try:
            want = from_torch(torch_convert(to_torch(t_in), target, blocksize, dense_dim))
        except (RuntimeError, NotImplementedError, TypeError):
            continue
        if target == "coo":
            want = from_torch(to_torch(want).coalesce())
        assert_eq(got, want, what=f"{src}->{target} (torch from {src})")
        compared += 1
    assert compared >= (0 if src in ("bsr", "bsc") else 1)


def test_convert_index_dtypes_follow_torch():
    """int32 compressed indices stay int32 through torch's conversions, as ours."""
    T = torch()
    x = T.tensor([[1.0, 0, 2, 0], [0, 0, 3, 4], [5, 0, 0, 0], [0, 6, 0, 7]])
    csr32 = T.sparse_csr_tensor(x.to_sparse_csr().crow_indices().int(), x.to_sparse_csr().col_indices().int(),
                                x.to_sparse_csr().values(), x.shape)
    ours = from_torch(csr32)
    assert ours.compressed_indices.dtype == np.int32
    for target, conv in (("csc", lambda a: a.to_sparse_csc()), ("bsr", lambda a: a.to_sparse_bsr((2, 2))),
                         ("coo", lambda a: a.to_sparse())):
        try:
            want = from_torch(conv(csr32))
        except RuntimeError:
            continue
        got = run("convert", sp_input=ours, layout=target, blocksize=[2, 2] if target == "bsr" else None)
        assert_eq(got, want, what=f"csr(int32) -> {target}")
