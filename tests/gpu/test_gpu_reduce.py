"""reduce_sum's and reduce_max's GPU kernels held to their CPU kernels' answers, and the
reductions that fall back (``Calls``: _gpu_calls.py)."""

from __future__ import annotations

import numpy as np
import pytest

from sparseserve import SparseTensor
from strategies import random_compressed, random_coo
from _gpu_calls import as_layout

# The be and calls fixtures of _gpu_calls.py: each test on numpy standing in for CuPy, and on CuPy
# where a GPU is.
pytest_plugins = ["_gpu_calls"]


# ------------------------------------------------------------------ reductions
AXES = [None, [], [0], [-1], [0, 1], [1]]


REDUCE_DTYPES = ("int8", "int32", "int64", "uint8", "uint64", "float16", "float32", "float64", "complex64",
                 "complex128")


# Complex maxima are UNIMPLEMENTED: tested as a fallback, not here.
@pytest.mark.parametrize("op, dtype", [(op, dtype) for op in ("reduce_sum", "reduce_max") for dtype in REDUCE_DTYPES
                                       if not (op == "reduce_max" and np.dtype(dtype).kind == "c")])
def test_reductions(calls, op, dtype):
    rng = np.random.default_rng(14)
    inputs = [random_coo(rng, (5, 4), 15, dtype), random_coo(rng, (3, 4, 5), 20, dtype),
              random_coo(rng, (4, 3, 2), 8, dtype, 2), random_coo(rng, (0, 3), 0, dtype),
              random_coo(rng, (4, 3), 0, dtype), random_coo(rng, (3, 2, 0), 4, dtype, 2),
              random_compressed(rng, "csr", (4, 5), dtype=dtype, index_dtype="int32", repeat=True),
              random_compressed(rng, "csc", (4, 5), dtype=dtype, repeat=True)]
    for t in inputs:
        for axis in AXES:
            if axis and max(axis) >= t.ndim:
                continue
            for keepdims in (False, True):
                calls.same(op, sp_input=t, axis=axis, keepdims=keepdims)
                if axis is not None and axis != [] or keepdims or t.ndim == 0:
                    out_rank = t.ndim if keepdims else t.ndim - (t.ndim if axis is None else len(axis))
                    if out_rank:
                        calls.same(op, sp_input=t, axis=axis, keepdims=keepdims, output_is_sparse=True)
                elif axis == []:
                    calls.same(op, sp_input=t, axis=axis, output_is_sparse=True)


def test_reduce_max_propagates_nan_and_ignores_unstored_zeros(calls):
    t = SparseTensor(indices=[[0, 0], [0, 1], [1, 1], [1, 1]], values=[-3.0, np.nan, -2.0, -5.0], dense_shape=[3, 2])
    assert calls.same("reduce_max", sp_input=t, axis=[1]).tolist()[1:] == [-2.0, 0.0]
    assert np.isnan(calls.same("reduce_max", sp_input=t, axis=[1])[0])


def test_reductions_fall_back_for_what_the_gpu_cannot_do(calls):
    rng = np.random.default_rng(15)
    assert calls.refused("reduce_sum", sp_input=random_coo(rng, (3, 3), 4, "bool")).reason == "UNSUPPORTED_DTYPE"
    assert calls.refused("reduce_max", sp_input=random_coo(rng, (3, 3), 4, "complex64")).reason == "UNSUPPORTED_DTYPE"
    assert calls.refused("reduce_sum", sp_input=random_coo(rng, (3, 3), 4, "float64"),
                         axis=[2]).reason == "AXIS_OUT_OF_RANGE"
    assert calls.refused("reduce_sum", sp_input=random_coo(rng, (3, 3), 4, "float64"),
                         output_is_sparse=True).reason == "RANK_TOO_LOW"
    f = random_coo(rng, (4, 4), 6, "float64", duplicates=False)
    calls.falls_back("reduce_sum", "layout", sp_input=as_layout(f, "bsr", blocksize=[2, 2]), axis=[0])
    batched = SparseTensor(layout="csr", compressed_indices=[[0, 1, 2], [0, 2, 2]], plain_indices=[[0, 1], [1, 0]],
                           values=np.array([[1.0, 2.0], [3.0, 4.0]]), dense_shape=[2, 2, 2])
    calls.falls_back("reduce_max", "batched", sp_input=batched, axis=[1])
