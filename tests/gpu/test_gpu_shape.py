"""transpose's GPU kernel held to its CPU kernel's answers, and the transposes that fall back
(``Calls``: _gpu_calls.py)."""

from __future__ import annotations

import numpy as np
import pytest

from sparseserve import SparseTensor
from strategies import random_compressed, random_coo
from _gpu_calls import as_layout

# The be and calls fixtures of _gpu_calls.py: each test on numpy standing in for CuPy, and on CuPy
# where a GPU is.
pytest_plugins = ["_gpu_calls"]


# ------------------------------------------------------------------ transpose
@pytest.mark.parametrize("dtype", ["bool", "int16", "uint64", "float16", "float64", "complex64"])
def test_transpose(calls, dtype):
    rng = np.random.default_rng(12)
    for shape, s, perms in [((6, 5), 2, [None, [0, 1], [1, 0]]), ((3, 4, 5), 3, [None, [2, 0, 1], [0, 2, 1]]),
                            ((4, 3, 2, 3), 2, [[1, 0, 3, 2], [0, 1, 2, 3]]), ((0, 3), 2, [None])]:
        for t in (random_coo(rng, shape, 20, dtype, s),
                  random_coo(rng, shape, 8, dtype, s, duplicates=False, sort=True)):
            for perm in perms:
                calls.same("transpose", sp_input=t, perm=perm)
    for t in (random_compressed(rng, "csr", (4, 6), dtype=dtype, index_dtype="int32", repeat=True),
              random_compressed(rng, "csc", (4, 6), dtype=dtype, repeat=True)):
        for perm in (None, [0, 1], [1, 0]):
            calls.same("transpose", sp_input=t, perm=perm)
    f = random_coo(rng, (4, 6), 10, dtype, duplicates=False)
    bsr = as_layout(f, "bsr", blocksize=[2, 3])
    calls.same("transpose", sp_input=bsr)
    hybrid = as_layout(random_coo(rng, (4, 6, 3, 2), 10, dtype, duplicates=False, sparse_ndim=2), "csr")
    calls.same("transpose", sp_input=hybrid, perm=[1, 0, 3, 2])


def test_transpose_falls_back_when_a_batch_dimension_moves(calls):
    batched = SparseTensor(layout="csr", compressed_indices=[[0, 1, 2], [0, 2, 2]], plain_indices=[[0, 1], [1, 0]],
                           values=np.array([[1.0, 2.0], [3.0, 4.0]]), dense_shape=[2, 2, 2])
    calls.same("transpose", sp_input=batched, perm=[0, 2, 1])
    calls.falls_back("transpose", "batched", sp_input=batched, perm=[1, 0, 2])
    calls.refused("transpose", sp_input=batched, perm=[0, 0, 1])
    hybrid = random_coo(np.random.default_rng(13), (3, 3, 2), 4, "float64", sparse_ndim=2)
    calls.refused("transpose", sp_input=hybrid)  # the reversal moves a dense dimension
