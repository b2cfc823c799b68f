"""The COO ops on CSR, CSC, BSR and BSC (batch and dense dimensions too).

Every op answers on a compressed tensor what it answers on the tensor's COO view, in the layout
a torch user expects: value-only ops (with_values, retain, mul, div, map_values) keep the
structure and work in storage order (torch's ``values()``), checked against the op on a COO
tensor listing the stored elements in that order; the others equal the COO answer converted
back to the input's layout, blocksize and index dtype (structure exact). Inputs are canonical
(each segment's plain indices strictly increasing) or not (repeats and disorder within
segments, which docs/contract.md, "Tensors", allows). TensorFlow and PyTorch are compared in
``tests/oracle/test_oracle_layouts.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparseserve import InvalidArgumentError, SparseTensor, UnimplementedError
from conftest import op_raises, run_op
from helpers import assert_eq
from strategies import compressed_tensors, layout_specs, random_values

run, raises = run_op, op_raises
SETTINGS = settings(max_examples=30, deadline=None)
FLOATS = ("float32", "float64")
DTYPES = ("bool", "int8", "int32", "int64", "uint8", "float16", "float32", "float64", "complex64")


# ------------------------------------------------------------------ inputs
def canonical(t: SparseTensor) -> bool:
    """Each segment's plain indices strictly increase (written out here, not ours)."""
    ci = t.compressed_indices.reshape(-1, t.compressed_indices.shape[-1])
    pi = t.plain_indices.reshape(ci.shape[0], t.plain_indices.shape[-1])
    return all(np.all(np.diff(pi[b, ci[b, k]:ci[b, k + 1]]) > 0)
               for b in range(ci.shape[0]) for k in range(ci.shape[1] - 1))


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


def coo_view(t: SparseTensor) -> SparseTensor:
    return run("convert", sp_input=t, layout="coo")


def back(coo: SparseTensor, t: SparseTensor) -> SparseTensor:
    """The COO answer in ``t``'s layout, blocksize and index dtype (where int32 holds it)."""
    out = run("convert", sp_input=coo, layout=t.layout, blocksize=None if t.blocksize is None else list(t.blocksize))
    dtype = t.compressed_indices.dtype
    if dtype == np.int32 and max(out.nnz, *out.dense_shape) > np.iinfo(np.int32).max:
        dtype = np.int64
    return SparseTensor(layout=out.layout, compressed_indices=out.compressed_indices.astype(dtype),
                        plain_indices=out.plain_indices.astype(dtype), values=out.values,
                        dense_shape=out.dense_shape, blocksize=out.blocksize)


def expect(fn):
    """fn()'s result, or the InvalidArgumentError it raises (reason compared by the caller)."""
    try:
        return fn()
    except InvalidArgumentError as exc:
        return exc


def assert_same_or_error(got_fn, want_fn, what="output"):
    want = expect(want_fn)
    if isinstance(want, InvalidArgumentError):
        with pytest.raises(InvalidArgumentError) as info:
            got_fn()
        assert info.value.reason == want.reason, (info.value, want)
        return None
    got = got_fn()
    assert_eq(got, want, what=what, exact=True)
    return got


# ------------------------------------------------------------------ value-only ops
@SETTINGS
@given(t=compressed_tensors(dtypes=DTYPES), data=st.data())
def test_with_values_keeps_structure(t, data):
    dtype = data.draw(st.sampled_from(DTYPES))
    new = random_values(np.random.default_rng(0), t.values.shape, dtype)
    out = run("with_values", sp_input=t, new_values=new)
    assert_eq(out, t, values=False)
    assert_eq(out.values, new, exact=True)
    raises(InvalidArgumentError, "VALUES_SHAPE_MISMATCH", "with_values", sp_input=t,
           new_values=np.zeros((*t.values.shape, 1)))


@SETTINGS
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


def broadcastable(data, shape):
    """A dense shape broadcasting to ``shape`` (a suffix, some dims 1)."""
    k = data.draw(st.integers(0, len(shape)))
    suffix = shape[len(shape) - k:]
    return tuple(1 if d and data.draw(st.booleans()) else d for d in suffix)


@SETTINGS
@given(t=compressed_tensors(dtypes=DTYPES), data=st.data())
def test_mul_and_div_by_dense(t, data):
    shape = broadcastable(data, t.dense_shape)
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


@SETTINGS
@given(t=compressed_tensors(dtypes=("int32", "float32", "float64", "complex64")), fn=st.sampled_from(MAP_FNS))
def test_map_values_keeps_structure(t, fn):
    out = run("map_values", sp_input=t, fn=fn)
    assert_eq(out, t, values=False)
    want = run("map_values", sp_input=storage_coo(t), fn=fn)
    np.testing.assert_allclose(out.values.reshape(want.values.shape), want.values, rtol=0, atol=0)
    assert out.values.dtype == want.values.dtype


# ------------------------------------------------------------------ through the COO view
@SETTINGS
@given(t=compressed_tensors(dtypes=DTYPES), default=st.integers(0, 1))
def test_to_dense(t, default):
    want = run("to_dense", sp_input=coo_view(t), default_value=default, validate_indices=False)
    assert_eq(run("to_dense", sp_input=t, default_value=default, validate_indices=False), want, exact=True)
    if default == 0:  # the SDK's own numpy expansion (it has no default value)
        np.testing.assert_array_equal(want, t.to_dense())
    if canonical(t):
        assert_eq(run("to_dense", sp_input=t, default_value=default), want, exact=True)
    else:
        err = op_raises_any(InvalidArgumentError, "to_dense", sp_input=t)
        assert err.reason in ("INDICES_REPEATED", "INDICES_UNSORTED") and "plain_indices" in err.message


def op_raises_any(cls, name, **kwargs):
    with pytest.raises(cls) as info:
        run(name, **kwargs)
    return info.value


@SETTINGS
@given(t=compressed_tensors(dtypes=DTYPES))
def test_reorder_and_coalesce(t):
    out = run("reorder", sp_input=t)
    if canonical(t):
        assert_eq(out, t, exact=True)  # returned as it is
        assert_eq(run("coalesce", sp_input=t), t, exact=True)
        return
    # reorder: each segment sorted, stably, repeats kept
    assert_structure_kept_shape(out, t)
    np.testing.assert_array_equal(out.compressed_indices, t.compressed_indices)
    assert out.compressed_indices.dtype == t.compressed_indices.dtype
    ci = t.compressed_indices.reshape(-1, t.compressed_indices.shape[-1])
    pi = t.plain_indices.reshape(ci.shape[0], t.plain_indices.shape[-1])
    vals = t.values.reshape(ci.shape[0], pi.shape[1], *t.values.shape[t.batch_ndim + 1:])
    got_pi = out.plain_indices.reshape(pi.shape)
    got_vals = out.values.reshape(vals.shape)
    for b in range(ci.shape[0]):
        for k in range(ci.shape[1] - 1):
            lo, hi = ci[b, k], ci[b, k + 1]
            order = np.argsort(pi[b, lo:hi], kind="stable")
            np.testing.assert_array_equal(got_pi[b, lo:hi], pi[b, lo:hi][order])
            np.testing.assert_array_equal(got_vals[b, lo:hi], vals[b, lo:hi][order])
    # coalesce: the COO answer converted back (or its batch-count error)
    assert_same_or_error(lambda: run("coalesce", sp_input=t),
                         lambda: back(run("coalesce", sp_input=coo_view(t)), t))


def assert_structure_kept_shape(got, t):
    assert got.layout == t.layout and tuple(got.dense_shape) == tuple(t.dense_shape) and got.blocksize == t.blocksize


@st.composite
def pairs(draw, dtypes=DTYPES):
    spec = draw(layout_specs())
    return draw(compressed_tensors(spec, dtypes=dtypes)), draw(compressed_tensors(spec, dtypes=dtypes))


@SETTINGS
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


@SETTINGS
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


@SETTINGS
@given(t=compressed_tensors(dtypes=("int8", "int64", "uint8")), vocab=st.integers(6, 8))
def test_to_indicator(t, vocab):
    t = SparseTensor(layout=t.layout, compressed_indices=t.compressed_indices, plain_indices=t.plain_indices,
                     values=np.abs(t.values.astype(np.int64)).astype(t.dtype), dense_shape=t.dense_shape,
                     blocksize=t.blocksize)
    assert_eq(run("to_indicator", sp_input=t, vocab_size=vocab),
              run("to_indicator", sp_input=coo_view(t), vocab_size=vocab), exact=True)
    if t.values.size and t.values.max() > 0:
        raises(InvalidArgumentError, "VALUE_OUT_OF_RANGE", "to_indicator", sp_input=t, vocab_size=int(t.values.max()))


@SETTINGS
@given(t=compressed_tensors(dtypes=DTYPES))
def test_fill_empty_rows(t):
    default = True if t.dtype == np.bool_ else 7

    def ours():
        return run("fill_empty_rows", sp_input=t, default_value=default)

    def want():
        out, empty = run("fill_empty_rows", sp_input=coo_view(t), default_value=default)
        return back(out, t), empty

    expected = expect(want)
    if isinstance(expected, InvalidArgumentError):
        assert op_raises_any(InvalidArgumentError, "fill_empty_rows", sp_input=t,
                             default_value=default).reason == expected.reason
        return
    out, empty = ours()
    assert_eq(out, expected[0], exact=True)
    assert_eq(empty, expected[1], exact=True)


@SETTINGS
@given(data=st.data())
def test_concat(data):
    spec = data.draw(layout_specs())
    tensors = [data.draw(compressed_tensors(spec, dtypes=("float64",))) for _ in range(data.draw(st.integers(1, 3)))]
    rank = tensors[0].ndim
    axis = data.draw(st.integers(-rank, rank - 1))
    if len(tensors) == 1:  # as tf.sparse.concat: one input comes back as it is
        assert_eq(run("concat", axis=axis, sp_inputs=tensors), tensors[0], exact=True)
        return
    assert_same_or_error(lambda: run("concat", axis=axis, sp_inputs=tensors),
                         lambda: back(run("concat", axis=axis, sp_inputs=[coo_view(t) for t in tensors]),
                                      tensors[0]))


def test_concat_mixed_layouts_is_unimplemented():
    coo = run("from_dense", tensor=np.eye(2))
    csr = run("convert", sp_input=coo, layout="csr")
    err = raises(UnimplementedError, "UNSUPPORTED_LAYOUT", "concat", axis=0, sp_inputs=[csr, coo])
    assert "coo" in err.message and "csr" in err.message


def draw_index(data, shape):
    index = []
    for d in shape[:data.draw(st.integers(0, len(shape)))]:
        if d and data.draw(st.booleans()):
            index.append(data.draw(st.integers(-d, d - 1)))
        else:
            index.append([data.draw(st.one_of(st.none(), st.integers(-d - 1, d + 1))),
                          data.draw(st.one_of(st.none(), st.integers(-d - 1, d + 1))),
                          data.draw(st.one_of(st.none(), st.integers(1, 3)))])
    return index


@SETTINGS
@given(t=compressed_tensors(dtypes=DTYPES, canonical=True), data=st.data())
def test_select(t, data):
    index = draw_index(data, t.dense_shape)
    nb = t.batch_ndim
    items = index + [[None, None, None]] * (t.ndim - len(index))
    keeps = not isinstance(items[nb], int) and not isinstance(items[nb + 1], int)
    want = run("select", sp_input=coo_view(t), index=index)
    if not keeps or not isinstance(want, SparseTensor):
        assert_eq(run("select", sp_input=t, index=index), want, exact=True)
        return
    rows, cols = want.dense_shape[want.indices.shape[1] - 2:want.indices.shape[1]]
    if t.blocksize is not None and (rows % t.blocksize[0] or cols % t.blocksize[1]):
        raises(InvalidArgumentError, "BLOCKSIZE", "select", sp_input=t, index=index)
        return
    assert_same_or_error(lambda: run("select", sp_input=t, index=index), lambda: back(want, t))


def test_select_examples_as_torch():
    d = np.array([[1.0, 0, 2, 0], [0, 0, 3, 0], [0, 0, 0, 0], [4, 5, 0, 6]])
    csr = run("convert", sp_input=run("from_dense", tensor=d), layout="csr")
    row = run("select", sp_input=csr, index=[0])  # torch: csr[0] is a sparse COO vector
    assert row.layout == "coo" and row.indices.tolist() == [[0], [2]] and row.values.tolist() == [1.0, 2.0]
    assert run("select", sp_input=csr, index=[3, 1]).tolist() == 5.0  # both fixed: dense
    part = run("select", sp_input=csr, index=[[1, 4, None]])
    assert part.layout == "csr" and part.to_dense().tolist() == d[1:].tolist()


# ------------------------------------------------------------------ errors and the wires
def test_retain_batches_must_keep_equal_counts():
    t = SparseTensor(layout="csr", compressed_indices=[[0, 1, 2], [0, 1, 2]], plain_indices=[[0, 1], [1, 0]],
                     values=np.ones((2, 2)), dense_shape=[2, 2, 2])
    err = raises(InvalidArgumentError, "BATCH_NSE_MISMATCH", "retain", sp_input=t,
                 to_retain=np.array([[True, True], [True, False]]))
    assert "batch" in err.message
    out = run("retain", sp_input=t, to_retain=np.array([[True, False], [False, True]]))
    assert out.compressed_indices.tolist() == [[0, 1, 1], [0, 0, 1]] and out.plain_indices.tolist() == [[0], [0]]


def test_ops_over_the_wire_with_csr(client):
    d = np.array([[1.0, 0, 2], [0, 0, 3]])
    csr = SparseTensor(layout="csr", compressed_indices=np.array([0, 2, 3], np.int32),
                       plain_indices=np.array([0, 2, 2], np.int32), values=np.array([1.0, 2.0, 3.0]),
                       dense_shape=[2, 3])
    np.testing.assert_array_equal(client.to_dense(csr), d)
    out = client.mul(csr, np.array([10.0, 20.0, 30.0]))
    assert out.layout == "csr" and out.values.tolist() == [10.0, 60.0, 90.0]
    assert out.compressed_indices.dtype == np.int32
    out = client.add(csr, csr, threshold=0.0)
    assert out.layout == "csr" and out.values.tolist() == [2.0, 4.0, 6.0]
    np.testing.assert_array_equal(client.add(csr, np.ones((2, 3))), d + 1)
    out = client.map_values(csr, "neg")
    assert out.layout == "csr" and out.values.tolist() == [-1.0, -2.0, -3.0]
    out = client.select(csr, [1])
    assert out.layout == "coo" and out.indices.tolist() == [[2]] and out.values.tolist() == [3.0]
    out = client.concat(0, [csr, csr])
    assert out.layout == "csr" and out.to_dense().tolist() == np.concatenate([d, d]).tolist()
    out = client.coalesce(csr)
    assert out.layout == "csr" and out.plain_indices.tolist() == [0, 2, 2]
    out, empty = client.fill_empty_rows(csr, 0.0)
    assert out.layout == "csr" and empty.tolist() == [False, False]


def test_gpu_kernels_leave_compressed_inputs_to_the_cpu():
    """The ops' GPU kernels take COO; a compressed input falls back (reason "layout") and gets
    the CPU kernel's answer (the numpy stand-in runs the GPU code paths here)."""
    from sparseserve.server.device import ArrayBackend
    from sparseserve.server.ops import REGISTRY

    fallbacks = []
    be = ArrayBackend.numpy_stand_in()
    be.on_fallback = lambda op, reason: fallbacks.append((op, reason))
    d = np.array([[1.0, 0, 2], [0, 0, 3]])
    csr = run("convert", sp_input=run("from_dense", tensor=d), layout="csr")
    calls = [("reorder", {"sp_input": csr}), ("coalesce", {"sp_input": csr}), ("to_dense", {"sp_input": csr}),
             ("with_values", {"sp_input": csr, "new_values": np.ones(3)}),
             ("mul", {"sp_input": csr, "dense": np.full(3, 2.0)}), ("div", {"sp_input": csr, "dense": np.full(3, 2.0)}),
             ("add", {"a": csr, "b": csr}), ("add", {"a": csr, "b": np.ones((2, 3))}),
             ("map_values", {"sp_input": csr, "fn": "neg"})]
    for name, args in calls:
        fallbacks.clear()
        op = REGISTRY.get(name)
        plan = op.plan(op.bind(args))
        got = be.to_host(be.run(op, plan)[0])
        assert fallbacks == [(name, "layout")], (name, fallbacks)
        assert_eq(got, op.run_plan("cpu", plan)[0], what=name, exact=True)
