"""with_values, retain, mul, div, add and map_values held to TensorFlow 2.21 and PyTorch 2.13
running the same inputs.

add is TensorFlow's SparseAdd kernel exactly: sparse + sparse merges the operands in one pass as
given (unsorted operands and repeated indices are not sorted or summed first), and ``thresh``
applies only to sums of an entry of each operand (kept when thresh <= |sum|, so a NaN sum is
dropped even at threshold 0); an entry of one operand alone is kept whatever its magnitude.
Compared exactly: indices, their order, dtypes, values (allclose for floats). sparse + dense
(SparseTensorDenseAdd) gives the dense sum, repeated indices summed. Every dtype TensorFlow's
kernels take is drawn; TensorFlow's SparseAdd has no bool, unsigned or float16 kernel.

retain, with_values, mul, div and map_values are held to TensorFlow too; map_values to PyTorch
(every function, every dtype torch takes for it, hybrid values, every declared layout). On CSR,
CSC, BSR and BSC tensors torch itself makes: ``*`` by a dense tensor of the same shape on CSR (a
CSR result; torch refuses CSC, BSR, BSC and batched CSR), ``+`` of two CSR matrices (torch's CSC,
BSR, BSC, batched, hybrid and empty sums fail or are wrong) and ``csr/csc + dense`` (dense), the
zero-preserving unary functions on all four (same layout), and rebuilding with new values
(with_values). retain and div have no torch answer on those layouts (torch's division refuses
them): they are held to our COO answer in tests/ops/test_ops_elementwise.py.

Deliberate differences (named where they are tested):
- Dtypes TensorFlow's kernel lacks (mul/div of complex, map_values' analytic functions of
  integers, ...) are ours alone: only the dtypes TensorFlow takes are compared.
"""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from _oracle import (COMPRESSED_SETTINGS, LAYOUTS, REAL, TF_DTYPES, TF_SETTINGS, TORCH_DTYPES, check, declared_layouts,
                     from_tf, from_torch, in_layout, ours_refuse, run, tf, tf_call, to_tf, to_torch, tol, torch,
                     torch_sparse)
from helpers import assert_eq
from strategies import coo_tensors, random_values
from sparseserve import SparseTensor
from sparseserve.errors import InvalidArgumentError, UnimplementedError


# ========================================================================= add
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# The dtypes of TensorFlow's CPU SparseAdd kernel (tf.sparse.add refuses the others).
SPARSE_ADD_DTYPES = ("int8", "int16", "int32", "int64", "float32", "float64", "complex64", "complex128")
# SparseTensorDenseAdd's (sparse + dense).
DENSE_ADD_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                    "float32", "float64", "complex64", "complex128")


def tf_threshold(threshold: float, dtype):
    """tf.sparse.add's thresh in the values' real dtype (an integral one for integer values)."""
    real = np.dtype(dtype).type(0).real.dtype
    return np.asarray(threshold).astype(real)[()]


@st.composite
def sparse_pairs(draw, dtypes=SPARSE_ADD_DTYPES):
    """Two COO tensors of one shape and dtype: sorted or not, with repeats or not (each drawn),
    sharing some indices so that sums and their thresholds are exercised."""
    a = draw(coo_tensors(dtypes, hybrid=False, max_rank=3))
    dtype = a.dtype.name
    b = draw(coo_tensors((dtype,), hybrid=False, shape=tuple(a.dense_shape),
                         duplicates=draw(st.booleans()), unsorted=draw(st.booleans())))
    if a.nnz and b.nnz and draw(st.booleans()):  # b takes some of a's indices
        k = draw(st.integers(1, min(a.nnz, b.nnz)))
        indices = b.indices.copy()
        indices[:k] = a.indices[:k]
        if draw(st.booleans()):  # keep the pair sorted where both were
            order = np.lexsort(indices.T[::-1])
            indices, values = indices[order], b.values[order]
        else:
            values = b.values
        b = SparseTensor(indices=indices, values=values, dense_shape=b.dense_shape)
    if draw(st.booleans()) and a.nnz and b.nnz and dtype[0] in "fc":  # cancellation and NaN sums
        values = b.values.copy()
        same = [j for j in range(b.nnz) if j < a.nnz and (b.indices[j] == a.indices[j]).all()]
        for j in same[:1]:
            values[j] = -a.values[j]
        if dtype[0] == "f" and len(same) > 1:
            values[same[1]] = np.nan
        b = SparseTensor(indices=b.indices, values=values, dense_shape=b.dense_shape)
    return a, b


@SETTINGS
@given(ab=sparse_pairs(), threshold=st.sampled_from([0.0, 0.0, 1.0, 2.0, 2.5, 6.0]))
def test_sparse_sparse_matches_tf(ab, threshold):
    a, b = ab
    if a.dtype.kind in "iu" and threshold != int(threshold):
        threshold = float(int(threshold))  # TensorFlow takes an integral thresh for integer values
    want = from_tf(tf().sparse.add(to_tf(a), to_tf(b), tf_threshold(threshold, a.dtype)))
    got = run("add", a=a, b=b, threshold=threshold)
    assert_eq(got, want)
    # The order of the operands matters only for unsorted ones, as in TensorFlow.
    want_ba = from_tf(tf().sparse.add(to_tf(b), to_tf(a), tf_threshold(threshold, a.dtype)))
    assert_eq(run("add", a=b, b=a, threshold=threshold), want_ba)


@SETTINGS
@given(t=coo_tensors(DENSE_ADD_DTYPES, hybrid=False, max_rank=3), seed=st.integers(0, 99),
       swap=st.booleans())
def test_sparse_dense_matches_tf(t, seed, swap):
    dense = random_values(np.random.default_rng(seed), t.dense_shape, t.dtype)
    want = tf().sparse.add(dense, to_tf(t)) if swap else tf().sparse.add(to_tf(t), dense)
    got = run("add", a=dense, b=t) if swap else run("add", a=t, b=dense)
    assert_eq(got, np.asarray(want))


def test_tf_examples_written_out():
    """The cases the kernel's rule decides, each checked against TensorFlow as well."""
    cases = [
        # (a indices, a values, b indices, b values, shape, threshold)
        ([[0], [2]], [0.1, 5.0], [[2]], [1.0], [4], 0.5),         # a small entry alone is kept
        ([[1], [1]], [1.0, 2.0], [[1]], [10.0], [4], 0.0),        # a repeat pairs once
        ([[1], [1]], [1.0, 2.0], [[1]], [-1.0], [4], 0.5),        # the cancelled pair dropped
        ([[3], [1]], [1.0, 2.0], [[1], [2]], [10.0, 20.0], [4], 0.0),  # unsorted: merged as given
        ([[1]], [np.nan], [[1]], [1.0], [4], 0.0),                # a NaN sum dropped at 0
        ([[1]], [np.nan], [[2]], [1.0], [4], 0.5),                # a NaN alone kept
        ([[1]], [1.0], [[1]], [-1.0], [4], 0.0),                  # 0 kept at threshold 0
    ]
    for ai, av, bi, bv, shape, threshold in cases:
        a = SparseTensor(indices=ai, values=np.array(av), dense_shape=shape)
        b = SparseTensor(indices=bi, values=np.array(bv), dense_shape=shape)
        want = from_tf(tf().sparse.add(to_tf(a), to_tf(b), threshold))
        assert_eq(run("add", a=a, b=b, threshold=threshold), want)


# ======================================================================= retain
@TF_SETTINGS
@given(st.data(), coo_tensors(hybrid=False))
def test_retain(data, t):
    keep = np.array(data.draw(st.lists(st.booleans(), min_size=t.nnz, max_size=t.nnz)), bool)
    want = tf().sparse.retain(to_tf(t), keep)
    assert_eq(run("retain", sp_input=t, to_retain=keep), want)


def test_retain_and_with_values_refuse_what_tensorflow_refuses():
    t = SparseTensor(indices=[[0, 1], [1, 0]], values=np.array([1.0, 2.0], np.float32), dense_shape=[2, 2])
    for name, kwargs, theirs in [
            ("retain", dict(to_retain=np.array([True])), lambda: tf().sparse.retain(to_tf(t), [True])),
            ("with_values", dict(new_values=np.array([1.0], np.float32)),
             lambda: to_tf(t).with_values(np.array([1.0], np.float32)))]:
        _, err = tf_call(theirs)
        assert err is not None
        ours_refuse(name, sp_input=t, **kwargs)


# ================================================================== with_values
@TF_SETTINGS
@given(st.data(), coo_tensors(hybrid=False))
def test_with_values(data, t):
    dtype = data.draw(st.sampled_from(TF_DTYPES))
    new = random_values(np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))), (t.nnz,), dtype)
    want = to_tf(t).with_values(tf().constant(new))
    assert_eq(run("with_values", sp_input=t, new_values=new), want)


# ===================================================================== mul, div
@st.composite
def cwise_args(draw, divide: bool):
    t = draw(coo_tensors(REAL, hybrid=False))
    shape = t.dense_shape
    k = draw(st.integers(0, len(shape)))  # the dense operand: a suffix of the shape, some dims 1
    dshape = tuple(1 if draw(st.booleans()) else d for d in shape[len(shape) - k:])
    if draw(st.integers(0, 6)) == 0:  # a dense side that would enlarge the result: refused
        dshape = (*dshape[:-1], 2 if not dshape or dshape[-1] != 2 else 3) if dshape else (2, 2)
        if len(dshape) > len(shape):
            dshape = (2,) + tuple(shape)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dense = np.asarray(random_values(rng, dshape, t.dtype))
    if divide and dense.size and draw(st.integers(0, 3)):  # mostly no zero divisor
        dense[dense == 0] = 1
    elif t.dtype.kind == "f" and dense.size and draw(st.booleans()):
        special = np.array([np.nan, np.inf, -np.inf, -0.0], t.dtype)
        pick = rng.random(dshape) < 0.3
        dense[pick] = special[rng.integers(0, 4, int(pick.sum()))]
    return t, dense


def _cwise_tf(op, t, dense):
    want = getattr(tf().raw_ops, op)(sp_indices=np.asarray(t.indices, np.int64).reshape(t.nnz, t.ndim),
                                     sp_values=tf().constant(np.asarray(t.values)),
                                     sp_shape=np.asarray(t.dense_shape, np.int64), dense=tf().constant(dense))
    return SparseTensor(indices=t.indices, values=want.numpy(), dense_shape=t.dense_shape)


@TF_SETTINGS
@given(cwise_args(divide=False))
def test_mul(args):
    t, dense = args
    check("mul", dict(sp_input=t, dense=dense), lambda: _cwise_tf("SparseDenseCwiseMul", t, dense),
          lambda got, want: assert_eq(got, want, **tol(t.dtype)))


@TF_SETTINGS
@given(cwise_args(divide=True))
def test_div(args):
    """Integers truncate toward zero; a zero divisor at a stored entry (any dtype, -0.0 too) is
    refused, as TensorFlow's SparseDenseCwiseDiv refuses it."""
    t, dense = args
    check("div", dict(sp_input=t, dense=dense), lambda: _cwise_tf("SparseDenseCwiseDiv", t, dense),
          lambda got, want: assert_eq(got, want, **tol(t.dtype)))


def test_div_zero_divisor_refused_like_tensorflow():
    t = SparseTensor(indices=[[0, 0], [1, 2]], values=np.array([1.0, -2.0], np.float32), dense_shape=[2, 3])
    for dense in (np.array([[-0.0, 1, 1], [1, 1, 1]], np.float32), np.float32(0.0), np.array([0.0, 1, 3], np.float32)):
        _, err = tf_call(lambda dense=dense: _cwise_tf("SparseDenseCwiseDiv", t, np.asarray(dense)))
        assert err is not None
        assert ours_refuse("div", sp_input=t, dense=np.asarray(dense)).reason == "DIVISION_BY_ZERO"
    # a zero divisor where sp_input stores nothing is fine
    dense = np.array([[2.0, 0, 0], [0, 0, 4]], np.float32)
    assert_eq(run("div", sp_input=t, dense=dense), _cwise_tf("SparseDenseCwiseDiv", t, dense))


# =================================================================== map_values
def _tnp(name):
    """A tf.experimental.numpy function of real floats (tnp takes other dtypes only with numpy
    behaviour switched on for the whole process)."""
    def fn(x):
        if not x.dtype.is_floating:
            raise TypeError(f"tnp.{name} of {x.dtype.name} is not compared")
        return getattr(tf().experimental.numpy, name)(x)
    return fn


def _angle(factor):
    """tnp.deg2rad / rad2deg (x * factor) of real floats; tnp's own need numpy behaviour switched
    on for the whole process, and angles of other dtypes are not compared."""
    def fn(x):
        if not x.dtype.is_floating:
            raise TypeError(f"angles of {x.dtype.name} are not compared")
        return x * tf().constant(factor, x.dtype)
    return fn


MAP_TF = {
    "neg": lambda x: tf().math.negative(x), "abs": lambda x: tf().math.abs(x),
    "sign": lambda x: tf().math.sign(x), "square": lambda x: tf().math.square(x),
    "conj": lambda x: tf().math.conj(x), "ceil": lambda x: tf().math.ceil(x),
    "floor": lambda x: tf().math.floor(x), "round": lambda x: tf().math.round(x),
    "trunc": _tnp("fix"), "sqrt": lambda x: tf().math.sqrt(x), "sin": lambda x: tf().math.sin(x),
    "tan": lambda x: tf().math.tan(x), "tanh": lambda x: tf().math.tanh(x),
    "asin": lambda x: tf().math.asin(x), "atan": lambda x: tf().math.atan(x),
    "sinh": lambda x: tf().math.sinh(x), "asinh": lambda x: tf().math.asinh(x),
    "atanh": lambda x: tf().math.atanh(x), "expm1": lambda x: tf().math.expm1(x),
    "log1p": lambda x: tf().math.log1p(x), "deg2rad": _angle(np.pi / 180), "rad2deg": _angle(180 / np.pi),
}


@TF_SETTINGS
@given(st.sampled_from(sorted(MAP_TF)), coo_tensors(hybrid=False))
def test_map_values(fn, t):
    """tf.sparse.map_values with the matching tf.math function, where TensorFlow takes the dtype."""
    try:
        want = tf().sparse.map_values(MAP_TF[fn], to_tf(t))
    except (tf().errors.NotFoundError, tf().errors.InvalidArgumentError, TypeError, ValueError):
        return  # a dtype TensorFlow's function lacks: ours may take it
    assert_eq(run("map_values", sp_input=t, fn=fn), want, **tol(t.dtype))


# ================================================== map_values against PyTorch
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


def with_specials(t: SparseTensor, rng) -> SparseTensor:
    """t with some values replaced by nan, +-inf, -0.0 and numbers past erfinv's domain."""
    if t.dtype.kind not in "fc" or t.nnz == 0:
        return t
    values = np.array(t.values, copy=True).reshape(-1)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.25, -0.75, 1.0, -1.0, 2.5])
    pick = rng.random(values.size) < 0.4
    values[pick] = rng.choice(specials, int(pick.sum())).astype(values.dtype)
    return SparseTensor(indices=t.indices, values=values.reshape(t.values.shape), dense_shape=t.dense_shape)


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


# ======================================================= CSR, CSC, BSR and BSC
@COMPRESSED_SETTINGS
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


@COMPRESSED_SETTINGS
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


@COMPRESSED_SETTINGS
@given(x=torch_sparse(layouts=("csr", "csc"), dense=False), seed=st.integers(0, 99), swap=st.booleans())
def test_compressed_plus_dense(x, seed, swap):
    t, ours, (shape, *_rest) = x
    dense = random_values(np.random.default_rng(seed), shape, ours.dtype)
    want = (t + torch().from_numpy(dense)).numpy()
    got = run("add", a=dense, b=ours) if swap else run("add", a=ours, b=dense)
    assert_eq(got, want)


@COMPRESSED_SETTINGS
@given(x=torch_sparse(dtypes=("float32", "float64")), fn=st.sampled_from(["neg", "abs", "sin", "sqrt", "sign",
                                                                          "tanh", "expm1", "trunc", "asinh"]))
def test_zero_preserving_functions(x, fn):
    t, ours, _ = x
    want = getattr(torch(), fn)(t)
    got = run("map_values", sp_input=ours, fn=fn)
    assert_eq(got, from_torch(want), rtol=1e-5, atol=1e-6)


@COMPRESSED_SETTINGS
@given(x=torch_sparse(), seed=st.integers(0, 99))
def test_with_values_as_torch_rebuilds(x, seed):
    t, ours, _ = x
    new = random_values(np.random.default_rng(seed), ours.values.shape, "float64")
    ci, pi, _ = _parts(t)
    want = torch().sparse_compressed_tensor(ci, pi, torch().from_numpy(new), size=t.shape, layout=t.layout)
    assert_eq(run("with_values", sp_input=ours, new_values=new), want)


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
