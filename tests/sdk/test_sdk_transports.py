"""Transports as objects (``sparseserve._transport``): a client picks one from its target, once,
and from then on only calls it, whichever wire it speaks.

A recording transport stands in for the wire to show what each client method asks of it and
what it makes of the answer; the target table and the settings the clients keep are checked
without a server; ``AsyncClient``'s REST calls in flight are not capped by asyncio's default
executor."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any

import numpy as np
import pytest

from sparseserve import AsyncClient, Client, RemoteTensor, SparseTensor
from sparseserve._transport import AsyncTransport, Settings, Stored, Transport
from sparseserve._transport_grpc import AsyncGrpcTransport, GrpcTransport
from sparseserve._transport_rest import AsyncRestTransport, RestTransport
from sparseserve.core.tensor import HandleRef
from sparseserve.server.ops import REGISTRY

from test_sdk_http import fake_server, no_proxy_env, not_found_kept_alive  # noqa: F401 (fixtures)

ST = SparseTensor(indices=[[1, 0], [0, 1]], values=[2.0, 1.0], dense_shape=[2, 2])


@pytest.mark.parametrize("target, wire, address, tls, blocking, awaited", [
    ("127.0.0.1:1", "grpc", "127.0.0.1:1", False, GrpcTransport, AsyncGrpcTransport),
    ("grpc://127.0.0.1:1", "grpc", "127.0.0.1:1", False, GrpcTransport, AsyncGrpcTransport),
    ("grpcs://127.0.0.1:1", "grpc", "127.0.0.1:1", True, GrpcTransport, AsyncGrpcTransport),
    ("http://127.0.0.1:1/", "rest", "http://127.0.0.1:1", False, RestTransport, AsyncRestTransport),
    ("https://127.0.0.1:1/sparse", "rest", "https://127.0.0.1:1/sparse", True, RestTransport, AsyncRestTransport),
])
def test_the_target_picks_the_transport(target, wire, address, tls, blocking, awaited):
    settings = Settings.parse(target)
    assert (settings.wire, settings.address, settings.tls) == (wire, address, tls)
    with Client(target) as c:
        assert type(c._transport) is blocking and c.wire == wire and c.tls == tls

    async def main():
        async with AsyncClient(target) as ac:
            return type(ac._transport)

    assert asyncio.run(main()) is awaited


def test_settings_are_checked_and_read_only():
    with pytest.raises(ValueError, match="encoding"):
        Client("127.0.0.1:1", encoding="xml")
    with pytest.raises(ValueError, match="ca_file"):
        Settings.parse("http://127.0.0.1:1", ca_file="ca.pem")
    with Client("http://127.0.0.1:1", token="t", timeout=2.5, encoding="json", stream_above_bytes=7) as c:
        assert (c.target, c.token, c.timeout, c.encoding, c.stream_above_bytes) == (
            "http://127.0.0.1:1", "t", 2.5, "json", 7)
        with pytest.raises(AttributeError):
            c.timeout = 5  # the transport was made with 2.5: a new value would change nothing


class Recording(Transport):
    """A wire that answers from memory and notes each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def _note(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))

    def list_ops(self):
        self._note("list_ops")
        return "cpu", [op.describe() for op in REGISTRY]

    def execute(self, op, args, keep, request_id):
        self._note("execute", op, args, keep, request_id)
        if op == "split":
            return [("output", [HandleRef("h-a"), HandleRef("h-b")] if keep else [ST, ST])]
        if op == "fill_empty_rows":
            return [("output", ST), ("empty_row_indicator", np.zeros(2, bool))]
        return [("output", HandleRef("h-k") if keep else ST)]

    def run_pipeline(self, steps, outputs, keep):
        self._note("run_pipeline", [op for _, op, _ in steps], outputs, keep)
        return [("s1.output", np.eye(2))]

    def put(self, tensor, partitions):
        self._note("put", partitions)
        return Stored("h-put", 32)

    def get(self, handle):
        self._note("get", handle)
        return ST

    def delete(self, handle):
        self._note("delete", handle)

    def put_shared(self, tensor):
        self._note("put_shared")
        return Stored("h-shm", 32)

    def get_shared(self, handle):
        self._note("get_shared", handle)
        return ST

    def close(self):
        self._note("close")


class AsyncRecording(AsyncTransport):
    """``Recording``, awaited."""

    def __init__(self, recording: Recording):
        self.recording = recording

    async def list_ops(self):
        return self.recording.list_ops()

    async def execute(self, op, args, keep, request_id):
        return self.recording.execute(op, args, keep, request_id)

    async def run_pipeline(self, steps, outputs, keep):
        return self.recording.run_pipeline(steps, outputs, keep)

    async def put(self, tensor, partitions):
        return self.recording.put(tensor, partitions)

    async def get(self, handle):
        return self.recording.get(handle)

    async def delete(self, handle):
        self.recording.delete(handle)

    async def put_shared(self, tensor):
        return self.recording.put_shared(tensor)

    async def get_shared(self, handle):
        return self.recording.get_shared(handle)

    async def close(self):
        self.recording.close()


async def settled(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def exercise(c: Client | AsyncClient) -> list:
    """The client surface once through (an AsyncClient's answers awaited)."""
    results = [(await settled(c.list_ops()))["reorder"]["name"], await settled(c.reorder(ST))]
    results.append(await settled(c.call("fill_empty_rows", sp_input=ST, default_value=0.0, request_id="r-1")))
    results.append(await settled(c.split(ST, 2, 0, keep=True)))
    results.append(await settled(c.put(np.eye(2), partitions=3)))
    results.append(await settled(c.put(np.eye(2), shared_memory=True)))
    results.append(await settled(c.get(results[-1])))
    results.append(await settled(c.get("h-x", shared_memory=True)))
    results.append(await settled(c.delete(results[-4])))
    p = c.pipeline()
    p.to_dense(p.coalesce(ST))
    results.append(await settled(p.run()))
    await settled(c.close())
    return results


EXPECTED_CALLS = [
    ("list_ops", ()),
    ("execute", ("reorder", {"sp_input": ST}, False, None)),
    ("execute", ("fill_empty_rows", {"sp_input": ST, "default_value": 0.0}, False, "r-1")),
    ("execute", ("split", {"sp_input": ST, "num_split": 2, "axis": 0}, True, None)),
    ("put", (3,)), ("put_shared", ()), ("get", ("h-shm",)), ("get_shared", ("h-x",)), ("delete", ("h-put",)),
    ("run_pipeline", (["coalesce", "to_dense"], [], False)),
    ("close", ()),
]


def check(c: Any, recording: Recording, results: list) -> None:
    assert recording.calls == EXPECTED_CALLS
    name, reordered, (filled, empty), parts, put, shared, got, got_shared, deleted, piped = results
    assert name == "reorder" and reordered is ST and filled is ST and empty.tolist() == [False, False]
    assert [type(p) for p in parts] == [RemoteTensor, RemoteTensor] and [p.handle for p in parts] == ["h-a", "h-b"]
    assert all(p.client is c for p in (*parts, put, shared))
    assert (put.handle, put.nbytes, shared.handle) == ("h-put", 32, "h-shm")
    assert got is ST and got_shared is ST and deleted is None
    np.testing.assert_array_equal(piped, np.eye(2))


def test_client_only_calls_its_transport():
    recording = Recording()
    c = Client("127.0.0.1:1")
    c._transport.close()
    c._transport = recording
    check(c, recording, asyncio.run(exercise(c)))


def test_async_client_only_calls_its_transport():
    recording = Recording()

    async def main():
        c = AsyncClient("127.0.0.1:1")
        await c._transport.close()
        c._transport = AsyncRecording(recording)
        return c, await exercise(c)

    c, results = asyncio.run(main())
    check(c, recording, results)


def test_async_rest_calls_in_flight_are_not_capped_by_the_default_executor(fake_server, no_proxy_env):  # noqa: F811
    """18 calls at once to a server that takes 0.5 s to answer each (each on its own
    connection): about one answer's time, where the loop's default executor (6 threads on 2
    cores) would take three."""
    def slow(conn):
        time.sleep(0.5)
        not_found_kept_alive(conn)

    srv = fake_server(slow, answers=100)

    async def main():
        async with AsyncClient(srv.url) as c:
            start = time.monotonic()
            outcomes = await asyncio.gather(*(c.delete(f"h-{i:032d}") for i in range(18)), return_exceptions=True)
            return time.monotonic() - start, outcomes

    seconds, outcomes = asyncio.run(main())
    assert all(type(o).__name__ == "NotFoundError" for o in outcomes)
    assert seconds < 1.2, seconds
