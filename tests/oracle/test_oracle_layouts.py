"""The COO ops on CSR, CSC, BSR and BSC held to PyTorch 2.13 where torch has the op on the layout.

Inputs are made by torch itself (``to_sparse_csr/csc/bsr/bsc`` of random dense tensors, with batch
and dense dimensions), so they are canonical, and compared exactly: layout, compressed and plain
indices (dtype too), blocksize, values (allclose for floats). What torch does on these layouts:
``to_dense`` on all four (batch and dense dims too), ``*`` by a dense tensor of the same shape on
CSR (a CSR result; torch refuses CSC, BSR, BSC and batched CSR), ``+`` of two CSR matrices
(torch's CSC, BSR, BSC, batched, hybrid and empty sums fail or are wrong) and ``csr/csc + dense``
(dense), the zero-preserving
unary functions on all four (same layout), indexing (``csr[i]`` a COO vector, ``hybrid.select`` of
a dense dim CSR, ``batched[b]`` CSR/BSR, ``select_copy`` of a BSR a COO vector of every element of
the stored blocks), and rebuilding with new values (with_values). The other ops (retain, concat,
to_indicator, fill_empty_rows, reorder, coalesce, div) have no torch answer on these layouts
(torch.cat, division and coalesce refuse them): they are held to our COO answer in
``tests/test_ops_layouts.py``.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from _oracle import from_torch, run, torch
from helpers import assert_eq
from strategies import random_values

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
LAYOUTS = ("csr", "csc", "bsr", "bsc")
NUMBERS = ("int32", "int64", "float32", "float64", "complex64")


@st.composite
def torch_sparse(draw, layouts=LAYOUTS, dtypes=NUMBERS, batch=True, dense=True, shape=None, blocksize=None):
    """(torch tensor, ours): a random dense tensor (about half zeros) made sparse by torch."""
    layout = draw(st.sampled_from(layouts))
    if shape is None:
        block = (draw(st.integers(1, 2)), draw(st.integers(1, 2))) if layout in ("bsr", "bsc") else (1, 1)
        rows, cols = block[0] * draw(st.integers(0, 3)), block[1] * draw(st.integers(0, 3))
        batch_shape = (draw(st.integers(1, 2)),) if batch and draw(st.booleans()) else ()
        dense_dims = (draw(st.integers(1, 2)),) if dense and draw(st.booleans()) else ()
        shape = (*batch_shape, rows, cols, *dense_dims)
        n_batch, n_dense = len(batch_shape), len(dense_dims)
    else:
        shape, n_batch, n_dense, block = shape
    dtype = draw(st.sampled_from(dtypes))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    base = random_values(rng, shape, dtype)
    if n_batch:  # every batch one sparsity pattern (torch needs equal nse), values differ
        pattern = rng.integers(0, 2, size=shape[n_batch:]).astype(bool)
        base = base * pattern
        base = np.where(base == 0, np.ones((), base.dtype), base) * pattern
    else:
        base = base * rng.integers(0, 2, size=shape).astype(base.dtype)
    dense_t = torch().from_numpy(np.ascontiguousarray(base))
    b = blocksize or block
    t = {"csr": lambda: dense_t.to_sparse_csr(dense_dim=n_dense),
         "csc": lambda: dense_t.to_sparse_csc(dense_dim=n_dense),
         "bsr": lambda: dense_t.to_sparse_bsr(b, dense_dim=n_dense),
         "bsc": lambda: dense_t.to_sparse_bsc(b, dense_dim=n_dense)}[layout]()
    return t, from_torch(t), (shape, n_batch, n_dense, b)


@SETTINGS
@given(x=torch_sparse(dtypes=NUMBERS + ("bool", "int8", "float16")))
def test_to_dense(x):
    t, ours, _ = x
    assert_eq(run("to_dense", sp_input=ours), t.to_dense().numpy())


@SETTINGS
@given(x=torch_sparse(layouts=("csr",), batch=False), seed=st.integers(0, 99))
def test_csr_times_dense(x, seed):
    t, ours, (shape, *_rest) = x
    dense = random_values(np.random.default_rng(seed), shape, ours.dtype)
    want = t * torch().from_numpy(dense)
    assert_eq(run("mul", sp_input=ours, dense=dense), want)


@st.composite
def torch_pairs(draw, layouts=LAYOUTS, dense=True, batch=True):
    t1, o1, spec = draw(torch_sparse(layouts=layouts, dtypes=("float64",), dense=dense, batch=batch))
    layout = o1.layout
    t2, o2, _ = draw(torch_sparse(layouts=(layout,), dtypes=("float64",), shape=spec))
    if spec[1]:  # batched: torch needs one nse in every batch of the sum too; same pattern
        ci, pi, _ = _parts(t1)
        t2 = torch().sparse_compressed_tensor(ci, pi, _parts(t1, o1.values.shape)[2], size=t1.shape,
                                              layout=t1.layout)
        o2 = from_torch(t2)
    return (t1, o1), (t2, o2)


def _parts(t, values_shape=None):
    if t.layout in (torch().sparse_csr, torch().sparse_bsr):
        ci, pi = t.crow_indices(), t.col_indices()
    else:
        ci, pi = t.ccol_indices(), t.row_indices()
    values = t.values()
    if values_shape is not None:
        values = torch().from_numpy(np.arange(1, 1 + int(np.prod(values_shape)), dtype=np.float64)
                                    .reshape(values_shape))
    return ci, pi, values


@SETTINGS
@given(pair=torch_pairs(layouts=("csr",), dense=False, batch=False))
def test_same_layout_sum(pair):
    assume(0 not in pair[0][0].shape)
    # torch's sum of CSC, BSR and BSC tensors fails or answers wrongly in 2.13 (CSC: "expected sparse
    # row compressed tensor layout"; BSR through MKL: errors for non-square blocks and a wrong shape
    # for batched ones); its batched CSR sum of two different patterns keeps the first batch's
    # values only, its hybrid one drops the dense dimension, and an empty matrix raises: a plain
    # non-empty CSR matrix is what torch answers.
    (t1, o1), (t2, o2) = pair
    assert_eq(run("add", a=o1, b=o2), t1 + t2)


@SETTINGS
@given(x=torch_sparse(layouts=("csr", "csc"), dense=False), seed=st.integers(0, 99), swap=st.booleans())
def test_compressed_plus_dense(x, seed, swap):
    t, ours, (shape, *_rest) = x
    dense = random_values(np.random.default_rng(seed), shape, ours.dtype)
    want = (t + torch().from_numpy(dense)).numpy()
    got = run("add", a=dense, b=ours) if swap else run("add", a=ours, b=dense)
    assert_eq(got, want)


@SETTINGS
@given(x=torch_sparse(dtypes=("float32", "float64")), fn=st.sampled_from(["neg", "abs", "sin", "sqrt", "sign",
                                                                          "tanh", "expm1", "trunc", "asinh"]))
def test_zero_preserving_functions(x, fn):
    t, ours, _ = x
    want = getattr(torch(), fn)(t)
    got = run("map_values", sp_input=ours, fn=fn)
    assert_eq(got, from_torch(want), rtol=1e-5, atol=1e-6)


@SETTINGS
@given(x=torch_sparse(), seed=st.integers(0, 99))
def test_with_values_as_torch_rebuilds(x, seed):
    t, ours, _ = x
    new = random_values(np.random.default_rng(seed), ours.values.shape, "float64")
    ci, pi, _ = _parts(t)
    want = torch().sparse_compressed_tensor(ci, pi, torch().from_numpy(new), size=t.shape, layout=t.layout)
    assert_eq(run("with_values", sp_input=ours, new_values=new), want)


@SETTINGS
@given(x=torch_sparse(layouts=("csr", "csc"), batch=False), data=st.data())
def test_index_a_sparse_dim(x, data):
    t, ours, (shape, _, n_dense, _) = x
    dim = data.draw(st.integers(0, 1))
    assume(shape[dim] > 0)
    i = data.draw(st.integers(0, shape[dim] - 1))
    want = torch().select_copy(t, dim, i)  # torch: a sparse COO tensor (t[i] for CSR rows)
    got = run("select", sp_input=ours, index=[i] if dim == 0 else [[None, None, None], i])
    assert got.layout == "coo"
    assert_eq(got, from_torch(want.coalesce()))


@SETTINGS
@given(x=torch_sparse(layouts=("csr",), batch=False, dense=True), data=st.data())
def test_select_a_dense_dim_keeps_csr(x, data):
    t, ours, (shape, _, n_dense, _) = x
    assume(n_dense)
    k = data.draw(st.integers(0, shape[2] - 1))
    want = t.select(2, k)
    assert_eq(run("select", sp_input=ours, index=[[None, None, None], [None, None, None], k]), want)


@SETTINGS
@given(x=torch_sparse(layouts=("csr", "bsr"), batch=True, dense=False), data=st.data())
def test_index_a_batch_keeps_layout(x, data):
    t, ours, (shape, n_batch, _, _) = x
    assume(n_batch)
    b = data.draw(st.integers(0, shape[0] - 1))
    assert_eq(run("select", sp_input=ours, index=[b]), t[b])


@SETTINGS
@given(x=torch_sparse(layouts=("bsr",), batch=False, dense=False), data=st.data())
def test_select_copy_of_bsr(x, data):
    t, ours, (shape, *_rest) = x
    assume(0 not in shape)
    dim = data.draw(st.integers(0, 1))
    i = data.draw(st.integers(0, shape[dim] - 1))
    want = torch().select_copy(t, dim, i)  # every element of the stored blocks, zeros included
    index = [i] if dim == 0 else [[None, None, None], i]
    got = run("select", sp_input=ours, index=index)
    w = want.coalesce()
    assert_eq(got, from_torch(w))
