"""index_select's GPU kernel held to its CPU kernel: run through the GPU backend's dispatch
(numpy standing in for CuPy always, CuPy itself where a GPU is) and on the CPU, the results equal
exactly (indices, entry order, values, coalesced flag), and supported calls do not fall back."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import assert_eq
from sparseserve import SparseTensor
from sparseserve.errors import InvalidArgumentError
from sparseserve.server.ops import REGISTRY
from strategies import random_coo


def both(be, **args):
    fallbacks = []
    be.on_fallback = lambda op, reason: fallbacks.append(reason)
    op = REGISTRY.get("index_select")
    gpu = be.to_host(be.run(op, op.plan(op.bind(args)))[0])
    cpu = op.run("cpu", op.bind(args))[0]
    return gpu, cpu, fallbacks


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "bool", "complex64"])
@pytest.mark.parametrize("shape, sparse_ndim, nnz", [((7, 5), 2, 30), ((6, 4, 3), 2, 20), ((50, 40), 2, 3000),
                                                     ((40_000, 9), 2, 40_000)])
def test_index_select_gpu_equals_cpu(array_backend, dtype, shape, sparse_ndim, nnz):
    rng = np.random.default_rng(nnz)
    for sort in (False, True):
        t = random_coo(rng, shape, nnz, dtype, sparse_ndim, sort=sort)
        for dim in range(-len(shape), len(shape)):
            size = shape[dim]
            for n_index in (0, 3, size * 2, 40_000 if size > 100 else 5):
                index = rng.integers(-size, size, n_index)
                gpu, cpu, fallbacks = both(array_backend, input=t, dim=dim, index=index)
                assert fallbacks == []
                assert_eq(gpu, cpu, exact=True, coalesced=True)


def test_index_select_gpu_falls_back_for_csr_and_bad_index(array_backend):
    t = SparseTensor(indices=[[0, 1], [1, 0]], values=[1.0, 2.0], dense_shape=[2, 2], coalesced=True)
    csr = REGISTRY.get("convert").run("cpu", {"sp_input": t, "layout": "csr", "blocksize": None,
                                              "dense_dim": None})[0]
    gpu, cpu, fallbacks = both(array_backend, input=csr, dim=0, index=np.array([1, 1]))
    assert fallbacks == ["layout"]
    np.testing.assert_array_equal(gpu.plain_indices, cpu.plain_indices)
    with pytest.raises(InvalidArgumentError):
        both(array_backend, input=t, dim=0, index=np.array([2]))
