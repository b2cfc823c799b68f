"""Observability against a real server: ``GET /metrics`` counts exactly the calls made, request ids
travel both ways on every wire, and the server logs one JSON line per request."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import time
from collections import Counter

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparseserve import AsyncClient, Client, SparseTensor
from sparseserve.errors import (InvalidArgumentError, NotFoundError, SparseServeError, UnauthenticatedError,
                                UnavailableError)

from conftest import ONE_TOKEN, ONE_TOKEN_INFO_LOGS, WIRES, ServerProcess, make_client

TOKEN = ONE_TOKEN
AUTH = {"authorization": f"Bearer {TOKEN}"}
FRESH_ID = re.compile(r"[0-9a-f]{32}")
GOOD = SparseTensor(indices=[[1, 2], [0, 0]], values=[2.0, 1.0], dense_shape=[3, 4])
BAD = SparseTensor(indices=[[0, 9]], values=[1.0], dense_shape=[3, 4])  # index out of range


@pytest.fixture(scope="module")
def srv(shared_server):
    """A server logging at INFO with one token (tests/server/test_server_docs_offline.py's too)."""
    return shared_server(*ONE_TOKEN_INFO_LOGS)


def client(s: ServerProcess, wire: str) -> Client:
    return make_client(s, wire, token=TOKEN)


def scrape(s: ServerProcess) -> dict[tuple, float]:
    """Every sample of /metrics, by (name, sorted labels). No token: /metrics is the operator's."""
    response = httpx.get(f"{s.http_url}/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.text) for sample in family.samples}


def moved(before: dict, after: dict, name: str) -> dict[tuple, float]:
    """The samples of ``name`` that changed, by their labels as a dict's items."""
    return {labels: after[key] - before.get(key, 0.0)
            for key in after if key[0] == name and after[key] != before.get(key, 0.0)
            for labels in [key[1]]}


def settled(s: ServerProcess, before: dict, expected: dict) -> dict:
    """The scrape once the request counter has moved by ``expected`` (a REST request is counted
    when its handler returns, which may be a moment after the client has the whole reply)."""
    deadline = time.monotonic() + 5
    while True:
        after = scrape(s)
        if moved(before, after, "sparseserve_requests_total") == expected or time.monotonic() > deadline:
            return after
        time.sleep(0.05)


def requests_key(wire: str, op: str, code: str) -> tuple:
    return tuple(sorted({"wire": wire, "op": op, "code": code}.items()))


def access_lines(s: ServerProcess) -> list[dict]:
    s._stderr.flush()
    lines = [json.loads(line) for line in s.stderr_path.read_text().splitlines() if line.strip()]
    return [line for line in lines if line["logger"] == "sparseserve.access"]


def access_line(s: ServerProcess, request_id: str) -> dict:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        found = [line for line in access_lines(s) if line["request_id"] == request_id]
        if found:
            assert len(found) == 1, found
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no access line for {request_id!r}")


def test_counters_move_by_exactly_the_calls_made(srv):
    before = scrape(srv)
    with client(srv, "grpc") as c:
        c.call("reorder", sp_input=GOOD)
        c.call("reorder", sp_input=GOOD)
        with pytest.raises(InvalidArgumentError):
            c.call("reorder", sp_input=BAD)
        with pytest.raises(NotFoundError):
            c.call("no_such_op", sp_input=GOOD)
        h = c.put(GOOD)
        c.get(h)
        c.delete(h)
        with pytest.raises(NotFoundError):
            c.delete(h)
    with client(srv, "rest-json") as c:
        c.call("coalesce", sp_input=GOOD)
        with pytest.raises(InvalidArgumentError):
            c.call("coalesce", sp_input=BAD)
        with pytest.raises(NotFoundError):
            c.call("no_such_op", sp_input=GOOD)
        h = c.put(GOOD)
        c.get(h)
        c.delete(h)
    with client(srv, "rest-protobuf") as c:
        c.call("reorder", sp_input=GOOD)
    with Client(srv.http_url) as anonymous, pytest.raises(UnauthenticatedError):
        anonymous.call("reorder", sp_input=GOOD)
    expected = {requests_key(*k): v for k, v in {
        ("grpc", "reorder", "OK"): 2, ("grpc", "reorder", "INVALID_ARGUMENT"): 1,
        ("grpc", "unknown", "NOT_FOUND"): 1, ("grpc", "Upload", "OK"): 1, ("grpc", "Download", "OK"): 1,
        ("grpc", "Delete", "OK"): 1, ("grpc", "Delete", "NOT_FOUND"): 1,
        ("rest", "coalesce", "OK"): 1, ("rest", "coalesce", "INVALID_ARGUMENT"): 1,
        ("rest", "unknown", "NOT_FOUND"): 1, ("rest", "put", "OK"): 1, ("rest", "get", "OK"): 1,
        ("rest", "delete", "OK"): 1, ("rest", "reorder", "OK"): 1, ("rest", "reorder", "UNAUTHENTICATED"): 1,
    }.items()}
    after = settled(srv, before, expected)
    assert moved(before, after, "sparseserve_requests_total") == expected

    # One latency observation per request, in the +Inf bucket too.
    per_op = Counter()
    for labels, n in expected.items():
        d = dict(labels)
        per_op[tuple(sorted({"wire": d["wire"], "op": d["op"]}.items()))] += n
    assert moved(before, after, "sparseserve_request_seconds_count") == dict(per_op)
    inf = {tuple(sorted((*labels, ("le", "+Inf")))): n for labels, n in per_op.items()}
    assert moved(before, after, "sparseserve_request_seconds_bucket").items() >= inf.items()
    assert all(v > 0 for v in moved(before, after, "sparseserve_request_seconds_sum").values())
    for name in ("sparseserve_received_bytes_total", "sparseserve_sent_bytes_total"):
        assert set(moved(before, after, name)) == {(("wire", "grpc"),), (("wire", "rest"),)}
    assert after[("sparseserve_in_flight_requests", ())] == 0


def test_rest_bytes_are_the_bodies_exactly(srv):
    body = json.dumps({"sp_input": {"indices": [[1, 0], [0, 1]], "values": [1, 2], "dense_shape": [2, 2]}})
    before = scrape(srv)
    response = httpx.post(f"{srv.http_url}/v1/ops/reorder", content=body,
                          headers={**AUTH, "content-type": "application/json"})
    assert response.status_code == 200
    after = settled(srv, before, {requests_key("rest", "reorder", "OK"): 1})
    assert moved(before, after, "sparseserve_received_bytes_total") == {(("wire", "rest"),): len(body)}
    assert moved(before, after, "sparseserve_sent_bytes_total") == {(("wire", "rest"),): len(response.content)}


def test_store_gauges_follow_put_and_delete(srv):
    def store():
        s = scrape(srv)
        return s[("sparseserve_store_bytes", ())], s[("sparseserve_store_handles", ())]

    bytes0, handles0 = store()
    with client(srv, "grpc") as c:
        h = c.put(SparseTensor(indices=[[0, 0], [1, 1], [2, 2]], values=[1.0, 2.0, 3.0], dense_shape=[3, 3]))
        assert h.nbytes > 0
        assert store() == (bytes0 + h.nbytes, handles0 + 1)
        c.delete(h)
    assert store() == (bytes0, handles0)


def test_unknown_op_names_share_one_label(srv):
    names = ["zz_op_a", "zz_op_b", 'zz"quote']
    with client(srv, "grpc") as g, client(srv, "rest-json") as r:
        for name in names:
            for c in (g, r):
                with pytest.raises(NotFoundError):
                    c.call(name, x=1)
    text = httpx.get(f"{srv.http_url}/metrics").text
    assert "zz_op" not in text and "zz\\\"quote" not in text and 'op="unknown"' in text


def test_metrics_needs_no_token_and_counts_no_scrape(srv):
    assert httpx.get(f"{srv.http_url}/v1/ops").status_code == 401
    first = scrape(srv)
    second = scrape(srv)
    assert moved(first, second, "sparseserve_requests_total") == {}
    assert not any(dict(k[1]).get("op") in ("metrics", "/metrics") for k in second)


@pytest.mark.parametrize("wire", WIRES)
def test_chosen_request_id_comes_back_on_errors_and_in_the_log(srv, wire):
    rid = f"obs-{wire}:1.a_b"
    with client(srv, wire) as c:
        with pytest.raises(InvalidArgumentError) as info:
            c.call("reorder", sp_input=BAD, request_id=rid)
        assert info.value.request_id == rid
        assert c.reorder(GOOD, request_id=f"{rid}-ok").nnz == 2  # the op methods take it too
        with pytest.raises(NotFoundError) as info:
            c.get("h-" + "0" * 32)
        assert FRESH_ID.fullmatch(info.value.request_id)  # none chosen: the server's own, as logged
    assert access_line(srv, info.value.request_id)["code"] == "NOT_FOUND"
    line = access_line(srv, rid)
    assert line["wire"] == ("grpc" if wire == "grpc" else "rest")
    assert (line["op"], line["code"], line["tenant"]) == ("reorder", "INVALID_ARGUMENT", "tenant-0")
    assert line["level"] == "INFO" and line["bytes_in"] > 0 and line["bytes_out"] >= 0 and line["seconds"] >= 0
    assert access_line(srv, f"{rid}-ok")["code"] == "OK"


def test_the_json_error_body_and_header_carry_the_id(srv):
    response = httpx.post(f"{srv.http_url}/v1/ops/no_such_op", json={}, headers={**AUTH, "x-request-id": "abc-123"})
    assert response.status_code == 404
    assert response.json()["error"]["request_id"] == "abc-123" == response.headers["x-request-id"]
    assert response.json()["error"]["code"] == "NOT_FOUND"


def test_a_request_id_is_made_once_on_first_use():
    from sparseserve.server.metrics import RequestInfo

    info = RequestInfo("grpc", "reorder", None)
    first = info.request_id
    assert FRESH_ID.fullmatch(first) and info.request_id == first  # made once, then kept
    assert RequestInfo("rest", "reorder", "abc-1").request_id == "abc-1"
    assert FRESH_ID.fullmatch(RequestInfo("rest", "reorder", "bad id").request_id)


@pytest.mark.parametrize("bad", ["x" * 500, 'a b"c', "é", ""])
def test_a_bad_request_id_is_replaced_not_echoed(srv, bad):
    response = httpx.post(f"{srv.http_url}/v1/ops/no_such_op", json={},
                          headers={**AUTH, "x-request-id": bad.encode("utf-8")})
    assert response.status_code == 404
    given = response.headers["x-request-id"]
    assert FRESH_ID.fullmatch(given) and response.json()["error"]["request_id"] == given
    with client(srv, "grpc") as c:
        if bad and bad.isascii():  # gRPC metadata is printable ASCII
            with pytest.raises(NotFoundError) as info:
                c.call("no_such_op", x=1, request_id=bad)
            assert FRESH_ID.fullmatch(info.value.request_id)
            assert bad not in srv.log()


def raw_get(s: ServerProcess, request_id: bytes) -> bytes:
    """The head of a GET /healthz reply to hand-made bytes (HTTP clients refuse such headers)."""
    with socket.create_connection(("127.0.0.1", s.http_port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-request-id: " + request_id
                     + b"\r\nconnection: close\r\n\r\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply.split(b"\r\n\r\n")[0]


def test_control_characters_in_a_request_id_never_reach_a_header_or_log_line(srv):
    head = raw_get(srv, b"evil\tid")  # a tab passes the HTTP parser: replaced
    assert re.search(rb"\r\nx-request-id: [0-9a-f]{32}\r\n", head) and b"evil" not in head
    for rid in (b"evil\nid", b"evil\r\n folded"):  # the HTTP parser refuses these before the app
        assert raw_get(srv, rid).startswith(b"HTTP/1.1 400") and b"evil" not in raw_get(srv, rid)
    assert "evil" not in srv.log()
    from sparseserve.server.metrics import request_id_from

    assert FRESH_ID.fullmatch(request_id_from("evil\nid"))  # the same rule, whatever the transport
    assert FRESH_ID.fullmatch(request_id_from("x" * 129))
    assert request_id_from("x" * 128) == "x" * 128


def test_every_rest_response_has_a_request_id(srv):
    with Client(srv.http_url, token=TOKEN) as c:
        h = c.put(GOOD)
    calls = [("GET", "/healthz", None), ("GET", "/readyz", None), ("GET", "/metrics", None),
             ("GET", "/v1/ops", None), ("GET", "/openapi.json", None), ("GET", "/nowhere", None),
             ("PUT", "/v1/ops", None), ("POST", "/v1/ops/reorder", b"{not json"),
             ("GET", f"/v1/tensors/{h.handle}", None), ("DELETE", f"/v1/tensors/{h.handle}", None)]
    for method, path, body in calls:
        for auth in ({}, AUTH):
            response = httpx.request(method, f"{srv.http_url}{path}", content=body, headers=auth)
            assert FRESH_ID.fullmatch(response.headers.get("x-request-id", "")), (method, path, response)
            chosen = httpx.request(method, f"{srv.http_url}{path}", content=body,
                                   headers={**auth, "x-request-id": "my.id:42"})
            assert chosen.headers["x-request-id"] == "my.id:42", (method, path)


def test_every_server_log_line_is_json(srv):
    with client(srv, "grpc") as c, pytest.raises(NotFoundError):
        c.call('no "such"\nop', x=1)
    srv._stderr.flush()
    lines = [line for line in srv.stderr_path.read_text().splitlines() if line.strip()]
    assert lines and all(isinstance(json.loads(line), dict) for line in lines)
    assert any(json.loads(line)["logger"].startswith("uvicorn") for line in lines)  # uvicorn's too


def test_the_formatter_keeps_a_message_on_one_line():
    from sparseserve.server.metrics import JsonFormatter, Metrics, current

    class _Service:
        store = None
        running = queued = 0

    record = logging.LogRecord("sparseserve.test", logging.WARNING, __file__, 1, 'a "quoted"\nmessage %s',
                               ("{brace",), None)
    metrics = Metrics(_Service())
    info, token = metrics.begin("grpc", "reorder", "rid-7")
    try:
        line = JsonFormatter().format(record)
    finally:
        current.reset(token)
    assert "\n" not in line
    assert json.loads(line) | {"time": None} == {"time": None, "level": "WARNING", "logger": "sparseserve.test",
                                                 "message": 'a "quoted"\nmessage {brace', "request_id": "rid-7"}


def test_request_totals_render_as_prometheus_families():
    """The request counters and the latency histogram are plain numbers rendered at scrape time:
    each duration lands in the first bucket whose bound holds it (a bound is inclusive), the
    buckets are cumulative, and the byte counters add up per wire."""
    from sparseserve.server.buffers import BufferPool
    from sparseserve.server.metrics import Metrics

    class _Service:
        class store:
            spilled, dropped = 0, {"evicted": 0}

            @staticmethod
            def stats():
                return 0, 0

            spill_stats = stats
        running = queued = 0
        buffers = BufferPool(0)

    metrics = Metrics(_Service())
    for seconds, code in ((0.0002, "OK"), (0.0004, "OK"), (0.003, "OK"), (100.0, "OK"), (0.0001, "NOT_FOUND")):
        info, token = metrics.begin("grpc", "reorder", None)
        info.start -= seconds
        info.code, info.bytes_in, info.bytes_out = code, 10, 3
        metrics.end(info, token)
    metrics.totals.add(("grpc", "reorder", "OK"), 0.001, 0, 0)  # on a bound: in its bucket
    samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in text_string_to_metric_families(metrics.render().decode())
               for sample in family.samples}
    grpc_reorder = (("op", "reorder"), ("wire", "grpc"))
    assert samples[("sparseserve_requests_total", (("code", "OK"), *grpc_reorder))] == 5
    assert samples[("sparseserve_requests_total", (("code", "NOT_FOUND"), *grpc_reorder))] == 1
    buckets = {dict(labels)["le"]: value for (name, labels), value in samples.items()
               if name == "sparseserve_request_seconds_bucket"}
    assert (buckets["0.0005"], buckets["0.001"], buckets["0.005"], buckets["60.0"], buckets["+Inf"]) == (3, 4, 5, 5, 6)
    assert samples[("sparseserve_request_seconds_count", grpc_reorder)] == 6
    assert samples[("sparseserve_request_seconds_sum", grpc_reorder)] == pytest.approx(100.0047, abs=1e-3)
    assert samples[("sparseserve_received_bytes_total", (("wire", "grpc"),))] == 50
    assert samples[("sparseserve_sent_bytes_total", (("wire", "grpc"),))] == 15


def test_sdk_errors_without_a_server_carry_the_id():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for target in (f"127.0.0.1:{port}", f"http://127.0.0.1:{port}"):
        with Client(target, timeout=5) as c, pytest.raises(UnavailableError) as info:
            c.call("reorder", sp_input=GOOD, request_id="offline-1")
        assert info.value.request_id == "offline-1"


def test_async_client_sends_and_reports_the_id(srv):
    async def main(target, **kwargs):
        async with AsyncClient(target, token=TOKEN, **kwargs) as c:
            with pytest.raises(InvalidArgumentError) as info:
                await c.call("reorder", sp_input=BAD, request_id="async-id")
            return info.value

    for target in (srv.grpc_target, srv.http_url):
        err = asyncio.run(main(target))
        assert err.request_id == "async-id" and isinstance(err, SparseServeError)


def test_access_lines_are_not_built_at_warning(server):
    with make_client(server, "grpc") as c:
        c.call("reorder", sp_input=GOOD, request_id="quiet-1")
    assert "quiet-1" not in server.log() and "sparseserve.access" not in server.log()
