"""The element-wise ops' GPU kernels (mul, div, with_values, map_values, add) held to their CPU
kernels' answers, and the calls that fall back (``Calls``: _gpu_calls.py)."""

from __future__ import annotations

import numpy as np
import pytest

from sparseserve import SparseTensor
from sparseserve.server.ops import REGISTRY
from strategies import random_coo, random_values
from _gpu_calls import ALL_DTYPES

# The be and calls fixtures of _gpu_calls.py: each test on numpy standing in for CuPy, and on CuPy
# where a GPU is.
pytest_plugins = ["_gpu_calls"]


# ------------------------------------------------------------------ element-wise
# (A 1 does not broadcast to an empty dimension, as in TensorFlow's SparseDenseCwise ops.)
BROADCASTS = [lambda shape: shape, lambda shape: shape[-1:], lambda shape: tuple(1 if d else 0 for d in shape),
              lambda shape: (shape[0], 1) + tuple(shape[2:]), lambda shape: ()]


@pytest.mark.parametrize("dtypes", [("float64", "float64"), ("float32", "float32"), ("int8", "int8"),
                                    ("int16", "float32"), ("uint64", "int64"), ("bool", "bool"), ("bool", "int32"),
                                    ("complex64", "float64"), ("float16", "float16"), ("int32", "int32"),
                                    ("uint8", "uint8"), ("int64", "int8")])
def test_mul_and_div(calls, dtypes):
    rng = np.random.default_rng(16)
    sp_dtype, dense_dtype = dtypes
    for shape, s in [((4, 5), 2), ((3, 4, 2), 3), ((3, 4, 2), 2), ((0, 3), 2)]:
        t = random_coo(rng, shape, 12, sp_dtype, s)
        for make in BROADCASTS:
            dense = random_values(rng, make(shape), dense_dtype)
            calls.same("mul", sp_input=t, dense=dense)
            kind = np.result_type(sp_dtype, dense_dtype).kind
            if kind == "b" or kind == "c":
                continue
            dense = np.where(dense == 0, np.ones((), dense.dtype), dense)  # zero divisors are refused
            calls.same("div", sp_input=t, dense=dense)


def test_div_truncates_wraps_and_follows_ieee(calls):
    t = SparseTensor(indices=[[0], [1], [2], [3]], values=np.array([-7, 7, -128, 5], np.int8), dense_shape=[5])
    out = calls.same("div", sp_input=t, dense=np.array([2, -2, -1, 3, 0], np.int8))  # 0 where nothing is stored
    assert out.values.tolist() == [-3, -3, -128, 1]
    f = SparseTensor(indices=[[0], [1], [2]], values=[1.0, -1.0, 0.0], dense_shape=[3])
    out = calls.same("div", sp_input=f, dense=np.array([0.5, np.inf, np.nan]))
    assert out.values[0] == 2.0 and out.values[1] == -0.0 and np.isnan(out.values[2])
    calls.falls_back("div", "division_by_zero", sp_input=f, dense=np.array([1.0, -0.0, 1.0]))  # refused
    out = calls.same("mul", sp_input=f, dense=np.array([np.inf, 2.0, np.nan]))
    assert out.values[0] == np.inf and np.isnan(out.values[2])


def test_mul_and_div_fall_back(calls):
    rng = np.random.default_rng(17)
    t = random_coo(rng, (3, 4), 6, "int32", duplicates=False)
    zero = np.zeros((3, 4), np.int32)
    calls.falls_back("div", "division_by_zero", sp_input=t, dense=zero)  # an error naming the entry
    c = random_coo(rng, (3, 4), 6, "complex128")
    calls.falls_back("div", "dtype", sp_input=c, dense=random_values(rng, (4,), "complex128"))
    calls.refused("div", sp_input=random_coo(rng, (3, 4), 6, "bool"), dense=np.ones(4, bool))
    calls.refused("mul", sp_input=t, dense=np.ones((2, 4), np.int32))
    calls.refused("mul", sp_input=t, dense=np.ones((2, 3, 4), np.int32))


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_with_values(calls, dtype):
    rng = np.random.default_rng(18)
    for shape, s in [((4, 5), 2), ((3, 4, 2), 2), ((0, 2), 2)]:
        t = random_coo(rng, shape, 9, "float64", s)
        calls.same("with_values", sp_input=t, new_values=random_values(rng, t.values.shape, dtype))
    calls.refused("with_values", sp_input=t, new_values=random_values(rng, (3,), dtype))


MAP_FNS = ("neg", "abs", "sign", "square", "conj", "ceil", "floor", "round", "trunc", "sqrt", "sin", "tan", "tanh",
           "asin", "atan", "sinh", "asinh", "atanh", "expm1", "log1p", "deg2rad", "rad2deg", "negative", "rint")


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int64", "float16", "float32", "float64", "complex64"])
def test_map_values(calls, dtype):
    rng = np.random.default_rng(19)
    t = random_coo(rng, (5, 6, 2), 12, dtype, 2)
    if np.dtype(dtype).kind == "f":
        t = SparseTensor(indices=t.indices, values=np.concatenate([t.values[:-1], [[np.nan, -0.0]]]).astype(dtype),
                         dense_shape=t.dense_shape)
    for fn in MAP_FNS:
        name = {"negative": "neg", "rint": "round"}.get(fn, fn)
        kind = np.dtype(dtype).kind
        cpu_refuses = (kind == "b" and name == "neg") or \
            (kind == "c" and name in ("ceil", "floor", "round", "trunc", "deg2rad", "rad2deg"))
        if cpu_refuses:
            calls.refused("map_values", sp_input=t, fn=fn)
        elif kind == "c" and name not in ("neg", "abs", "square", "conj"):
            calls.falls_back("map_values", "dtype", sp_input=t, fn=fn)
        else:
            calls.same("map_values", sp_input=t, fn=fn)
    calls.refused("map_values", sp_input=t, fn="cos")  # an error naming to_dense


TORCH_MAP_FNS = ("sgn", "signbit", "isnan", "isinf", "isposinf", "isneginf", "erf", "erfinv", "angle", "frac",
                 "relu", "positive", "nan_to_num", "conj_physical")


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int64", "float16", "float32", "float64", "complex64"])
def test_map_values_torch_functions(calls, dtype):
    rng = np.random.default_rng(21)
    t = random_coo(rng, (5, 6, 2), 12, dtype, 2)
    kind = np.dtype(dtype).kind
    if kind in "fc":
        special = np.array([[np.nan, -0.0], [np.inf, -np.inf], [0.5, -0.75]]).astype(dtype)
        t = SparseTensor(indices=t.indices, values=np.concatenate([t.values[:-3], special]).astype(dtype),
                         dense_shape=t.dense_shape)
    for fn in TORCH_MAP_FNS:
        refused = (kind == "c" and fn in ("signbit", "isposinf", "isneginf", "erf", "erfinv", "frac", "relu")) or \
            (kind == "b" and fn == "frac")
        if refused:
            calls.refused("map_values", sp_input=t, fn=fn)
        elif kind == "c" and fn in ("sgn", "angle"):
            calls.falls_back("map_values", "dtype", sp_input=t, fn=fn)
        else:
            calls.same("map_values", sp_input=t, fn=fn)
    for exponent in (1.0, 2.0, 2.5, 3.0):
        if kind == "c":
            calls.falls_back("map_values", "dtype", sp_input=t, fn="pow", exponent=exponent)
        else:
            calls.same("map_values", sp_input=t, fn="pow", exponent=exponent)
    calls.refused("map_values", sp_input=t, fn="pow", exponent=-1.0)
    calls.refused("map_values", sp_input=t, fn="pow")
    calls.refused("map_values", sp_input=t, fn="abs", exponent=2.0)


@pytest.mark.parametrize("dtypes", [("float64", "float64"), ("float32", "float64"), ("int8", "int8"),
                                    ("bool", "bool"), ("uint32", "int16"), ("complex64", "complex64"),
                                    ("float16", "float16")])
def test_add(calls, dtypes):
    rng = np.random.default_rng(20)
    for shape, s in [((5, 4), 2), ((3, 4, 2), 2), ((3, 4, 2), 3), ((0, 4), 2)]:
        # TensorFlow's merge: the GPU takes operands sorted with unique indices, others fall back.
        a, b = (random_coo(rng, shape, 12, dtypes[0], s, duplicates=False, sort=True),
                random_coo(rng, shape, 9, dtypes[1], s, duplicates=False, sort=True))
        calls.same("add", a=a, b=b)
        calls.same("add", a=b, b=a)
        complex_sum = np.result_type(*dtypes).kind == "c"
        if not complex_sum:
            calls.same("add", a=a, b=b, threshold=1.0)
            calls.same("add", a=a, b=b, threshold=2.5)
        unordered = random_coo(rng, shape, 12, dtypes[0], s)
        if unordered.nnz > 1:
            calls.falls_back("add", "unordered", a=unordered, b=b)
        dense = random_values(rng, shape, dtypes[1])
        calls.same("add", a=a, b=dense)
        calls.same("add", a=dense, b=a)


def test_add_keeps_cancellation_zeros_and_falls_back(calls):
    a = SparseTensor(indices=[[0, 0], [1, 1]], values=[1.0, 2.0], dense_shape=[2, 2])
    b = SparseTensor(indices=[[0, 0]], values=[-1.0], dense_shape=[2, 2])
    assert calls.same("add", a=a, b=b).values.tolist() == [0.0, 2.0]
    assert calls.same("add", a=a, b=b, threshold=0.5).indices.tolist() == [[1, 1]]
    z = SparseTensor(indices=[[0, 0]], values=np.array([1 + 1j]), dense_shape=[2, 2])
    calls.falls_back("add", "dtype", a=z, b=z, threshold=1.0)
    calls.refused("add", a=a, b=SparseTensor(indices=[[0]], values=[1.0], dense_shape=[2]))
    calls.refused("add", a=a, b=a, threshold=-1.0)
    calls.refused("add", a=np.ones((2, 2)), b=np.ones((2, 2)))
    csr = REGISTRY.get("convert").run("cpu", {"sp_input": a, "layout": "csr", "blocksize": None,
                                              "dense_dim": None})[0]
    calls.falls_back("add", "layout", a=csr, b=csr)  # compressed operands run on the CPU
    calls.falls_back("add", "layout", a=csr, b=np.ones((2, 2)))
