"""Local conversions of SparseTensor: numpy, scipy.sparse and torch, every
layout, batches and dense dimensions; and torch/scipy inputs through a server."""

from __future__ import annotations

import numpy as np
import pytest

from sparseserve import SparseTensor
from sparseserve.core.convert import as_tensor

torch = pytest.importorskip("torch")
sp = pytest.importorskip("scipy.sparse")


def torch_samples():
    one = torch.tensor([[0.0, 1.0, 0.0, 0.0], [2.0, 0.0, 0.0, 3.0]])
    dense = torch.stack([one, -2 * one])  # batch of 2 with the same nse each, as torch requires
    yield "coo", dense.to_sparse()
    yield "coo-hybrid", dense.to_sparse(sparse_dim=2)
    yield "csr-batched", dense.to_sparse_csr()
    yield "csc", dense[0].to_sparse_csc()
    yield "bsr-batched", dense.to_sparse_bsr((1, 2))
    yield "bsc", dense[1].to_sparse_bsc((2, 2))
    hybrid = torch.arange(24.0).reshape(2, 4, 3)
    hybrid[0, 1] = 0
    yield "csr-hybrid", hybrid.to_sparse_csr(dense_dim=1)


@pytest.mark.parametrize("name, t", list(torch_samples()), ids=[n for n, _ in torch_samples()])
def test_torch_round_trip_every_layout(name, t):
    st = as_tensor(t)
    st.validate("t")
    np.testing.assert_array_equal(st.to_dense(), t.to_dense().numpy())
    back = st.to_torch()
    assert back.layout == t.layout
    np.testing.assert_array_equal(back.to_dense().numpy(), t.to_dense().numpy())
    np.testing.assert_array_equal(st.to_coo().to_dense(), t.to_dense().numpy())


def test_uncoalesced_torch_input_keeps_its_entries():
    t = torch.sparse_coo_tensor([[1, 1, 0]], [3.0, 4.0, 1.0], (3,))
    st = as_tensor(t)
    assert st.nnz == 3 and not st.coalesced
    assert st.to_dense().tolist() == [1.0, 7.0, 0.0]


def test_torch_dense_becomes_numpy_without_a_copy():
    t = torch.arange(6.0).reshape(2, 3)
    a = as_tensor(t)
    assert isinstance(a, np.ndarray) and np.shares_memory(a, t.numpy())


@pytest.mark.parametrize("fmt", ["csr", "csc", "bsr", "coo"])
def test_scipy_round_trip(fmt):
    m = sp.random(6, 8, density=0.3, format="csr", random_state=2, dtype=np.float32)
    m = m.tobsr(blocksize=(2, 2)) if fmt == "bsr" else m.asformat(fmt)
    st = as_tensor(m)
    assert st.layout == fmt
    st.validate("m")
    np.testing.assert_array_equal(st.to_dense(), m.toarray())
    np.testing.assert_array_equal(st.to_scipy().toarray(), m.toarray())


def test_scipy_csr_is_wrapped_without_copying():
    m = sp.random(50, 50, density=0.1, format="csr", random_state=3)
    st = as_tensor(m)
    assert np.shares_memory(st.values, m.data) and np.shares_memory(st.plain_indices, m.indices)


def test_from_dense_locally_matches_torch():
    a = np.array([[[0.0, 0.0], [1.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]], [[0.0, 2.0], [0.0, 0.0]]])
    for sparse_dim in (1, 2, 3):
        st = SparseTensor.from_dense(a, sparse_dim)
        ref = torch.from_numpy(a).to_sparse(sparse_dim)
        np.testing.assert_array_equal(st.indices.T, ref.indices().numpy())
        np.testing.assert_array_equal(st.values, ref.values().numpy())


def test_torch_inputs_through_the_server(client):
    t = torch.sparse_coo_tensor([[1, 0, 1], [2, 0, 2]], [2.0, 1.0, 4.0], (3, 4))
    out = client.coalesce(t)
    ref = t.coalesce()
    np.testing.assert_array_equal(out.indices.T, ref.indices().numpy())
    np.testing.assert_array_equal(out.values, ref.values().numpy())
    np.testing.assert_array_equal(client.to_dense(out), ref.to_dense().numpy())
    back = client.from_dense(torch.eye(3))
    assert torch.equal(back.to_torch().to_dense(), torch.eye(3, dtype=torch.float32))
