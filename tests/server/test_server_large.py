"""A 1 GB tensor goes up with put and comes back with get, intact, over gRPC
(chunked Upload/Download: well past gRPC's 4 MiB default and the message limit)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from sparseserve import Client, SparseTensor


@pytest.mark.slow
def test_one_gigabyte_round_trip_over_grpc(server):
    nnz = 45_000_000  # 45M x (2 int64 indices + 1 float64 value) = 1.08 GB
    rng = np.random.default_rng(7)
    indices = np.empty((nnz, 2), np.int64)
    indices[:, 0] = np.arange(nnz) // 1000
    indices[:, 1] = rng.integers(0, 1_000_000, nnz)
    values = rng.standard_normal(nnz)
    st = SparseTensor(indices=indices, values=values, dense_shape=[nnz // 1000, 1_000_000])
    assert st.nbytes >= 1_000_000_000

    with Client(server.grpc_target) as c:
        start = time.perf_counter()
        h = c.put(st)
        up = time.perf_counter() - start
        assert h.nbytes == st.nbytes
        start = time.perf_counter()
        back = c.get(h)
        down = time.perf_counter() - start
        c.delete(h)
    assert back.dense_shape == st.dense_shape
    assert np.array_equal(back.indices, indices)
    assert np.array_equal(back.values, values)
    print(f"put {st.nbytes / up / 1e9:.2f} GB/s, get {st.nbytes / down / 1e9:.2f} GB/s")
