"""The hostile-input table: one real server with every limit set low and two tenants, attacked
over gRPC, REST with protobuf bodies and REST with JSON bodies. Each case asserts the exact
code and reason, and that the server then still answers a valid call correctly."""

from __future__ import annotations

import asyncio

import grpc
import httpx
import numpy as np
import pytest

from sparseserve import Client, SparseTensor
from sparseserve.core.jsoncodec import tensor_to_json as json_tensor
from sparseserve.core.tensor import HandleRef
from sparseserve.errors import SparseServeError
from sparseserve.server.config import ServerConfig
from sparseserve.server.device import ArrayBackend
from sparseserve.server.ops import REGISTRY
from sparseserve.server.service import Service

from conftest import WIRES, ServerProcess, make_client

ALICE, BOB = "alice-secret", "bob-secret"
KiB = 1 << 10
LIMITS = {"--max-request-bytes": 256 * KiB, "--max-result-bytes": 1024 * KiB, "--max-nnz": 5000,
          "--max-rank": 6, "--max-json-depth": 12, "--store-bytes": 512 * KiB, "--tenant-store-bytes": 200 * KiB}

G = SparseTensor(indices=[[0, 0], [1, 2]], values=[1.0, 2.0], dense_shape=[3, 4])
I64 = SparseTensor(indices=[[0, 0], [1, 2]], values=np.array([1, 2], np.int64), dense_shape=[3, 4])
# index_select is declared for COO and CSR only (no library selects along a CSC tensor).
CSC = SparseTensor(layout="csc", compressed_indices=[0, 1, 1, 1, 2], plain_indices=[0, 2], values=[1.0, 2.0],
                   dense_shape=[3, 4])


def coo(indices, values, shape, dtype=np.float64) -> SparseTensor:
    return SparseTensor(indices=np.asarray(indices, np.int64).reshape(len(values), -1),
                        values=np.asarray(values, dtype), dense_shape=shape)


def diagonal(n: int) -> SparseTensor:
    return coo(np.repeat(np.arange(n), 2).reshape(n, 2), np.ones(n), [n, n])


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tokens = tmp_path_factory.mktemp("tokens") / "tokens"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\n")
    flags = [str(x) for pair in LIMITS.items() for x in pair]
    s = ServerProcess("--token-file", str(tokens), *flags)
    yield s
    code = s.stop()
    assert code == 0, f"server exited with {code}: {s.log()}"


def still_answers(s: ServerProcess) -> None:
    for wire in WIRES:
        with make_client(s, wire, token=ALICE) as c:
            out = c.reorder(coo([[2, 0], [0, 1]], [5.0, 6.0], [3, 2]))
            assert out.indices.tolist() == [[0, 1], [2, 0]] and out.values.tolist() == [6.0, 5.0]


# (case, op, arguments, code, reason): every class of bad input the ops check, and every limit.
CASES = [
    # docs/contract.md ("Tensors") invariants
    ("index past the shape", "to_dense", dict(sp_input=coo([[0, 9]], [1.0], [3, 4])),
     "INVALID_ARGUMENT", "INDEX_OUT_OF_RANGE"),
    ("negative index", "coalesce", dict(sp_input=coo([[-1, 0]], [1.0], [3, 4])), "INVALID_ARGUMENT",
     "INDEX_OUT_OF_RANGE"),
    ("negative dimension", "reorder", dict(sp_input=coo([[0, 0]], [1.0], [-3, 4])), "INVALID_ARGUMENT",
     "NEGATIVE_DIMENSION"),
    ("more values than indices", "reorder",
     dict(sp_input=SparseTensor(indices=np.zeros((1, 2), np.int64), values=np.ones(2), dense_shape=[3, 4])),
     "INVALID_ARGUMENT", "VALUES_SHAPE_MISMATCH"),
    ("repeated index where unique ones are needed", "to_dense",
     dict(sp_input=coo([[1, 2], [1, 2]], [1.0, 2.0], [3, 4])), "INVALID_ARGUMENT", "INDICES_REPEATED"),
    ("decreasing row pointers", "to_dense",
     dict(sp_input=SparseTensor(layout="csr", compressed_indices=[0, 2, 1, 2], plain_indices=[0, 3],
                                values=[1.0, 2.0], dense_shape=[3, 4])),
     "INVALID_ARGUMENT", "COMPRESSED_DECREASING"),
    ("shape whose size overflows int64", "reorder", dict(sp_input=coo([[0, 0]], [1.0], [1 << 40, 1 << 40])),
     "INVALID_ARGUMENT", "SHAPE_OVERFLOW"),
    # op-specific rules
    ("reduction axis out of range", "reduce_sum", dict(sp_input=G, axis=5), "INVALID_ARGUMENT",
     "AXIS_OUT_OF_RANGE"),
    ("softmax axis out of range", "softmax", dict(sp_input=G, axis=-3), "INVALID_ARGUMENT", "AXIS_OUT_OF_RANGE"),
    ("concat axis out of range", "concat", dict(axis=3, sp_inputs=[G, G]), "INVALID_ARGUMENT",
     "AXIS_OUT_OF_RANGE"),
    ("dense side that does not broadcast", "mul", dict(sp_input=G, dense=np.ones((2, 4))), "INVALID_ARGUMENT",
     "SHAPE_MISMATCH"),
    ("add of different shapes", "add", dict(a=G, b=coo([[0, 0]], [1.0], [4, 3])), "INVALID_ARGUMENT",
     "SHAPE_MISMATCH"),
    ("concat of unequal other dimensions", "concat", dict(axis=0, sp_inputs=[G, coo([[0, 0]], [1.0], [1, 5])]),
     "INVALID_ARGUMENT", "SHAPE_MISMATCH"),
    ("matmul of shapes that do not multiply", "matmul", dict(a=G, b=np.ones((3, 2))), "INVALID_ARGUMENT",
     "SHAPE_MISMATCH"),
    ("mask of the wrong length", "retain", dict(sp_input=G, to_retain=np.array([True])), "INVALID_ARGUMENT",
     "SHAPE_MISMATCH"),
    ("new values of the wrong length", "with_values", dict(sp_input=G, new_values=np.ones(3)),
     "INVALID_ARGUMENT", "VALUES_SHAPE_MISMATCH"),
    ("reshape that changes the size", "reshape", dict(sp_input=G, shape=[5, 5]), "INVALID_ARGUMENT",
     "SHAPE_SIZE_MISMATCH"),
    ("two inferred dimensions", "reshape", dict(sp_input=G, shape=[-1, -1]), "INVALID_ARGUMENT",
     "MULTIPLE_INFERRED_DIMENSIONS"),
    ("not a permutation", "transpose", dict(sp_input=G, perm=[0, 0]), "INVALID_ARGUMENT", "BAD_PERMUTATION"),
    ("negative slice size", "slice", dict(sp_input=G, start=[0, 0], size=[-1, 1]), "INVALID_ARGUMENT",
     "NEGATIVE_SLICE"),
    ("slice start of the wrong rank", "slice", dict(sp_input=G, start=[0], size=[1, 1]), "INVALID_ARGUMENT",
     "RANK_MISMATCH"),
    ("value past the vocabulary", "to_indicator", dict(sp_input=I64, vocab_size=1), "INVALID_ARGUMENT",
     "VALUE_OUT_OF_RANGE"),
    ("negative vocabulary", "to_indicator", dict(sp_input=I64, vocab_size=-1), "INVALID_ARGUMENT",
     "NEGATIVE_DIMENSION"),
    ("integer division by zero", "div", dict(sp_input=I64, dense=np.zeros((3, 4), np.int64)), "INVALID_ARGUMENT",
     "DIVISION_BY_ZERO"),
    ("select index out of range", "select", dict(sp_input=G, index=[7]), "INVALID_ARGUMENT",
     "INDEX_OUT_OF_RANGE"),
    ("dense indices out of the output shape", "sparse_to_dense",
     dict(sparse_indices=np.array([[5, 0]]), output_shape=[3, 4], sparse_values=np.array([1.0]),
          default_value=0.0), "INVALID_ARGUMENT", "INDEX_OUT_OF_RANGE"),
    ("unknown function", "map_values", dict(sp_input=G, fn="exec"), "INVALID_ARGUMENT", "UNKNOWN_FUNCTION"),
    ("blocksize that does not divide", "convert", dict(sp_input=G, layout="bsr", blocksize=[2, 3]),
     "INVALID_ARGUMENT", "BLOCKSIZE"),
    ("layout the op is not declared for", "index_select", dict(input=CSC, dim=0, index=np.array([0])),
     "UNIMPLEMENTED", "UNSUPPORTED_LAYOUT"),
    # limits
    ("dense result over --max-result-bytes", "to_dense", dict(sp_input=coo([[0, 0]], [1.0], [100000, 100000])),
     "RESOURCE_EXHAUSTED", "RESULT_TOO_LARGE"),
    ("more stored values than --max-nnz", "reorder", dict(sp_input=diagonal(5001)), "RESOURCE_EXHAUSTED",
     "NNZ_TOO_LARGE"),
    ("result with more stored values than --max-nnz", "matmul",  # an outer product: 80 x 80 entries
     dict(a=coo([[i, 0] for i in range(80)], np.ones(80), [80, 1]),
          b=coo([[0, i] for i in range(80)], np.ones(80), [1, 80])), "RESOURCE_EXHAUSTED", "NNZ_TOO_LARGE"),
    ("tensor of more dimensions than --max-rank", "reorder", dict(sp_input=coo([[0] * 7], [1.0], [2] * 7)),
     "RESOURCE_EXHAUSTED", "RANK_TOO_LARGE"),
    ("shape argument longer than --max-rank", "reshape", dict(sp_input=G, shape=[1] * 10 + [12]),
     "RESOURCE_EXHAUSTED", "RANK_TOO_LARGE"),
    ("list of tensors, one over --max-nnz", "concat", dict(axis=0, sp_inputs=[G, diagonal(5001)]),
     "RESOURCE_EXHAUSTED", "NNZ_TOO_LARGE"),
    ("unknown op", "no_such_op", dict(sp_input=G), "NOT_FOUND", "UNKNOWN_OP"),
]


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("case, op, args, code, reason", CASES, ids=[c[0] for c in CASES])
def test_hostile_call_gets_its_exact_error_and_the_server_keeps_serving(srv, wire, case, op, args, code, reason):
    with make_client(srv, wire, token=ALICE) as c:
        with pytest.raises(SparseServeError) as info:
            c.call(op, **args)
        assert (info.value.code, info.value.reason) == (code, reason), info.value
        assert info.value.request_id
    still_answers(srv)


@pytest.fixture(scope="module")
def gpu_worker():
    """A GPU worker's service in process, numpy standing in for CuPy, with the same limits."""
    config = ServerConfig(**{flag[2:].replace("-", "_"): value for flag, value in LIMITS.items()})
    service = Service(config, REGISTRY, backend=ArrayBackend.numpy_stand_in())
    yield service
    service.close()


def _as_handles(service: Service, value):
    """``value`` with each tensor the store accepts replaced by its handle (held in device memory)."""
    if isinstance(value, list):
        return [_as_handles(service, v) for v in value]
    if not isinstance(value, SparseTensor):
        return value
    try:
        return HandleRef(asyncio.run(service.put(value, ""))[0])
    except SparseServeError:  # an invalid tensor: it stays an inline argument
        return value


@pytest.mark.parametrize("held", [False, True], ids=["inline", "device-handles"])
@pytest.mark.parametrize("case, op, args, code, reason", CASES, ids=[c[0] for c in CASES])
def test_a_gpu_worker_refuses_each_hostile_call_as_the_cpu_does(gpu_worker, held, case, op, args, code, reason):
    """The GPU backend's dispatch (its supports checks, its kernels) gives the exact code and
    reason the CPU kernels give, whether the tensors come inline or from device-held handles."""
    if held:
        args = {name: _as_handles(gpu_worker, value) for name, value in args.items()}
    with pytest.raises(SparseServeError) as info:
        asyncio.run(gpu_worker.execute(op, args, False, ""))
    assert (info.value.code, info.value.reason) == (code, reason), info.value


def test_limit_errors_name_the_limit_and_the_asked_size(srv):
    with make_client(srv, "grpc", token=ALICE) as c:
        for op, args, words in [
            ("reorder", dict(sp_input=diagonal(5001)), ["5001 stored values", "limit of 5000", "--max-nnz"]),
            ("reorder", dict(sp_input=coo([[0] * 7], [1.0], [2] * 7)), ["rank 7", "limit of 6", "--max-rank"]),
            ("to_dense", dict(sp_input=coo([[0, 0]], [1.0], [400, 400])),
             ["1280000 bytes", f"limit of {1024 * KiB} bytes", "--max-result-bytes"]),
        ]:
            with pytest.raises(SparseServeError) as info:
                c.call(op, **args)
            assert all(w in info.value.message for w in words), info.value.message


def test_tenants_cannot_reach_each_others_handles(srv):
    for wire in WIRES:
        with make_client(srv, wire, token=ALICE) as alice, make_client(srv, wire, token=BOB) as bob:
            h = alice.put(G)
            assert h.handle.startswith("h-") and len(h.handle) == 34  # 128 random bits
            for attempt in (lambda h=h: bob.get(h), lambda h=h: bob.delete(h), lambda h=h: bob.to_dense(h),
                            lambda h=h: bob.call("concat", axis=0, sp_inputs=[G, h])):
                with pytest.raises(SparseServeError) as info:
                    attempt()
                assert (info.value.code, info.value.reason) == ("PERMISSION_DENIED", "OTHER_TENANT"), info.value
                assert "1.0" not in info.value.message and "2.0" not in info.value.message
            with pytest.raises(SparseServeError) as info:
                bob.get("h-" + "0" * 32)
            assert (info.value.code, info.value.reason) == ("NOT_FOUND", "UNKNOWN_HANDLE")
            np.testing.assert_array_equal(alice.to_dense(h), G.to_dense())  # untouched by bob
            alice.delete(h)
    still_answers(srv)


@pytest.mark.parametrize("token, reason", [(None, "MISSING_TOKEN"), ("wrong", "BAD_TOKEN")])
def test_calls_without_a_valid_token_are_refused_on_every_wire(srv, token, reason):
    for wire in WIRES:
        with make_client(srv, wire, token=token) as c:
            for attempt in (lambda: c.reorder(G), lambda: c.put(G), lambda: c.get("h-" + "1" * 32)):
                with pytest.raises(SparseServeError) as info:
                    attempt()
                assert (info.value.code, info.value.reason) == ("UNAUTHENTICATED", reason)
    still_answers(srv)


def test_requests_over_max_request_bytes_are_refused_on_every_wire(srv):
    big = diagonal(20000)  # 480 kB as protobuf, about 400 kB as JSON
    for wire in WIRES:
        with make_client(srv, wire, token=ALICE) as c:
            with pytest.raises(SparseServeError) as info:
                c.reorder(big)
            # Over gRPC, gRPC's own message limit answers before the handler runs; the SDK
            # gives its refusal the same reason.
            assert (info.value.code, info.value.reason) == ("RESOURCE_EXHAUSTED", "REQUEST_TOO_LARGE")
            assert f"{256 * KiB}" in info.value.message
    # Streamed in frames each under the limit: the handler's own check refuses the whole;
    # in 1 MiB frames, gRPC's limit refuses the first frame.
    for chunk_bytes in (64 * KiB, 1 << 20):
        with Client(srv.grpc_target, token=ALICE, stream_above_bytes=0, chunk_bytes=chunk_bytes) as c:
            with pytest.raises(SparseServeError) as info:
                c.reorder(big)
            assert (info.value.code, info.value.reason) == ("RESOURCE_EXHAUSTED", "REQUEST_TOO_LARGE")
            assert f"{256 * KiB}" in info.value.message
    still_answers(srv)


def test_the_store_budget_evicts_instead_of_growing(srv):
    with make_client(srv, "grpc", token=ALICE) as c, make_client(srv, "grpc", token=BOB) as bob:
        bobs = bob.put(G)
        handles = [c.put(diagonal(4000)) for _ in range(8)]  # 96 kB each, 768 kB in all
        kept = []
        for h in handles:
            try:
                c.get(h)
                kept.append(h)
            except SparseServeError as err:
                assert (err.code, err.reason) == ("NOT_FOUND", "EVICTED")  # told so, not unknown
        assert kept == handles[-2:]  # her least recently used went first, down to her budget
        np.testing.assert_array_equal(bob.to_dense(bobs), G.to_dense())  # alice's puts cannot evict bob's
        with pytest.raises(SparseServeError) as info:
            c.put(diagonal(30000))  # bigger than the whole store
        assert (info.value.code, info.value.reason) == ("RESOURCE_EXHAUSTED", "STORE_BUDGET")
        for h in kept:
            c.delete(h)
        bob.delete(bobs)
    for wire in WIRES:  # bigger than one tenant's budget: a quota, 429 over HTTP
        with make_client(srv, wire, token=ALICE) as c, pytest.raises(SparseServeError) as info:
            c.put(np.ones((200, 130)))  # 208 kB
        assert (info.value.code, info.value.reason) == ("RESOURCE_EXHAUSTED", "TENANT_QUOTA")
        assert "--tenant-store-bytes" in info.value.message
    response = httpx.post(f"{srv.http_url}/v1/tensors", json=json_tensor(np.ones((200, 130))),
                          headers={"authorization": f"Bearer {ALICE}"})
    assert response.status_code == 429 and response.json()["error"]["reason"] == "TENANT_QUOTA"
    still_answers(srv)


def rest(srv, path: str, body: bytes, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{srv.http_url}{path}", content=body,
                      headers={"authorization": f"Bearer {ALICE}", "content-type": "application/json",
                               **(headers or {})}, timeout=30)


def nested(depth: int) -> str:
    return "[" * (depth - 1) + "1" + "]" * (depth - 1)  # depth levels inside a JSON object


@pytest.mark.parametrize("path, body, headers, status, code, reason", [
    ("/v1/ops/reorder", b'{"sp_input": ' + nested(13).encode() + b"}", None, 413, "RESOURCE_EXHAUSTED",
     "JSON_TOO_DEEP"),
    ("/v1/ops/reorder", b'{"sp_input": ' + nested(100000).encode() + b"}", None, 413, "RESOURCE_EXHAUSTED",
     "JSON_TOO_DEEP"),
    ("/v1/tensors", nested(40).encode(), None, 413, "RESOURCE_EXHAUSTED", "JSON_TOO_DEEP"),
    ("/v1/pipelines", b'{"steps": ' + nested(30).encode() + b"}", None, 413, "RESOURCE_EXHAUSTED",
     "JSON_TOO_DEEP"),
    ("/v1/ops/reorder", b"{not json", None, 422, "INVALID_ARGUMENT", "BAD_JSON"),
    ("/v1/ops/reorder", b"\xff\xfe", {"content-type": "application/x-protobuf"}, 422, "INVALID_ARGUMENT",
     "BAD_BODY"),
    ("/v1/ops/reorder", b"x" * (300 * KiB), None, 413, "RESOURCE_EXHAUSTED", "REQUEST_TOO_LARGE"),
    ("/v1/ops/reorder", b'{"sp_input": {"indices": [[0]], "values": [1], "dense_shape": [2]}}',
     {"x-request-timeout": "soon"}, 400, "INVALID_ARGUMENT", "BAD_TIMEOUT"),
    ("/v1/ops/reorder", b'{"sp_input": {"indices": [[0]], "values": [1], "dense_shape": [2]}}',
     {"x-request-timeout": "-1"}, 400, "INVALID_ARGUMENT", "BAD_TIMEOUT"),
    ("/v1/ops/reorder", b'{"sp_input": {"handle": "h-' + b"0" * 32 + b'"}}', None, 404, "NOT_FOUND",
     "UNKNOWN_HANDLE"),
    ("/v1/ops/reorder", b'{"sp_input": {"indices": [[0]], "values": [1], "dense_shape": [2]}}',
     {"authorization": "Bearer nope"}, 401, "UNAUTHENTICATED", "BAD_TOKEN"),
])
def test_hostile_http_bodies_and_headers(srv, path, body, headers, status, code, reason):
    response = rest(srv, path, body, headers)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["code"], error["reason"]) == (code, reason), error
    assert error["request_id"] == response.headers["x-request-id"]
    still_answers(srv)


def test_hostile_grpc_bytes(srv):
    """Raw bytes that are no ExecuteRequest, straight to the gRPC method."""
    metadata = (("authorization", f"Bearer {ALICE}"),)
    with grpc.insecure_channel(srv.grpc_target) as channel:
        execute = channel.unary_unary("/sparseserve.v1.SparseService/Execute", request_serializer=None,
                                      response_deserializer=None)
        for raw, code, reason in [(b"\xff\xff\xff", grpc.StatusCode.INVALID_ARGUMENT, "BAD_BODY"),
                                  (b"", grpc.StatusCode.NOT_FOUND, "UNKNOWN_OP"),
                                  (b"\x0a\x07reorder\x12\xff", grpc.StatusCode.INVALID_ARGUMENT, "BAD_BODY")]:
            with pytest.raises(grpc.RpcError) as info:
                execute(raw, metadata=metadata, timeout=30)
            assert info.value.code() == code, (raw, info.value)
            assert dict(info.value.trailing_metadata())["sparseserve-reason"] == reason
    still_answers(srv)


def test_metrics_saw_no_server_error(srv):
    """After every attack above: no INTERNAL or UNKNOWN among the counted requests."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{srv.http_url}/metrics").text
    counted = [s.labels for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "sparseserve_requests_total"]
    codes = {labels["code"] for labels in counted}
    assert {"OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "PERMISSION_DENIED"} <= codes
    assert [labels for labels in counted if labels["code"] in ("INTERNAL", "UNKNOWN")] == []
