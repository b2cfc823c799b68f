"""split, expand_dims, eye, reset_shape, spdiags: errors in-process, every op over the three
wires, and list outputs (split's) end to end: the wire forms, keep=True, pipelines, AsyncClient.
Their answers against TensorFlow and PyTorch: tests/oracle/test_oracle_construct.py."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import numpy as np
import pytest

from conftest import WIRES, make_client, op_raises, run_op
from sparseserve import (AsyncClient, InvalidArgumentError, ResourceExhaustedError, SparseTensor,
                         UnimplementedError)
from sparseserve.core.frames import outputs_from_bytes, outputs_to_bytes
from sparseserve.core.jsoncodec import dumps, loads, tensor_to_json
from sparseserve.core.tensor import HandleRef
from sparseserve._wire import outputs_from_json
from sparseserve.v1 import sparseserve_pb2 as pb

ST = SparseTensor(indices=[[0, 4], [0, 1], [1, 2], [2, 0], [0, 1]], values=[1.0, 2, 3, 4, 5],
                  dense_shape=[3, 5])


def _triples(pieces):
    return [(p.indices.tolist(), p.values.tolist(), list(p.dense_shape)) for p in pieces]


# What tf.sparse.split answers for ST (2 pieces along the columns; checked by the oracle tests too).
SPLIT_ST = [([[0, 1], [1, 2], [2, 0], [0, 1]], [2.0, 3.0, 4.0, 5.0], [3, 3]), ([[0, 1]], [1.0], [3, 2])]


# ------------------------------------------------------------------ in-process
def test_split_uneven_sizes_and_order():
    row = SparseTensor(indices=[[0, 4], [0, 3], [0, 0], [0, 2], [0, 1]], values=[5, 4, 1, 3, 2],
                       dense_shape=[1, 5])
    pieces = run_op("split", sp_input=row, num_split=3, axis=1)
    assert _triples(pieces) == [([[0, 0], [0, 1]], [1, 2], [1, 2]), ([[0, 1], [0, 0]], [4, 3], [1, 2]),
                                ([[0, 0]], [5], [1, 1])]


def test_split_dense_axis_of_hybrid():
    t = SparseTensor(indices=[[1], [0]], values=np.arange(8, dtype=np.int16).reshape(2, 4), dense_shape=[2, 4])
    a, b = run_op("split", sp_input=t, num_split=2, axis=1)
    assert a.indices.tolist() == b.indices.tolist() == [[1], [0]]
    assert a.values.tolist() == [[0, 1], [4, 5]] and b.values.tolist() == [[2, 3], [6, 7]]
    assert tuple(a.dense_shape) == (2, 2)


def test_split_compressed_gives_row_major_coo():
    csr = SparseTensor(layout="csr", compressed_indices=[0, 2, 3], plain_indices=[2, 0, 1],
                       values=[1.0, 2.0, 3.0], dense_shape=[2, 3])
    left, right = run_op("split", sp_input=csr, num_split=2, axis=1)
    assert left.layout == "coo" and left.indices.tolist() == [[0, 0], [1, 1]] and left.values.tolist() == [2, 3]
    assert right.indices.tolist() == [[0, 0]] and tuple(right.dense_shape) == (2, 1)


@pytest.mark.parametrize("kwargs, reason", [
    (dict(num_split=0, axis=0), "BAD_NUM_SPLIT"),
    (dict(num_split=4, axis=0), "BAD_NUM_SPLIT"),      # more pieces than rows
    (dict(num_split=1, axis=2), "AXIS_OUT_OF_RANGE"),
    (dict(num_split=1, axis=-3), "AXIS_OUT_OF_RANGE"),
])
def test_split_errors(kwargs, reason):
    err = op_raises(InvalidArgumentError, reason, "split", sp_input=ST, **kwargs)
    assert ("num_split" if reason == "BAD_NUM_SPLIT" else "axis") in err.message


def test_split_of_empty_dimension_is_refused():
    empty = SparseTensor(indices=np.zeros((0, 2), np.int64), values=np.zeros(0), dense_shape=[0, 3])
    op_raises(InvalidArgumentError, "BAD_NUM_SPLIT", "split", sp_input=empty, num_split=1, axis=0)


def test_expand_dims_hybrid_and_errors():
    t = SparseTensor(indices=[[0], [2]], values=np.ones((2, 3)), dense_shape=[3, 3])
    sparse_axis = run_op("expand_dims", sp_input=t, axis=1)
    assert sparse_axis.indices.tolist() == [[0, 0], [2, 0]] and tuple(sparse_axis.dense_shape) == (3, 1, 3)
    dense_axis = run_op("expand_dims", sp_input=t, axis=-1)
    assert dense_axis.indices.tolist() == [[0], [2]] and dense_axis.values.shape == (2, 3, 1)
    for axis in (3, -4):
        err = op_raises(InvalidArgumentError, "AXIS_OUT_OF_RANGE", "expand_dims", sp_input=t, axis=axis)
        assert "axis" in err.message and "[-3, 2]" in err.message


def test_eye_errors():
    op_raises(InvalidArgumentError, "NEGATIVE_DIMENSION", "eye", num_rows=-1)
    op_raises(InvalidArgumentError, "NEGATIVE_DIMENSION", "eye", num_rows=2, num_columns=-1)
    op_raises(InvalidArgumentError, "BAD_DTYPE", "eye", num_rows=2, dtype="float8")
    op_raises(InvalidArgumentError, "SHAPE_OVERFLOW", "eye", num_rows=1 << 40)


def test_reset_shape_rules():
    assert tuple(run_op("reset_shape", sp_input=ST).dense_shape) == (3, 5)
    sparse = SparseTensor(indices=[[0, 1]], values=[1.0], dense_shape=[4, 6])
    assert tuple(run_op("reset_shape", sp_input=sparse).dense_shape) == (1, 2)
    assert tuple(run_op("reset_shape", sp_input=ST, new_shape=[4, 7]).dense_shape) == (4, 7)
    empty = SparseTensor(indices=np.zeros((0, 2), np.int64), values=np.zeros(0), dense_shape=[0, 3])
    assert tuple(run_op("reset_shape", sp_input=empty).dense_shape) == (0, 0)
    op_raises(InvalidArgumentError, "SHAPE_TOO_SMALL", "reset_shape", sp_input=ST, new_shape=[3, 4])
    op_raises(InvalidArgumentError, "SHAPE_TOO_SMALL", "reset_shape", sp_input=sparse, new_shape=[2, 6])
    op_raises(InvalidArgumentError, "RANK_MISMATCH", "reset_shape", sp_input=ST, new_shape=[3])
    op_raises(InvalidArgumentError, "NEGATIVE_DIMENSION", "reset_shape", sp_input=ST, new_shape=[-3, 5])
    op_raises(InvalidArgumentError, "SHAPE_OVERFLOW", "reset_shape", sp_input=ST, new_shape=[1 << 62, 1 << 62])
    hybrid = SparseTensor(indices=[[1]], values=np.ones((1, 2)), dense_shape=[4, 2])
    out = run_op("reset_shape", sp_input=hybrid)
    assert tuple(out.dense_shape) == (2, 2)
    op_raises(InvalidArgumentError, "DENSE_DIMS_CHANGED", "reset_shape", sp_input=hybrid, new_shape=[4, 3])


def test_spdiags_errors():
    d = np.ones((2, 3))
    cases = [
        (dict(diagonals=d, offsets=np.array([0, 0]), shape=[3, 3]), InvalidArgumentError, "DUPLICATE_OFFSETS"),
        (dict(diagonals=d, offsets=np.array([0]), shape=[3, 3]), InvalidArgumentError, "SIZE_MISMATCH"),
        (dict(diagonals=np.ones((1, 1, 3)), offsets=np.array([0]), shape=[3, 3]), InvalidArgumentError,
         "BAD_DIAGONALS"),
        (dict(diagonals=d, offsets=np.array([[0, 1]]), shape=[3, 3]), InvalidArgumentError, "BAD_OFFSETS"),
        (dict(diagonals=d, offsets=np.array([0.0, 1.0]), shape=[3, 3]), InvalidArgumentError, "BAD_OFFSETS"),
        (dict(diagonals=d, offsets=np.array([0, 1]), shape=[3, 3, 3]), InvalidArgumentError, "RANK_MISMATCH"),
        (dict(diagonals=d, offsets=np.array([0, 1]), shape=[-1, 3]), InvalidArgumentError, "NEGATIVE_DIMENSION"),
        (dict(diagonals=d, offsets=np.array([0, 1]), shape=[3, 3], layout="bsr"), UnimplementedError,
         "UNSUPPORTED_LAYOUT"),
        (dict(diagonals=d, offsets=np.array([0, 1]), shape=[3, 3], layout="dia"), InvalidArgumentError,
         "BAD_LAYOUT"),
    ]
    for kwargs, cls, reason in cases:
        op_raises(cls, reason, "spdiags", **kwargs)


def test_spdiags_far_offsets_store_nothing():
    # torch's CPU kernel corrupts memory on these; the answer is the empty diagonal.
    out = run_op("spdiags", diagonals=np.arange(1.0, 7).reshape(2, 3),
                 offsets=np.array([np.iinfo(np.int64).min, 9]), shape=[3, 3])
    assert out.nnz == 0 and tuple(out.dense_shape) == (3, 3)
    narrow = run_op("spdiags", diagonals=np.zeros((1, 0)), offsets=np.array([1]), shape=[4, 5])
    assert narrow.nnz == 0


# ------------------------------------------------------------------ list outputs on the wires (codecs)
@pytest.mark.parametrize("items", [0, 1, 3])
def test_list_output_codecs_round_trip(items):
    pieces = [SparseTensor(indices=[[i]], values=[float(i)], dense_shape=[5]) for i in range(items)]
    outputs = [("first", np.arange(3.0)), ("output", pieces), ("last", np.int64(7) * np.ones((), np.int64))]
    body = outputs_to_bytes(outputs)
    names = [o.name for o in pb.ExecuteResponse.FromString(body).outputs]
    assert names == ["first", "output[]", *[f"output[{i}]" for i in range(items)], "last"]
    back = outputs_from_bytes(body)
    assert [n for n, _ in back] == ["first", "output", "last"]
    assert [(p.indices.tolist(), p.values.tolist()) for p in back[1][1]] == [([[i]], [float(i)]) for i in range(items)]
    as_json = loads(dumps({"outputs": {n: [tensor_to_json(x) for x in v] if isinstance(v, list) else tensor_to_json(v)
                                       for n, v in outputs}}))
    assert isinstance(as_json["outputs"]["output"], list) and len(as_json["outputs"]["output"]) == items
    again = outputs_from_json(as_json)
    assert len(again[1][1]) == items
    handles = outputs_from_json({"outputs": {"output": [{"handle": "a"}, {"handle": "b"}]}})
    assert handles == [("output", [HandleRef("a"), HandleRef("b")])]


@pytest.mark.parametrize("entries", [
    [("output[]", np.array(2, np.int64))],                                   # counts more than follow
    [("output[]", np.array([1.0]))],                                         # not an integer scalar
    [("output[]", np.array(1, np.int64)), ("other", np.zeros(1))],           # not output[0]
])
def test_list_output_bad_count_is_refused(entries):
    with pytest.raises(InvalidArgumentError) as info:
        outputs_from_bytes(outputs_to_bytes(entries))
    assert info.value.reason == "BAD_BODY"


# ------------------------------------------------------------------ every op over the wires
def test_split_over_the_wires(client):
    pieces = client.split(ST, num_split=2, axis=-1)
    assert isinstance(pieces, list) and _triples(pieces) == SPLIT_ST
    assert client.list_ops()["split"]["outputs"][0]["type"] == "sparse_list"


def test_split_keep_returns_a_list_of_handles(client):
    handles = client.split(ST, 2, 1, keep=True)
    assert isinstance(handles, list) and len(handles) == 2
    assert _triples([h.get() for h in handles]) == SPLIT_ST
    dense = client.to_dense(handles[1])  # a kept piece is an argument like any handle
    np.testing.assert_array_equal(dense, [[0, 1.0], [0, 0], [0, 0]])
    for h in handles:
        h.delete()


def test_other_ops_over_the_wires(client):
    assert client.expand_dims(ST, axis=0).indices.tolist() == [[0, *i] for i in ST.indices.tolist()]
    e = client.eye(3, num_columns=4, dtype="int8")
    assert e.indices.tolist() == [[0, 0], [1, 1], [2, 2]] and e.values.dtype == np.int8
    assert tuple(client.reset_shape(ST, new_shape=[5, 5]).dense_shape) == (5, 5)
    assert tuple(client.reset_shape(SparseTensor(indices=[[1, 1]], values=[1.0], dense_shape=[4, 4])).dense_shape) \
        == (2, 2)
    sp = client.spdiags(np.arange(1.0, 13).reshape(3, 4), np.array([0, -1, 2]), [4, 5])
    assert sp.indices.T.tolist() == [[0, 1, 2, 3, 1, 2, 3, 0, 1], [0, 1, 2, 3, 0, 1, 2, 2, 3]]
    csr = client.spdiags(np.arange(1.0, 13).reshape(3, 4), np.array([0, -1, 2]), [4, 5], layout="csr")
    assert csr.layout == "csr" and csr.compressed_indices.tolist() == [0, 2, 5, 7, 9]
    with pytest.raises(InvalidArgumentError) as info:
        client.split(ST, num_split=9, axis=0)
    assert info.value.reason == "BAD_NUM_SPLIT"


def test_huge_eye_is_refused_before_allocating(client):
    with pytest.raises(ResourceExhaustedError) as info:
        client.eye(10**9)
    assert info.value.reason == "RESULT_TOO_LARGE"
    with pytest.raises(ResourceExhaustedError):
        client.split(SparseTensor(indices=[[0]], values=[1.0], dense_shape=[10**8]), num_split=10**7, axis=0)


# ------------------------------------------------------------------ pipelines
def test_pipeline_with_list_outputs(client):
    p = client.pipeline()
    parts = p.split(ST, num_split=2, axis=1)
    joined = p.concat(axis=1, sp_inputs=parts.output)          # the whole list
    second = p.reorder(parts.output[1])                       # one element
    whole, one, again = p.run(parts.output, second.output, joined.output)
    assert _triples(whole) == SPLIT_ST
    assert one.indices.tolist() == [[0, 1]]
    assert tuple(again.dense_shape) == (3, 5) and again.nnz == 5
    # An element chosen as an output, with keep: a handle; the whole list: a list of handles.
    p = client.pipeline()
    parts = p.split(ST, num_split=2, axis=1)
    kept_list, kept_one = p.run(parts.output, parts.output[0], keep=True)
    assert len(kept_list) == 2 and _triples([kept_one.get()]) == SPLIT_ST[:1]
    for h in (*kept_list, kept_one):
        h.delete()


def test_pipeline_list_reference_errors(client):
    p = client.pipeline()
    parts = p.split(ST, num_split=2, axis=1)
    p.reorder(parts.output[5])
    with pytest.raises(InvalidArgumentError) as info:
        p.run()
    assert info.value.reason == "BAD_REF" and "output[5]" in info.value.message
    p = client.pipeline()
    parts = p.split(ST, num_split=2, axis=1)
    p.reorder(parts.output)  # a list where one tensor goes: refused before anything runs
    with pytest.raises(InvalidArgumentError) as info:
        p.run()
    assert info.value.reason == "BAD_REF" and "list output" in info.value.message


# ------------------------------------------------------------------ raw wire forms
def _post(server, path: str, body: dict, accept: str = "application/json") -> bytes:
    request = urllib.request.Request(server.http_url + path, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json", "accept": accept})
    with urllib.request.urlopen(request) as response:
        return response.read()


def test_rest_forms_of_a_list_output(server):
    body = {"sp_input": tensor_to_json(ST), "num_split": 2, "axis": 1}
    out = json.loads(_post(server, "/v1/ops/split", body))["outputs"]
    assert [len(p["indices"]) for p in out["output"]] == [4, 1]
    kept = json.loads(_post(server, "/v1/ops/split?keep=true", body))["outputs"]["output"]
    assert all(set(h) == {"handle", "info"} for h in kept) and len(kept) == 2
    # Each kept part says what it holds: the two halves' shapes and entries.
    assert [(h["info"]["layout"], h["info"]["shape"], h["info"]["nnz"]) for h in kept] == \
        [("coo", [p["dense_shape"][0], p["dense_shape"][1]], len(p["indices"])) for p in out["output"]]
    raw = pb.ExecuteResponse.FromString(_post(server, "/v1/ops/split", body, "application/x-protobuf"))
    assert [o.name for o in raw.outputs] == ["output[]", "output[0]", "output[1]"]
    catalogue = json.loads(urllib.request.urlopen(server.http_url + "/v1/ops").read())
    assert {o["type"] for op in catalogue["ops"] if op["name"] == "split" for o in op["outputs"]} == {"sparse_list"}
    pipeline = {"steps": [{"name": "a", "op": "split", "args": body},
                          {"name": "b", "op": "concat", "args": {"axis": 1, "sp_inputs": [{"ref": "a.output"}]}}],
                "outputs": ["a.output", "a.output[1]", "b.output"]}
    out = json.loads(_post(server, "/v1/pipelines", pipeline))["outputs"]
    assert len(out["a.output"]) == 2 and out["a.output[1]"]["indices"] == [[0, 1]] and \
        len(out["b.output"]["indices"]) == 5


# ------------------------------------------------------------------ AsyncClient
@pytest.mark.parametrize("wire", WIRES)
def test_async_client_list_outputs(server, wire):
    async def go():
        target = server.grpc_target if wire == "grpc" else server.http_url
        kwargs = {} if wire == "grpc" else {"encoding": "protobuf" if wire == "rest-protobuf" else "json"}
        async with AsyncClient(target, **kwargs) as c:
            pieces = await c.call("split", sp_input=ST, num_split=2, axis=1)
            assert _triples(pieces) == SPLIT_ST
            handles = await c.call("split", sp_input=ST, num_split=3, axis=0, keep=True)
            got = [await h.get() for h in handles]
            assert [list(p.dense_shape) for p in got] == [[1, 5]] * 3
            await c.list_ops()
            p = c.pipeline()
            parts = p.split(ST, num_split=2, axis=1)
            one = await p.run(parts.output[0])
            assert one.indices.tolist() == SPLIT_ST[0][0]
            assert (await c.eye(2)).values.tolist() == [1.0, 1.0]
            for h in handles:
                await h.delete()

    asyncio.run(go())


def test_split_through_a_kept_input(server):
    with make_client(server, "grpc") as c:
        h = c.put(ST)
        assert _triples(c.split(h, num_split=2, axis=1)) == SPLIT_ST
        h.delete()
