"""matmul and sampled_addmm held to TensorFlow 2.21 and PyTorch 2.13 running the same inputs.

TensorFlow: sparse @ dense (tf.sparse.sparse_dense_matmul, adjoints included). PyTorch: sparse @
sparse in COO and CSR, and sampled_addmm (torch takes CSR only; the other declared layouts are
held to torch's values for the same matrix as CSR).
"""

from __future__ import annotations


import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from _oracle import (TF_SETTINGS, TORCH_SETTINGS, check, declared_layouts, from_torch, in_layout, _index_dtype_like,
                     run, tf, to_tf, to_torch, tol, torch)
from helpers import assert_eq
from strategies import coo_tensors, random_values
from sparseserve import SparseTensor

MATMUL = ("int32", "float16", "float32", "float64", "complex64", "complex128")  # sparse_dense_matmul


# ======================================================================= matmul
@st.composite
def matmul_args(draw):
    adjoint_a, adjoint_b = draw(st.booleans()), draw(st.booleans())
    m, n, k = (draw(st.integers(0, 4)) for _ in range(3))
    dtype = draw(st.sampled_from(MATMUL))
    a = draw(coo_tensors((dtype,), hybrid=False, shape=(n, m) if adjoint_a else (m, n)))
    inner = n if draw(st.integers(0, 8)) else n + 1  # now and then inner dimensions that differ
    b = random_values(np.random.default_rng(draw(st.integers(0, 2**32 - 1))),
                      (k, inner) if adjoint_b else (inner, k), dtype)
    return a, b, adjoint_a, adjoint_b


@TF_SETTINGS
@given(matmul_args())
def test_matmul_sparse_dense(args):
    a, b, adjoint_a, adjoint_b = args
    check("matmul", dict(a=a, b=b, adjoint_a=adjoint_a, adjoint_b=adjoint_b),
          lambda: tf().sparse.sparse_dense_matmul(to_tf(a), tf().constant(b), adjoint_a=adjoint_a,
                                                  adjoint_b=adjoint_b),
          lambda got, want: assert_eq(got, want, **tol(a.dtype)))


def coalesced(t: SparseTensor) -> SparseTensor:
    return run("coalesce", sp_input=t)


# ================================================================== sampled_addmm
@TORCH_SETTINGS
@given(data=st.data())
def test_sampled_addmm_matches_torch(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    m, n, d = (data.draw(st.integers(1, 5)) for _ in range(3))
    dtype = data.draw(st.sampled_from(("float32", "float64", "complex64", "complex128")))
    dense = np.where(rng.random((m, n)) < 0.5, random_values(rng, (m, n), dtype), 0).astype(dtype)
    x = SparseTensor.from_dense(dense)
    mat1, mat2 = random_values(rng, (m, d), dtype), random_values(rng, (d, n), dtype)
    beta, alpha = data.draw(st.sampled_from([1, 0, 0.5, -2])), data.draw(st.sampled_from([1, 2, 0.5, -1]))
    for layout in declared_layouts("sampled_addmm", "input"):
        if layout not in ("csr",):  # torch.sparse.sampled_addmm takes CSR only
            continue
        x_in = in_layout(x, layout)
        got = run("sampled_addmm", input=x_in, mat1=mat1, mat2=mat2, beta=beta, alpha=alpha)
        want = torch().sparse.sampled_addmm(to_torch(x_in), to_torch(mat1), to_torch(mat2), beta=beta, alpha=alpha)
        want = from_torch(want)
        want = _index_dtype_like(want, got) if got.compressed_indices.dtype != want.compressed_indices.dtype else want
        assert_eq(got, want, rtol=1e-5, atol=1e-5)


def test_sampled_addmm_other_layouts_match_torch_on_csr():
    """COO and CSC inputs (torch takes CSR only): the values torch gives for the same matrix as CSR."""
    rng = np.random.default_rng(7)
    dense = np.where(rng.random((4, 5)) < 0.5, random_values(rng, (4, 5), "float64"), 0)
    x = SparseTensor.from_dense(dense)
    mat1, mat2 = random_values(rng, (4, 3), "float64"), random_values(rng, (3, 5), "float64")
    want = torch().sparse.sampled_addmm(to_torch(in_layout(x, "csr")), to_torch(mat1), to_torch(mat2),
                                        beta=0.5, alpha=2).to_dense().numpy()
    for layout in declared_layouts("sampled_addmm", "input"):
        got = run("sampled_addmm", input=in_layout(x, layout), mat1=mat1, mat2=mat2, beta=0.5, alpha=2)
        assert got.layout == layout
        assert_eq(run("to_dense", sp_input=run("convert", sp_input=got, layout="coo")), want)


# ================================================================== matmul sparse @ sparse
@TORCH_SETTINGS
@given(data=st.data())
def test_spgemm_matches_torch(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    m, k, n = (data.draw(st.integers(1, 6)) for _ in range(3))
    dtype = data.draw(st.sampled_from(("float32", "float64", "complex128")))
    a = SparseTensor.from_dense(np.where(rng.random((m, k)) < 0.4, random_values(rng, (m, k), dtype), 0).astype(dtype))
    b = SparseTensor.from_dense(np.where(rng.random((k, n)) < 0.4, random_values(rng, (k, n), dtype), 0).astype(dtype))
    layouts_a = declared_layouts("matmul", "a")
    for layout in ("coo", "csr"):
        if layout not in layouts_a:
            continue
        a_in, b_in = in_layout(a, layout), in_layout(b, layout)
        got = run("matmul", a=a_in, b=b_in)
        want_t = torch().sparse.mm(to_torch(a_in), to_torch(b_in)) if layout == "coo" else \
            torch().mm(to_torch(a_in), to_torch(b_in))
        want = from_torch(want_t.coalesce() if layout == "coo" else want_t)
        assert got.layout == want.layout
        if layout == "coo":
            assert_eq(got, want, rtol=1e-5, atol=1e-5)
        else:
            # torch's CSR @ CSR leaves the columns of a row in an unspecified order (often not
            # ascending); ours sorts them. Same row pointers, same entries per row.
            np.testing.assert_array_equal(got.compressed_indices, want.compressed_indices)
            assert_eq(coalesced(run("convert", sp_input=got, layout="coo")),
                        from_torch(_fresh_coalesce(want_t.to_sparse())), rtol=1e-5, atol=1e-5)
            for r in range(m):
                lo, hi = got.compressed_indices[r], got.compressed_indices[r + 1]
                assert np.all(np.diff(got.plain_indices[lo:hi]) > 0)


def _fresh_coalesce(x):
    """x coalesced for real: torch marks the COO of a CSR tensor coalesced even where its columns
    are unsorted, and coalesce() then does nothing."""
    T = torch()
    return T.sparse_coo_tensor(x._indices(), x._values(), x.shape).coalesce()
