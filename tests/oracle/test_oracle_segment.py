"""segment_sum / segment_mean / segment_sqrt_n and bincount against TensorFlow itself.

Hypothesis draws the inputs (every data dtype TensorFlow's kernels take, int32/int64 indices and
ids, empty segments, leading gaps, repeated indices, num_segments, higher-rank data; bincount over
dense and sparse values, weights of every dtype TensorFlow takes, axis 0 and -1, minlength,
maxlength, binary_output) and both libraries run on the same inputs. Integers and every piece of
structure must be equal; floats allclose. Inputs TensorFlow refuses (unsorted or out-of-range
ids, bad indices, negative values) must be refused by us too, as INVALID_ARGUMENT."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from _oracle import from_tf, raises, run, tf, to_tf
from helpers import assert_eq
from strategies import coo_tensors, random_values

from sparseserve import SparseTensor

SETTINGS = settings(max_examples=30, deadline=None)
SUM_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
              "float64")
FLOAT_DTYPES = ("float16", "float32", "float64")
OPS = {"segment_sum": SUM_DTYPES, "segment_mean": FLOAT_DTYPES, "segment_sqrt_n": FLOAT_DTYPES}


@st.composite
def segment_calls(draw, dtypes=SUM_DTYPES):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = draw(st.sampled_from(dtypes))
    rows = draw(st.integers(1, 6))
    inner = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    data = random_values(rng, (rows, *inner), dtype)
    k = draw(st.integers(0, 12))
    indices = rng.integers(0, rows, k)
    ids = np.sort(rng.integers(0, 8, k))  # gaps: empty segments, leading ones too
    num_segments = None
    if draw(st.booleans()):
        num_segments = (int(ids[-1]) + 1 if k else 0) + draw(st.integers(0, 3))
    index_dtype, id_dtype = draw(st.sampled_from(["int32", "int64"])), draw(st.sampled_from(["int32", "int64"]))
    return data, indices.astype(index_dtype), ids.astype(id_dtype), num_segments


def _tf_segment(op, data, indices, ids, num_segments):
    fn = getattr(tf().sparse, op)
    if num_segments is None:
        return fn(data, indices, ids).numpy()
    return fn(data, indices, ids, num_segments=num_segments).numpy()


def _tolerance(dtype):
    return {"float16": 2e-3}.get(np.dtype(dtype).name, 1e-6)


def _check_segment(op, call):
    data, indices, ids, num_segments = call
    want = _tf_segment(op, data, indices, ids, num_segments)
    got = run(op, data=data, indices=indices, segment_ids=ids, num_segments=num_segments)
    tol = _tolerance(data.dtype)
    assert_eq(got, want, rtol=tol, atol=tol)


@SETTINGS
@given(segment_calls())
def test_segment_sum_matches_tf(call):
    _check_segment("segment_sum", call)


@SETTINGS
@given(segment_calls(FLOAT_DTYPES))
def test_segment_mean_matches_tf(call):
    _check_segment("segment_mean", call)


@SETTINGS
@given(segment_calls(FLOAT_DTYPES))
def test_segment_sqrt_n_matches_tf(call):
    _check_segment("segment_sqrt_n", call)


@settings(max_examples=30, deadline=None)
@given(segment_calls(("float32",)), st.sampled_from(["unsorted", "negative", "too_large", "bad_index"]),
       st.sampled_from(list(OPS)))
def test_refused_where_tf_refuses(call, breakage, op):
    data, indices, ids, num_segments = call
    ids, indices = ids.astype(np.int64), indices.astype(np.int64)
    if breakage == "unsorted":
        ids = np.concatenate([ids, [3, 2]])
        indices = np.concatenate([indices, [0, 0]])
        num_segments = None if num_segments is None else max(num_segments, 4)
    elif breakage == "negative":
        ids = np.concatenate([[-1], ids])
        indices = np.concatenate([[0], indices])
    elif breakage == "too_large":
        num_segments = int(ids[-1]) + 1 if ids.size else 0
        ids = np.concatenate([ids, [num_segments]])
        indices = np.concatenate([indices, [0]])
    else:
        indices = np.concatenate([indices, [data.shape[0]]])
        ids = np.concatenate([ids, [ids[-1] if ids.size else 0]])
    try:
        _tf_segment(op, data, indices, ids, num_segments)
    except tf().errors.InvalidArgumentError:
        pass
    else:
        raise AssertionError("TensorFlow accepted the call")
    err = raises(op, data=data, indices=indices, segment_ids=ids, num_segments=num_segments)
    assert err.code == "INVALID_ARGUMENT", err


# ------------------------------------------------------------------ bincount
WEIGHT_DTYPES = ("int32", "int64", "float32", "float64")


@st.composite
def bincount_options(draw):
    weights = draw(st.sampled_from([None, "binary", *WEIGHT_DTYPES]))
    return dict(weights=weights, axis=draw(st.sampled_from([0, -1])),
                minlength=draw(st.one_of(st.none(), st.integers(-1, 12))),
                maxlength=draw(st.one_of(st.none(), st.integers(-1, 12))))


def _tf_bincount(values, weights, options):
    kwargs = {k: v for k, v in options.items() if k != "weights" and v is not None}
    if options["weights"] == "binary":
        kwargs["binary_output"] = True
    elif weights is not None:
        kwargs["weights"] = weights
    return from_tf(tf().sparse.bincount(values, **kwargs))


def _ours_bincount(values, weights, options):
    kwargs = {k: v for k, v in options.items() if k != "weights"}
    if options["weights"] == "binary":
        kwargs["binary_output"] = True
    elif weights is not None:
        kwargs["weights"] = weights
    return run("bincount", values=values, **kwargs)


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.sampled_from(["int32", "int64"]), st.sampled_from([(0,), (1,), (5,), (2, 3),
                                                                                        (3, 1), (2, 0), (2, 2, 2)]),
       bincount_options(), st.booleans())
def test_bincount_dense_matches_tf(seed, dtype, shape, options, big):
    if options["axis"] == -1 and len(shape) > 2:
        options["axis"] = 0  # TensorFlow takes rank 1 or 2 with axis -1 (we refuse the rest too)
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 2**40 if big and dtype == "int64" else 9, shape).astype(dtype)
    values.reshape(-1)[::2] %= 9  # repeats among big values
    weights = None
    if options["weights"] not in (None, "binary"):
        weights = random_values(rng, shape, options["weights"])
    want = _tf_bincount(values, weights, options)
    assert_eq(_ours_bincount(values, weights, options), want)


@SETTINGS
@given(coo_tensors(dtypes=("int32", "int64"), hybrid=False, min_dim=1, max_rank=3), bincount_options(),
       st.integers(0, 2**32 - 1))
def test_bincount_sparse_matches_tf(t, options, seed):
    t = SparseTensor(indices=t.indices, values=np.abs(t.values), dense_shape=t.dense_shape)
    weights = None
    if options["weights"] not in (None, "binary"):
        w = random_values(np.random.default_rng(seed), (t.nnz,), options["weights"])
        weights = SparseTensor(indices=t.indices, values=w, dense_shape=t.dense_shape)
    want = _tf_bincount(to_tf(t), None if weights is None else to_tf(weights), options)
    assert_eq(_ours_bincount(t, weights, options), want)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([(4,), (2, 3)]), st.sampled_from([0, -1]))
def test_bincount_negative_values_refused_as_tf(seed, shape, axis):
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 5, shape).astype(np.int32)
    values.reshape(-1)[rng.integers(0, values.size)] = -int(rng.integers(1, 4))
    try:
        tf().sparse.bincount(values, axis=axis)
    except tf().errors.InvalidArgumentError:
        pass
    else:
        raise AssertionError("TensorFlow accepted negative values")
    err = raises("bincount", values=values, axis=axis)
    assert err.code == "INVALID_ARGUMENT" and err.reason == "VALUE_OUT_OF_RANGE"
