"""convert's GPU kernel (between COO, CSR and CSC) held to its CPU kernel's answers, and the
conversions that fall back: blocks, batches, dense dimensions (``Calls``: _gpu_calls.py)."""

from __future__ import annotations

import numpy as np
import pytest

from sparseserve import SparseTensor
from strategies import random_compressed, random_coo
from _gpu_calls import ALL_DTYPES, SHAPES_2D, as_layout

# The be and calls fixtures of _gpu_calls.py: each test on numpy standing in for CuPy, and on CuPy
# where a GPU is.
pytest_plugins = ["_gpu_calls"]


# ------------------------------------------------------------------ convert
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_convert_between_coo_csr_csc(calls, dtype):
    rng = np.random.default_rng(6)
    for shape in SHAPES_2D:
        sources = [random_coo(rng, shape, 3 * max(shape), dtype),
                   random_coo(rng, shape, 6, dtype, duplicates=False, sort=True),
                   random_compressed(rng, "csr", shape, dtype=dtype, index_dtype="int32", repeat=True),
                   random_compressed(rng, "csr", shape, dtype=dtype, canonical=True),
                   random_compressed(rng, "csc", shape, dtype=dtype, index_dtype="int32", canonical=True),
                   random_compressed(rng, "csc", shape, dtype=dtype, repeat=True)]
        for t in sources:
            for layout in ("coo", "csr", "csc"):
                calls.same("convert", sp_input=t, layout=layout)
                if t.layout != "coo":
                    calls.same("convert", sp_input=t, layout=layout, dense_dim=0)


def test_convert_coo_to_coo_of_any_shape_is_a_coalesce(calls):
    rng = np.random.default_rng(7)
    for shape, s in [((3, 4, 5), 3), ((3, 4, 2), 2), ((7,), 1), ((0, 4), 2)]:
        calls.same("convert", sp_input=random_coo(rng, shape, 20, "float32", s), layout="coo")


def test_convert_falls_back_for_blocks_batches_and_dense_dims(calls):
    rng = np.random.default_rng(8)
    f = random_coo(rng, (4, 6), 10, "float64")
    calls.falls_back("convert", "layout", sp_input=f, layout="bsr", blocksize=[2, 3])
    bsc = as_layout(f, "bsc", blocksize=[2, 2])
    calls.falls_back("convert", "layout", sp_input=bsc, layout="csr")
    calls.falls_back("convert", "layout", sp_input=bsc, layout="bsc", blocksize=[1, 1])
    assert calls.same("convert", sp_input=bsc, layout="bsc", blocksize=[2]).blocksize == (2, 2)  # itself
    calls.falls_back("convert", "batched", sp_input=random_coo(rng, (2, 3, 3), 6, "float64", duplicates=False),
                     layout="csr")
    batched = SparseTensor(layout="csr", compressed_indices=[[0, 1, 2], [0, 2, 2]], plain_indices=[[0, 1], [1, 0]],
                           values=np.array([[1.0, 2.0], [3.0, 4.0]]), dense_shape=[2, 2, 2])
    calls.falls_back("convert", "batched", sp_input=batched, layout="csc")
    calls.same("convert", sp_input=batched, layout="csr")  # itself
    calls.falls_back("convert", "hybrid", sp_input=random_coo(rng, (4, 4, 2), 5, "float64", sparse_ndim=2),
                     layout="csr")
    calls.falls_back("convert", "dense_dim", sp_input=f, layout="coo", dense_dim=1)
    calls.refused("convert", sp_input=f, layout="dense")
    calls.refused("convert", sp_input=f, layout="csr", blocksize=[2, 2])
