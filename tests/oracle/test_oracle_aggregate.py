"""mm (with reduce), addmm and hspmm held to PyTorch on the same inputs.

The reference for ``mm``'s mean/amax/amin is ``torch.sparse.mm(csr, x, reduce=...)`` on the CSR
PyTorch's own conversion makes of the input (it reduces CSR only): ``to_sparse_csr()`` of a COO
(which coalesces it) or a CSC, ``to_sparse_coo().to_sparse_csr()`` of a BSR. The sum, addmm and
hspmm are compared against PyTorch's COO kernels, which take integers and complex too.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from _oracle import from_torch, in_layout, run, to_torch, torch
from helpers import assert_eq
from strategies import coo_tensors, random_values

NUMBERS = ("int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64", "complex64",
           "complex128")
FLOATS = ("float16", "float32", "float64")
SETTINGS = settings(max_examples=30, deadline=None)


def tol(dtype) -> dict:
    """float16 sums of up to a dozen products of halves round in the last bits."""
    return {"rtol": 1e-2, "atol": 6e-2} if np.dtype(dtype) == np.float16 else {"rtol": 1e-5, "atol": 1e-5}


@st.composite
def products(draw, dtypes, *, layouts=("coo", "csr", "csc", "bsr")):
    """(mat1 in some layout, mat1 as drawn (COO), mat2 [n, k]) with repeated and unsorted indices."""
    m, n, k = draw(st.integers(0, 5)), draw(st.integers(0, 5)), draw(st.integers(0, 4))
    layout = draw(st.sampled_from(layouts))
    if layout == "bsr":  # blocks of 1 or 2 rows/columns: dimensions multiples of them
        br, bc = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2]))
        m, n = m - m % br, n - n % bc
    coo = draw(coo_tensors(dtypes, shape=(m, n), sparse_ndim=2, max_nnz=14))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = random_values(rng, (n, k), coo.dtype)
    if layout == "bsr":
        mat1 = in_layout(coo, "bsr", blocksize=(br, bc))
    else:
        mat1 = in_layout(coo, layout)
    return mat1, coo, x


def torch_csr_of(mat1):
    """The CSR PyTorch reduces for our ``mat1`` (its own conversion of that layout)."""
    t = to_torch(mat1)
    if mat1.layout == "bsr":
        return t.to_sparse_coo().to_sparse_csr()
    return t if mat1.layout == "csr" else t.to_sparse_csr()


def torch_coo_of(mat1):
    t = to_torch(mat1)
    return t if mat1.layout == "coo" else t.to_sparse_coo()


@SETTINGS
@given(products(FLOATS), st.sampled_from(["mean", "amax", "amin"]))
def test_mm_reduce_matches_torch(case, reduce):
    mat1, _, x = case
    want = torch().sparse.mm(torch_csr_of(mat1), to_torch(x), reduce=reduce).numpy()
    got = run("mm", mat1=mat1, mat2=x, reduce=reduce)
    assert_eq(got, want, **tol(x.dtype))


@SETTINGS
@given(products(FLOATS, layouts=("csr",)))
def test_mm_explicit_sum_matches_torch_reduce_sum(case):
    mat1, _, x = case
    want = torch().sparse.mm(to_torch(mat1), to_torch(x), reduce="sum").numpy()
    assert_eq(run("mm", mat1=mat1, mat2=x, reduce="sum"), want, **tol(x.dtype))


@SETTINGS
@given(products(NUMBERS))
def test_mm_sum_matches_torch_in_every_dtype(case):
    mat1, _, x = case
    want = torch().sparse.mm(torch_coo_of(mat1), to_torch(x)).numpy()
    assert_eq(run("mm", mat1=mat1, mat2=x), want, **tol(x.dtype))


@st.composite
def addmm_cases(draw):
    mat1, coo, x = draw(products(NUMBERS))
    m, k = int(mat1.dense_shape[0]), int(x.shape[1])
    shape = draw(st.sampled_from([(m, k), (k,), (1, k), (m, 1), (), (1, 1), (1,)]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    input = np.asarray(random_values(rng, shape, coo.dtype))  # a 0-d array, not a numpy scalar
    kind = np.dtype(coo.dtype).kind
    scalars = st.integers(-3, 3) if kind in "iu" else st.sampled_from([0, 1, -1, 0.5, 2.5, -1.25])
    if kind == "u":
        scalars = st.integers(0, 3)
    return input, mat1, x, draw(scalars), draw(scalars)


@SETTINGS
@given(addmm_cases())
def test_addmm_matches_torch(case):
    input, mat1, x, beta, alpha = case
    got = run("addmm", input=input, mat1=mat1, mat2=x, beta=beta, alpha=alpha)
    want = torch().sparse.addmm(to_torch(input), torch_coo_of(mat1), to_torch(x), beta=beta, alpha=alpha).numpy()
    assert_eq(got, want, **tol(x.dtype))


@SETTINGS
@given(products(NUMBERS, layouts=("coo",)))
def test_hspmm_matches_torch(case):
    mat1, _, x = case
    want = torch().hspmm(to_torch(mat1), to_torch(x))
    got = run("hspmm", mat1=mat1, mat2=x)
    assert_eq(got, from_torch(want), **tol(x.dtype))
    assert got.coalesced == want.is_coalesced()
    assert got.indices.dtype == np.int64


@SETTINGS
@given(products(NUMBERS, layouts=("csr", "csc", "bsr")))
def test_hspmm_of_compressed_layouts_is_hspmm_of_their_coo(case):
    mat1, _, x = case
    want = torch().hspmm(torch_coo_of(mat1), to_torch(x))
    got = run("hspmm", mat1=mat1, mat2=x)
    assert_eq(got, from_torch(want), **tol(x.dtype))
    assert got.coalesced == want.is_coalesced()
