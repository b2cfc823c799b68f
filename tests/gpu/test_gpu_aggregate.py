"""mm's GPU kernel (sum, mean, amax, amin) held to its CPU kernel's answers.

Each call is bound with the op's real ``bind`` and run through the GPU backend's dispatch
(``ArrayBackend.run``) and on the CPU kernel. Calls the GPU kernel supports must not fall back
(so the device path really ran) and must agree with the CPU to a tight tolerance (sums run in
another order on the device); the others fall back with the expected reason and give the CPU's
answer. Calls mm refuses are refused by its check before any device runs. The ``array_backend``
fixture runs everything on numpy + scipy.sparse standing in for CuPy, and on CuPy itself where a
GPU is present (it skips with the reason otherwise).
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers import assert_eq
from sparseserve import SparseTensor
from sparseserve.errors import SparseServeError
from sparseserve.kernels import PARALLEL_MIN
from sparseserve.server.device import ArrayBackend
from sparseserve.server.ops import REGISTRY
from strategies import random_compressed, random_coo

REDUCES = ("sum", "mean", "amax", "amin")
VALUES = {"low": -6, "high": 6}  # halves -3..3
# Sums run in another order on the device: float32 and complex64 agree to 2e-5, the others to 1e-12.
TOL = {"float16": 1e-12, "float32": 2e-5, "complex64": 2e-5, "float64": 1e-12, "complex128": 1e-12}
OP = REGISTRY.get("mm")


class Runs:
    def __init__(self, be: ArrayBackend):
        self.be = be
        self.fallbacks: list[tuple[str, str]] = []
        be.on_fallback = lambda op, reason: self.fallbacks.append((op, reason))

    def both(self, **args):
        self.fallbacks.clear()
        try:
            plan = OP.plan(OP.bind(args))
        except SparseServeError as exc:  # refused by the op's check, before any device runs
            return exc, exc
        try:
            want = OP.run_plan("cpu", plan)[0]
        except SparseServeError as exc:
            want = exc
        try:
            got = self.be.run(OP, plan)[0]
        except SparseServeError as exc:
            return exc, want
        if not self.fallbacks:
            assert isinstance(got, self.be.xp.ndarray)  # the device path returns a device array
        return self.be.to_host(got), want

    def same(self, **args) -> np.ndarray:
        got, want = self.both(**args)
        assert not self.fallbacks, f"mm fell back: {self.fallbacks}"
        assert not isinstance(want, Exception), f"the CPU kernel raised {want!r}"
        assert not isinstance(got, Exception), f"the GPU kernel raised {got!r}"
        assert_eq(got, want, rtol=TOL, atol=TOL)
        return got

    def refused(self, **args) -> SparseServeError:
        """mm refuses the call before dispatch (its argument types or its check): no device
        kernel, GPU or CPU, is asked to run it, and no fallback is counted."""
        self.fallbacks.clear()
        with pytest.raises(SparseServeError) as err:
            OP.plan(OP.bind(args))
        assert not self.fallbacks, self.fallbacks
        return err.value

    def falls_back(self, reason: str, **args):
        got, want = self.both(**args)
        assert self.fallbacks == [("mm", reason)], self.fallbacks
        if isinstance(want, Exception):
            assert type(got) is type(want) and got.reason == want.reason, (got, want)
        else:
            assert_eq(got, want, exact=True)


@pytest.fixture
def runs(array_backend) -> Runs:
    return Runs(array_backend)


def messy_coo(rng, shape, nnz, dtype) -> SparseTensor:
    """Random order, repeated indices, an explicit zero."""
    t = random_coo(rng, shape, nnz, dtype, values=VALUES)
    if t.nnz > 1:
        t.values[1] = 0
    return t


def layouts_of(rng, shape, nnz, dtype):
    t = messy_coo(rng, shape, nnz, dtype)
    yield t
    for layout in ("csr", "csc"):
        yield convert(t, layout)
    # a CSR whose rows repeat and disorder their columns (every stored entry counts)
    yield random_compressed(rng, "csr", shape, dtype=dtype, index_dtype="int32", repeat=True, values=VALUES)


def convert(t, layout):
    op = REGISTRY.get("convert")
    return op.run("cpu", op.bind({"sp_input": t, "layout": layout}))[0]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("shape, k", [((6, 5), 3), ((1, 1), 1), ((0, 3), 2), ((4, 0), 2), ((5, 4), 0), ((9, 7), 4)])
def test_gpu_kernel_equals_cpu_kernel(runs, dtype, reduce, shape, k):
    rng = np.random.default_rng(sum(shape) * 10 + k)
    x = rng.standard_normal((shape[1], k)).astype(dtype)
    for mat1 in layouts_of(rng, shape, 2 * max(shape) + 1, dtype):
        runs.same(mat1=mat1, mat2=x, reduce=reduce)


@pytest.mark.parametrize("reduce", REDUCES)
def test_nan_inf_and_empty_rows(runs, reduce):
    t = SparseTensor(layout="csr", compressed_indices=np.array([0, 2, 2, 4, 6]),
                     plain_indices=np.array([0, 1, 1, 0, 0, 1]),
                     values=np.array([1.0, np.nan, -np.inf, 2.0, -1.0, -2.0]), dense_shape=[4, 2])
    x = np.array([[1.0, -2.0, 0.0], [3.0, np.nan, 4.0]])
    runs.same(mat1=t, mat2=x, reduce=reduce)


def test_large_graph_past_the_parallel_threshold(runs):
    rng = np.random.default_rng(11)
    n, e = 5_000, 2 * PARALLEL_MIN
    t = SparseTensor(indices=np.stack([rng.integers(0, n, e), rng.integers(0, n, e)], axis=1),
                     values=rng.standard_normal(e).astype(np.float32), dense_shape=[n, n])
    x = rng.standard_normal((n, 4)).astype(np.float32)
    for reduce in REDUCES:
        runs.same(mat1=t, mat2=x, reduce=reduce)


def test_complex_sum_runs_on_the_device(runs):
    rng = np.random.default_rng(5)
    t = messy_coo(rng, (4, 3), 7, np.complex128)
    t = SparseTensor(indices=t.indices, values=t.values * (1 - 2j), dense_shape=[4, 3])
    runs.same(mat1=t, mat2=(rng.standard_normal((3, 2)) + 1j).astype(np.complex128))


def test_calls_it_cannot_take_fall_back(runs):
    rng = np.random.default_rng(2)
    t = messy_coo(rng, (4, 4), 6, np.float64)
    x = np.ones((4, 2))
    # float16 and integers: the CPU kernel (float16 computed in float32; integers refused for mean)
    half = SparseTensor(indices=t.indices, values=t.values.astype(np.float16), dense_shape=[4, 4])
    runs.falls_back("dtype", mat1=half, mat2=x.astype(np.float16), reduce="mean")
    ints = SparseTensor(indices=t.indices, values=t.values.astype(np.int64), dense_shape=[4, 4])
    runs.falls_back("dtype", mat1=ints, mat2=x.astype(np.int64))
    runs.refused(mat1=ints, mat2=x.astype(np.int64), reduce="amax")
    # block layouts; everything mm refuses is refused before any device (its check)
    runs.falls_back("layout", mat1=convert_blocks(t), mat2=x, reduce="amin")
    runs.refused(mat1=t, mat2=np.ones((3, 2)), reduce="mean")
    runs.refused(mat1=t, mat2=x, reduce="median")
    runs.refused(mat1=t, mat2=x.astype(np.float32), reduce="amax")


def convert_blocks(t):
    op = REGISTRY.get("convert")
    return op.run("cpu", op.bind({"sp_input": t, "layout": "bsr", "blocksize": [2, 2]}))[0]
