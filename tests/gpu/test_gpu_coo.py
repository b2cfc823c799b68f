"""reorder's, coalesce's and to_dense's GPU kernels held to their CPU kernels' answers
(``Calls``: _gpu_calls.py), and the COO ops' GPU kernels leaving compressed inputs to the CPU."""

from __future__ import annotations

import numpy as np
import pytest

from sparseserve import SparseTensor
from conftest import run_op as run
from helpers import assert_eq
from strategies import random_coo
from _gpu_calls import ALL_DTYPES

# The be and calls fixtures of _gpu_calls.py: each test on numpy standing in for CuPy, and on CuPy
# where a GPU is.
pytest_plugins = ["_gpu_calls"]


# ------------------------------------------------------------------ reorder, coalesce, to_dense
COO_SHAPES = [((6, 5), 2), ((3, 4, 5), 3), ((4, 3, 2), 2), ((9,), 1), ((0, 3), 2), ((3, 4, 0), 2)]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_reorder_and_coalesce(calls, dtype):
    rng = np.random.default_rng(9)
    for shape, s in COO_SHAPES:
        for t in (random_coo(rng, shape, 25, dtype, s), random_coo(rng, shape, 0, dtype, s),
                  random_coo(rng, shape, 8, dtype, s, duplicates=False, sort=True)):
            calls.same("reorder", sp_input=t)
            calls.same("coalesce", sp_input=t)


def test_sums_wrap_and_keep_the_sign_of_zero(calls):
    big = SparseTensor(indices=[[0], [0], [1]], values=np.array([100, 100, -128], np.int8), dense_shape=[2])
    assert calls.same("coalesce", sp_input=big).values.tolist() == [-56, -128]
    wide = SparseTensor(indices=[[1], [1]], values=np.array([2**63 - 1, 1], np.int64), dense_shape=[2])
    assert calls.same("coalesce", sp_input=wide).values.tolist() == [-2**63]
    neg = SparseTensor(indices=[[1], [0], [1]], values=np.array([-0.0, -0.0, 1.5]), dense_shape=[2])
    out = calls.same("coalesce", sp_input=neg)
    assert np.signbit(out.values).tolist() == [True, False]
    flags = SparseTensor(indices=[[0], [0], [1]], values=np.array([False, True, False]), dense_shape=[2])
    assert calls.same("coalesce", sp_input=flags).values.tolist() == [True, False]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_to_dense(calls, dtype):
    rng = np.random.default_rng(10)
    default = {"b": True, "u": 3, "i": -2, "f": 1.5, "c": 0.5}[np.dtype(dtype).kind]
    for shape, s in COO_SHAPES:
        messy = random_coo(rng, shape, 25, dtype, s)
        calls.same("to_dense", sp_input=messy, validate_indices=False)
        calls.same("to_dense", sp_input=messy, validate_indices=False, default_value=default)
        ordered = random_coo(rng, shape, 10, dtype, s, duplicates=False, sort=True)
        calls.same("to_dense", sp_input=ordered)
        calls.same("to_dense", sp_input=ordered, default_value=default)


def test_to_dense_falls_back_to_name_the_bad_entry(calls):
    rng = np.random.default_rng(11)
    unordered = random_coo(rng, (5, 5), 12, "float64")
    error = calls.falls_back("to_dense", "unordered", sp_input=unordered)
    assert error.reason in ("INDICES_UNSORTED", "INDICES_REPEATED")
    calls.refused("to_dense", sp_input=random_coo(rng, (3, 3), 2, "int8", duplicates=False, sort=True),
                  default_value=1000)


def test_gpu_kernels_leave_compressed_inputs_to_the_cpu():
    """The ops' GPU kernels take COO; a compressed input falls back (reason "layout") and gets
    the CPU kernel's answer (the numpy stand-in runs the GPU code paths here)."""
    from sparseserve.server.device import ArrayBackend
    from sparseserve.server.ops import REGISTRY

    fallbacks = []
    be = ArrayBackend.numpy_stand_in()
    be.on_fallback = lambda op, reason: fallbacks.append((op, reason))
    d = np.array([[1.0, 0, 2], [0, 0, 3]])
    csr = run("convert", sp_input=run("from_dense", tensor=d), layout="csr")
    calls = [("reorder", {"sp_input": csr}), ("coalesce", {"sp_input": csr}), ("to_dense", {"sp_input": csr}),
             ("with_values", {"sp_input": csr, "new_values": np.ones(3)}),
             ("mul", {"sp_input": csr, "dense": np.full(3, 2.0)}), ("div", {"sp_input": csr, "dense": np.full(3, 2.0)}),
             ("add", {"a": csr, "b": csr}), ("add", {"a": csr, "b": np.ones((2, 3))}),
             ("map_values", {"sp_input": csr, "fn": "neg"})]
    for name, args in calls:
        fallbacks.clear()
        op = REGISTRY.get(name)
        plan = op.plan(op.bind(args))
        got = be.to_host(be.run(op, plan)[0])
        assert fallbacks == [(name, "layout")], (name, fallbacks)
        assert_eq(got, op.run_plan("cpu", plan)[0], what=name, exact=True)
