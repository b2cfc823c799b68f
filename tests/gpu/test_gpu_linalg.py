"""matmul's GPU kernels (SpMV, SpMM, dense @ sparse, SpGEMM in COO, CSR and CSC, adjoints)
held to its CPU kernel's answers, and the calls that fall back (``Calls``: _gpu_calls.py)."""

from __future__ import annotations

import numpy as np
import pytest

from sparseserve import SparseTensor
from strategies import random_compressed, random_coo, random_values
from _gpu_calls import SHAPES_2D, as_layout

# The be and calls fixtures of _gpu_calls.py: each test on numpy standing in for CuPy, and on CuPy
# where a GPU is.
pytest_plugins = ["_gpu_calls"]


CUSPARSE = ("float32", "float64", "complex64", "complex128")


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
