"""A real server process driven over both wires: the SDK on gRPC, REST with
protobuf bodies and REST with JSON, and raw HTTP as a non-Python caller would."""

from __future__ import annotations

import asyncio
import inspect
import json

import grpc
import httpx
import numpy as np
import pytest

from sparseserve import (AsyncClient, InvalidArgumentError, InvalidArgumentTypeError, NotFoundError, RemoteTensor,
                         ResourceExhaustedError, SparseTensor, UnimplementedError)
from sparseserve.core.dtypes import DTYPE_NAMES

from conftest import WIRES, make_client
from helpers import assert_eq
from strategies import random_coo

VALUES = {"low": 0, "high": 4, "halves": False}  # small integers, also as floats: exact on every wire


def reference_dense(t: SparseTensor) -> np.ndarray:
    out = np.zeros(t.dense_shape, dtype=t.dtype)
    for i in range(t.nnz):
        key = tuple(t.indices[i])
        out[key] = (out[key] | t.values[i]) if t.dtype == np.bool_ else out[key] + t.values[i]
    return out


def test_readme_example_over_every_wire(client):
    st = SparseTensor(indices=[[1, 2], [0, 0]], values=[2.0, 1.0], dense_shape=[3, 4])
    r = client.reorder(st)
    assert r.indices.tolist() == [[0, 0], [1, 2]] and r.values.tolist() == [1.0, 2.0]
    np.testing.assert_array_equal(client.to_dense(r), [[1, 0, 0, 0], [0, 0, 2, 0], [0, 0, 0, 0]])
    assert client.device == "cpu"


def test_op_methods_are_made_once_and_follow_the_catalogue(client):
    first = client.reorder
    assert client.reorder is first and first.__name__ == "reorder"  # kept, not made per call
    assert "sp_input" in str(inspect.signature(first))
    catalogue = client.list_ops()
    client._set_catalogue(client.device, [op for name, op in catalogue.items() if name != "reorder"])
    with pytest.raises(AttributeError):
        _ = client.reorder  # a catalogue without the op drops the method made from the old one
    client._set_catalogue(client.device, list(catalogue.values()))
    assert client.reorder is not first and client.reorder(SparseTensor(indices=[[1], [0]], values=[2.0, 1.0],
                                                                        dense_shape=[2])).values.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
def test_every_dtype_through_every_op(server, dtype):
    rng = np.random.default_rng(len(dtype))
    t = random_coo(rng, (5, 4, 3), 12, dtype, sparse_ndim=2, values=VALUES)  # hybrid, with a duplicate
    for wire in WIRES:
        with make_client(server, wire) as c:
            co = c.coalesce(t)
            dense = reference_dense(t)
            assert co.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(co.to_dense(), dense)
            keys = co.indices[:, 0] * 4 + co.indices[:, 1]
            assert np.all(np.diff(keys) > 0)
            ro = c.reorder(t)
            keys = ro.indices[:, 0] * 4 + ro.indices[:, 1]
            assert np.all(np.diff(keys) >= 0) and ro.nnz == t.nnz
            np.testing.assert_array_equal(c.to_dense(t, validate_indices=False), dense)
            np.testing.assert_array_equal(c.to_dense(co), dense)
            back = c.from_dense(dense, sparse_dim=2)
            np.testing.assert_array_equal(back.to_dense(), dense)
            np.testing.assert_array_equal(c.from_dense(dense).to_dense(), dense)


def test_empty_and_rank_five(client):
    empty = SparseTensor(indices=np.zeros((0, 5), np.int64), values=np.zeros(0, np.float32),
                         dense_shape=[2, 1, 3, 1, 2])
    assert client.coalesce(empty).nnz == 0
    assert client.to_dense(empty, default_value=1.5).tolist() == np.full((2, 1, 3, 1, 2), 1.5).tolist()
    assert client.from_dense(np.zeros((2, 3))).nnz == 0


def test_to_dense_validate_indices(client):
    unsorted = SparseTensor(indices=[[1, 0], [0, 1]], values=[1, 2], dense_shape=[2, 2])
    with pytest.raises(InvalidArgumentError) as info:
        client.to_dense(unsorted)
    assert info.value.reason == "INDICES_UNSORTED" and "sp_input.indices[1] = [0, 1]" in info.value.message
    repeated = SparseTensor(indices=[[0, 1], [0, 1]], values=[1, 2], dense_shape=[2, 2])
    with pytest.raises(InvalidArgumentError) as info:
        client.to_dense(repeated)
    assert info.value.reason == "INDICES_REPEATED"
    assert client.to_dense(repeated, validate_indices=False, default_value=7).tolist() == [[7, 3], [7, 7]]
    with pytest.raises(InvalidArgumentError, match="default_value = 1.5 cannot be represented as int64"):
        client.to_dense(repeated, default_value=1.5, validate_indices=False)


def test_handles_keep_and_ops_on_handles(client):
    st = SparseTensor(indices=[[1, 2], [0, 0], [1, 2]], values=[2.0, 1.0, 4.0], dense_shape=[3, 4])
    h = client.put(st)
    assert isinstance(h, RemoteTensor) and h.nbytes == st.nbytes
    kept = client.coalesce(h, keep=True)
    assert isinstance(kept, RemoteTensor)
    np.testing.assert_array_equal(client.to_dense(kept), [[1, 0, 0, 0], [0, 0, 6, 0], [0, 0, 0, 0]])
    got = client.get(h)
    np.testing.assert_array_equal(got.indices, st.indices)
    dense_handle = client.put(np.eye(3))
    np.testing.assert_array_equal(client.get(dense_handle), np.eye(3))
    for handle in (h, kept, dense_handle):
        client.delete(handle)
    with pytest.raises(NotFoundError) as info:
        client.get(h)
    assert info.value.reason == "UNKNOWN_HANDLE"
    with pytest.raises(NotFoundError):
        client.to_dense(h)


@pytest.mark.parametrize("case", ["malformed", "unknown-op", "unknown-arg", "layout", "too-large", "bad-axis"])
def test_error_classes_are_the_same_on_every_wire(server, case):
    """Each failure raises the same SDK class and reason over gRPC and both REST encodings."""
    seen = set()
    for wire in WIRES:
        with make_client(server, wire) as c:
            with pytest.raises(Exception) as info:
                if case == "malformed":
                    c.reorder(SparseTensor(indices=[[0, 0], [1, 7]], values=[1.0, 2.0], dense_shape=[3, 4]))
                elif case == "unknown-op":
                    c.call("no_such_op", x=1)
                elif case == "unknown-arg":
                    c.call("reorder", sp_input=np.eye(2), bogus=1)
                elif case == "layout":
                    c.index_select(SparseTensor(layout="csc", compressed_indices=[0, 1], plain_indices=[0],
                                                values=[1.0], dense_shape=[1, 1]), dim=0, index=[0])
                elif case == "too-large":
                    c.to_dense(SparseTensor(indices=[[0, 0]], values=[1.0], dense_shape=[100_000, 100_000]))
                else:
                    c.from_dense(np.eye(2), sparse_dim=3)
            seen.add((type(info.value), info.value.reason, info.value.code))
    assert len(seen) == 1, seen
    cls, reason, _ = seen.pop()
    expected = {"malformed": (InvalidArgumentError, "INDEX_OUT_OF_RANGE"),
                "unknown-op": (NotFoundError, "UNKNOWN_OP"),
                "unknown-arg": (InvalidArgumentTypeError, "UNKNOWN_ARGUMENT"),  # a TypeError too
                "layout": (UnimplementedError, "UNSUPPORTED_LAYOUT"),
                "too-large": (ResourceExhaustedError, "RESULT_TOO_LARGE"),
                "bad-axis": (InvalidArgumentError, "AXIS_OUT_OF_RANGE")}[case]
    assert (cls, reason) == expected


def test_raw_http_json(server):
    body = {"sp_input": {"indices": [[1, 2], [0, 0]], "values": [2, 1], "dense_shape": [3, 4]}}
    r = httpx.post(f"{server.http_url}/v1/ops/reorder", json=body)
    assert r.status_code == 200
    assert r.json() == {"outputs": {"output": {"layout": "coo", "dtype": "int64", "dense_shape": [3, 4],
                                               "indices": [[0, 0], [1, 2]], "values": [1, 2]}}}
    r = httpx.post(f"{server.http_url}/v1/ops/to_dense", json={**body, "validate_indices": False,
                                                                "default_value": -1})
    assert r.json()["outputs"]["output"] == {"dtype": "int64", "shape": [3, 4],
                                             "data": [1, -1, -1, -1, -1, -1, 2, -1, -1, -1, -1, -1]}


@pytest.mark.parametrize("request_kwargs, status, code, reason, words", [
    ({"json": {"sp_input": {"indices": [[0, 0], [1, 2], [2, 3], [0, 7]], "values": [1, 2, 3, 4],
                            "dense_shape": [3, 4]}}},
     400, "INVALID_ARGUMENT", "INDEX_OUT_OF_RANGE",
     "sp_input.indices[3, 1] = 7 is out of range for sp_input.dense_shape[1] = 4"),
    ({"json": {"sp_input": {"indices": [[0]], "values": [1, 2], "dense_shape": [3]}}},
     400, "INVALID_ARGUMENT", "VALUES_SHAPE_MISMATCH", "sp_input.values"),
    ({"content": b"{not json", "headers": {"content-type": "application/json"}},
     422, "INVALID_ARGUMENT", "BAD_JSON", "not valid JSON"),
    ({"json": [1, 2]}, 422, "INVALID_ARGUMENT", "BAD_JSON", "JSON object"),
    ({"json": {"sp_input": {"indices": [[0]], "values": [1], "dense_shape": [3]}, "extra": 1}},
     422, "INVALID_ARGUMENT", "UNKNOWN_ARGUMENT", "'extra'"),
    ({"json": {}}, 422, "INVALID_ARGUMENT", "MISSING_ARGUMENT", "'sp_input'"),
    ({"content": b"\xff\xff", "headers": {"content-type": "application/x-protobuf"}},
     422, "INVALID_ARGUMENT", "BAD_BODY", "ExecuteRequest"),
    ({"json": {"sp_input": {"handle": "h-nope"}}}, 404, "NOT_FOUND", "UNKNOWN_HANDLE", "h-nope"),
    ({"json": {"sp_input": {"indices": [[0, 0]], "values": [1.0], "dense_shape": [100000, 100000]}}},
     413, "RESOURCE_EXHAUSTED", "RESULT_TOO_LARGE", "--max-result-bytes"),
])
def test_raw_http_errors_and_server_keeps_serving(server, request_kwargs, status, code, reason, words):
    r = httpx.post(f"{server.http_url}/v1/ops/to_dense", **request_kwargs)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert (err["code"], err["reason"]) == (code, reason)
    assert words in err["message"]
    assert httpx.get(f"{server.http_url}/healthz").json() == {"status": "ok"}


def test_raw_grpc_malformed_tensor_gets_invalid_argument_with_reason(server):
    from sparseserve.v1 import sparseserve_pb2 as pb
    from sparseserve.v1 import sparseserve_pb2_grpc as pb_grpc

    request = pb.ExecuteRequest(op="coalesce")
    sp = request.args["sp_input"].tensor.sparse
    sp.dense_shape[:] = [3, 4]
    sp.indices.CopyFrom(pb.Array(dtype=pb.INT64, shape=[1, 2], data=b"\0" * 15))  # one byte short
    sp.values.CopyFrom(pb.Array(dtype=pb.FLOAT64, shape=[1], data=b"\0" * 8))
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = pb_grpc.SparseServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Execute(request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "sp_input.indices.data has 15 bytes" in info.value.details()
        assert dict(info.value.trailing_metadata())["sparseserve-reason"] == "BUFFER_LENGTH"
        ops = stub.ListOps(pb.ListOpsRequest())
        assert {"reorder", "coalesce", "to_dense", "from_dense"} <= {op.name for op in ops.ops}


def test_raw_grpc_request_that_is_no_message_gets_invalid_argument(server):
    with grpc.insecure_channel(server.grpc_target) as channel:
        execute = channel.unary_unary("/sparseserve.v1.SparseService/Execute", request_serializer=None,
                                      response_deserializer=None)
        for body in (b"\xff", b"\x12\xff\xff"):
            with pytest.raises(grpc.RpcError) as info:
                execute(body)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert dict(info.value.trailing_metadata())["sparseserve-reason"] == "BAD_BODY"
    with make_client(server, "grpc") as c:
        assert c.reorder(SparseTensor(indices=[[1], [0]], values=[2, 1], dense_shape=[2])).values.tolist() == [1, 2]


def test_big_requests_go_by_execute_stream_with_the_same_answers(server):
    """Requests over ``stream_above_bytes`` travel as MessageFrames both ways (sync and async
    SDK); answers, kept handles and errors are those of unary Execute."""
    rng = np.random.default_rng(5)
    st = random_coo(rng, (300, 400), 3000, values=VALUES)
    dense = rng.standard_normal((300, 400))

    def refuse_unary(*args, **kwargs):
        raise AssertionError("a request over stream_above_bytes went by unary Execute")

    with make_client(server, "grpc") as unary, make_client(server, "grpc", stream_above_bytes=0) as c:
        c._transport._raw.execute = refuse_unary
        product = unary.mul(st, dense)
        assert_eq(c.mul(st, dense), product, exact=True)
        assert np.array_equal(c.to_dense(st, validate_indices=False), reference_dense(st))
        kept = c.add(st, st, keep=True)
        assert isinstance(kept, RemoteTensor)
        assert_eq(c.get(kept), unary.add(st, st), exact=True)
        with pytest.raises(InvalidArgumentError) as info:
            c.to_dense(SparseTensor(indices=[[5]], values=[1.0], dense_shape=[3]))
        assert info.value.reason == "INDEX_OUT_OF_RANGE"

    async def main():
        async with AsyncClient(server.grpc_target, stream_above_bytes=0) as ac:
            ac._transport._raw.execute = refuse_unary
            return await ac.call("mul", sp_input=st, dense=dense)

    assert_eq(asyncio.run(main()), product, exact=True)


def test_raw_execute_stream_refuses_bad_streams_and_keeps_serving(server):
    from sparseserve.core.frames import message_frames
    from sparseserve.v1 import sparseserve_pb2 as pb

    request = pb.ExecuteRequest(op="reorder", args={"sp_input": pb.Value(tensor=pb.Tensor(sparse=pb.SparseTensor(
        dense_shape=[3], indices=pb.Array(dtype=pb.INT64, shape=[2, 1], data=np.array([2, 0]).tobytes()),
        values=pb.Array(dtype=pb.FLOAT64, shape=[2], data=np.array([1.0, 2.0]).tobytes()))))})
    whole = request.SerializeToString()
    cases = [
        (list(message_frames([whole], 5)), None, None),
        ([pb.MessageFrame(total_bytes=1 << 40).SerializeToString()], grpc.StatusCode.RESOURCE_EXHAUSTED,
         "REQUEST_TOO_LARGE"),
        ([pb.MessageFrame(total_bytes=len(whole), data=whole[:-1]).SerializeToString()],
         grpc.StatusCode.INVALID_ARGUMENT, "BUFFER_LENGTH"),
        ([b"\xff\xff"], grpc.StatusCode.INVALID_ARGUMENT, "BAD_STREAM"),
        (list(message_frames([b"\x12\xff\xff"])), grpc.StatusCode.INVALID_ARGUMENT, "BAD_BODY"),
    ]
    with grpc.insecure_channel(server.grpc_target) as channel:
        execute_stream = channel.stream_stream("/sparseserve.v1.SparseService/ExecuteStream",
                                               request_serializer=None, response_deserializer=None)
        for frames, code, reason in cases:
            if code is None:
                replies = [pb.MessageFrame.FromString(f) for f in execute_stream(iter(frames))]
                response = pb.ExecuteResponse.FromString(b"".join(r.data for r in replies))
                assert replies[0].total_bytes == len(response.SerializeToString())
                values = np.frombuffer(response.outputs[0].tensor.sparse.values.data, np.float64)
                assert values.tolist() == [2.0, 1.0]
                continue
            with pytest.raises(grpc.RpcError) as info:
                list(execute_stream(iter(frames)))
            assert info.value.code() == code
            assert dict(info.value.trailing_metadata())["sparseserve-reason"] == reason
    with make_client(server, "grpc") as c:
        assert c.reorder(SparseTensor(indices=[[1], [0]], values=[2, 1], dense_shape=[2])).values.tolist() == [1, 2]


def test_grpc_health_and_reflection(server):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(server.grpc_target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "sparseserve.v1.SparseService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = {s.name for r in replies for s in r.list_services_response.service}
        assert {"sparseserve.v1.SparseService", "grpc.health.v1.Health"} <= names


def test_health_ready_docs_and_catalogue(server):
    assert httpx.get(f"{server.http_url}/readyz").json() == {"status": "ready", "device": "cpu"}
    catalogue = httpx.get(f"{server.http_url}/v1/ops").json()
    ops = {op["name"]: op for op in catalogue["ops"]}
    assert [a["name"] for a in ops["to_dense"]["args"]] == ["sp_input", "default_value", "validate_indices"]
    assert ops["to_dense"]["args"][2] == {"name": "validate_indices", "type": "bool", "required": False,
                                          "default": True, "doc": "Require sorted, unique indices.",
                                          "layouts": []}
    schema = httpx.get(f"{server.http_url}/openapi.json").json()
    for name in ops:
        body = schema["paths"][f"/v1/ops/{name}"]["post"]["requestBody"]["content"]["application/json"]
        assert set(body["schema"]["properties"]) == {a["name"] for a in ops[name]["args"]}
    assert "Tensor" in schema["components"]["schemas"]
    assert httpx.get(f"{server.http_url}/docs").status_code == 200


def test_sdk_methods_come_from_the_catalogue(server):
    import inspect

    with make_client(server, "grpc") as c:
        names = set(c.list_ops())
        assert names <= set(dir(c))
        sig = inspect.signature(c.to_dense)
        assert list(sig.parameters) == ["sp_input", "default_value", "validate_indices", "keep", "request_id"]
        assert sig.parameters["validate_indices"].default is True
        assert "tf.sparse.to_dense" in c.to_dense.__doc__
        with pytest.raises(AttributeError):
            _ = c.not_an_op


def test_inputs_from_scipy_and_tensorflow_like_objects(client):
    sp = pytest.importorskip("scipy.sparse")
    m = sp.random(20, 30, density=0.1, format="coo", random_state=1)
    out = client.coalesce(m)
    np.testing.assert_allclose(out.to_dense(), m.toarray())
    np.testing.assert_allclose(out.to_scipy().toarray(), m.toarray())

    class TFLike:  # what tf.sparse.SparseTensor exposes
        indices = np.array([[0, 1]])
        values = np.array([5.0])
        dense_shape = np.array([2, 2])

    assert client.to_dense(TFLike()).tolist() == [[0, 5], [0, 0]]


def test_async_client(server):
    async def main():
        results = []
        for target, enc in ((server.grpc_target, "protobuf"), (server.http_url, "protobuf"),
                            (server.http_url, "json")):
            async with AsyncClient(target, encoding=enc) as c:
                await c.list_ops()
                st = SparseTensor(indices=[[1], [0], [1]], values=[1, 2, 3], dense_shape=[3])
                outs = await asyncio.gather(*(c.coalesce(st) for _ in range(8)))
                h = await c.put(st)
                dense = await c.to_dense(h, validate_indices=False)
                assert (await c.get(h)).nnz == 3
                await c.delete(h)
                with pytest.raises(NotFoundError):
                    await c.call("to_dense", sp_input=h)
                results.append((outs[0].values.tolist(), dense.tolist()))
        return results

    assert asyncio.run(main()) == [([2, 4], [2, 4, 0])] * 3


HOSTILE_BODIES = [
    {"sp_input": {"indices": [[0]], "values": [1], "dense_shape": [10**30]}},
    {"sp_input": {"indices": [[10**30]], "values": [1], "dense_shape": [3]}},
    {"sp_input": {"indices": [[-1]], "values": [1], "dense_shape": [3]}},
    {"sp_input": {"indices": [[0]], "values": [1], "dense_shape": [-3]}},
    {"sp_input": {"indices": [[0, 0]], "values": [1], "dense_shape": [2**62, 2**62]}},
    {"sp_input": {"indices": [[0]], "values": ["a"], "dense_shape": [3]}},
    {"sp_input": {"indices": [[0]], "values": [{"x": 1}], "dense_shape": [3]}},
    {"sp_input": {"indices": "nope", "values": [1], "dense_shape": [3]}},
    {"sp_input": {"indices": [[0]], "dense_shape": [3]}},
    {"sp_input": {"compressed_indices": [0, 1], "plain_indices": [5], "values": [1.0], "dense_shape": [1, 2]}},
    {"sp_input": {"compressed_indices": [0, 1], "values": [1.0], "dense_shape": [1, 2], "layout": "csr"}},
    {"sp_input": 5},
    {"sp_input": None},
    {"sp_input": {"indices": [[0]], "values": [1], "dense_shape": [3]}, "default_value": "x"},
    {"sp_input": {"indices": [[0]], "values": [1], "dense_shape": [3]}, "validate_indices": 3},
    {"sp_input": {"indices": [[0]], "values": [1], "dense_shape": [3]}, "default_value": [[[1]]]},
    {"sp_input": {"dtype": "float64", "shape": [2**40, 2**40], "data": []}},
    {"sp_input": json.loads("[" * 100 + "1" + "]" * 100)},
    {"tensor": {"dtype": "float64", "shape": [3], "data": [1, 2, 3]}, "sparse_dim": 2**70},
]


@pytest.mark.parametrize("body", HOSTILE_BODIES, ids=range(len(HOSTILE_BODIES)))
def test_hostile_json_gets_a_client_error_not_a_crash(server, body):
    op = "from_dense" if "tensor" in body else "to_dense"
    r = httpx.post(f"{server.http_url}/v1/ops/{op}", json=body)
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error"]["code"] in ("INVALID_ARGUMENT", "UNIMPLEMENTED", "RESOURCE_EXHAUSTED")
    assert httpx.get(f"{server.http_url}/healthz").status_code == 200


def test_megabytes_put_and_get_intact_over_every_wire(client):
    """Bigger than one chunk or socket buffer: gRPC streams frames, REST+protobuf streams the
    spliced message both ways (arrays used in place, 16-byte aligned)."""
    rng = np.random.default_rng(3)
    nnz = 400_000  # 9.6 MB: over two gRPC chunks and many socket buffers
    st = SparseTensor(indices=rng.integers(0, 50_000, (nnz, 2)), values=rng.standard_normal(nnz),
                      dense_shape=[50_000, 50_000])
    handle = client.put(st)
    back = client.get(handle)
    client.delete(handle)
    assert np.array_equal(back.indices, st.indices) and np.array_equal(back.values, st.values)
    assert back.dense_shape == st.dense_shape
