"""What the GPU kernels' tests share: ``Calls``, which holds an op's GPU kernel to its CPU kernel.

Every call is bound with the op's real ``bind`` and run twice: through the GPU backend's
dispatch (``ArrayBackend.run``) and on the CPU kernel. The results must agree exactly in
structure (layout, shape, index arrays and dtypes, entry order, explicit zeros, the coalesced
flag) and in values: exactly for integers and bools, to a tight tolerance for floats (sums of
repeated entries run in another order on the device). Calls the GPU kernels support must not
fall back (so the device path really ran); the others must fall back with the expected reason
and still give the CPU's answer or raise the CPU's error.

The backend is numpy + scipy.sparse standing in for CuPy + cupyx.scipy.sparse, so every GPU
code path runs here; with CuPy and a GPU present the same tests run on the device too.

A test module takes the ``be`` and ``calls`` fixtures with ``pytest_plugins = ["_gpu_calls"]``
and the rest with ``from _gpu_calls import ...`` (this folder is on the path of its tests).
test_gpu_aggregate.py and test_gpu_segment.py keep comparisons of their own (mm's tolerances,
the segment ops' exact sums).
"""

from __future__ import annotations

import pytest

from helpers import assert_eq
from sparseserve import SparseTensor
from sparseserve.errors import SparseServeError
from sparseserve.server.device import ArrayBackend, DeviceTensor
from sparseserve.server.ops import REGISTRY

ALL_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "float32", "float64", "complex64", "complex128")


# Floats and complex agree to a tight tolerance (sums of repeated entries run in another order on
# the device); integers and bools exactly.
TOL = {"float16": 4e-3, "float32": 2e-5, "complex64": 2e-5, "float64": 1e-12, "complex128": 1e-12}


@pytest.fixture
def be(array_backend) -> ArrayBackend:
    """Each test twice: on numpy standing in for CuPy, and on CuPy where a GPU is (conftest)."""
    return array_backend


def cpu(op: str, **args):
    out = REGISTRY.get(op).run("cpu", REGISTRY.get(op).bind(args))
    return out[0]


def as_layout(t: SparseTensor, layout: str, **kw) -> SparseTensor:
    return cpu("convert", sp_input=t, layout=layout, **kw)


class Calls:
    """Runs ops through the GPU backend and the CPU kernel and compares them, recording fallbacks."""

    def __init__(self, be: ArrayBackend):
        self.be = be
        self.fallbacks: list[tuple[str, str]] = []
        be.on_fallback = lambda op, reason: self.fallbacks.append((op, reason))

    def both(self, name: str, **args):
        """(gpu outputs on the host, cpu outputs) or the error each raised."""
        op = REGISTRY.get(name)
        try:
            plan = op.plan(op.bind(args))
        except SparseServeError as exc:  # refused by the op's check, before any device runs
            return exc, exc
        try:
            want = op.run_plan("cpu", plan)
        except SparseServeError as exc:
            want = exc
        try:
            got = self.be.run(op, plan)
        except SparseServeError as exc:
            return exc, want
        for out in got if not self.fallbacks else ():  # what the device path returns lives on the device
            if isinstance(out, SparseTensor):
                assert type(out) is DeviceTensor
                assert isinstance(out.values, self.be.xp.ndarray)
            else:
                assert isinstance(out, self.be.xp.ndarray)
        return tuple(self.be.to_host(out) for out in got), want

    def same(self, name: str, **args):
        """The GPU path runs (no fallback) and gives the CPU's answer."""
        self.fallbacks.clear()
        got, want = self.both(name, **args)
        assert not self.fallbacks, f"{name} fell back: {self.fallbacks}"
        assert not isinstance(want, Exception), f"the CPU kernel raised {want!r}"
        assert not isinstance(got, Exception), f"the GPU kernel raised {got!r}"
        for g, w in zip(got, want, strict=True):
            assert_eq(g, w, coalesced=True, rtol=TOL, atol=TOL)
        return got[0]

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
        """The call falls back with ``reason`` and gives the CPU's answer (or its error)."""
        self.fallbacks.clear()
        got, want = self.both(name, **args)
        assert self.fallbacks == [(name, reason)], self.fallbacks
        if isinstance(want, Exception):
            assert type(got) is type(want) and got.reason == want.reason, (got, want)
        else:
            for g, w in zip(got, want, strict=True):
                assert_eq(g, w, coalesced=True, rtol=TOL, atol=TOL)
        return got


@pytest.fixture
def calls(be) -> Calls:
    return Calls(be)


SHAPES_2D = [(5, 4), (1, 1), (0, 3), (3, 0), (6, 7)]
