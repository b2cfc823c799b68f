"""Element-wise ops: with_values, retain, mul, div, add, map_values.

The seed documents' worked examples as written, hypothesis properties against
plain numpy references (random shapes of rank 1 to 5, hybrid values, every
dtype, duplicates, unsorted and empty inputs), the error cases (class and
reason), and every op over every wire. The last section: each op on CSR, CSC,
BSR and BSC against its answer on the tensor's COO view (``_compressed.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparseserve import InvalidArgumentError, SparseTensor, UnimplementedError
from sparseserve.core.dtypes import DTYPE_NAMES
from conftest import op_raises, run_op
from helpers import assert_eq
from strategies import compressed_tensors, coo_tensors, layout_specs, random_values
from _compressed import DTYPES, assert_same_or_error, back, canonical, coo_view

NUMBER_DTYPES = [d for d in DTYPE_NAMES if d != "bool"]
SETTINGS = settings(max_examples=60, deadline=None)
# float16 values of several steps round in the last bits; the others to 1e-6.
RTOL = {"float16": 2e-3, "float32": 1e-6, "float64": 1e-6, "complex64": 1e-6, "complex128": 1e-6}


run, raises = run_op, op_raises


@st.composite
def broadcastable(draw, shape, dtypes=DTYPE_NAMES, nonzero=False):
    """A dense array whose shape broadcasts to ``shape``: leading dims dropped, some set to 1."""
    drop = draw(st.integers(0, len(shape)))
    # A 1 never stands for an empty dimension: TensorFlow's SparseDenseCwise ops refuse that.
    dims = [1 if draw(st.booleans()) and draw(st.booleans()) and d != 0 else d for d in shape[drop:]]
    dtype = np.dtype(draw(st.sampled_from(dtypes)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    out = random_values(rng, dims, dtype)
    if nonzero:  # a zero divisor at a stored entry is refused for every dtype
        out = np.asarray(np.where(out == 0, np.ones((), dtype), out), dtype=dtype)
    return out


def reference_dense(t: SparseTensor, dtype=None) -> np.ndarray:
    dtype = np.dtype(dtype or t.dtype)
    out = np.zeros(t.dense_shape, dtype=dtype)
    for i in range(t.nnz):
        key = tuple(t.indices[i])
        v = t.values[i].astype(dtype)
        out[key] = (out[key] | v) if dtype == np.bool_ else out[key] + v
    return out


# ================================================================ seed examples
def test_seed_with_values_example():
    # st = tf.sparse.from_dense([[1, 0, 2, 0], [3, 0, 0, 4]]); to_dense(st.with_values([10, 20, 30, 40]))
    st_ = run("from_dense", tensor=np.array([[1, 0, 2, 0], [3, 0, 0, 4]], np.int32))
    out = run("with_values", sp_input=st_, new_values=np.array([10, 20, 30, 40], np.int32))
    dense = run("to_dense", sp_input=out)
    assert dense.dtype == np.int32
    np.testing.assert_array_equal(dense, [[10, 0, 20, 0], [30, 0, 0, 40]])


def test_seed_retain_example():
    # shape [4, 5], [0, 1]: a, [0, 3]: b, [2, 0]: c, [3, 1]: d; to_retain = [True, False, False, True]
    st_ = SparseTensor(indices=[[0, 1], [0, 3], [2, 0], [3, 1]], values=np.array([1.0, 2, 3, 4]),
                       dense_shape=[4, 5])
    out = run("retain", sp_input=st_, to_retain=np.array([True, False, False, True]))
    assert out.indices.tolist() == [[0, 1], [3, 1]] and out.values.tolist() == [1.0, 4.0]
    assert tuple(out.dense_shape) == (4, 5)


def test_seed_mul_implicit_zeros_stay_zero_against_inf():
    # "The output locations corresponding to the implicitly zero elements in the sparse tensor will be
    # zero (i.e., will not take up storage space), regardless of the contents of the dense tensor
    # (even if it's +/-INF and that INF*0 == NaN)."
    st_ = SparseTensor(indices=[[0, 0], [1, 1]], values=np.array([2.0, -3.0]), dense_shape=[2, 2])
    dense = np.array([[np.inf, np.inf], [np.nan, -np.inf]])
    out = run("mul", sp_input=st_, dense=dense)
    assert out.indices.tolist() == [[0, 0], [1, 1]] and out.values.tolist() == [np.inf, np.inf]
    np.testing.assert_array_equal(run("to_dense", sp_input=out), [[np.inf, 0], [0, np.inf]])


def test_seed_mul_div_broadcast_dense_side_only():
    # "this Op only broadcasts the dense side to the sparse side, but not the other direction"
    st_ = SparseTensor(indices=[[0, 1], [2, 0]], values=np.array([4.0, 9.0]), dense_shape=[3, 2])
    assert run("mul", sp_input=st_, dense=np.array([10.0, 100.0])).values.tolist() == [400.0, 90.0]
    assert run("div", sp_input=st_, dense=np.array([[2.0], [1.0], [3.0]])).values.tolist() == [2.0, 3.0]
    raises(InvalidArgumentError, "SHAPE_MISMATCH", "mul", sp_input=st_, dense=np.ones((2, 3, 2)))
    assert run("mul", sp_input=st_, dense=2.0).values.tolist() == [8.0, 18.0]  # a 0-D dense


def test_tf_add_threshold_example():
    # tf.sparse.add's docstring: the logical sum [[2], [.1, 0], [6, -.2]] (5 pairs): threshold 0
    # keeps all 5, 0.11 drops .1 and 0, 0.21 drops .1, 0 and -.2.
    a = SparseTensor(indices=[[0, 0], [1, 0], [1, 1], [2, 0], [2, 1]],
                     values=np.array([1.0, 0.05, 1.0, 6.0, -0.1]), dense_shape=[3, 2])
    b = SparseTensor(indices=[[0, 0], [1, 0], [1, 1], [2, 1]], values=np.array([1.0, 0.05, -1.0, -0.1]),
                     dense_shape=[3, 2])
    assert len(run("add", a=a, b=b).values) == 5
    out = run("add", a=a, b=b, threshold=0.11)
    assert out.indices.tolist() == [[0, 0], [2, 0], [2, 1]]
    out = run("add", a=a, b=b, threshold=0.21)
    assert out.indices.tolist() == [[0, 0], [2, 0]] and out.values.tolist() == [2.0, 6.0]


# ================================================================ properties
@SETTINGS
@given(st.data())
def test_with_values_property(data):
    t = data.draw(coo_tensors())
    dtype = data.draw(st.sampled_from(DTYPE_NAMES))
    new = random_values(np.random.default_rng(0), t.values.shape, dtype)
    out = run("with_values", sp_input=t, new_values=new)
    assert_eq(out, t, values=False)
    assert_eq(out.values, new, rtol=RTOL, atol=0)


@SETTINGS
@given(st.data())
def test_retain_property(data):
    t = data.draw(coo_tensors())
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=t.nnz, max_size=t.nnz)), dtype=bool)
    out = run("retain", sp_input=t, to_retain=mask)
    keep = [i for i in range(t.nnz) if mask[i]]
    assert out.indices.tolist() == [t.indices[i].tolist() for i in keep]
    assert_eq(out.values, t.values[keep].reshape((len(keep), *t.values.shape[1:])), rtol=RTOL, atol=0)
    assert tuple(out.dense_shape) == tuple(t.dense_shape)


def cwise_reference(t: SparseTensor, dense: np.ndarray, op) -> np.ndarray:
    dtype = np.result_type(t.dtype, dense.dtype)
    full = np.broadcast_to(dense, t.dense_shape)
    out = np.empty(t.values.shape, dtype)
    for i in range(t.nnz):
        out[i] = op(t.values[i].astype(dtype), full[tuple(t.indices[i])].astype(dtype), dtype)
    return out


def ref_mul(a, b, dtype):
    with np.errstate(all="ignore"):
        return np.logical_and(a, b) if dtype == np.bool_ else a * b


def ref_div(a, b, dtype):
    with np.errstate(all="ignore"):
        if dtype.kind in "fc":
            return a / b
    a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    q = [(abs(int(x)) // abs(int(y))) * (1 if (int(x) < 0) == (int(y) < 0) else -1)
         for x, y in zip(a.ravel(), b.ravel(), strict=True)]
    return np.array(q, dtype=dtype).reshape(a.shape)


@SETTINGS
@given(st.data())
def test_mul_property(data):
    t = data.draw(coo_tensors())
    dense = data.draw(broadcastable(t.dense_shape))
    out = run("mul", sp_input=t, dense=dense)
    assert_eq(out, t, values=False)
    assert_eq(out.values, cwise_reference(t, dense, ref_mul), rtol=RTOL, atol=0)


@SETTINGS
@given(st.data())
def test_div_property(data):
    t = data.draw(coo_tensors(NUMBER_DTYPES))
    dense = data.draw(broadcastable(t.dense_shape, dtypes=NUMBER_DTYPES, nonzero=True))
    out = run("div", sp_input=t, dense=dense)
    assert_eq(out, t, values=False)
    assert_eq(out.values, cwise_reference(t, dense, ref_div), rtol=RTOL, atol=0)


def sparse_sum_reference(a: SparseTensor, b: SparseTensor, dtype, threshold):
    """(index tuples, blocks) of TensorFlow's SparseAdd, written out: one merge pass over the
    operands as given; equal indices pair and sum, and only such sums meet the threshold
    (kept when threshold <= |sum| for some element, compared in a float sum's own real dtype)."""
    def value(t, i):
        return np.asarray(t.values[i]).astype(dtype)

    def reaches(v):
        if v.size == 0:
            return threshold <= 0
        mag = np.abs(v) if v.dtype.kind in "fc" else np.abs(v.astype(np.float64))
        return bool(np.any(np.asarray(threshold).astype(mag.dtype) <= mag))

    keys, blocks = [], []
    i = j = 0
    ka = [tuple(r) for r in a.indices.tolist()]
    kb = [tuple(r) for r in b.indices.tolist()]
    while i < len(ka) or j < len(kb):
        if j == len(kb) or (i < len(ka) and ka[i] < kb[j]):
            keys.append(ka[i]), blocks.append(value(a, i))
            i += 1
        elif i == len(ka) or kb[j] < ka[i]:
            keys.append(kb[j]), blocks.append(value(b, j))
            j += 1
        else:
            with np.errstate(all="ignore"):
                s = (value(a, i) | value(b, j)) if dtype == np.bool_ else value(a, i) + value(b, j)
            if reaches(s):
                keys.append(ka[i]), blocks.append(s)
            i += 1
            j += 1
    return keys, blocks


@SETTINGS
@given(st.data())
def test_add_sparse_sparse_property(data):
    a = data.draw(coo_tensors())
    b = data.draw(coo_tensors(shape=tuple(a.dense_shape), sparse_ndim=a.sparse_ndim))
    threshold = data.draw(st.sampled_from([0.0, 0.0, 1.0, 2.5]))
    a, b = (b, a) if data.draw(st.booleans()) else (a, b)
    dtype = np.result_type(a.dtype, b.dtype)
    out = run("add", a=a, b=b, threshold=threshold)
    keys, blocks = sparse_sum_reference(a, b, dtype, threshold)
    assert [tuple(k) for k in out.indices.tolist()] == keys
    assert tuple(out.dense_shape) == tuple(a.dense_shape)
    assert out.coalesced == all(k < n for k, n in zip(keys, keys[1:], strict=False))
    assert_eq(out.values, np.array(blocks, dtype=dtype).reshape((len(keys), *a.values.shape[1:])), rtol=RTOL, atol=0)


@SETTINGS
@given(st.data())
def test_add_sparse_dense_property(data):
    t = data.draw(coo_tensors())
    dense = random_values(np.random.default_rng(data.draw(st.integers(0, 99))), t.dense_shape,
                          data.draw(st.sampled_from(DTYPE_NAMES)))
    dtype = np.result_type(t.dtype, dense.dtype)
    expected = reference_dense(t, dtype)
    expected = (expected | dense) if dtype == np.bool_ else expected + dense.astype(dtype)
    swap = data.draw(st.booleans())
    out = run("add", a=dense, b=t) if swap else run("add", a=t, b=dense)
    assert isinstance(out, np.ndarray)
    assert_eq(out, expected, rtol=RTOL, atol=0)


MAP_REFERENCE = {
    "neg": np.negative, "abs": np.abs, "sign": np.sign, "square": np.square, "conj": np.conj,
    "sqrt": np.sqrt, "sin": np.sin, "tan": np.tan, "tanh": np.tanh, "asin": np.arcsin, "atan": np.arctan,
    "sinh": np.sinh, "asinh": np.arcsinh, "atanh": np.arctanh, "expm1": np.expm1, "log1p": np.log1p,
    "ceil": np.ceil, "floor": np.floor, "round": np.round, "trunc": np.trunc, "deg2rad": np.deg2rad,
    "rad2deg": np.rad2deg,
}
ROUNDING = ("ceil", "floor", "round", "trunc")


def map_reference(fn, values):
    kind = values.dtype.kind
    if kind == "b":
        if fn in ("abs", "sign", "square", "conj", *ROUNDING):
            return values.copy()
        if fn == "neg":
            return None
    if kind == "c" and fn in (*ROUNDING, "deg2rad", "rad2deg"):
        return None
    if kind in "iu" and fn in ROUNDING:
        return values.copy()
    if kind in "biu" and fn not in ("neg", "abs", "sign", "square", "conj"):
        values = values.astype(np.float32)  # torch's int -> float32 promotion
    with np.errstate(all="ignore"):
        return np.array([MAP_REFERENCE[fn](v) for v in values.reshape(-1)],
                        dtype=MAP_REFERENCE[fn](values[:0]).dtype).reshape(values.shape)


@SETTINGS
@given(st.data())
def test_map_values_property(data):
    t = data.draw(coo_tensors())
    fn = data.draw(st.sampled_from(sorted(MAP_REFERENCE)))
    expected = map_reference(fn, t.values)
    if expected is None:
        raises(UnimplementedError, "UNSUPPORTED_DTYPE", "map_values", sp_input=t, fn=fn)
        return
    out = run("map_values", sp_input=t, fn=fn)
    assert_eq(out, t, values=False)
    assert_eq(out.values, expected, rtol=RTOL, atol=0)


def test_map_values_dtype_rules():
    ints = SparseTensor(indices=[[0], [2]], values=np.array([4, -9], np.int16), dense_shape=[3])
    assert run("map_values", sp_input=ints, fn="sqrt").values.dtype == np.float32  # as torch.sqrt
    assert run("map_values", sp_input=ints, fn="floor").values.tolist() == [4, -9]
    assert run("map_values", sp_input=ints, fn="sign").values.dtype == np.int16
    z = SparseTensor(indices=[[1]], values=np.array([3 + 4j], np.complex64), dense_shape=[3])
    out = run("map_values", sp_input=z, fn="abs")
    assert out.values.dtype == np.float32 and out.values.tolist() == [5.0]
    half = SparseTensor(indices=[[1]], values=np.array([2.5], np.float16), dense_shape=[3])
    out = run("map_values", sp_input=half, fn="round")
    assert out.values.dtype == np.float16 and out.values.tolist() == [2.0]  # half to even
    assert run("map_values", sp_input=half, fn="arcsin").values.dtype == np.float16  # alias
    empty = SparseTensor(indices=np.zeros((0, 2), np.int64), values=np.zeros((0, 3), np.float32),
                         dense_shape=[2, 2, 3])
    out = run("map_values", sp_input=empty, fn="tanh")
    assert out.values.shape == (0, 3) and out.values.dtype == np.float32


def test_div_integer_truncates_float_is_ieee_and_zero_divisors_are_refused():
    t = SparseTensor(indices=[[0], [1], [2], [3]], values=np.array([7, -7, 7, -7], np.int32), dense_shape=[4])
    out = run("div", sp_input=t, dense=np.array([2, 2, -2, -2], np.int32))
    assert out.values.dtype == np.int32 and out.values.tolist() == [3, -3, -3, 3]
    m = np.iinfo(np.int64).min
    t = SparseTensor(indices=[[0]], values=np.array([m]), dense_shape=[2])
    assert run("div", sp_input=t, dense=np.array([-1])).values.tolist() == [m]  # wraps, no trap
    f = SparseTensor(indices=[[0], [1]], values=np.array([1.0, 0.0]), dense_shape=[3])
    out = run("div", sp_input=f, dense=np.array([np.inf, np.nan, 0.0]))
    assert out.values[0] == 0 and np.isnan(out.values[1]) and out.nnz == 2
    # a zero divisor (-0.0 too) at a stored entry is refused for floats as for integers, as
    # TensorFlow's SparseDenseCwiseDiv refuses it
    for zero in (0.0, -0.0):
        raises(InvalidArgumentError, "DIVISION_BY_ZERO", "div", sp_input=f, dense=np.array([1.0, zero, 1.0]))
    # a zero divisor at an implicit zero is fine
    t = SparseTensor(indices=[[0]], values=np.array([5], np.uint8), dense_shape=[2])
    assert run("div", sp_input=t, dense=np.array([2, 0], np.uint8)).values.tolist() == [2]


def test_hybrid_mul_broadcasts_over_dense_dims():
    t = SparseTensor(indices=[[1], [0]], values=np.array([[1, 2, 3], [4, 5, 6]], np.int64), dense_shape=[2, 3])
    out = run("mul", sp_input=t, dense=np.array([10, 100, 1000], np.int16))
    assert out.values.dtype == np.int64 and out.values.tolist() == [[10, 200, 3000], [40, 500, 6000]]
    out = run("mul", sp_input=t, dense=np.array([[2.0], [3.0]], np.float32))
    assert out.values.dtype == np.float64 and out.values.tolist() == [[3, 6, 9], [8, 10, 12]]


def test_add_keeps_cancellation_zeros_and_nan():
    a = SparseTensor(indices=[[0], [1], [1]], values=np.array([1.0, np.nan, 2.0]), dense_shape=[3])
    b = SparseTensor(indices=[[0]], values=np.array([-1.0]), dense_shape=[3])
    # As TensorFlow's SparseAdd: a's repeated index 1 is not summed (b has no entry there), the
    # cancelled pair at 0 is kept at threshold 0 and dropped at 0.5; entries of one operand alone
    # are kept whatever their magnitude (NaN included).
    out = run("add", a=a, b=b)
    assert out.indices.tolist() == [[0], [1], [1]] and out.values[0] == 0.0 and np.isnan(out.values[1])
    assert out.values[2] == 2.0 and not out.coalesced
    out = run("add", a=a, b=b, threshold=0.5)
    assert out.indices.tolist() == [[1], [1]] and np.isnan(out.values[0]) and out.values[1] == 2.0
    # A NaN sum of a pair is dropped even at threshold 0 (thresh <= |nan| is false).
    n = SparseTensor(indices=[[2]], values=np.array([np.nan]), dense_shape=[3])
    assert run("add", a=n, b=SparseTensor(indices=[[2]], values=np.array([1.0]), dense_shape=[3])).nnz == 0
    e = SparseTensor(indices=np.zeros((0, 1), np.int64), values=np.zeros(0, np.int8), dense_shape=[3])
    out = run("add", a=e, b=e)
    assert out.nnz == 0 and out.values.dtype == np.int8
    assert run("add", a=e, b=np.arange(3, dtype=np.uint8)).dtype == np.int16


# ================================================================ errors
def test_errors():
    t = SparseTensor(indices=[[0, 1], [1, 0]], values=np.array([1, 2], np.int32), dense_shape=[2, 3])
    raises(InvalidArgumentError, "VALUES_SHAPE_MISMATCH", "with_values", sp_input=t, new_values=np.ones(3))
    raises(InvalidArgumentError, "VALUES_SHAPE_MISMATCH", "with_values", sp_input=t,
           new_values=np.ones((2, 1)))
    raises(InvalidArgumentError, "SHAPE_MISMATCH", "retain", sp_input=t, to_retain=np.array([True]))
    raises(InvalidArgumentError, "SHAPE_MISMATCH", "retain", sp_input=t, to_retain=np.ones((2, 1), bool))
    raises(InvalidArgumentError, "BAD_DTYPE", "retain", sp_input=t, to_retain=np.array([1, 0]))
    err = raises(InvalidArgumentError, "SHAPE_MISMATCH", "mul", sp_input=t, dense=np.ones((3, 5)))
    assert "[3, 5]" in err.message and "[2, 3]" in err.message
    raises(InvalidArgumentError, "SHAPE_MISMATCH", "div", sp_input=t, dense=np.ones(2))
    raises(InvalidArgumentError, "SHAPE_MISMATCH", "mul", sp_input=t, dense=np.ones((1, 2, 3)))
    err = raises(InvalidArgumentError, "DIVISION_BY_ZERO", "div", sp_input=t,
                 dense=np.array([[1, 1, 1], [0, 1, 1]], np.int32))
    assert "[1, 0]" in err.message
    b = SparseTensor(indices=[[0, 0]], values=np.array([True]), dense_shape=[2, 3])
    raises(UnimplementedError, "UNSUPPORTED_DTYPE", "div", sp_input=b, dense=np.array([True]))
    raises(InvalidArgumentError, "SHAPE_MISMATCH", "add", a=t, b=SparseTensor(
        indices=[[0, 0]], values=np.array([1]), dense_shape=[2, 4]))
    raises(InvalidArgumentError, "SHAPE_MISMATCH", "add", a=t, b=np.ones((3, 2)))
    raises(InvalidArgumentError, "SPARSE_DIM_MISMATCH", "add", a=t, b=SparseTensor(
        indices=[[0]], values=np.ones((1, 3)), dense_shape=[2, 3]))
    raises(InvalidArgumentError, "VALUE_OUT_OF_RANGE", "add", a=t, b=t, threshold=-1.0)
    raises(UnimplementedError, "UNSUPPORTED_LAYOUT", "add", a=np.ones(2), b=np.ones(2))
    raises(UnimplementedError, "UNSUPPORTED_LAYOUT", "mul", sp_input=t, dense=t)
    for fn in ("cos", "exp", "log", "sigmoid"):
        err = raises(InvalidArgumentError, "NOT_ZERO_PRESERVING", "map_values", sp_input=t, fn=fn)
        assert "to_dense" in err.message and fn in err.message
    err = raises(InvalidArgumentError, "UNKNOWN_FUNCTION", "map_values", sp_input=t, fn="frobnicate")
    assert "to_dense" in err.message
    raises(UnimplementedError, "UNSUPPORTED_DTYPE", "map_values", sp_input=b, fn="neg")
    raises(UnimplementedError, "UNSUPPORTED_DTYPE", "map_values", sp_input=b, fn="frac")
    raises(InvalidArgumentError, "BAD_ARGUMENT_TYPE", "map_values", sp_input=t, fn=3)


def test_inputs_are_not_written():
    t = SparseTensor(indices=[[1], [0]], values=np.array([1.0, 2.0]), dense_shape=[2])
    for arr in (t.indices, t.values):
        arr.setflags(write=False)
    d = np.array([3.0, 4.0])
    d.setflags(write=False)
    run("mul", sp_input=t, dense=d)
    run("div", sp_input=t, dense=d)
    run("add", a=t, b=d)
    run("add", a=t, b=t, threshold=2.5)
    run("map_values", sp_input=t, fn="neg")
    out = run("with_values", sp_input=t, new_values=d)
    assert out.values.tolist() == [3.0, 4.0] and t.values.tolist() == [1.0, 2.0]


# ================================================================ over the wires
def test_every_op_over_every_wire(client):
    st_ = SparseTensor(indices=[[0, 1], [2, 0], [0, 1]], values=np.array([1.0, -2.0, 3.0]), dense_shape=[3, 2])
    out = client.with_values(st_, np.array([1, 2, 3], np.int8))
    assert out.values.dtype == np.int8 and out.indices.tolist() == [[0, 1], [2, 0], [0, 1]]
    out = client.retain(st_, np.array([False, True, True]))
    assert out.indices.tolist() == [[2, 0], [0, 1]] and out.values.tolist() == [-2.0, 3.0]
    out = client.mul(st_, np.array([10.0, np.inf]))
    assert out.values.tolist() == [np.inf, -20.0, np.inf] and out.nnz == 3
    out = client.div(st_, np.array([[2.0], [1.0], [4.0]]))
    assert out.values.tolist() == [0.5, -0.5, 1.5]
    out = client.add(st_, st_, threshold=3.0)  # TensorFlow's merge, pair by pair: 2 dropped, -4 and 6 kept
    assert out.indices.tolist() == [[2, 0], [0, 1]] and out.values.tolist() == [-4.0, 6.0]
    dense = client.add(st_, np.ones((3, 2)))
    np.testing.assert_array_equal(dense, [[1, 5], [1, 1], [-1, 1]])
    out = client.map_values(st_, "abs")
    assert out.values.tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(InvalidArgumentError) as info:
        client.map_values(st_, "cos")
    assert info.value.reason == "NOT_ZERO_PRESERVING" and "to_dense" in info.value.message
    ints = SparseTensor(indices=[[1]], values=np.array([3], np.int32), dense_shape=[2])
    with pytest.raises(InvalidArgumentError) as info:
        client.div(ints, np.array([1, 0], np.int32))
    assert info.value.reason == "DIVISION_BY_ZERO"


def test_handle_input(client):
    st_ = SparseTensor(indices=[[1, 0]], values=np.array([2.5]), dense_shape=[2, 2])
    h = client.put(st_)
    try:
        out = client.mul(h, np.array([[2.0, 0.0], [4.0, 0.0]]))
        assert out.indices.tolist() == [[1, 0]] and out.values.tolist() == [10.0]
        assert client.add(h, np.zeros((2, 2))).tolist() == [[0, 0], [2.5, 0]]
    finally:
        client.delete(h)


@pytest.mark.parametrize("dtype", ["float64", "int16", "uint64", "complex64"])
@pytest.mark.parametrize("dense_shape", [(300, 400), (1, 400), (300, 1), (400,)])
def test_large_mul_takes_the_fused_path_and_agrees(dtype, dense_shape):
    """Past PARALLEL_MIN entries with one dtype and no hybrid dims, mul runs one fused parallel
    kernel; it must equal values * the dense broadcast to the sparse shape."""
    from sparseserve.kernels import elementwise as ek
    from sparseserve.kernels import PARALLEL_MIN

    rng = np.random.default_rng(3)
    n = 2 * PARALLEL_MIN
    idx = np.stack([rng.integers(0, 300, n), rng.integers(0, 400, n)], axis=1)
    vals = rng.integers(1, 5, n).astype(dtype)
    dense = rng.integers(-3, 4, dense_shape).astype(dtype)
    assert ek.multiply_stored(idx, vals, dense, 2) is not None
    out = run_op("mul", sp_input=SparseTensor(indices=idx, values=vals, dense_shape=[300, 400]),
                 dense=dense)
    expected = vals * np.broadcast_to(dense, (300, 400))[idx[:, 0], idx[:, 1]]
    assert out.values.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out.values, expected)
    np.testing.assert_array_equal(out.indices, idx)


# ======================================================= CSR, CSC, BSR and BSC
COMPRESSED_SETTINGS = settings(max_examples=30, deadline=None)


def storage_coo(t: SparseTensor) -> SparseTensor:
    """A COO tensor listing every stored element of ``t`` in the order of ``t.values`` (batch,
    entry, place in its block), built by plain loops."""
    nb = t.batch_ndim
    batch_shape = t.dense_shape[:nb]
    ci = t.compressed_indices.reshape(-1, t.compressed_indices.shape[-1])
    pi = t.plain_indices.reshape(ci.shape[0], t.plain_indices.shape[-1])
    br, bc = t.blocksize if t.blocksize is not None else (1, 1)
    rows = []
    for b in range(ci.shape[0]):
        lead = list(np.unravel_index(b, batch_shape)) if nb else []
        for k in range(ci.shape[1] - 1):
            for j in range(ci[b, k], ci[b, k + 1]):
                major, minor = (k, pi[b, j]) if t.layout in ("csr", "bsr") else (pi[b, j], k)
                for r in range(br):
                    for c in range(bc):
                        rows.append([*lead, major * br + r, minor * bc + c])
    indices = np.array(rows, np.int64).reshape(len(rows), nb + 2)
    dense = t.dense_shape[nb + 2:]
    return SparseTensor(indices=indices, values=t.values.reshape(len(rows), *dense), dense_shape=t.dense_shape)


@COMPRESSED_SETTINGS
@given(t=compressed_tensors(dtypes=DTYPES), data=st.data())
def test_with_values_keeps_structure(t, data):
    dtype = data.draw(st.sampled_from(DTYPES))
    new = random_values(np.random.default_rng(0), t.values.shape, dtype)
    out = run("with_values", sp_input=t, new_values=new)
    assert_eq(out, t, values=False)
    assert_eq(out.values, new, exact=True)
    raises(InvalidArgumentError, "VALUES_SHAPE_MISMATCH", "with_values", sp_input=t,
           new_values=np.zeros((*t.values.shape, 1)))


@COMPRESSED_SETTINGS
@given(t=compressed_tensors(dtypes=DTYPES), data=st.data())
def test_retain_in_storage_order(t, data):
    nb = t.batch_ndim
    lead = t.values.shape[:nb + 1]
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    flags = rng.integers(0, 2, size=lead).astype(bool)
    if nb and data.draw(st.booleans()) and t.nnz:  # the same count in every batch
        flags = np.broadcast_to(flags.reshape(-1, t.nnz)[:1], (int(np.prod(lead[:-1])), t.nnz)).reshape(lead)
    counts = flags.reshape(-1, t.nnz).sum(axis=1) if t.nnz else np.zeros(1)
    if counts.size > 1 and np.any(counts != counts[0]):
        raises(InvalidArgumentError, "BATCH_NSE_MISMATCH", "retain", sp_input=t, to_retain=flags)
        return
    out = run("retain", sp_input=t, to_retain=flags)
    assert out.layout == t.layout and out.blocksize == t.blocksize
    assert out.compressed_indices.dtype == t.compressed_indices.dtype
    per_element = np.repeat(flags.reshape(-1), int(np.prod(t.blocksize or (1, 1))))
    want = run("retain", sp_input=storage_coo(t), to_retain=per_element)
    got = storage_coo(out)
    np.testing.assert_array_equal(got.indices, want.indices)
    assert_eq(got.values, want.values, exact=True)
    raises(InvalidArgumentError, "SHAPE_MISMATCH", "retain", sp_input=t, to_retain=np.ones(t.nnz + 1, bool))


def broadcastable_shape(data, shape):
    """A dense shape broadcasting to ``shape`` (a suffix, some dims 1)."""
    k = data.draw(st.integers(0, len(shape)))
    suffix = shape[len(shape) - k:]
    return tuple(1 if d and data.draw(st.booleans()) else d for d in suffix)


@COMPRESSED_SETTINGS
@given(t=compressed_tensors(dtypes=DTYPES), data=st.data())
def test_mul_and_div_by_dense(t, data):
    shape = broadcastable_shape(data, t.dense_shape)
    dtype = data.draw(st.sampled_from(("int16", "float32", "float64", "bool")))
    dense = np.asarray(random_values(np.random.default_rng(data.draw(st.integers(0, 99))), shape, dtype))
    view = storage_coo(t)
    out = run("mul", sp_input=t, dense=dense)
    assert_eq(out, t, values=False)
    want = run("mul", sp_input=view, dense=dense)
    assert_eq(out.values.reshape(want.values.shape), want.values, exact=True)
    if canonical(t):  # the COO answer converted back
        assert_eq(out, back(run("mul", sp_input=coo_view(t), dense=dense), t), exact=True)
    if np.result_type(t.dtype, dense.dtype) == np.bool_:
        raises(UnimplementedError, "UNSUPPORTED_DTYPE", "div", sp_input=t, dense=dense)
        return
    dense = np.where(dense == 0, np.ones((), dense.dtype), dense)
    out = run("div", sp_input=t, dense=dense)
    assert_eq(out, t, values=False)
    want = run("div", sp_input=view, dense=dense)
    assert_eq(out.values.reshape(want.values.shape), want.values, exact=True)


def test_div_by_zero_names_the_element():
    t = SparseTensor(layout="csr", compressed_indices=[0, 1, 2], plain_indices=[1, 0],
                     values=np.array([4, 6], np.int32), dense_shape=[2, 2])
    err = raises(InvalidArgumentError, "DIVISION_BY_ZERO", "div", sp_input=t,
                 dense=np.array([[1, 1], [0, 1]], np.int32))
    assert "[1, 0]" in err.message


MAP_FNS = ("neg", "abs", "sqrt", "sin", "square", "sign")


@COMPRESSED_SETTINGS
@given(t=compressed_tensors(dtypes=("int32", "float32", "float64", "complex64")), fn=st.sampled_from(MAP_FNS))
def test_map_values_keeps_structure(t, fn):
    out = run("map_values", sp_input=t, fn=fn)
    assert_eq(out, t, values=False)
    want = run("map_values", sp_input=storage_coo(t), fn=fn)
    np.testing.assert_allclose(out.values.reshape(want.values.shape), want.values, rtol=0, atol=0)
    assert out.values.dtype == want.values.dtype


@st.composite
def pairs(draw, dtypes=DTYPES):
    spec = draw(layout_specs())
    return draw(compressed_tensors(spec, dtypes=dtypes)), draw(compressed_tensors(spec, dtypes=dtypes))


@COMPRESSED_SETTINGS
@given(ab=pairs(dtypes=("int32", "float64", "bool")), threshold=st.sampled_from([0.0, 0.0, 1.0, 2.5]))
def test_add_sparse_sparse(ab, threshold):
    a, b = ab
    got = assert_same_or_error(lambda: run("add", a=a, b=b, threshold=threshold),
                               lambda: back(run("add", a=coo_view(a), b=coo_view(b), threshold=threshold),
                                            a if a.compressed_indices.dtype == np.int64 else b))
    if got is not None and threshold == 0:
        dtype = np.result_type(a.dtype, b.dtype)
        def dense(t):  # values cast first, as add casts them before summing
            return SparseTensor(layout=t.layout, compressed_indices=t.compressed_indices, plain_indices=t.plain_indices,
                                values=t.values.astype(dtype), dense_shape=t.dense_shape,
                                blocksize=t.blocksize).to_dense()

        da, db = dense(a), dense(b)
        np.testing.assert_array_equal(got.to_dense(), (da | db) if dtype == np.bool_ else da + db)


@COMPRESSED_SETTINGS
@given(t=compressed_tensors(dtypes=DTYPES), data=st.data())
def test_add_sparse_dense(t, data):
    dense = random_values(np.random.default_rng(data.draw(st.integers(0, 99))), t.dense_shape,
                          data.draw(st.sampled_from(DTYPES)))
    assert_eq(run("add", a=t, b=dense), run("add", a=coo_view(t), b=dense), exact=True)
    assert_eq(run("add", a=dense, b=t), run("add", a=dense, b=coo_view(t)), exact=True)


def test_add_mixed_layouts_is_unimplemented():
    d = np.array([[1.0, 0.0], [0.0, 2.0]])
    coo = run("from_dense", tensor=d)
    csr = run("convert", sp_input=coo, layout="csr")
    csc = run("convert", sp_input=coo, layout="csc")
    for a, b in [(csr, coo), (coo, csr), (csr, csc)]:
        err = raises(UnimplementedError, "UNSUPPORTED_LAYOUT", "add", a=a, b=b)
        assert a.layout in err.message and b.layout in err.message
    b1 = run("convert", sp_input=coo, layout="bsr", blocksize=[1, 1])
    b2 = run("convert", sp_input=coo, layout="bsr", blocksize=[2, 2])
    assert "blocksize" in raises(UnimplementedError, "UNSUPPORTED_LAYOUT", "add", a=b1, b=b2).message


def test_retain_batches_must_keep_equal_counts():
    t = SparseTensor(layout="csr", compressed_indices=[[0, 1, 2], [0, 1, 2]], plain_indices=[[0, 1], [1, 0]],
                     values=np.ones((2, 2)), dense_shape=[2, 2, 2])
    err = raises(InvalidArgumentError, "BATCH_NSE_MISMATCH", "retain", sp_input=t,
                 to_retain=np.array([[True, True], [True, False]]))
    assert "batch" in err.message
    out = run("retain", sp_input=t, to_retain=np.array([[True, False], [False, True]]))
    assert out.compressed_indices.tolist() == [[0, 1, 1], [0, 0, 1]] and out.plain_indices.tolist() == [[0], [0]]
