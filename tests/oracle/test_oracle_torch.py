"""Differential tests against PyTorch: the ops whose names come from torch, or that torch has too.

map_values (every function, every dtype torch takes for it, hybrid values), convert (to_sparse,
to_sparse_csr/csc/bsr/bsc with dense_dim), select, sampled_addmm, softmax and log_softmax,
matmul sparse @ sparse, coalesce, transpose of compressed layouts. The layouts each op is tested in
come from its declaration (REGISTRY), so layouts added later are covered where torch takes them.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _oracle import TORCH_DTYPES, from_torch, in_layout, run, tf, to_tf, to_torch, torch
from helpers import assert_eq
from strategies import coo_tensors, random_values
from sparseserve import SparseTensor
from sparseserve.errors import InvalidArgumentError, UnimplementedError

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
COMPRESSED = ("csr", "csc", "bsr", "bsc")

warnings.filterwarnings("ignore", message=".*[Ss]parse.*")  # torch's beta-layout warnings


def declared_layouts(op: str, arg: str) -> tuple[str, ...]:
    from sparseserve.server.ops import REGISTRY

    return tuple(REGISTRY.get(op).args_by_name[arg].layouts)


def coalesced(t: SparseTensor) -> SparseTensor:
    return run("coalesce", sp_input=t)


def with_specials(t: SparseTensor, rng) -> SparseTensor:
    """t with some values replaced by nan, +-inf, -0.0 and numbers past erfinv's domain."""
    if t.dtype.kind not in "fc" or t.nnz == 0:
        return t
    values = np.array(t.values, copy=True).reshape(-1)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.25, -0.75, 1.0, -1.0, 2.5])
    pick = rng.random(values.size) < 0.4
    values[pick] = rng.choice(specials, int(pick.sum())).astype(values.dtype)
    return SparseTensor(indices=t.indices, values=values.reshape(t.values.shape), dense_shape=t.dense_shape)


# ================================================================== map_values
# Each of our functions and the torch function it is held to (pow gets its exponent).
TORCH_FN = {
    "neg": "neg", "abs": "abs", "sign": "sign", "square": "square", "conj": "conj_physical",
    "conj_physical": "conj_physical", "ceil": "ceil", "floor": "floor", "round": "round", "trunc": "trunc",
    "sqrt": "sqrt", "sin": "sin", "tan": "tan", "tanh": "tanh", "asin": "asin", "atan": "atan",
    "sinh": "sinh", "asinh": "asinh", "atanh": "atanh", "expm1": "expm1", "log1p": "log1p",
    "deg2rad": "deg2rad", "rad2deg": "rad2deg", "erf": "erf", "erfinv": "erfinv", "angle": "angle",
    "sgn": "sgn", "signbit": "signbit", "isnan": "isnan", "isinf": "isinf", "isposinf": "isposinf",
    "isneginf": "isneginf", "frac": "frac", "relu": "relu", "positive": "positive",
    "nan_to_num": "nan_to_num", "pow": "pow", "negative": "negative", "absolute": "absolute",
    "arcsin": "arcsin", "fix": "fix",
}
# (fn, dtype kind) where torch refuses and we define the obvious answer (documented in map_values):
# the identity on bools, z/|z| for complex sign (numpy 2, TensorFlow), 0 as an integer's frac.
EXTENSIONS = {("abs", "b"), ("absolute", "b"), ("square", "b"), ("ceil", "b"), ("floor", "b"), ("round", "b"),
              ("trunc", "b"), ("fix", "b"), ("relu", "b"), ("positive", "b"), ("sign", "c"),
              ("frac", "i"), ("frac", "u")}
# Where torch and TensorFlow disagree and map_values (a TensorFlow name) follows TensorFlow's function.
TF_SIDE = {"sign"}  # tf.math.sign(nan) = nan; torch.sign(nan) = 0


def torch_values(fn: str, values: np.ndarray, exponent=None) -> np.ndarray:
    """torch's fn on a sparse tensor holding ``values`` as its entries, in order: a COO tensor
    whose one sparse dimension numbers the entries (coalesced as it is, so torch's coalescing
    keeps the order), or for angle, which torch refuses on COO, the CSR tensor of one column."""
    T = torch()
    v = T.from_numpy(np.ascontiguousarray(values))
    n = values.shape[0]
    if fn == "angle":
        t = T.sparse_csr_tensor(T.arange(n + 1), T.zeros(n, dtype=T.int64), v, (n, 1, *values.shape[1:]))
    else:
        t = T.sparse_coo_tensor(T.arange(n)[None], v, (n, *values.shape[1:])).coalesce()
    f = getattr(T, TORCH_FN[fn])
    out = f(t, exponent) if fn == "pow" else f(t)
    return out.values().numpy()


def map_case(fn: str, t: SparseTensor, exponent=None):
    """Our map_values against torch's function on the same values: the same answer where torch
    has one; where torch refuses the dtype, ours refuses too unless it is a listed extension."""
    kind = t.dtype.kind
    kwargs = {"exponent": exponent} if fn == "pow" else {}
    try:
        want = torch_values(fn, t.values, exponent)
    except (RuntimeError, TypeError, NotImplementedError):
        want = None
    if want is None:
        if (fn, kind) in EXTENSIONS or (fn == "pow" and (kind == "b" or kind in "iu")):
            run("map_values", sp_input=t, fn=fn, **kwargs)  # defined here, torch has none
        else:
            with pytest.raises(UnimplementedError) as info:
                run("map_values", sp_input=t, fn=fn, **kwargs)
            assert info.value.reason == "UNSUPPORTED_DTYPE"
        return
    got = run("map_values", sp_input=t, fn=fn, **kwargs)
    if fn in TF_SIDE and kind == "f":
        want = np.where(np.isnan(t.values), t.values, want)
    assert got.layout == t.layout and tuple(got.dense_shape) == tuple(t.dense_shape)
    np.testing.assert_array_equal(got.indices, t.indices)
    tol = 1e-2 if t.dtype == np.float16 or want.dtype == np.float16 else 1e-5
    assert_eq(got.values, want, rtol=tol, atol=tol, what=f"map_values({fn}) of {t.dtype}")


@pytest.mark.parametrize("fn", sorted(TORCH_FN))
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(t=coo_tensors(TORCH_DTYPES, max_rank=4), seed=st.integers(0, 2**32 - 1))
def test_map_values_matches_torch(fn, t, seed):
    t = with_specials(t, np.random.default_rng(seed))
    if fn == "pow":
        for exponent in (1.0, 2.0, 3.0, 0.5, 2.5):
            map_case(fn, t, exponent)
    else:
        map_case(fn, t)


def test_map_values_every_dtype_torch_takes():
    """One fixed tensor per dtype (hybrid, with specials) through every function."""
    rng = np.random.default_rng(5)
    for dtype in TORCH_DTYPES:
        values = random_values(rng, (6, 2), dtype)
        t = with_specials(SparseTensor(indices=[[0, 1], [1, 0], [1, 2], [2, 2], [3, 0], [3, 1]], values=values,
                                       dense_shape=[4, 3, 2]), rng)
        for fn in sorted(TORCH_FN):
            if fn == "pow":
                for exponent in (2.0, 0.5, 3.0):
                    map_case(fn, t, exponent)
            else:
                map_case(fn, t)


def test_map_values_in_declared_layouts():
    """Every layout map_values is declared for: torch's function on the same tensor in that layout
    where torch takes it, the values carrier otherwise; structure unchanged."""
    base = SparseTensor(indices=[[0, 0], [0, 3], [1, 1], [3, 2], [3, 3]],
                        values=np.array([-1.5, 0.5, 2.0, -0.25, 0.75]), dense_shape=[4, 4])
    for layout in declared_layouts("map_values", "sp_input"):
        t = in_layout(base, layout, blocksize=[2, 2] if layout in ("bsr", "bsc") else None)
        for fn in ("abs", "neg", "sqrt", "sgn", "signbit", "isnan", "erf", "angle", "frac", "relu"):
            got = run("map_values", sp_input=t, fn=fn)
            assert got.layout == t.layout
            try:
                want = from_torch(getattr(torch(), TORCH_FN[fn])(to_torch(t)))
            except (RuntimeError, NotImplementedError):
                want = None
            if want is not None and want.layout == t.layout:
                assert_eq(got, want, what=f"{fn} {layout}")
            else:
                np.testing.assert_allclose(got.values, torch_values(fn, np.asarray(t.values)), equal_nan=True)
        got = run("map_values", sp_input=t, fn="pow", exponent=2.0)
        np.testing.assert_allclose(got.values, torch_values("pow", np.asarray(t.values), 2.0))


def test_map_values_pow_exponent_rules():
    t = SparseTensor(indices=[[0], [2]], values=np.array([3, -7], np.int8), dense_shape=[3])
    for bad in (0.0, -1.0, float("nan"), -np.inf):
        with pytest.raises(InvalidArgumentError) as info:
            run("map_values", sp_input=t, fn="pow", exponent=bad)
        assert "exponent" in info.value.message
    with pytest.raises(InvalidArgumentError) as info:
        run("map_values", sp_input=t, fn="pow")
    assert "exponent" in info.value.message
    with pytest.raises(InvalidArgumentError) as info:
        run("map_values", sp_input=t, fn="abs", exponent=2.0)
    assert "exponent" in info.value.message
    # torch: pow(sparse, 0) is refused as densifying
    with pytest.raises(RuntimeError):
        torch().pow(to_torch(t), 0)
    # integer exponents wrap as torch's; huge ones too (odd ** 2**70 = 1 modulo 2**8)
    # (torch casts the exponent to the values' dtype: int8 takes up to 127)
    t64 = SparseTensor(indices=[[0], [1], [2]], values=np.array([3, 6, -7], np.int64), dense_shape=[3])
    for x, exponents in ((t, (1, 2, 5, 7, 64, 65, 127)), (t64, (63, 64, 65, 2**40 + 3, 2**52 + 1))):
        for e in exponents:
            got = run("map_values", sp_input=x, fn="pow", exponent=float(e))
            want = torch().pow(to_torch(x), e).coalesce().values().numpy()
            assert_eq(got.values, want, what=f"pow {e}")
    got = run("map_values", sp_input=t, fn="pow", exponent=2.5)
    assert got.values.dtype == np.float32  # as torch's int ** float on a dense tensor
    np.testing.assert_allclose(got.values, (torch().from_numpy(t.values) ** 2.5).numpy(), equal_nan=True)


# ================================================================== convert
def nonzero_values(rng, shape, dtype):
    v = random_values(rng, shape, dtype)
    if np.dtype(dtype) == np.bool_:
        return np.ones(shape, bool)
    return np.where(v == 0, np.ones((), dtype), v).astype(dtype)


@st.composite
def convertible(draw):
    """A coalesced COO tensor with nonzero values: batch dims 0-1, sparse 2, dense 0-1."""
    batch = draw(st.integers(0, 1))
    dense = draw(st.integers(0, 1))
    shape = [draw(st.integers(1, 3)) for _ in range(batch)] + \
        [draw(st.sampled_from([2, 4, 6])) for _ in range(2)] + [draw(st.integers(1, 3)) for _ in range(dense)]
    dtype = draw(st.sampled_from(("float32", "float64", "int32", "int64", "complex64", "bool", "float16")))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    s = batch + 2
    full = rng.random(shape[:s]) < draw(st.sampled_from([0.2, 0.5, 0.9]))
    if batch:  # torch needs one nse per batch: the same pattern in each
        full[:] = full[:1]
    idx = np.argwhere(full).astype(np.int64)
    values = nonzero_values(rng, (idx.shape[0], *shape[s:]), dtype)
    return SparseTensor(indices=idx, values=values, dense_shape=shape), batch, dense


def torch_convert(x, layout, blocksize, dense_dim):
    if layout == "coo":
        return x.to_sparse() if x.layout != torch().strided else x.to_sparse(x.ndim - (dense_dim or 0))
    if layout == "csr":
        return x.to_sparse_csr(dense_dim)
    if layout == "csc":
        return x.to_sparse_csc(dense_dim)
    if layout == "bsr":
        return x.to_sparse_bsr(blocksize, dense_dim)
    return x.to_sparse_bsc(blocksize, dense_dim)


@SETTINGS
@given(case=convertible(), data=st.data())
def test_convert_matches_torch(case, data):
    t, batch, dense = case
    layouts = declared_layouts("convert", "sp_input")
    src = data.draw(st.sampled_from([lay for lay in layouts if lay == "coo" or batch == 0 or lay in COMPRESSED]))
    bs = data.draw(st.sampled_from([(1, 1), (2, 2), (2, 1)]))
    if src in ("bsr", "bsc"):
        t_in = run("convert", sp_input=t, layout=src, blocksize=list(bs))
    else:
        t_in = in_layout(t, src)
    compared = 0
    for target in ("coo", "csr", "csc", "bsr", "bsc"):
        blocksize = bs if target in ("bsr", "bsc") else None
        # dense_dim: the input's (None), or one given, which may move dimensions between the
        # sparse and the dense side
        dense_dim = data.draw(st.sampled_from([None, 0, 1]))
        target_dense = dense if dense_dim is None else dense_dim
        try:
            got = run("convert", sp_input=t_in, layout=target,
                      blocksize=None if blocksize is None else list(blocksize), dense_dim=dense_dim)
        except InvalidArgumentError as exc:
            if src not in ("bsr", "bsc") and exc.reason in ("BATCH_NSE_MISMATCH", "BLOCKSIZE"):
                # torch refuses the same tensor too
                dense_t = to_torch(np.asarray(run("to_dense", sp_input=t)))
                with pytest.raises(RuntimeError):
                    torch_convert(dense_t, target, blocksize, target_dense)
            continue
        if src not in ("bsr", "bsc"):
            # torch from the dense tensor: every layout, batches and dense dims included
            dense_t = to_torch(np.asarray(run("to_dense", sp_input=t)))
            want = from_torch(torch_convert(dense_t, target, blocksize, target_dense))
            if target != "coo":
                want = _index_dtype_like(want, got)
            assert_eq(got, want, what=f"{src}->{target} dense_dim={dense_dim} (through dense)")
            compared += 1
        if dense_dim is not None and dense_dim != t_in.dense_ndim:
            continue  # torch changes dense_dim only from a strided tensor
        # torch from the sparse tensor itself, where torch converts that pair
        try:
            want = from_torch(torch_convert(to_torch(t_in), target, blocksize, dense_dim))
        except (RuntimeError, NotImplementedError, TypeError):
            continue
        if target == "coo":
            want = from_torch(to_torch(want).coalesce())
        assert_eq(got, want, what=f"{src}->{target} (torch from {src})")
        compared += 1
    assert compared >= (0 if src in ("bsr", "bsc") else 1)


def _index_dtype_like(want: SparseTensor, got: SparseTensor) -> SparseTensor:
    """torch's dense -> compressed gives int64 indices; ours keeps a compressed input's int32."""
    assert np.dtype(want.compressed_indices.dtype) == np.int64
    if got.compressed_indices.dtype == want.compressed_indices.dtype:
        return want
    return SparseTensor(layout=want.layout,
                        compressed_indices=want.compressed_indices.astype(got.compressed_indices.dtype),
                        plain_indices=want.plain_indices.astype(got.plain_indices.dtype), values=want.values,
                        dense_shape=want.dense_shape, blocksize=want.blocksize)


def test_convert_index_dtypes_follow_torch():
    """int32 compressed indices stay int32 through torch's conversions, as ours."""
    T = torch()
    x = T.tensor([[1.0, 0, 2, 0], [0, 0, 3, 4], [5, 0, 0, 0], [0, 6, 0, 7]])
    csr32 = T.sparse_csr_tensor(x.to_sparse_csr().crow_indices().int(), x.to_sparse_csr().col_indices().int(),
                                x.to_sparse_csr().values(), x.shape)
    ours = from_torch(csr32)
    assert ours.compressed_indices.dtype == np.int32
    for target, conv in (("csc", lambda a: a.to_sparse_csc()), ("bsr", lambda a: a.to_sparse_bsr((2, 2))),
                         ("coo", lambda a: a.to_sparse())):
        try:
            want = from_torch(conv(csr32))
        except RuntimeError:
            continue
        got = run("convert", sp_input=ours, layout=target, blocksize=[2, 2] if target == "bsr" else None)
        assert_eq(got, want, what=f"csr(int32) -> {target}")


# ================================================================== coalesce
@SETTINGS
@given(t=coo_tensors(TORCH_DTYPES, max_rank=4))
def test_coalesce_matches_torch(t):
    got = run("coalesce", sp_input=t)
    want = from_torch(to_torch(t).coalesce())
    assert got.coalesced
    assert_eq(got, want, rtol=1e-3 if t.dtype == np.float16 else 1e-6)


# ================================================================== select
@SETTINGS
@given(t=coo_tensors(TORCH_DTYPES, min_rank=2, max_rank=4, min_dim=1), data=st.data())
def test_select_matches_torch(t, data):
    dim = data.draw(st.integers(0, t.ndim - 1))
    i = data.draw(st.integers(-t.dense_shape[dim], t.dense_shape[dim] - 1))
    index = [[None, None, None]] * dim + [i]
    got = run("select", sp_input=t, index=index)
    want_t = to_torch(t).select(dim, i)
    if isinstance(got, SparseTensor):
        want = from_torch(want_t)
        if want.layout == "coo":
            # torch's select keeps the surviving entries in their order, as ours
            assert_eq(got, want, what=f"select dim {dim} index {i}")
        else:
            assert_eq(run("to_dense", sp_input=got, validate_indices=False), want_t.to_dense().numpy())
    else:
        dense_want = want_t.to_dense().numpy() if want_t.layout != torch().strided else want_t.numpy()
        assert_eq(got, dense_want, what=f"select dim {dim} index {i} (dense)")


@SETTINGS
@given(t=coo_tensors(TORCH_DTYPES, min_rank=1, max_rank=3, min_dim=1, hybrid=False), data=st.data())
def test_select_slices_match_torch_narrow(t, data):
    dim = data.draw(st.integers(0, t.ndim - 1))
    n = t.dense_shape[dim]
    start = data.draw(st.integers(0, n - 1))
    length = data.draw(st.integers(0, n - start))
    index = [[None, None, None]] * dim + [[start, start + length, 1]]
    got = run("select", sp_input=t, index=index)
    want = to_torch(t).narrow_copy(dim, start, length)
    assert_eq(run("to_dense", sp_input=got, validate_indices=False),
                      want.to_dense().numpy(), rtol=1e-3, atol=1e-3)
    want = from_torch(want)
    np.testing.assert_array_equal(np.sort(got.indices, axis=0), np.sort(want.indices, axis=0))


# ================================================================== sampled_addmm
@SETTINGS
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


# ================================================================== softmax, log_softmax
@SETTINGS
@given(t=coo_tensors(("float32", "float64"), min_rank=1, max_rank=4, duplicates=False), data=st.data())
def test_log_softmax_and_softmax_match_torch(t, data):
    dim = data.draw(st.integers(-t.ndim, t.ndim - 1))
    for name, fn in (("log_softmax", torch().sparse.log_softmax), ("softmax", torch().sparse.softmax)):
        got = run(name, sp_input=t, axis=dim)
        want_t = fn(to_torch(t).coalesce(), dim)
        if t.values.size == 0 and t.nnz:
            # entries of zero elements (a dense dimension of size 0): torch drops them, ours keeps
            # the input's sparsity; both hold no number
            assert got.nnz == t.nnz and want_t._nnz() == 0
            continue
        assert_eq(got, from_torch(want_t), rtol=1e-5, atol=1e-5, what=f"{name} dim {dim}")


def test_softmax_last_axis_matches_tf_too():
    """tf.sparse.softmax (last axis, rank >= 2) agrees with torch there: unstored entries are -inf."""
    rng = np.random.default_rng(8)
    idx = np.argwhere(rng.random((3, 4, 5)) < 0.5)
    t = SparseTensor(indices=idx, values=random_values(rng, (idx.shape[0],), "float64"), dense_shape=[3, 4, 5])
    got = run("softmax", sp_input=t, axis=-1)
    want = tf().sparse.softmax(to_tf(t))
    np.testing.assert_allclose(got.values, want.values.numpy(), rtol=1e-6)


def test_softmax_in_declared_layouts():
    rng = np.random.default_rng(9)
    dense = np.where(rng.random((4, 6)) < 0.5, random_values(rng, (4, 6), "float64"), 0)
    x = SparseTensor.from_dense(dense)
    for layout in declared_layouts("log_softmax", "sp_input"):
        x_in = in_layout(x, layout, blocksize=[2, 2] if layout in ("bsr", "bsc") else None)
        got = run("log_softmax", sp_input=x_in, axis=1)
        # the stored positions of x_in (a block's zeros are stored entries) as torch's COO input
        want = from_torch(torch().sparse.log_softmax(to_torch(run("convert", sp_input=x_in, layout="coo")), 1))
        try:
            want_l = from_torch(torch().sparse.log_softmax(to_torch(x_in), 1))
        except (RuntimeError, NotImplementedError):
            want_l = None
        if want_l is not None and want_l.layout == got.layout:
            assert_eq(got, want_l, what=f"log_softmax {layout}")
        got_coo = run("convert", sp_input=got, layout="coo")
        want_d = run("to_dense", sp_input=want)
        got_d = run("to_dense", sp_input=got_coo)
        assert_eq(got_d, want_d, what=f"log_softmax {layout} (dense)")


# ================================================================== matmul sparse @ sparse
@SETTINGS
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


# ================================================================== transpose of compressed layouts
@pytest.mark.parametrize("layout", COMPRESSED)
def test_transpose_compressed_matches_torch(layout):
    if layout not in declared_layouts("transpose", "sp_input"):
        pytest.fail(f"transpose does not declare {layout}")  # its doc says it takes them
    rng = np.random.default_rng(10)
    for shape, dense_dim in (((4, 6), 0), ((4, 6, 2), 1), ((2, 4, 6), 0)):
        p = len(shape) - dense_dim
        mask = rng.random(shape[p - 2:p] + (1,) * dense_dim) < 0.5  # the same in each batch: one nse
        dense = np.where(mask, nonzero_values(rng, shape, "float64"), 0)
        x = to_torch(dense)
        bs = (2, 2) if layout in ("bsr", "bsc") else None
        tx = torch_convert(x, layout, bs, dense_dim)
        ours = from_torch(tx)
        nb = len(shape) - dense_dim - 2
        d0, d1 = nb, nb + 1
        perm = list(range(len(shape)))
        perm[d0], perm[d1] = d1, d0
        got = run("transpose", sp_input=ours, perm=perm)
        if dense_dim:  # torch: "transpose(): hybrid sparse compressed tensors ... are not supported"
            with pytest.raises(RuntimeError):
                tx.transpose(d0, d1)
            assert got.layout == {"csr": "csc", "csc": "csr", "bsr": "bsc", "bsc": "bsr"}[layout]
            assert_eq(run("to_dense", sp_input=run("convert", sp_input=got, layout="coo")),
                              np.ascontiguousarray(np.swapaxes(dense, d0, d1)))
            continue
        want = from_torch(tx.transpose(d0, d1))
        assert_eq(got, want, what=f"transpose {layout} {shape}")


# ================================================================== over the wires
def test_torch_ops_over_the_wires(client):
    T = torch()
    t = SparseTensor(indices=[[0, 1], [2, 0], [1, 1], [0, 1]], values=np.array([-1.5, np.nan, 0.25, 2.0]),
                     dense_shape=[3, 2])
    for fn in ("sgn", "signbit", "isnan", "erf", "angle", "frac", "sqrt"):
        got = client.map_values(t, fn)
        np.testing.assert_allclose(got.values, torch_values(fn, t.values), equal_nan=True)
        assert got.values.dtype == torch_values(fn, t.values).dtype
    got = client.map_values(t, "pow", exponent=3)
    np.testing.assert_allclose(got.values, torch_values("pow", t.values, 3), equal_nan=True)
    with pytest.raises(InvalidArgumentError) as info:
        client.map_values(t, "pow", exponent=-2)
    assert "exponent" in info.value.message
    ints = SparseTensor(indices=[[0], [1]], values=np.array([3, -4], np.int32), dense_shape=[2])
    got = client.map_values(ints, "sqrt")
    assert got.values.dtype == np.float32
    got = client.coalesce(t)
    want = from_torch(to_torch(t).coalesce())
    assert_eq(got, want)
    csr = client.convert(SparseTensor(indices=[[0, 1], [1, 0]], values=np.array([1.0, 2.0]), dense_shape=[2, 2]),
                         "csr")
    want = from_torch(T.tensor([[0.0, 1.0], [2.0, 0.0]], dtype=T.float64).to_sparse_csr())
    assert_eq(csr, want)
    sm = client.log_softmax(SparseTensor(indices=[[0, 0], [0, 1]], values=np.array([1.0, 2.0]), dense_shape=[2, 2]),
                            axis=1)
    want = T.sparse.log_softmax(T.sparse_coo_tensor([[0, 0], [0, 1]], [1.0, 2.0], (2, 2)), 1).coalesce()
    np.testing.assert_allclose(sm.values, want.values().numpy())
