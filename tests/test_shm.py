"""Same-host transfers through shared memory: ``put``/``get`` with ``shared_memory=True``.

Round trips of every layout and dtype (and through the other path: shared-memory put, then
a streamed get, and back), segments gone from /dev/shm after each call, a client killed
before claiming its segment, hostile PutShared requests, and the TTL bookkeeping of the
server's ``SharedSegments`` in-process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given, settings

from sparseserve import (AsyncClient, Client, InvalidArgumentError, NotFoundError, ResourceExhaustedError,
                         SparseTensor, UnavailableError, UnimplementedError)
from sparseserve.core import shm as layout
from sparseserve.core.codec import tensor_to_pb
from sparseserve.core.dtypes import DTYPE_NAMES
from sparseserve.v1 import sparseserve_pb2 as pb
from conftest import ServerProcess, make_client
from helpers import assert_eq
from strategies import coo_tensors, random_coo

SHM_DIR = "/dev/shm"
pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="needs POSIX shared memory in /dev/shm")


def segments() -> set[str]:
    return {n for n in os.listdir(SHM_DIR) if n.startswith("sparseserve-")}


@pytest.fixture
def grpc_client(server):
    with Client(server.grpc_target) as c:
        yield c


@pytest.fixture
def no_leaks():
    """Fails the test when it leaves a sparseserve segment behind."""
    before = segments()
    yield
    assert segments() - before == set()


VALUES = {"low": -50, "high": 49, "halves": False}


def examples():
    rng = np.random.default_rng(3)
    return {
        "coo": random_coo(rng, (50, 40), 300, values=VALUES),
        "coo-coalesced": SparseTensor(indices=[[0, 1], [1, 0]], values=[3.0, 4.0], dense_shape=[2, 2],
                                      coalesced=True),
        "hybrid": random_coo(rng, (20, 30, 3, 2), 100, np.float32, 2, values=VALUES),
        "csr-int32": SparseTensor(layout="csr", compressed_indices=np.array([0, 2, 2, 3], np.int32),
                                  plain_indices=np.array([0, 3, 1], np.int32), values=[1.5, 2.5, 3.5],
                                  dense_shape=[3, 4]),
        "csc": SparseTensor(layout="csc", compressed_indices=[0, 1, 1, 3], plain_indices=[2, 0, 1],
                            values=np.array([1, 2, 3], np.int16), dense_shape=[3, 3]),
        "batched-csr": SparseTensor(layout="csr", compressed_indices=[[0, 1, 2], [0, 0, 2]],
                                    plain_indices=[[1, 0], [0, 1]], values=[[1.0, 2.0], [3.0, 4.0]],
                                    dense_shape=[2, 2, 2]),
        "bsr": SparseTensor(layout="bsr", compressed_indices=[0, 1, 2], plain_indices=[1, 0],
                            values=np.arange(8, dtype=np.complex64).reshape(2, 2, 2), dense_shape=[4, 4],
                            blocksize=[2, 2]),
        "dense": np.arange(24, dtype=np.float64).reshape(2, 3, 4),
        "dense-0d": np.array(7, np.int8),
        "empty-coo": SparseTensor(indices=np.zeros((0, 2), np.int64), values=[], dense_shape=[5, 6]),
        "empty-csr": SparseTensor(layout="csr", compressed_indices=[0, 0, 0], plain_indices=[], values=[],
                                  dense_shape=[2, 3]),
        "empty-dense": np.zeros((0, 3), np.uint16),
        **{f"dtype-{d}": random_coo(rng, (7, 9), 12, d, values=VALUES) for d in DTYPE_NAMES},
    }


EXAMPLES = examples()


# ------------------------------------------------------------------ round trips
@pytest.mark.parametrize("name", list(EXAMPLES))
@pytest.mark.usefixtures("no_leaks")
def test_round_trip_and_no_segment_left(grpc_client, name):
    tensor = EXAMPLES[name]
    remote = grpc_client.put(tensor, shared_memory=True)
    assert remote.nbytes == (tensor.nbytes if isinstance(tensor, SparseTensor) else tensor.nbytes)
    assert_eq(grpc_client.get(remote, shared_memory=True), tensor, exact=True, coalesced=True)
    # The server kept exactly that tensor: the streamed path reads the same.
    assert_eq(grpc_client.get(remote), tensor, exact=True, coalesced=True)
    grpc_client.delete(remote)


@pytest.mark.parametrize("name", ["hybrid", "bsr", "dense"])
@pytest.mark.usefixtures("no_leaks")
def test_streamed_put_then_shared_get(grpc_client, name):
    tensor = EXAMPLES[name]
    remote = grpc_client.put(tensor)
    assert_eq(grpc_client.get(remote.handle, shared_memory=True), tensor, exact=True, coalesced=True)
    grpc_client.delete(remote)


@pytest.mark.usefixtures("no_leaks")
def test_results_are_writable_copies(grpc_client):
    """What comes back owns its memory: the segment is gone, and writing to it is the caller's business."""
    tensor = EXAMPLES["coo"]
    remote = grpc_client.put(tensor, shared_memory=True)
    back = grpc_client.get(remote, shared_memory=True)
    back.values[0] += 1
    assert_eq(grpc_client.get(remote, shared_memory=True), tensor, exact=True, coalesced=True)
    grpc_client.delete(remote)


@pytest.mark.usefixtures("no_leaks")
def test_big_endian_input_arrives_native(grpc_client):
    tensor = SparseTensor(indices=np.array([[0], [2]], ">i8"), values=np.array([1.5, -2.0], ">f8"),
                          dense_shape=[3])
    back = grpc_client.get(grpc_client.put(tensor, shared_memory=True), shared_memory=True)
    assert back.values.dtype == np.float64 and back.indices.dtype == np.int64
    np.testing.assert_array_equal(back.values, [1.5, -2.0])
    np.testing.assert_array_equal(back.indices, [[0], [2]])


@settings(max_examples=30, deadline=None)
@given(tensor=coo_tensors(max_rank=4, min_dim=1, max_dim=6, max_nnz=40, values=VALUES))
def test_random_coo_round_trips(server, tensor):
    before = segments()
    with Client(server.grpc_target) as c:
        back = c.get(c.put(tensor, shared_memory=True), shared_memory=True)
    assert_eq(back, tensor, exact=True, coalesced=True)
    np.testing.assert_array_equal(back.to_dense(), tensor.to_dense())
    assert segments() - before == set()


@pytest.mark.usefixtures("no_leaks")
def test_tensor_over_64_mib(grpc_client):
    nnz = (70 << 20) // 24
    rng = np.random.default_rng(11)
    indices = np.stack([np.arange(nnz) // 1000, rng.integers(0, 1000, nnz)], axis=1)
    tensor = SparseTensor(indices=indices, values=rng.standard_normal(nnz), dense_shape=[nnz // 1000 + 1, 1000])
    remote = grpc_client.put(tensor, shared_memory=True)
    assert remote.nbytes == tensor.nbytes > 64 << 20
    assert_eq(grpc_client.get(remote, shared_memory=True), tensor, exact=True, coalesced=True)
    grpc_client.delete(remote)


# ------------------------------------------------------------------ AsyncClient
@pytest.mark.parametrize("name", ["coo", "hybrid", "bsr", "dense", "empty-csr"])
@pytest.mark.usefixtures("no_leaks")
def test_async_client_round_trip(server, name):
    tensor = EXAMPLES[name]

    async def main():
        async with AsyncClient(server.grpc_target) as c:
            remote = await c.put(tensor, shared_memory=True)
            shared, streamed = await c.get(remote, shared_memory=True), await c.get(remote)
            await c.delete(remote)
            return remote.nbytes, shared, streamed

    nbytes, shared, streamed = asyncio.run(main())
    assert nbytes == tensor.nbytes
    assert_eq(shared, tensor, exact=True, coalesced=True)
    assert_eq(streamed, tensor, exact=True, coalesced=True)  # the server kept exactly that tensor


@pytest.mark.usefixtures("no_leaks")
def test_async_put_cancelled_mid_copy_leaves_no_segment(server):
    """The copy into the segment runs in a thread that a cancelled caller cannot stop: the
    segment it finishes writing must still be unlinked."""
    big = np.arange((64 << 20) // 8, dtype=np.float64)  # tens of milliseconds to copy

    async def main():
        async with AsyncClient(server.grpc_target) as c:
            put = asyncio.ensure_future(c.put(big, shared_memory=True))
            await asyncio.sleep(0)  # the copy has started in its thread
            put.cancel()
            with pytest.raises(asyncio.CancelledError):
                await put
            deadline = time.monotonic() + 30
            while segments() - before and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            back = await c.get(await c.put(big[:10], shared_memory=True), shared_memory=True)
            np.testing.assert_array_equal(back, big[:10])  # and the client goes on working

    before = segments()
    asyncio.run(main())


@pytest.mark.usefixtures("no_leaks")
def test_async_put_cancelled_then_loop_closed_leaves_no_segment(server):
    """Cancelled mid-copy and the program's loop shut down at once: the thread still writing
    has no loop left to report to, and the segment it finishes must still be unlinked."""
    big = np.arange((64 << 20) // 8, dtype=np.float64)

    async def main():
        c = AsyncClient(server.grpc_target)
        put = asyncio.ensure_future(c.put(big, shared_memory=True))
        await asyncio.sleep(0)  # the copy has started in its thread
        put.cancel()
        with pytest.raises(asyncio.CancelledError):
            await put
        await c.close()

    for _ in range(3):  # the copy ends before or after the loop closes: either way, nothing left
        asyncio.run(main())  # returns once the default executor's threads have finished


@pytest.mark.usefixtures("no_leaks")
def test_async_rest_client_is_refused(server):
    async def main():
        async with AsyncClient(server.http_url) as c:
            with pytest.raises(UnimplementedError) as info:
                await c.put(EXAMPLES["coo"], shared_memory=True)
            assert info.value.reason == "SHARED_MEMORY_NEEDS_GRPC"
            with pytest.raises(UnimplementedError):
                await c.get("h-" + "0" * 32, shared_memory=True)

    asyncio.run(main())


# ------------------------------------------------------------------ errors
@pytest.mark.usefixtures("no_leaks")
def test_invalid_tensor_is_refused_and_leaves_nothing(grpc_client):
    bad = SparseTensor(indices=[[0, 5]], values=[1.0], dense_shape=[2, 2])  # column 5 of 2
    with pytest.raises(InvalidArgumentError) as info:
        grpc_client.put(bad, shared_memory=True)
    assert info.value.reason == "INDEX_OUT_OF_RANGE", info.value


@pytest.mark.usefixtures("no_leaks")
def test_unknown_handle(grpc_client):
    with pytest.raises(NotFoundError):
        grpc_client.get("h-" + "0" * 32, shared_memory=True)


@pytest.mark.parametrize("wire", ["rest-protobuf", "rest-json"])
@pytest.mark.usefixtures("no_leaks")
def test_rest_client_is_refused(server, wire):
    with make_client(server, wire) as c:
        with pytest.raises(UnimplementedError) as info:
            c.put(EXAMPLES["coo"], shared_memory=True)
        assert info.value.reason == "SHARED_MEMORY_NEEDS_GRPC" and "gRPC" in info.value.message
        with pytest.raises(UnimplementedError):
            c.get("h-" + "0" * 32, shared_memory=True)


def put_shared(client, segment: str, header: pb.Tensor):
    transport = client._transport  # the raw call, with a segment name of the test's choosing
    return transport._unary(transport._stub.PutShared, pb.SharedTensor(segment=segment, header=header))


DENSE_HEADER = tensor_to_pb(np.zeros(4), with_data=False)


@pytest.mark.parametrize("segment", [
    "sparseserve-../../etc/passwd", "../sparseserve-" + "a" * 32, "/dev/shm/sparseserve-" + "a" * 32,
    "sparseserve-" + "a" * 16 + "/" + "b" * 15, "sparseserve-" + "A" * 32, "sparseserve-" + "a" * 33,
    "psm_0123abcd", "", "sparseserve-" + "a" * 32 + "\n", "sparseserve-" + "a" * 32 + "\x00"])
def test_hostile_segment_names(grpc_client, segment):
    with pytest.raises(InvalidArgumentError) as info:
        put_shared(grpc_client, segment, DENSE_HEADER)
    assert info.value.reason == "BAD_SEGMENT_NAME", info.value


def test_nonexistent_segment(grpc_client):
    with pytest.raises(NotFoundError) as info:
        put_shared(grpc_client, layout.new_segment_name(), DENSE_HEADER)
    assert info.value.reason == "SEGMENT_NOT_FOUND" and "host" in info.value.message


@pytest.fixture
def small_segment():
    """A real 64-byte segment, as a hostile client could make."""
    shm = layout.create_segment(64)
    yield shm
    layout.close_segment(shm)
    layout.unlink_segment(shm.name)


def test_header_announcing_more_than_the_segment(grpc_client, small_segment):
    header = tensor_to_pb(SparseTensor(indices=np.zeros((100, 2), np.int64), values=np.zeros(100),
                                       dense_shape=[4, 4]), with_data=False)
    with pytest.raises(InvalidArgumentError) as info:
        put_shared(grpc_client, small_segment.name, header)
    assert info.value.reason == "BUFFER_LENGTH", info.value
    assert small_segment.name not in segments()  # handed over: the server unlinked it


def test_header_over_the_store_budget(grpc_client, small_segment):
    header = pb.Tensor(dense=pb.Array(dtype=pb.FLOAT64, shape=[1 << 40]))
    with pytest.raises(ResourceExhaustedError) as info:
        put_shared(grpc_client, small_segment.name, header)
    assert info.value.reason == "STORE_BUDGET", info.value


@pytest.mark.parametrize("header, reason", [
    (pb.Tensor(handle="h-" + "0" * 32), "BAD_HEADER"),
    (pb.Tensor(), "BAD_HEADER"),
    (pb.Tensor(dense=pb.Array(dtype=pb.FLOAT64, shape=[1], data=b"\0" * 8)), "BAD_HEADER"),
    (pb.Tensor(dense=pb.Array(dtype=pb.FLOAT64, shape=[-1])), "NEGATIVE_DIMENSION"),
    (pb.Tensor(dense=pb.Array(dtype=999, shape=[1])), "BAD_DTYPE"),
])
def test_malformed_headers(grpc_client, small_segment, header, reason):
    with pytest.raises(InvalidArgumentError) as info:
        put_shared(grpc_client, small_segment.name, header)
    assert info.value.reason == reason, info.value


@pytest.mark.usefixtures("no_leaks")
def test_server_keeps_serving_after_hostile_requests(server, grpc_client):
    for segment in ("sparseserve-../x", layout.new_segment_name()):
        with pytest.raises((InvalidArgumentError, NotFoundError)):
            put_shared(grpc_client, segment, DENSE_HEADER)
    assert server.proc.poll() is None
    assert_eq(grpc_client.get(grpc_client.put(EXAMPLES["hybrid"], shared_memory=True), shared_memory=True),
              EXAMPLES["hybrid"], exact=True, coalesced=True)


def test_segment_shrunk_mid_read_is_an_error_not_a_crash():
    """Reads go through preadv: a segment shorter than announced comes back short, no SIGBUS."""
    shm = layout.create_segment(256)
    try:
        fd = layout.open_segment(shm.name, "")
        os.ftruncate(shm._fd, 100)
        with pytest.raises(InvalidArgumentError) as info:
            layout.read_slot(fd, layout.Slot("values", np.dtype(np.float64), (32,), 0, 256), shm.name)
        assert info.value.reason == "BUFFER_LENGTH"
        os.close(fd)
    finally:
        layout.close_segment(shm)
        layout.unlink_segment(shm.name)


# ------------------------------------------------------------------ unclaimed segments
_DYING_CLIENT = """
import os, signal, sys
import numpy as np
from sparseserve import Client
from sparseserve.v1 import sparseserve_pb2 as pb
c = Client(sys.argv[1])
handle = c.put(np.arange(1000.0)).handle
reply = c._transport._stub.GetShared(pb.Handle(handle=handle))
print(reply.segment, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_segment_of_a_killed_client_is_reaped_within_the_ttl(tmp_path):
    srv = ServerProcess("--shm-ttl", "1")
    try:
        proc = subprocess.run([sys.executable, "-c", _DYING_CLIENT, srv.grpc_target], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        name = proc.stdout.strip()
        assert layout.SEGMENT_NAME.match(name)
        assert name in segments()  # written, never claimed
        # No further call reaches the server: its timer thread alone must remove the segment.
        deadline = time.monotonic() + 10
        while name in segments() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert name not in segments()
        assert "not claimed" in srv.log()
    finally:
        assert srv.stop() == 0


def test_shutdown_unlinks_pending_segments():
    srv = ServerProcess("--shm-ttl", "600")
    try:
        with Client(srv.grpc_target) as c:
            handle = c.put(np.arange(10.0)).handle
            name = c._transport._stub.GetShared(pb.Handle(handle=handle)).segment
        assert name in segments()
    finally:
        assert srv.stop() == 0
    assert name not in segments()


# ------------------------------------------------------------------ SharedSegments in-process
class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_reap_unlinks_only_expired_segments():
    from sparseserve.server.shm import SharedSegments

    clock = Clock()
    shared = SharedSegments(10, clock=clock)
    try:
        first = shared.export(np.arange(3.0)).segment
        clock.now = 6
        second = shared.export(EXAMPLES["csc"]).segment
        assert {first, second} <= segments()
        clock.now = 12
        assert shared.reap() == 1
        assert first not in segments() and second in segments()
        # A segment the client claimed (unlinked) is not counted as reaped.
        layout.unlink_segment(second)
        clock.now = 20
        assert shared.reap() == 0 and shared.pending() == []
    finally:
        shared.close()


def test_export_checks_the_ttl_itself():
    from sparseserve.server.shm import SharedSegments

    clock = Clock()
    shared = SharedSegments(5, clock=clock)
    try:
        old = shared.export(np.zeros(2)).segment
        clock.now = 5
        shared.export(np.zeros(2))
        assert old not in segments() and shared.reaped == 1
    finally:
        shared.close()


def test_close_unlinks_everything_and_refuses_new_exports():
    from sparseserve.server.shm import SharedSegments

    shared = SharedSegments(60)
    names = [shared.export(t).segment for t in (np.zeros(2), EXAMPLES["bsr"], EXAMPLES["empty-coo"])]
    assert set(names) <= segments()
    before = segments()
    shared.close()
    assert not set(names) & segments()
    with pytest.raises(UnavailableError):
        shared.export(np.zeros(2))
    assert segments() <= before


def test_read_copies_out_and_unlinks():
    from sparseserve.server.shm import SharedSegments

    shared = SharedSegments(60)
    tensor = EXAMPLES["hybrid"]
    msg = shared.export(tensor)
    back = shared.read(msg, max_bytes=1 << 20)
    assert_eq(back, tensor, exact=True, coalesced=True)
    assert msg.segment not in segments()
    assert back.values.flags.writeable and back.values.ctypes.data % back.values.dtype.alignment == 0
    with pytest.raises(ResourceExhaustedError) as info:
        shared.read(shared.export(tensor), max_bytes=tensor.nbytes - 1)
    assert info.value.reason == "STORE_BUDGET"
    shared.close()


def test_segment_layout_is_aligned():
    slots = layout.header_slots(tensor_to_pb(EXAMPLES["csr-int32"], with_data=False))
    assert [s.field for s in slots] == ["compressed_indices", "plain_indices", "values"]
    assert [s.offset for s in slots] == [0, 64, 128]
    assert layout.segment_bytes(slots) == 128 + 24
    assert layout.segment_bytes(layout.header_slots(tensor_to_pb(EXAMPLES["empty-dense"], with_data=False))) == 0


def test_segment_names_are_unguessable():
    names = {layout.new_segment_name() for _ in range(100)}
    assert len(names) == 100 and all(layout.SEGMENT_NAME.match(n) for n in names)


def test_big_arrays_are_read_in_parallel_pieces(monkeypatch):
    """The threaded read (arrays of 64 MiB and more) joins its pieces in order, and a short
    piece is still an error."""
    from sparseserve.server.shm import SharedSegments

    monkeypatch.setattr(layout, "_PARALLEL_BYTES", 1000)
    monkeypatch.setattr(layout, "_READ_THREADS", 3)
    rng = np.random.default_rng(5)
    tensor = random_coo(rng, (300, 300), 5000, np.complex128, values=VALUES)  # pieces not a multiple of the 4 KiB step
    shared = SharedSegments(60)
    try:
        assert_eq(shared.read(shared.export(tensor), max_bytes=1 << 30), tensor, exact=True, coalesced=True)
        shm = layout.create_segment(100_000)
        try:
            fd = layout.open_segment(shm.name, "")
            os.ftruncate(shm._fd, 50_000)
            with pytest.raises(InvalidArgumentError) as info:
                layout.read_slot(fd, layout.Slot("values", np.dtype(np.uint8), (100_000,), 0, 100_000), shm.name)
            assert info.value.reason == "BUFFER_LENGTH"
            os.close(fd)
        finally:
            layout.close_segment(shm)
            layout.unlink_segment(shm.name)
    finally:
        shared.close()
