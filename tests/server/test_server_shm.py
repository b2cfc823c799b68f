"""Same-host transfers through shared memory: ``put``/``get`` with ``shared_memory=True``.

Round trips of every layout and dtype (and through the other path: shared-memory put, then
a streamed get, and back), segments gone from /dev/shm after each call, clients killed
before handing over or claiming their segment, hostile PutShared requests, who may hand a
segment over (only the tenant it was registered for, once; never a segment the server
exported), shared memory off without ``--allow-shared-memory``, and the TTL bookkeeping of
the server's ``SharedSegments`` in-process."""

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

from sparseserve import (AsyncClient, Client, InvalidArgumentError, NotFoundError, PermissionDeniedError,
                         ResourceExhaustedError, SparseTensor, UnavailableError, UnimplementedError)
from sparseserve import _shm as sdk_shm
from sparseserve.core import shm as layout
from sparseserve.core.codec import tensor_to_pb
from sparseserve.core.dtypes import DTYPE_NAMES
from sparseserve.v1 import sparseserve_pb2 as pb
from conftest import ServerProcess, make_client
from helpers import assert_eq
from strategies import coo_tensors, random_coo

SHM_DIR = "/dev/shm"
pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="needs POSIX shared memory in /dev/shm")

TOKEN_A, TOKEN_B = "shm-tenant-a", "shm-tenant-b"
# Long enough for any transfer here on a loaded machine; what outlives the client is gone within it.
TTL = 10


def segments() -> set[str]:
    return {n for n in os.listdir(SHM_DIR) if n.startswith("sparseserve-")}


@pytest.fixture(scope="module")
def shm_server():
    """Shared memory on, two tenants (``TOKEN_A``, ``TOKEN_B``)."""
    srv = ServerProcess("--allow-shared-memory", "--token", TOKEN_A, "--token", TOKEN_B, "--shm-ttl", str(TTL))
    yield srv
    code = srv.stop()
    assert code == 0, f"server exited with {code}: {srv.log()}"


@pytest.fixture
def grpc_client(shm_server):
    with Client(shm_server.grpc_target, token=TOKEN_A) as c:
        yield c


@pytest.fixture
def other_tenant(shm_server):
    with Client(shm_server.grpc_target, token=TOKEN_B) as c:
        yield c


@pytest.fixture
def no_leaks():
    """Fails the test when it leaves a sparseserve segment behind."""
    before = segments()
    yield
    assert segments() - before == set()


def wait_gone(names: set[str], seconds: float) -> set[str]:
    """``names`` still in /dev/shm after waiting up to ``seconds`` for them to go."""
    deadline = time.monotonic() + seconds
    while names & segments() and time.monotonic() < deadline:
        time.sleep(0.05)
    return names & segments()


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
def test_random_coo_round_trips(shm_server, tensor):
    before = segments()
    with Client(shm_server.grpc_target, token=TOKEN_A) as c:
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
def test_async_client_round_trip(shm_server, name):
    tensor = EXAMPLES[name]

    async def main():
        async with AsyncClient(shm_server.grpc_target, token=TOKEN_A) as c:
            remote = await c.put(tensor, shared_memory=True)
            shared, streamed = await c.get(remote, shared_memory=True), await c.get(remote)
            await c.delete(remote)
            return remote.nbytes, shared, streamed

    nbytes, shared, streamed = asyncio.run(main())
    assert nbytes == tensor.nbytes
    assert_eq(shared, tensor, exact=True, coalesced=True)
    assert_eq(streamed, tensor, exact=True, coalesced=True)  # the server kept exactly that tensor


BIG = np.arange((64 << 20) // 8, dtype=np.float64)  # tens of milliseconds to copy


def written_to(name: str) -> bool:
    """Whether the client has started writing segment ``name`` (tmpfs counts the pages it wrote)."""
    try:
        return os.stat(os.path.join(SHM_DIR, name)).st_blocks > 0
    except FileNotFoundError:
        return True  # written and handed over already


async def cancel_put(c: AsyncClient, copying: bool) -> None:
    """Start a big shared-memory put and cancel it as soon as the server has made its segment
    (the RegisterSegment reply may still be on its way), or with ``copying`` once the client
    has started writing it."""
    before = segments()
    put = asyncio.ensure_future(c.put(BIG, shared_memory=True))
    deadline = time.monotonic() + 30
    while not put.done() and time.monotonic() < deadline:
        made = segments() - before
        if made and (not copying or all(written_to(name) for name in made)):
            break
        await asyncio.sleep(0.001)
    put.cancel()
    with pytest.raises(asyncio.CancelledError):
        await put


@pytest.mark.parametrize("copying", [False, True], ids=["registering", "copying"])
@pytest.mark.usefixtures("no_leaks")
def test_async_put_cancelled_leaves_no_segment(shm_server, copying):
    """Cancelled while RegisterSegment is answered, the segment is unlinked when the reply comes;
    cancelled mid-copy, in a thread the caller cannot stop, it is unlinked at once all the same.
    Neither waits for the server's TTL."""
    async def main():
        async with AsyncClient(shm_server.grpc_target, token=TOKEN_A) as c:
            before = segments()
            await cancel_put(c, copying)
            left = segments() - before
            back = await c.get(await c.put(BIG[:10], shared_memory=True), shared_memory=True)
            np.testing.assert_array_equal(back, BIG[:10])  # and the client goes on working
            return left

    assert not wait_gone(asyncio.run(main()), 5)


@pytest.mark.usefixtures("no_leaks")
def test_async_put_cancelled_mid_copy_then_loop_closed_leaves_no_segment(shm_server):
    """Cancelled mid-copy and the program's loop shut down at once: the thread still writing has
    no loop left to report to, and its segment must be gone all the same."""
    async def main():
        c = AsyncClient(shm_server.grpc_target, token=TOKEN_A)
        await cancel_put(c, copying=True)
        await c.close()

    for _ in range(3):  # the copy ends before or after the loop closes: either way, nothing left
        asyncio.run(main())  # returns once the default executor's threads have finished


def test_async_put_cancelled_then_channel_closed_leaves_nothing_past_the_ttl(short_ttl_server):
    """Cancelled while RegisterSegment is answered, and the channel closed at once: the reply
    may never reach the client, which then cannot know the name; the server's TTL removes it."""
    before = segments()

    async def main():
        c = AsyncClient(short_ttl_server.grpc_target)
        await cancel_put(c, copying=False)
        await c.close()

    asyncio.run(main())
    assert not wait_gone(segments() - before, 10)


@pytest.mark.usefixtures("no_leaks")
def test_async_rest_client_is_refused(shm_server):
    async def main():
        async with AsyncClient(shm_server.http_url, token=TOKEN_A) as c:
            with pytest.raises(UnimplementedError) as info:
                await c.put(EXAMPLES["coo"], shared_memory=True)
            assert info.value.reason == "SHARED_MEMORY_NEEDS_GRPC"
            with pytest.raises(UnimplementedError):
                await c.get("h-" + "0" * 32, shared_memory=True)

    asyncio.run(main())


# ------------------------------------------------------------------ off without the flag
def assert_off(info: pytest.ExceptionInfo) -> None:
    assert info.value.reason == "SHARED_MEMORY_OFF", info.value
    assert "--allow-shared-memory" in info.value.message


@pytest.mark.usefixtures("no_leaks")
def test_shared_memory_is_off_without_the_flag(server):
    """The suite's default server has no --allow-shared-memory: both SDK calls, sync and async,
    and the raw RPCs are refused with one clear error, and no segment is made."""
    with Client(server.grpc_target) as c:
        handle = c.put(np.arange(3.0))
        with pytest.raises(UnimplementedError) as info:
            c.put(np.arange(3.0), shared_memory=True)
        assert_off(info)
        with pytest.raises(UnimplementedError) as info:
            c.get(handle, shared_memory=True)
        assert_off(info)
        with pytest.raises(UnimplementedError) as info:
            put_shared(c, layout.new_segment_name(), DENSE_HEADER)
        assert_off(info)
        np.testing.assert_array_equal(c.get(handle), np.arange(3.0))  # the streamed path still works

    async def main():
        async with AsyncClient(server.grpc_target) as c:
            handle = await c.put(np.arange(3.0))
            for call in (c.put(np.arange(3.0), shared_memory=True), c.get(handle, shared_memory=True)):
                with pytest.raises(UnimplementedError) as info:
                    await call
                assert_off(info)

    asyncio.run(main())


@pytest.mark.parametrize("environment, argv, expected", [
    ({}, [], False),
    ({}, ["--allow-shared-memory"], True),
    ({"SPARSESERVE_ALLOW_SHARED_MEMORY": "1"}, [], True),
    ({"SPARSESERVE_ALLOW_SHARED_MEMORY": "TRUE"}, [], True),
    ({"SPARSESERVE_ALLOW_SHARED_MEMORY": "yes"}, [], True),
    ({"SPARSESERVE_ALLOW_SHARED_MEMORY": "on"}, [], True),
    ({"SPARSESERVE_ALLOW_SHARED_MEMORY": "0"}, [], False),
    ({"SPARSESERVE_ALLOW_SHARED_MEMORY": "false"}, [], False),
    ({"SPARSESERVE_ALLOW_SHARED_MEMORY": "no"}, [], False),
    ({"SPARSESERVE_ALLOW_SHARED_MEMORY": "off"}, [], False),
    ({"SPARSESERVE_ALLOW_SHARED_MEMORY": "on"}, ["--no-allow-shared-memory"], False),  # the flag wins
    ({"SPARSESERVE_ALLOW_SHARED_MEMORY": "off"}, ["--allow-shared-memory"], True),
])
def test_allow_shared_memory_flag_and_environment(monkeypatch, environment, argv, expected):
    from sparseserve.server.config import config_from_args

    monkeypatch.delenv("SPARSESERVE_ALLOW_SHARED_MEMORY", raising=False)
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    assert config_from_args(argv).allow_shared_memory is expected


def test_allow_shared_memory_environment_must_be_a_yes_or_a_no(monkeypatch, capsys):
    from sparseserve.server.config import config_from_args

    monkeypatch.setenv("SPARSESERVE_ALLOW_SHARED_MEMORY", "maybe")
    with pytest.raises(SystemExit) as info:
        config_from_args([])
    assert info.value.code == 2
    assert "SPARSESERVE_ALLOW_SHARED_MEMORY='maybe'" in capsys.readouterr().err


# ------------------------------------------------------------------ who may hand a segment over
def register(client, nbytes: int) -> pb.RegisterSegmentResponse:
    transport = client._transport  # the raw call, as a client of the test's making would
    return transport._unary(transport._stub.RegisterSegment, pb.RegisterSegmentRequest(nbytes=nbytes))


def put_shared(client, segment: str, header: pb.Tensor):
    transport = client._transport  # the raw call, with a segment name of the test's choosing
    return transport._unary(transport._stub.PutShared, pb.SharedTensor(segment=segment, header=header))


def get_shared(client, handle: str) -> pb.SharedTensor:
    transport = client._transport
    return transport._unary(transport._stub.GetShared, pb.Handle(handle=handle))


def assert_not_registered(info: pytest.ExceptionInfo) -> None:
    assert info.value.reason == "SEGMENT_NOT_REGISTERED", info.value


SECRET = SparseTensor(indices=[[0, 1], [2, 0]], values=[31.0, 41.0], dense_shape=[3, 2])


@pytest.mark.usefixtures("no_leaks")
def test_another_tenant_cannot_take_a_registered_segment(grpc_client, other_tenant):
    """The attack of issue 26: tenant B writes a segment, tenant A finds its name in /dev/shm
    and hands it to PutShared with its own token. A is refused, learns nothing of B's tensor,
    and B's transfer still goes through."""
    a, b = grpc_client, other_tenant
    before = segments()
    outgoing = sdk_shm.Outgoing.of(SECRET)
    lease = register(b, outgoing.registration().nbytes)
    with sdk_shm.segment_of(outgoing, lease) as request:
        (seen,) = segments() - before  # what A can see: every user may list /dev/shm
        assert seen == lease.segment
        for attempt in (request, pb.SharedTensor(segment=seen, header=tensor_to_pb(np.zeros(2), with_data=False))):
            with pytest.raises(PermissionDeniedError) as info:
                put_shared(a, attempt.segment, attempt.header)
            assert_not_registered(info)
            message = info.value.message.replace(seen, "<name>")
            assert "31" not in message and "41" not in message and "tenant-1" not in message
        assert seen in segments()  # the refusal left B's segment alone
        stored = put_shared(b, request.segment, request.header)
    assert_eq(b.get(stored.handle), SECRET, exact=True, coalesced=True)
    with pytest.raises(PermissionDeniedError):  # and the handle is B's alone, as any
        a.get(stored.handle)
    b.delete(stored.handle)


@pytest.mark.usefixtures("no_leaks")
def test_an_exported_segment_cannot_be_handed_to_put_shared(grpc_client, other_tenant):
    """A segment the server wrote for GetShared is never taken back by PutShared: not from the
    tenant it was written for, nor from another; it stays for its client to claim."""
    handle = other_tenant.put(SECRET).handle
    reply = get_shared(other_tenant, handle)
    for client in (other_tenant, grpc_client):
        with pytest.raises(PermissionDeniedError) as info:
            put_shared(client, reply.segment, reply.header)
        assert_not_registered(info)
    assert reply.segment in segments()
    assert_eq(sdk_shm.claim(reply), SECRET, exact=True, coalesced=True)
    other_tenant.delete(handle)


@pytest.mark.usefixtures("no_leaks")
def test_a_registered_segment_is_handed_over_once(grpc_client):
    outgoing = sdk_shm.Outgoing.of(SECRET)
    with sdk_shm.segment_of(outgoing, register(grpc_client, outgoing.registration().nbytes)) as request:
        stored = put_shared(grpc_client, request.segment, request.header)
        with pytest.raises(PermissionDeniedError) as info:
            put_shared(grpc_client, request.segment, request.header)
        assert_not_registered(info)
    grpc_client.delete(stored.handle)


@pytest.mark.usefixtures("no_leaks")
def test_a_name_never_registered_is_refused(grpc_client):
    """Even when the segment is there, made by someone on this host as the SDK used to."""
    name = layout.new_segment_name()
    fd = layout.create_segment(name, 64)
    try:
        with pytest.raises(PermissionDeniedError) as info:
            put_shared(grpc_client, name, DENSE_HEADER)
        assert_not_registered(info)
        assert name in segments()  # not the server's to unlink
    finally:
        os.close(fd)
        layout.unlink_segment(name)


@pytest.mark.usefixtures("no_leaks")
def test_a_segment_put_under_a_registered_name_is_refused(grpc_client):
    """The object under the name must be the one RegisterSegment made."""
    lease = register(grpc_client, 32)
    layout.unlink_segment(lease.segment)
    fd = layout.create_segment(lease.segment, 32)  # someone else's object, same name
    try:
        with pytest.raises(InvalidArgumentError) as info:
            put_shared(grpc_client, lease.segment, DENSE_HEADER)
        assert info.value.reason == "BAD_SEGMENT" and "another" in info.value.message
        assert lease.segment not in segments()  # the name was lent: the server unlinked it
    finally:
        os.close(fd)


@pytest.mark.usefixtures("no_leaks")
def test_registered_segment_is_made_by_the_server_0600(grpc_client):
    lease = register(grpc_client, 1000)
    try:
        st = os.stat(os.path.join(SHM_DIR, lease.segment))
        assert st.st_mode & 0o777 == 0o600 and st.st_size == 1000 and st.st_uid == os.geteuid()
        assert lease.ttl_seconds == TTL
    finally:
        layout.unlink_segment(lease.segment)


@pytest.mark.usefixtures("no_leaks")
def test_exported_segment_is_0600(grpc_client):
    handle = grpc_client.put(np.arange(5.0)).handle
    reply = get_shared(grpc_client, handle)
    assert os.stat(os.path.join(SHM_DIR, reply.segment)).st_mode & 0o777 == 0o600
    np.testing.assert_array_equal(sdk_shm.claim(reply), np.arange(5.0))
    grpc_client.delete(handle)


def test_register_checks_the_size(grpc_client):
    with pytest.raises(InvalidArgumentError) as info:
        register(grpc_client, -1)
    assert info.value.reason == "BAD_SEGMENT_SIZE"
    with pytest.raises(ResourceExhaustedError) as info:
        register(grpc_client, 1 << 60)
    assert info.value.reason == "STORE_BUDGET"


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
def test_rest_client_is_refused(shm_server, wire):
    with make_client(shm_server, wire, token=TOKEN_A) as c:
        with pytest.raises(UnimplementedError) as info:
            c.put(EXAMPLES["coo"], shared_memory=True)
        assert info.value.reason == "SHARED_MEMORY_NEEDS_GRPC" and "gRPC" in info.value.message
        with pytest.raises(UnimplementedError):
            c.get("h-" + "0" * 32, shared_memory=True)


DENSE_HEADER = tensor_to_pb(np.zeros(4), with_data=False)


@pytest.mark.parametrize("segment", [
    "sparseserve-../../etc/passwd", "../sparseserve-" + "a" * 32, "/dev/shm/sparseserve-" + "a" * 32,
    "sparseserve-" + "a" * 16 + "/" + "b" * 15, "sparseserve-" + "A" * 32, "sparseserve-" + "a" * 33,
    "psm_0123abcd", "", "sparseserve-" + "a" * 32 + "\n", "sparseserve-" + "a" * 32 + "\x00"])
def test_hostile_segment_names(grpc_client, segment):
    with pytest.raises(InvalidArgumentError) as info:
        put_shared(grpc_client, segment, DENSE_HEADER)
    assert info.value.reason == "BAD_SEGMENT_NAME", info.value


def test_registered_segment_unlinked_before_put_shared(grpc_client):
    lease = register(grpc_client, 32)
    layout.unlink_segment(lease.segment)
    with pytest.raises(NotFoundError) as info:
        put_shared(grpc_client, lease.segment, DENSE_HEADER)
    assert info.value.reason == "SEGMENT_NOT_FOUND", info.value


@pytest.fixture
def small_segment(grpc_client):
    """A registered 64-byte segment, as a hostile client could ask for."""
    lease = register(grpc_client, 64)
    yield lease
    layout.unlink_segment(lease.segment)


def test_header_announcing_more_than_the_segment(grpc_client, small_segment):
    header = tensor_to_pb(SparseTensor(indices=np.zeros((100, 2), np.int64), values=np.zeros(100),
                                       dense_shape=[4, 4]), with_data=False)
    with pytest.raises(InvalidArgumentError) as info:
        put_shared(grpc_client, small_segment.segment, header)
    assert info.value.reason == "BUFFER_LENGTH", info.value
    assert small_segment.segment not in segments()  # handed over: the server unlinked it


def test_header_over_the_store_budget(grpc_client, small_segment):
    header = pb.Tensor(dense=pb.Array(dtype=pb.FLOAT64, shape=[1 << 40]))
    with pytest.raises(ResourceExhaustedError) as info:
        put_shared(grpc_client, small_segment.segment, header)
    assert info.value.reason == "STORE_BUDGET", info.value
    assert small_segment.segment not in segments()


@pytest.mark.parametrize("header, reason", [
    (pb.Tensor(handle="h-" + "0" * 32), "BAD_HEADER"),
    (pb.Tensor(), "BAD_HEADER"),
    (pb.Tensor(dense=pb.Array(dtype=pb.FLOAT64, shape=[1], data=b"\0" * 8)), "BAD_HEADER"),
    (pb.Tensor(dense=pb.Array(dtype=pb.FLOAT64, shape=[-1])), "NEGATIVE_DIMENSION"),
    (pb.Tensor(dense=pb.Array(dtype=999, shape=[1])), "BAD_DTYPE"),
])
def test_malformed_headers(grpc_client, small_segment, header, reason):
    with pytest.raises(InvalidArgumentError) as info:
        put_shared(grpc_client, small_segment.segment, header)
    assert info.value.reason == reason, info.value


@pytest.mark.usefixtures("no_leaks")
def test_server_keeps_serving_after_hostile_requests(shm_server, grpc_client):
    for segment in ("sparseserve-../x", layout.new_segment_name()):
        with pytest.raises((InvalidArgumentError, PermissionDeniedError)):
            put_shared(grpc_client, segment, DENSE_HEADER)
    assert shm_server.proc.poll() is None
    assert_eq(grpc_client.get(grpc_client.put(EXAMPLES["hybrid"], shared_memory=True), shared_memory=True),
              EXAMPLES["hybrid"], exact=True, coalesced=True)


def test_segment_shrunk_mid_read_is_an_error_not_a_crash():
    """Reads go through preadv: a segment shorter than announced comes back short, no SIGBUS."""
    name = layout.new_segment_name()
    writer = layout.create_segment(name, 256)
    try:
        fd = layout.open_segment(name, "")
        os.ftruncate(writer, 100)
        with pytest.raises(InvalidArgumentError) as info:
            layout.read_slot(fd, layout.Slot("values", np.dtype(np.float64), (32,), 0, 256), name)
        assert info.value.reason == "BUFFER_LENGTH"
        os.close(fd)
    finally:
        os.close(writer)
        layout.unlink_segment(name)


# ------------------------------------------------------------------ unclaimed segments
@pytest.fixture(scope="module")
def short_ttl_server():
    srv = ServerProcess("--allow-shared-memory", "--shm-ttl", "1")
    yield srv
    code = srv.stop()
    assert code == 0, f"server exited with {code}: {srv.log()}"


_DYING_GETTER = """
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

# Killed between writing its segment and PutShared.
_DYING_PUTTER = """
import os, signal, sys
import numpy as np
from sparseserve import Client, _shm
c = Client(sys.argv[1])
outgoing = _shm.Outgoing.of(np.arange(1000.0))
lease = c._transport._stub.RegisterSegment(outgoing.registration())
_shm._fill(outgoing, lease)
print(lease.segment, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("script, logged", [(_DYING_GETTER, "not claimed"), (_DYING_PUTTER, "not handed over")],
                         ids=["get", "put"])
def test_segment_of_a_killed_client_is_reaped_within_the_ttl(short_ttl_server, script, logged):
    srv = short_ttl_server
    proc = subprocess.run([sys.executable, "-c", script, srv.grpc_target], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    name = proc.stdout.strip()
    assert layout.SEGMENT_NAME.match(name)
    assert name in segments()  # written, never claimed or handed over
    assert os.stat(os.path.join(SHM_DIR, name)).st_size == 8000
    # No further call reaches the server: its timer thread alone must remove the segment (TTL
    # 1 s, checked every 0.25 s; the slack is for a loaded machine).
    assert not wait_gone({name}, 10)
    assert logged in srv.log()


def test_shutdown_unlinks_pending_and_registered_segments():
    srv = ServerProcess("--allow-shared-memory", "--shm-ttl", "600")
    try:
        with Client(srv.grpc_target) as c:
            handle = c.put(np.arange(10.0)).handle
            names = {get_shared(c, handle).segment, register(c, 80).segment}
        assert names <= segments()
    finally:
        assert srv.stop() == 0
    assert not names & segments()


# ------------------------------------------------------------------ SharedSegments in-process
class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def handed(shared, tensor, tenant: str = "") -> pb.SharedTensor:
    """A PutShared request for ``tensor``, written as the SDK writes it into a registered segment."""
    outgoing = sdk_shm.Outgoing.of(tensor)
    lease = shared.register(tenant, outgoing.registration().nbytes)
    sdk_shm._fill(outgoing, lease)
    return pb.SharedTensor(segment=lease.segment, header=outgoing.header)


def test_reap_unlinks_only_expired_segments():
    from sparseserve.server.shm import SharedSegments

    clock = Clock()
    shared = SharedSegments(10, clock=clock)
    try:
        first = shared.export(np.arange(3.0)).segment
        registered = shared.register("t", 16).segment
        clock.now = 6
        second = shared.export(EXAMPLES["csc"]).segment
        assert {first, registered, second} <= segments()
        clock.now = 12
        assert shared.reap() == 2
        assert first not in segments() and registered not in segments() and second in segments()
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


def test_close_unlinks_everything_and_refuses_new_segments():
    from sparseserve.server.shm import SharedSegments

    shared = SharedSegments(60)
    names = [shared.export(t).segment for t in (np.zeros(2), EXAMPLES["bsr"], EXAMPLES["empty-coo"])]
    names.append(shared.register("t", 100).segment)
    assert set(names) <= segments()
    before = segments()
    shared.close()
    assert not set(names) & segments()
    for make in (lambda: shared.export(np.zeros(2)), lambda: shared.register("t", 8)):
        with pytest.raises(UnavailableError):
            make()
    assert segments() <= before


def test_read_copies_out_and_unlinks():
    from sparseserve.server.shm import SharedSegments

    shared = SharedSegments(60)
    tensor = EXAMPLES["hybrid"]
    msg = handed(shared, tensor)
    back = shared.read(msg, "", max_bytes=1 << 20)
    assert_eq(back, tensor, exact=True, coalesced=True)
    assert msg.segment not in segments()
    assert back.values.flags.writeable and back.values.ctypes.data % back.values.dtype.alignment == 0
    msg = handed(shared, tensor)
    with pytest.raises(ResourceExhaustedError) as info:
        shared.read(msg, "", max_bytes=tensor.nbytes - 1)
    assert info.value.reason == "STORE_BUDGET" and msg.segment not in segments()
    shared.close()


def test_read_takes_a_segment_only_from_its_tenant_once_within_the_ttl():
    from sparseserve.server.shm import SharedSegments

    clock = Clock()
    shared = SharedSegments(10, clock=clock)
    try:
        msg = handed(shared, np.arange(4.0), tenant="b")
        exported = shared.export(np.arange(4.0))
        for request, tenant in ((msg, "a"), (msg, ""), (exported, "b"), (exported, "")):
            with pytest.raises(PermissionDeniedError) as info:
                shared.read(request, tenant)
            assert_not_registered(info)
        np.testing.assert_array_equal(shared.read(msg, "b"), np.arange(4.0))
        with pytest.raises(PermissionDeniedError):
            shared.read(msg, "b")
        late = handed(shared, np.arange(4.0), tenant="b")
        clock.now = 10  # expired, not reaped yet: refused, and unlinked there and then
        with pytest.raises(PermissionDeniedError):
            shared.read(late, "b")
        assert late.segment not in segments()
    finally:
        shared.close()


def test_registrations_per_tenant_are_capped():
    from sparseserve.server.shm import SharedSegments

    shared = SharedSegments(60, max_leases=2)
    try:
        held = [shared.register("a", 8).segment for _ in range(2)]
        before = segments()
        with pytest.raises(ResourceExhaustedError) as info:
            shared.register("a", 8)
        assert info.value.reason == "TOO_MANY_SEGMENTS" and segments() == before
        shared.register("b", 8)  # another tenant's count is its own
        shared.read(handed_into(held[0]), "a")  # one handed over frees a place
        shared.register("a", 8)
    finally:
        shared.close()


def handed_into(segment: str) -> pb.SharedTensor:
    """A PutShared request for the empty 8-byte segment ``segment`` (one float64)."""
    return pb.SharedTensor(segment=segment, header=tensor_to_pb(np.zeros(1), with_data=False))


def test_segment_layout_is_aligned():
    slots = layout.header_slots(tensor_to_pb(EXAMPLES["csr-int32"], with_data=False))
    assert [s.field for s in slots] == ["compressed_indices", "plain_indices", "values"]
    assert [s.offset for s in slots] == [0, 64, 128]
    assert layout.segment_bytes(slots) == 128 + 24
    assert layout.segment_bytes(layout.header_slots(tensor_to_pb(EXAMPLES["empty-dense"], with_data=False))) == 0


def test_segment_names_are_unguessable():
    names = {layout.new_segment_name() for _ in range(100)}
    assert len(names) == 100 and all(layout.SEGMENT_NAME.match(n) for n in names)


def test_create_segment_never_opens_an_existing_name():
    name = layout.new_segment_name()
    fd = layout.create_segment(name, 8)
    try:
        with pytest.raises(FileExistsError):
            layout.create_segment(name, 8)
    finally:
        os.close(fd)
        layout.unlink_segment(name)


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
        assert_eq(shared.read(handed(shared, tensor), "", max_bytes=1 << 30), tensor, exact=True, coalesced=True)
        name = layout.new_segment_name()
        writer = layout.create_segment(name, 100_000)
        try:
            fd = layout.open_segment(name, "")
            os.ftruncate(writer, 50_000)
            with pytest.raises(InvalidArgumentError) as info:
                layout.read_slot(fd, layout.Slot("values", np.dtype(np.uint8), (100_000,), 0, 100_000), name)
            assert info.value.reason == "BUFFER_LENGTH"
            os.close(fd)
        finally:
            os.close(writer)
            layout.unlink_segment(name)
    finally:
        shared.close()
