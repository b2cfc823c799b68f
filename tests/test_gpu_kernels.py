"""The ops' GPU kernels held to their CPU kernels' answers.

Every call is bound with the op's real ``bind`` and run twice: through the GPU backend's
dispatch (``ArrayBackend.run``) and on the CPU kernel. The results must agree exactly in
structure (layout, shape, index arrays and dtypes, entry order, explicit zeros, the coalesced
flag) and in values: exactly for integers and bools, to a tight tolerance for floats (sums of
repeated entries run in another order on the device). Calls the GPU kernels support must not
fall back (so the device path really ran); the others must fall back with the expected reason
and still give the CPU's answer or raise the CPU's error.

The backend is numpy + scipy.sparse standing in for CuPy + cupyx.scipy.sparse, so every GPU
code path runs here; with CuPy and a GPU present the same tests run on the device too.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers import assert_eq
from sparseserve import SparseTensor
from sparseserve.errors import SparseServeError
from sparseserve.server.device import ArrayBackend, DeviceTensor
from sparseserve.server.ops import REGISTRY
from strategies import random_compressed, random_coo, random_values

ALL_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "float32", "float64", "complex64", "complex128")
CUSPARSE = ("float32", "float64", "complex64", "complex128")
# Floats and complex agree to a tight tolerance (sums of repeated entries run in another order on
# the device); integers and bools exactly.
TOL = {"float16": 4e-3, "float32": 2e-5, "complex64": 2e-5, "float64": 1e-12, "complex128": 1e-12}


# ------------------------------------------------------------------ backends
@pytest.fixture
def be(array_backend) -> ArrayBackend:
    """Each test twice: on numpy standing in for CuPy, and on CuPy where a GPU is (conftest)."""
    return array_backend


# ------------------------------------------------------------------ inputs
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


def matrices(rng, shape, dtype):
    """The same kind of matrix in every 2-D layout the GPU multiplies, messy and clean."""
    yield random_coo(rng, shape, 2 * max(shape), dtype)
    yield random_coo(rng, shape, 0, dtype)
    for layout in ("csr", "csc"):
        for index in ("int32", "int64"):
            yield random_compressed(rng, layout, shape, dtype=dtype, index_dtype=index, canonical=index != "int64",
                                    repeat=index == "int64")


# ------------------------------------------------------------------ matmul
@pytest.mark.parametrize("dtype", CUSPARSE)
def test_matmul_sparse_times_dense(calls, dtype):
    rng = np.random.default_rng(1)
    for shape in SHAPES_2D:
        for a in matrices(rng, shape, dtype):
            for adjoint_a in (False, True):
                inner = shape[0] if adjoint_a else shape[1]
                calls.same("matmul", a=a, b=random_values(rng, (inner,), dtype), adjoint_a=adjoint_a)
                for adjoint_b in (False, True):
                    b = random_values(rng, (3, inner) if adjoint_b else (inner, 3), dtype)
                    calls.same("matmul", a=a, b=b, adjoint_a=adjoint_a, adjoint_b=adjoint_b)
                calls.same("matmul", a=a, b=random_values(rng, (inner, 0), dtype), adjoint_a=adjoint_a)


@pytest.mark.parametrize("dtype", CUSPARSE)
def test_matmul_dense_times_sparse(calls, dtype):
    rng = np.random.default_rng(2)
    for shape in SHAPES_2D:
        for b in matrices(rng, shape, dtype):
            for adjoint_b in (False, True):
                inner = shape[1] if adjoint_b else shape[0]
                calls.same("matmul", a=random_values(rng, (inner,), dtype), b=b, adjoint_b=adjoint_b)
                for adjoint_a in (False, True):
                    a = random_values(rng, (inner, 3) if adjoint_a else (3, inner), dtype)
                    calls.same("matmul", a=a, b=b, adjoint_a=adjoint_a, adjoint_b=adjoint_b)


def test_matmul_worked_examples(calls):
    a = SparseTensor(layout="csr", compressed_indices=[0, 2, 2, 3], plain_indices=[0, 2, 1],
                     values=[1.0, 2.0, 3.0], dense_shape=[3, 3])
    assert calls.same("matmul", a=a, b=np.array([1.0, 10.0, 100.0])).tolist() == [201.0, 0.0, 30.0]
    assert calls.same("matmul", a=np.array([1.0, 10.0, 100.0]), b=a).tolist() == [1.0, 300.0, 2.0]
    z = SparseTensor(indices=[[0, 1]], values=np.array([1 + 2j]), dense_shape=[2, 2])
    assert calls.same("matmul", a=z, b=np.array([1 + 0j, 1 + 0j]), adjoint_a=True).tolist() == [0, 1 - 2j]
    assert calls.same("matmul", a=np.array([[1j], [0]]), b=z, adjoint_a=True).tolist() == [[0, 2 - 1j]]


@pytest.mark.parametrize("dtype", CUSPARSE)
def test_spgemm_every_layout_pair_and_adjoint(calls, dtype):
    rng = np.random.default_rng(3)
    for m, q, r in [(4, 5, 3), (1, 1, 1), (0, 3, 2), (3, 0, 2), (3, 2, 0), (6, 6, 6)]:
        for adjoint_a in (False, True):
            for adjoint_b in (False, True):
                sa = (q, m) if adjoint_a else (m, q)
                sb = (r, q) if adjoint_b else (q, r)
                lefts = [random_coo(rng, sa, 2 * max(sa), dtype),
                         random_compressed(rng, "csr", sa, dtype=dtype, index_dtype="int32", repeat=True),
                         random_compressed(rng, "csr", sa, dtype=dtype, index_dtype="int64", canonical=True),
                         random_compressed(rng, "csc", sa, dtype=dtype, repeat=True)]
                rights = [random_coo(rng, sb, 2 * max(sb), dtype),
                          random_compressed(rng, "csr", sb, dtype=dtype, index_dtype="int32", repeat=True),
                          random_compressed(rng, "csc", sb, dtype=dtype, index_dtype="int32", canonical=True)]
                for a in lefts:
                    for b in rights:
                        calls.same("matmul", a=a, b=b, adjoint_a=adjoint_a, adjoint_b=adjoint_b)


def test_spgemm_keeps_zeros_from_cancellation_and_stored_zeros(calls):
    a = SparseTensor(layout="csr", compressed_indices=[0, 2], plain_indices=[0, 1], values=[1.0, 1.0],
                     dense_shape=[1, 2])
    b = SparseTensor(layout="csr", compressed_indices=[0, 2, 4], plain_indices=[2, 3, 0, 2],
                     values=[2.0, 1.0, 7.0, -2.0], dense_shape=[2, 4])
    out = calls.same("matmul", a=a, b=b)
    assert out.plain_indices.tolist() == [0, 2, 3] and out.values.tolist() == [7.0, 0.0, 1.0]
    zeros = SparseTensor(indices=[[0, 0], [1, 1], [0, 0]], values=[0.0, 0.0, 3.0], dense_shape=[2, 2])
    out = calls.same("matmul", a=zeros, b=zeros)  # stored zeros (and 0 * 3) stay stored
    assert out.indices.tolist() == [[0, 0], [1, 1]]
    big = random_coo(np.random.default_rng(4), (40, 40), 400, "float64")
    calls.same("matmul", a=big, b=as_layout(big, "csr"))
    calls.same("matmul", a=as_layout(big, "csr"), b=big, adjoint_b=True)


def test_matmul_falls_back_for_what_the_gpu_cannot_do(calls):
    rng = np.random.default_rng(5)
    a = random_coo(rng, (4, 4), 8, "int64")
    calls.falls_back("matmul", "dtype", a=a, b=random_values(rng, (4,), "int64"))
    calls.falls_back("matmul", "dtype", a=random_coo(rng, (4, 4), 8, "float16"),
                     b=random_values(rng, (4, 2), "float16"))
    assert calls.refused("matmul", a=random_coo(rng, (4, 4), 8, "bool"),
                         b=random_values(rng, (4,), "bool")).reason == "UNSUPPORTED_DTYPE"
    assert calls.refused("matmul", a=random_coo(rng, (4, 4), 8, "float32"),
                         b=random_values(rng, (4,), "float64")).reason == "DTYPE_MISMATCH"
    f = random_coo(rng, (4, 4), 8, "float64")
    calls.falls_back("matmul", "layout", a=as_layout(f, "bsr", blocksize=[2, 2]),
                     b=random_values(rng, (4, 3), "float64"))
    calls.falls_back("matmul", "layout", a=random_values(rng, (4,), "float64"), b=as_layout(f, "bsc", blocksize=[2, 2]))
    batched = random_coo(rng, (2, 4, 4), 10, "float64", duplicates=False)
    calls.falls_back("matmul", "batched", a=batched, b=random_values(rng, (2, 4, 3), "float64"))
    hybrid = random_coo(rng, (4, 4, 2), 5, "float64", sparse_ndim=2)
    assert calls.refused("matmul", a=hybrid, b=random_values(rng, (4, 3), "float64")).reason == "UNSUPPORTED_HYBRID"
    assert calls.refused("matmul", a=f, b=random_values(rng, (5,), "float64")).reason == "SHAPE_MISMATCH"
    assert calls.refused("matmul", a=f, b=random_coo(rng, (3, 2), 2, "float64")).reason == "SHAPE_MISMATCH"
    assert calls.refused("matmul", a=random_values(rng, (4,), "float64"), b=f, adjoint_a=True).reason == "RANK"
    assert calls.refused("matmul", a=random_values(rng, (4, 4), "float64"),
                         b=random_values(rng, (4, 4), "float64")).reason == "UNSUPPORTED_LAYOUT"


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


# ------------------------------------------------------------------ coverage of the registry
GPU_OPS = {"add", "coalesce", "convert", "div", "map_values", "matmul", "mul", "reduce_max", "reduce_sum", "reorder",
           "to_dense", "transpose", "with_values",
           # tests/test_gpu_segment.py, test_gpu_aggregate.py and test_gpu_gather.py hold these
           "segment_sum", "segment_mean", "segment_sqrt_n", "mm", "index_select"}


def test_the_ops_with_gpu_kernels():
    assert {op.name for op in REGISTRY if "cuda" in op.kernels} == GPU_OPS


def test_inputs_are_never_written(calls):
    """The stand-in passes the bound (read-only) arrays straight to the kernels: a kernel that
    wrote its input would raise here. Kept device tensors are shared the same way."""
    rng = np.random.default_rng(21)
    t = random_coo(rng, (6, 6), 20, "float64")
    bound = REGISTRY.get("coalesce").bind({"sp_input": t})
    assert not bound["sp_input"].values.flags.writeable
    before = bound["sp_input"].values.copy()
    matmul, coalesce = REGISTRY.get("matmul"), REGISTRY.get("coalesce")
    calls.be.run(matmul, matmul.plan(matmul.bind({"a": bound["sp_input"], "b": np.ones(6)})))
    calls.be.run(coalesce, coalesce.plan(bound))
    np.testing.assert_array_equal(bound["sp_input"].values, before)
