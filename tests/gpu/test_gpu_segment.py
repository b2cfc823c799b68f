"""The GPU kernels of segment_sum / segment_mean / segment_sqrt_n held to the CPU kernels' answers.

Each call is bound with the op's real ``bind`` and run through the GPU backend's dispatch
(``ArrayBackend.run``) and on the CPU kernel. Supported calls must not fall back and must give
the CPU's answer exactly (dtype, shape and every value: inputs are small halves, so every sum
is exact whatever order a device adds in); calls with a bad index or segment id fall back with
the expected reason and raise the CPU's error, and calls the op's check refuses (a dtype, lengths,
num_segments) are refused before any device runs. The backend is numpy
standing in for CuPy (always) and CuPy itself where a GPU is (``array_backend`` in conftest).
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers import assert_eq
from sparseserve.errors import SparseServeError
from sparseserve.kernels import PARALLEL_MIN
from sparseserve.server.device import ArrayBackend
from sparseserve.server.ops import REGISTRY
from strategies import random_values

SUM_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
              "float64")
FLOAT_DTYPES = ("float16", "float32", "float64")
OPS = {"segment_sum": SUM_DTYPES, "segment_mean": FLOAT_DTYPES, "segment_sqrt_n": FLOAT_DTYPES}


class Calls:
    def __init__(self, be: ArrayBackend):
        self.be = be
        self.fallbacks: list[tuple[str, str]] = []
        be.on_fallback = lambda op, reason: self.fallbacks.append((op, reason))

    def both(self, name: str, **args):
        op = REGISTRY.get(name)
        self.fallbacks.clear()
        try:
            plan = op.plan(op.bind(args))
        except SparseServeError as exc:  # refused by the op's check, before any device runs
            return exc, exc
        try:
            want = op.run_plan("cpu", plan)[0]
        except SparseServeError as exc:
            want = exc
        try:
            got = self.be.run(op, plan)[0]
        except SparseServeError as exc:
            return exc, want
        if not self.fallbacks:
            assert isinstance(got, self.be.xp.ndarray), "the device path returns a device array"
        return self.be.to_host(got), want

    def same(self, name: str, **args) -> np.ndarray:
        got, want = self.both(name, **args)
        assert not self.fallbacks, f"{name} fell back: {self.fallbacks}"
        assert not isinstance(want, Exception), f"the CPU kernel raised {want!r}"
        assert_eq(got, want, exact=True)
        if got.dtype.kind == "f":
            assert np.array_equal(np.signbit(got), np.signbit(want)), "signs of zeros"
        return got

    def refused(self, name: str, **args) -> SparseServeError:
        """The op refuses the call before dispatch (its argument types or its check): no device
        kernel, GPU or CPU, is asked to run it, and no fallback is counted."""
        self.fallbacks.clear()
        op = REGISTRY.get(name)
        with pytest.raises(SparseServeError) as err:
            op.plan(op.bind(args))
        assert not self.fallbacks, self.fallbacks
        return err.value

    def falls_back(self, name: str, reason: str, **args):
        got, want = self.both(name, **args)
        assert self.fallbacks == [(name, reason)], self.fallbacks
        assert isinstance(want, SparseServeError) and type(got) is type(want) and got.reason == want.reason
        return got


@pytest.fixture
def calls(array_backend) -> Calls:
    return Calls(array_backend)


@pytest.mark.parametrize("op", list(OPS))
def test_gpu_equals_cpu_every_dtype(calls, op):
    rng = np.random.default_rng(0)
    for dtype in OPS[op]:
        for index_dtypes in (("int32", "int32"), ("int64", "int64"), ("int32", "int64")):
            for inner in ((), (3,), (2, 2), (0,)):
                data = random_values(rng, (6, *inner), dtype, low=-8, high=8)
                k = int(rng.integers(0, 15))
                indices = rng.integers(0, 6, k).astype(index_dtypes[0])
                ids = np.sort(rng.integers(0, 9, k)).astype(index_dtypes[1])
                calls.same(op, data=data, indices=indices, segment_ids=ids)
                n_out = (int(ids[-1]) + 1 if k else 0) + int(rng.integers(0, 3))
                calls.same(op, data=data, indices=indices, segment_ids=ids, num_segments=n_out)


@pytest.mark.parametrize("op", list(OPS))
def test_gpu_edge_cases(calls, op):
    data = np.array([[-0.0, 1.5], [2.0, -3.0], [0.5, 0.25]], np.float32)
    empty = np.zeros(0, np.int64)
    assert calls.same(op, data=data, indices=empty, segment_ids=empty).shape == (0, 2)
    assert calls.same(op, data=data, indices=empty, segment_ids=empty, num_segments=3).tolist() == [[0, 0]] * 3
    out = calls.same(op, data=data, indices=[0], segment_ids=[2])  # a single -0.0 stays -0.0
    assert np.signbit(out[2, 0]) and out[:2].tolist() == [[0, 0], [0, 0]]
    calls.same(op, data=data, indices=[2, 2, 2, 0, 1], segment_ids=[0, 0, 0, 4, 4], num_segments=6)
    calls.same(op, data=np.array([1.0, 2.0, 4.0]), indices=[2, 0, 1], segment_ids=[1, 1, 1])
    ones = np.ones((3000, 1), np.float16)  # float16 summed in float32 on both
    assert calls.same(op, data=ones, indices=np.arange(3000), segment_ids=np.zeros(3000, np.int64))[0, 0] == \
        (3000 if op == "segment_sum" else 1 if op == "segment_mean" else np.float16(3000 / np.sqrt(3000)))


def test_gpu_integers_wrap_as_cpu(calls):
    calls.same("segment_sum", data=np.full((3, 2), 100, np.int8), indices=[0, 1, 2], segment_ids=[0, 0, 0])
    big = np.iinfo(np.int64).max
    calls.same("segment_sum", data=np.array([big, big, -5], np.int64), indices=[0, 1, 2], segment_ids=[1, 1, 1])
    calls.same("segment_sum", data=np.array([2**64 - 1, 2], np.uint64), indices=[0, 1], segment_ids=[0, 0])


@pytest.mark.parametrize("op", list(OPS))
def test_gpu_large_inputs(calls, op):
    rng = np.random.default_rng(1)
    k = 2 * PARALLEL_MIN
    data = random_values(rng, (k // 2, 4), "float64", low=-8, high=8)
    indices = rng.permutation(k) % (k // 2)
    ids = np.sort(rng.integers(0, k // 10, k))
    calls.same(op, data=data, indices=indices, segment_ids=ids, num_segments=k // 10 + 3)


@pytest.mark.parametrize("op", list(OPS))
def test_gpu_bad_entries_fall_back_to_the_cpu_error(calls, op):
    data = np.ones((4, 2), np.float32)
    err = calls.falls_back(op, "argument", data=data, indices=[0, 4], segment_ids=[0, 0])
    assert err.reason == "INDEX_OUT_OF_RANGE" and "indices[1] = 4" in err.message
    assert calls.falls_back(op, "argument", data=data, indices=[0, -1], segment_ids=[0, 1]).reason == \
        "INDEX_OUT_OF_RANGE"
    assert calls.falls_back(op, "argument", data=data, indices=[0, 1, 2], segment_ids=[1, 0, 1]).reason == \
        "SEGMENT_IDS_UNSORTED"
    assert calls.falls_back(op, "argument", data=data, indices=[0, 1], segment_ids=[-1, 0]).reason == \
        "SEGMENT_ID_OUT_OF_RANGE"
    assert calls.falls_back(op, "argument", data=data, indices=[0, 1], segment_ids=[0, 2],
                            num_segments=2).reason == "SEGMENT_ID_OUT_OF_RANGE"
    assert calls.refused(op, data=data, indices=[0, 1], segment_ids=[0]).reason == "SHAPE_MISMATCH"
    assert calls.refused(op, data=data, indices=[0], segment_ids=[0], num_segments=-1).reason == "VALUE_OUT_OF_RANGE"
    assert calls.refused(op, data=data, indices=np.array([0], np.int16), segment_ids=[0]).reason == "BAD_DTYPE"


def test_gpu_refused_dtypes_fall_back(calls):
    assert calls.refused("segment_sum", data=np.ones((2, 2), bool), indices=[0],
                         segment_ids=[0]).reason == "UNSUPPORTED_DTYPE"
    assert calls.refused("segment_sum", data=np.ones((2, 2), np.complex64), indices=[0],
                         segment_ids=[0]).reason == "UNSUPPORTED_DTYPE"
    assert calls.refused("segment_mean", data=np.ones((2, 2), np.int32), indices=[0],
                         segment_ids=[0]).reason == "UNSUPPORTED_DTYPE"
    swapped = np.ones((2, 2), ">f4")  # CuPy holds native byte order only: the CPU kernel answers
    got, want = calls.both("segment_sum", data=swapped, indices=[0, 1], segment_ids=[0, 0])
    assert calls.fallbacks == [("segment_sum", "dtype")]
    np.testing.assert_array_equal(got, want)
