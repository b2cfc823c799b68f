"""Our ops held to TensorFlow 2.21 running the same inputs.

Each test draws inputs with hypothesis (ranks 1-5, every dtype TensorFlow's kernel takes for the op,
empty tensors, repeated and unsorted indices where TensorFlow's op takes them), runs TensorFlow's op
and ours, and compares exactly: indices, their order, shapes and dtypes; values allclose for floats.
Where TensorFlow refuses an input (InvalidArgumentError, or the ValueError of its Python checks) we
must refuse it with INVALID_ARGUMENT rather than return something.

Deliberate differences (named where they are tested):
- to_dense / sparse_to_dense without validate_indices: the contract says repeated indices are summed (as
  torch's to_dense); TensorFlow's kernel keeps the last one written. Held to torch's to_dense and
  to TensorFlow's own unsorted_segment_sum of the repeats.
- Rank-0 results (reduce over every axis with output_is_sparse and no keepdims): TensorFlow makes a
  rank-0 SparseTensor, a COO tensor here has rank >= 1: we refuse it (INVALID_ARGUMENT).
- Inputs TensorFlow accepts but answers with an invalid tensor, garbage or an order-dependent
  result (slice with a negative size; transpose with perm [0, 0];
  fill_empty_rows with an empty second dimension; maximum or softmax of unsorted input; NaN in
  reduce_max, where TensorFlow's answer depends on the entry order and ours is NaN): we refuse them
  or answer consistently, and they are not compared here.
- softmax follows torch where the two differ (see its doc); only canonical input is compared.
- TensorFlow's Reorder (behind concat) is std::sort, unstable past 16 entries: concat's values at
  one repeated index are compared as a multiset. Ours is stable.
- Dtypes TensorFlow's kernel lacks (mul/div of complex, map_values' analytic functions of integers,
  ...) are ours alone: only the dtypes TensorFlow takes are compared. tf.sparse.to_indicator casts
  any values to int64; ours takes integer ids only (UNIMPLEMENTED otherwise), so integers are drawn.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _oracle import TF_DTYPES, from_tf, run, tf, to_tf, torch
from helpers import assert_eq
from strategies import coo_tensors, random_values
from sparseserve import SparseTensor
from sparseserve.errors import InvalidArgumentError

SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
FLOATS = ("float16", "float32", "float64")
COMPLEX = ("complex64", "complex128")
REAL = INTS + FLOATS  # TensorFlow's REAL_NUMBER_TYPES: mul, div, reduce_max, maximum, minimum
NUMBER = REAL + COMPLEX  # reduce_sum
MATMUL = ("int32", "float16", "float32", "float64", "complex64", "complex128")  # sparse_dense_matmul


def tol(dtype) -> dict:
    return {"rtol": 2e-3, "atol": 2e-3} if np.dtype(dtype) in (np.float16, np.complex64) else \
        {"rtol": 1e-5, "atol": 1e-6}


def tf_call(fn):
    """TensorFlow's answer, or the error it refuses the input with (None, error)."""
    try:
        return fn(), None
    except (tf().errors.InvalidArgumentError, ValueError) as exc:
        return None, exc


def ours_refuse(name: str, **kwargs) -> InvalidArgumentError:
    with pytest.raises(InvalidArgumentError) as info:
        run(name, **kwargs)
    return info.value


def check(name: str, kwargs: dict, theirs, compare) -> None:
    """TensorFlow's result compared with ours, or both refusing the input."""
    want, err = tf_call(theirs)
    if err is not None:
        ours_refuse(name, **kwargs)
        return
    compare(run(name, **kwargs), want)


def same_sparse_up_to_ties(got, want, **kw):
    """As assert_eq, but the values at one repeated index may come in any order: TensorFlow's
    Reorder is std::sort, stable only up to 16 entries (its insertion-sort cut-off)."""
    want = from_tf(want)
    assert_eq(SparseTensor(indices=got.indices, values=_tie_sorted(got), dense_shape=got.dense_shape),
                SparseTensor(indices=want.indices, values=_tie_sorted(want), dense_shape=want.dense_shape), **kw)


def _tie_sorted(t: SparseTensor) -> np.ndarray:
    """The values with each run of equal indices sorted by their bytes."""
    values = np.array(t.values)
    idx = np.asarray(t.indices).reshape(t.nnz, -1) if t.nnz else np.zeros((0, 1))
    i = 0
    while i < t.nnz:
        j = i + 1
        while j < t.nnz and (idx[j] == idx[i]).all():
            j += 1
        values[i:j] = sorted(values[i:j], key=lambda v: np.asarray(v).tobytes())
        i = j
    return values


@st.composite
def scalars(draw, dtype):
    """A small scalar of ``dtype`` (what default_value arguments take)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return random_values(rng, (), dtype)[()]


@st.composite
def shapes(draw, min_rank=1, max_rank=5, min_dim=0, max_dim=4):
    rank = draw(st.integers(min_rank, max_rank))
    return tuple(draw(st.lists(st.integers(min_dim, max_dim if rank < 5 else 3), min_size=rank, max_size=rank)))


def tf_scalar(value, dtype):
    return tf().constant(np.asarray(value, dtype=dtype))


def sorted_unique(**kw):
    return coo_tensors(hybrid=False, duplicates=False, unsorted=False, **kw)


# ====================================================================== reorder
@SETTINGS
@given(coo_tensors(hybrid=False))
def test_reorder(t):
    want = tf().sparse.reorder(to_tf(t))
    assert_eq(run("reorder", sp_input=t), want)


# ===================================================================== to_dense
@SETTINGS
@given(st.data(), coo_tensors(hybrid=False))
def test_to_dense_validated(data, t):
    """validate_indices=True: TensorFlow refuses unsorted or repeated indices; so must we."""
    default = data.draw(scalars(t.dtype))
    check("to_dense", dict(sp_input=t, default_value=default, validate_indices=True),
          lambda: tf().sparse.to_dense(to_tf(t), default_value=tf_scalar(default, t.dtype),
                                       validate_indices=True),
          assert_eq)


@SETTINGS
@given(st.data(), coo_tensors(hybrid=False, duplicates=False))
def test_to_dense_unvalidated_unsorted(data, t):
    default = data.draw(scalars(t.dtype))
    want = tf().sparse.to_dense(to_tf(t), default_value=tf_scalar(default, t.dtype), validate_indices=False)
    assert_eq(run("to_dense", sp_input=t, default_value=default, validate_indices=False), want)


TORCH_SUMS = ("int8", "int16", "int32", "int64", "uint8", "float32", "float64", "complex64", "complex128")


@SETTINGS
@given(coo_tensors(TORCH_SUMS, hybrid=False))
def test_to_dense_unvalidated_repeats_are_summed_as_torch(t):
    """The contract: without validate_indices repeated indices are summed (torch's to_dense); TensorFlow's
    kernel keeps the last value written instead, so here torch is the oracle."""
    want = to_torch_coo(t).to_dense().numpy()
    assert_eq(run("to_dense", sp_input=t, validate_indices=False), want)


def to_torch_coo(t: SparseTensor):
    return torch().sparse_coo_tensor(torch().from_numpy(np.asarray(t.indices).T.copy()),
                                     torch().from_numpy(np.asarray(t.values).copy()), tuple(t.dense_shape),
                                     check_invariants=True)


# ============================================================== sparse_to_dense
@st.composite
def sparse_to_dense_args(draw):
    """(sparse_indices, output_shape, sparse_values, default_value, validate_indices), in each of
    the index forms: 0-D (one index into a 1-D output), 1-D, 2-D [N, rank]; values a scalar or a
    vector; now and then an index out of range."""
    form = draw(st.sampled_from(["0d", "1d", "2d"]))
    if form == "2d":
        shape = draw(shapes(min_dim=1))
    else:
        shape = (draw(st.integers(1, 6)),)
    dtype = np.dtype(draw(st.sampled_from(TF_DTYPES)))
    index_dtype = draw(st.sampled_from([np.int32, np.int64]))
    n = 1 if form == "0d" else draw(st.integers(0, 8))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    idx = np.stack([rng.integers(0, d, n) for d in shape], axis=1) if n else np.zeros((0, len(shape)), np.int64)
    if n and draw(st.booleans()):
        idx = idx[np.lexsort(idx.T[::-1])]
    if n and draw(st.integers(0, 5)) == 0:
        idx[rng.integers(0, n), rng.integers(0, len(shape))] = draw(st.sampled_from([-1, 7]))
    idx = idx.astype(index_dtype)
    idx = np.asarray(idx[0, 0]) if form == "0d" else idx[:, 0] if form == "1d" else idx
    values = np.asarray(random_values(rng, (), dtype) if draw(st.booleans()) else random_values(rng, (n,), dtype))
    default = random_values(rng, (), dtype)[()]
    return idx, list(shape), values, default, draw(st.booleans())


@SETTINGS
@given(sparse_to_dense_args())
def test_sparse_to_dense(args):
    idx, shape, values, default, validate = args
    flat = np.asarray(idx).reshape(-1, len(shape)) if np.ndim(idx) else np.asarray(idx).reshape(1, 1)
    if not validate and len(np.unique(flat, axis=0)) < len(flat):
        return _repeats_summed(args)
    check("sparse_to_dense", dict(sparse_indices=idx, output_shape=shape, sparse_values=values,
                                  default_value=default, validate_indices=validate),
          lambda: tf().raw_ops.SparseToDense(sparse_indices=idx, output_shape=np.asarray(shape, idx.dtype),
                                             sparse_values=values, default_value=default,
                                             validate_indices=validate),
          assert_eq)


def test_sparse_to_dense_repeats_are_summed():
    _repeats_summed((np.array([[2, 1], [0, 0], [2, 1]]), [3, 2], np.array([1.5, 2.0, 4.0]), 0.0, False))


def _repeats_summed(args):
    """Repeated indices without validate_indices add up, as to_dense's do (the contract; TensorFlow's
    kernel keeps the last). Checked against TensorFlow's own sum of the repeats (segment_sum)."""
    idx, shape, values, default, _ = args
    if np.asarray(values).dtype == np.bool_:
        return
    flat = np.asarray(idx).reshape(-1, len(shape)) if np.ndim(idx) else np.asarray(idx).reshape(1, 1)
    if ((flat < 0) | (flat >= np.asarray(shape))).any():
        ours_refuse("sparse_to_dense", sparse_indices=idx, output_shape=shape, sparse_values=values,
                    default_value=default, validate_indices=False)
        return
    keys = np.ravel_multi_index(flat.T, shape)
    vals = np.broadcast_to(values, (len(flat),))
    summed = tf().math.unsorted_segment_sum(vals, keys, int(np.prod(shape))).numpy()
    hit = np.zeros(int(np.prod(shape)), bool)
    hit[keys] = True
    want = np.where(hit, summed, np.asarray(default, vals.dtype)).reshape(shape)
    got = run("sparse_to_dense", sparse_indices=idx, output_shape=shape, sparse_values=values,
              default_value=default, validate_indices=False)
    assert_eq(got, want.astype(vals.dtype))


# =================================================================== from_dense
@st.composite
def dense_arrays(draw, dtypes=TF_DTYPES):
    shape = draw(shapes())
    dtype = np.dtype(draw(st.sampled_from(dtypes)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    a = random_values(rng, shape, dtype)
    a[rng.random(shape) < 0.5] = 0  # mostly zeros
    if dtype.kind in "fc" and a.size:
        special = np.array([np.nan, np.inf, -np.inf, -0.0], dtype)
        pick = rng.random(shape) < 0.15
        a[pick] = special[rng.integers(0, 4, int(pick.sum()))]
    return a


@SETTINGS
@given(dense_arrays())
def test_from_dense(a):
    """Every non-zero element kept (nan and inf too; -0.0 is zero), row-major."""
    want = tf().sparse.from_dense(tf().constant(a))
    assert_eq(run("from_dense", tensor=a), want)


# ================================================================= to_indicator
@st.composite
def id_tensors(draw):
    t = draw(coo_tensors(INTS, hybrid=False))
    vocab = draw(st.integers(0, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ids = rng.integers(0, max(vocab, 1), t.nnz)
    if t.nnz and draw(st.integers(0, 4)) == 0:  # an id out of range: TensorFlow refuses it
        ids[rng.integers(0, t.nnz)] = draw(st.sampled_from([-1, vocab, vocab + 3]))
    if t.dtype.kind == "u":
        ids = np.abs(ids) + (ids < 0) * vocab  # unsigned: out of range only above
    values = ids.astype(t.dtype)
    return SparseTensor(indices=t.indices, values=values, dense_shape=t.dense_shape), vocab


@SETTINGS
@given(id_tensors())
def test_to_indicator(arg):
    t, vocab = arg
    check("to_indicator", dict(sp_input=t, vocab_size=vocab),
          lambda: tf().sparse.to_indicator(to_tf(t), vocab), assert_eq)


# ======================================================================= concat
@st.composite
def concat_args(draw):
    base = draw(shapes(max_dim=3))
    rank = len(base)
    axis = draw(st.integers(-rank, rank - 1))
    expand = draw(st.booleans())
    dtype = draw(st.sampled_from(TF_DTYPES))
    mismatch = draw(st.integers(0, 5)) == 0  # other dims differ without expand: refused
    inputs = []
    for _ in range(draw(st.integers(1, 3))):
        shape = list(base)
        shape[axis] = draw(st.integers(0, 3))
        if expand or mismatch:
            for d in range(rank):
                if d != axis % rank and draw(st.booleans()):
                    shape[d] = draw(st.integers(0, 3))
        inputs.append(draw(coo_tensors((dtype,), hybrid=False, shape=tuple(shape))))
    return axis, inputs, expand


@SETTINGS
@given(concat_args())
def test_concat(args):
    axis, inputs, expand = args
    check("concat", dict(axis=axis, sp_inputs=inputs, expand_nonconcat_dims=expand),
          lambda: tf().sparse.concat(axis, [to_tf(t) for t in inputs], expand_nonconcat_dims=expand),
          same_sparse_up_to_ties)


# ======================================================================= retain
@SETTINGS
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


# ============================================================== fill_empty_rows
@st.composite
def fill_inputs(draw):
    shape = draw(shapes(min_dim=1))
    shape = (draw(st.integers(0, 4)), *shape[1:])  # no row, or rows; an index [row, 0, ...] exists
    return draw(coo_tensors(hybrid=False, shape=shape))


@SETTINGS
@given(st.data(), fill_inputs())
def test_fill_empty_rows(data, t):
    default = data.draw(scalars(t.dtype))
    out, empty = tf().sparse.fill_empty_rows(to_tf(t), tf_scalar(default, t.dtype))
    got, got_empty = run("fill_empty_rows", sp_input=t, default_value=default)
    assert_eq(got, out, what="output")
    assert_eq(got_empty, empty, what="empty_row_indicator")


# ================================================================== with_values
@SETTINGS
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


@SETTINGS
@given(cwise_args(divide=False))
def test_mul(args):
    t, dense = args
    check("mul", dict(sp_input=t, dense=dense), lambda: _cwise_tf("SparseDenseCwiseMul", t, dense),
          lambda got, want: assert_eq(got, want, **tol(t.dtype)))


@SETTINGS
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


@SETTINGS
@given(st.sampled_from(sorted(MAP_TF)), coo_tensors(hybrid=False))
def test_map_values(fn, t):
    """tf.sparse.map_values with the matching tf.math function, where TensorFlow takes the dtype."""
    try:
        want = tf().sparse.map_values(MAP_TF[fn], to_tf(t))
    except (tf().errors.NotFoundError, tf().errors.InvalidArgumentError, TypeError, ValueError):
        return  # a dtype TensorFlow's function lacks: ours may take it
    assert_eq(run("map_values", sp_input=t, fn=fn), want, **tol(t.dtype))


# ============================================================ reduce_sum / _max
@st.composite
def reduce_args(draw, dtypes):
    t = draw(coo_tensors(dtypes, hybrid=False))
    rank = t.ndim
    kind = draw(st.sampled_from(["none", "int", "list"]))
    if kind == "none":
        axis = None
    elif kind == "int":
        axis = draw(st.integers(-rank, rank - 1))
    else:
        axis = draw(st.lists(st.integers(-rank, rank - 1), max_size=rank + 1))
    return t, axis, draw(st.booleans()), draw(st.booleans())


def _every_axis(axis, rank: int) -> bool:
    if axis is None:
        return True
    axes = [axis] if isinstance(axis, int) else axis
    return {a % rank for a in axes} == set(range(rank))


def _reduce(op, t, axis, keepdims, sparse_out):
    fn = getattr(tf().sparse, op)
    kwargs = dict(sp_input=t, axis=axis, keepdims=keepdims, output_is_sparse=sparse_out)
    if sparse_out and not keepdims and _every_axis(axis, t.ndim):
        # TensorFlow answers with a rank-0 SparseTensor; a COO tensor has rank >= 1 here.
        assert fn(to_tf(t), axis=axis, output_is_sparse=True).dense_shape.shape[0] == 0
        ours_refuse(op, **kwargs)
        return
    compare = (lambda got, want: assert_eq(got, want, **tol(t.dtype))) if sparse_out else \
        (lambda got, want: assert_eq(got, want, **tol(t.dtype)))
    check(op, kwargs, lambda: fn(to_tf(t), axis=axis, keepdims=keepdims, output_is_sparse=sparse_out), compare)


@SETTINGS
@given(reduce_args(NUMBER))
def test_reduce_sum(args):
    _reduce("reduce_sum", *args)


@SETTINGS
@given(reduce_args(REAL))
def test_reduce_max(args):
    _reduce("reduce_max", *args)


# ====================================================================== softmax
@SETTINGS
@given(sorted_unique(dtypes=FLOATS, min_rank=2))
def test_softmax(t):
    """tf.sparse.softmax (the innermost dimension) of a tensor in canonical order, which is what
    TensorFlow's op requires; torch.sparse.softmax agrees on it."""
    want = tf().sparse.softmax(to_tf(t))
    assert_eq(run("softmax", sp_input=t), want, **tol(t.dtype))
    assert_eq(run("softmax", sp_input=t, axis=t.ndim - 1), want, **tol(t.dtype))


# ============================================================ maximum, minimum
@st.composite
def operand_pairs(draw):
    shape = draw(shapes())
    dtype = draw(st.sampled_from(REAL))
    a = draw(sorted_unique(dtypes=(dtype,), shape=shape))
    if draw(st.integers(0, 6)) == 0:  # shapes that differ: refused
        shape = (*shape[:-1], shape[-1] + 1)
    b = draw(sorted_unique(dtypes=(dtype,), shape=shape))
    return a, b


@SETTINGS
@given(operand_pairs(), st.sampled_from(["maximum", "minimum"]))
def test_maximum_minimum(pair, op):
    a, b = pair
    check(op, dict(sp_a=a, sp_b=b), lambda: getattr(tf().sparse, op)(to_tf(a), to_tf(b)), assert_eq)


# ==================================================================== transpose
@SETTINGS
@given(st.data(), coo_tensors(hybrid=False))
def test_transpose(data, t):
    perm = data.draw(st.none() | st.permutations(list(range(t.ndim))))
    want = tf().sparse.transpose(to_tf(t), perm)
    assert_eq(run("transpose", sp_input=t, perm=perm), want)


# ====================================================================== reshape
@st.composite
def reshape_args(draw):
    t = draw(coo_tensors(hybrid=False))
    size = math.prod(t.dense_shape)
    rank = draw(st.integers(1, 5))
    left, new = size, []
    for _ in range(rank - 1):
        if left == 0:
            d = draw(st.integers(0, 3))
        else:
            d = draw(st.sampled_from([k for k in range(1, left + 1) if left % k == 0]))
        new.append(d)
        left = left // d if d else left
    new.append(left if 0 not in new else draw(st.integers(0, 3)))
    if draw(st.booleans()):
        new[draw(st.integers(0, rank - 1))] = -1
    if draw(st.integers(0, 6)) == 0:
        new[draw(st.integers(0, rank - 1))] += 1  # a size that no longer matches: refused
    return t, new


@SETTINGS
@given(reshape_args())
def test_reshape(args):
    t, shape = args
    check("reshape", dict(sp_input=t, shape=shape), lambda: tf().sparse.reshape(to_tf(t), shape), assert_eq)


# ======================================================================== slice
@SETTINGS
@given(st.data(), coo_tensors(hybrid=False))
def test_slice(data, t):
    start = [data.draw(st.integers(0, d + 1)) for d in t.dense_shape]
    size = [data.draw(st.integers(0, d + 1)) for d in t.dense_shape]
    within = [d for d in range(t.ndim) if start[d] < t.dense_shape[d]]
    if within and data.draw(st.integers(0, 6)) == 0:
        # A negative size is refused by both (TensorFlow checks it only where start is inside
        # the dimension: past it TensorFlow returns an empty slice; we refuse it everywhere).
        size[data.draw(st.sampled_from(within))] = -1
    check("slice", dict(sp_input=t, start=start, size=size),
          lambda: tf().sparse.slice(to_tf(t), start, size), assert_eq)


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


@SETTINGS
@given(matmul_args())
def test_matmul_sparse_dense(args):
    a, b, adjoint_a, adjoint_b = args
    check("matmul", dict(a=a, b=b, adjoint_a=adjoint_a, adjoint_b=adjoint_b),
          lambda: tf().sparse.sparse_dense_matmul(to_tf(a), tf().constant(b), adjoint_a=adjoint_a,
                                                  adjoint_b=adjoint_b),
          lambda got, want: assert_eq(got, want, **tol(a.dtype)))


# ================================================================== the wires
WIRE_T = SparseTensor(indices=[[3, 1], [0, 2], [3, 0], [0, 2], [1, 1]],
                      values=np.array([1.5, -2.0, 4.0, 0.5, -1.0], np.float32), dense_shape=[5, 3])


def test_wires_match_tensorflow(client):
    t = WIRE_T
    assert_eq(client.reorder(t), tf().sparse.reorder(to_tf(t)))
    out, empty = client.fill_empty_rows(t, -7.0)
    want, want_empty = tf().sparse.fill_empty_rows(to_tf(t), np.float32(-7.0))
    assert_eq(out, want)
    assert_eq(empty, want_empty)
    s = tf().sparse.reorder(to_tf(t))
    assert_eq(client.reduce_sum(t, axis=-1), tf().sparse.reduce_sum(s, axis=-1))
    assert_eq(client.reduce_max(t, axis=[0], keepdims=True, output_is_sparse=True),
                tf().sparse.reduce_max(s, axis=[0], keepdims=True, output_is_sparse=True))
    assert_eq(client.transpose(t, perm=[1, 0]), tf().sparse.transpose(to_tf(t), [1, 0]))
    assert_eq(client.slice(t, start=[0, 1], size=[4, 5]), tf().sparse.slice(to_tf(t), [0, 1], [4, 5]))
    dense = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert_eq(client.matmul(t, dense), tf().sparse.sparse_dense_matmul(to_tf(t), dense))
    with pytest.raises(InvalidArgumentError):  # TensorFlow refuses the unsorted input too
        client.to_dense(t)
    with pytest.raises(tf().errors.InvalidArgumentError):
        tf().sparse.to_dense(to_tf(t))
    coalesced = client.coalesce(t)
    assert_eq(client.to_dense(coalesced, default_value=9.0),
               tf().sparse.to_dense(to_tf(coalesced), default_value=9.0))
