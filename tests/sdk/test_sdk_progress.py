"""``put`` and ``get`` with ``progress=``: the callback's sequence of ``(done_bytes, total_bytes)``
on both wires (REST with protobuf and JSON bodies), from ``Client`` and ``AsyncClient``, against
the session's real server; the tqdm bar; and the argument's errors."""

from __future__ import annotations

import asyncio
import sys
import threading

import httpx
import numpy as np
import pytest

from sparseserve import AsyncClient, NotFoundError, SparseTensor
from sparseserve.core.codec import tensor_to_bytes
from sparseserve.core.jsoncodec import dumps, tensor_to_json

from conftest import WIRES, ServerProcess, make_client
from helpers import assert_eq

MIB = 1 << 20


@pytest.fixture(scope="module")
def big():
    """About 2.9 MB of arrays: several 256 KiB chunks, and three reports of 1 MiB or more."""
    rng = np.random.default_rng(28)
    n = 120_000
    indices = np.stack([rng.integers(0, 2000, n), rng.integers(0, 2000, n)], axis=1)
    return SparseTensor(indices=indices, values=rng.random(n), dense_shape=[2000, 2000])


def check_sequence(calls: list[tuple[int, int]], total: int) -> None:
    """(0, total) first, then done growing by at least a MiB a call (the last may be less),
    ending at (total, total); the total the same in every call."""
    assert calls[0] == (0, total)
    assert calls[-1] == (total, total)
    assert {t for _, t in calls} == {total}
    done = [d for d, _ in calls]
    steps = np.diff(done)
    assert (steps > 0).all(), done
    assert (steps[:-1] >= MIB).all(), done
    assert len(calls) >= 3  # the transfer was reported on its way, not only at its ends


def wire_totals(server, wire: str, tensor: SparseTensor, handle: str) -> tuple[int, int]:
    """(put's total, get's total) as the wire carries them: over gRPC the arrays' bytes; over
    REST the request body, and the response body as the server sends it (read here by httpx)."""
    if wire == "grpc":
        return tensor.nbytes, tensor.nbytes
    protobuf = wire == "rest-protobuf"
    sent = len(tensor_to_bytes(tensor)) if protobuf else len(dumps(tensor_to_json(tensor)))
    accept = "application/x-protobuf" if protobuf else "application/json"
    reply = httpx.get(f"{server.http_url}/v1/tensors/{handle}", headers={"accept": accept})
    assert reply.status_code == 200
    return sent, len(reply.content)


@pytest.mark.parametrize("wire", WIRES)
def test_blocking_put_and_get_report_every_byte(server, big, wire):
    with make_client(server, wire, chunk_bytes=256 << 10) as c:
        put_calls: list[tuple[int, int]] = []
        h = c.put(big, progress=lambda done, total: put_calls.append((done, total)))
        get_calls: list[tuple[int, int]] = []
        back = c.get(h, progress=lambda done, total: get_calls.append((done, total)))
        assert_eq(back, big)
        assert h.nbytes == big.nbytes
        sent, received = wire_totals(server, wire, big, h.handle)
        check_sequence(put_calls, sent)
        check_sequence(get_calls, received)
        c.delete(h)


@pytest.mark.parametrize("wire", WIRES)
def test_async_put_and_get_report_on_the_event_loop(server, big, wire):
    async def transfer():
        loop_thread = threading.get_ident()
        calls: dict[str, list] = {"put": [], "get": []}
        threads = set()

        def recorder(name):
            def record(done, total):
                threads.add(threading.get_ident())
                calls[name].append((done, total))
            return record

        target = server.grpc_target if wire == "grpc" else server.http_url
        encoding = "json" if wire == "rest-json" else "protobuf"
        async with AsyncClient(target, encoding=encoding, chunk_bytes=256 << 10) as c:
            h = await c.put(big, progress=recorder("put"))
            put_seen = list(calls["put"])  # everything reported before put returned
            back = await c.get(h, progress=recorder("get"))
            get_seen = list(calls["get"])
            totals = wire_totals(server, wire, big, h.handle)
            await c.delete(h)
        return back, put_seen, get_seen, totals, threads, loop_thread

    back, put_calls, get_calls, (sent, received), threads, loop_thread = asyncio.run(transfer())
    assert_eq(back, big)
    assert threads == {loop_thread}  # REST's worker thread hands its reports to the loop
    check_sequence(put_calls, sent)
    check_sequence(get_calls, received)


def test_an_empty_tensor_reports_once(server):
    empty = SparseTensor(indices=np.zeros((0, 2), np.int64), values=np.zeros(0), dense_shape=[5, 5])
    with make_client(server, "grpc") as c:
        calls: list[tuple[int, int]] = []
        h = c.put(empty, progress=lambda *a: calls.append(a))
        assert calls == [(0, 0)]
        calls.clear()
        assert c.get(h, progress=lambda *a: calls.append(a)).nnz == 0
        assert calls == [(0, 0)]


def test_shared_memory_reports_once_at_the_end(big):
    srv = ServerProcess("--allow-shared-memory")
    try:
        with make_client(srv, "grpc") as c:
            calls: list[tuple[int, int]] = []
            h = c.put(big, shared_memory=True, progress=lambda *a: calls.append(a))
            assert calls == [(0, big.nbytes), (big.nbytes, big.nbytes)]
            calls.clear()
            assert_eq(c.get(h, shared_memory=True, progress=lambda *a: calls.append(a)), big)
            assert calls == [(0, big.nbytes), (big.nbytes, big.nbytes)]
    finally:
        srv.stop()


@pytest.mark.parametrize("wire", ["grpc", "rest-protobuf"])
def test_a_failed_get_reports_nothing(server, wire):
    calls: list = []
    with make_client(server, wire) as c, pytest.raises(NotFoundError):
        c.get("h-" + "0" * 32, progress=lambda *a: calls.append(a))
    assert calls == []  # the error's body is not the tensor's progress


@pytest.mark.parametrize("wire", ["grpc", "rest-protobuf"])
def test_progress_true_draws_a_tqdm_bar(server, big, wire, capsys):
    tqdm = pytest.importorskip("tqdm", reason="the [progress] extra draws the bar").tqdm
    with make_client(server, wire) as c:
        h = c.put(big, progress=True)
        assert_eq(c.get(h, progress=True), big)
        c.delete(h)
    err = capsys.readouterr().err
    size = tqdm.format_sizeof(big.nbytes, divisor=1024)  # REST's bodies: 84 bytes more, the same here
    assert "put: 100%" in err and "get: 100%" in err, err
    assert f"{size}/{size}" in err, err


def test_progress_true_without_tqdm_says_what_to_install(server, big, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # as if tqdm were not installed
    with make_client(server, "grpc") as c, pytest.raises(ImportError, match=r'sparseserve\[progress\]'):
        c.put(big, progress=True)


@pytest.mark.parametrize("bad", ["yes", 1, [print]])
def test_a_bad_progress_is_a_type_error_naming_it(server, big, bad):
    with make_client(server, "grpc") as c:
        with pytest.raises(TypeError, match="progress must be True"):
            c.put(big, progress=bad)
        with pytest.raises(TypeError, match="progress must be True"):
            c.get("h-" + "0" * 32, progress=bad)
