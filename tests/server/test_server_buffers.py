"""The pool of upload buffers: a block comes back only when nothing can read it any more, is
reused for a request of about its size, and the pool keeps to its budget and lets idle blocks
go. Then against a real server: uploads reuse the memory of deleted tensors, and a tensor
deleted while a get streams it is never overwritten by the next upload."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

from sparseserve import Client
from sparseserve.core.codec import assemble
from sparseserve.v1 import sparseserve_pb2 as pb
from sparseserve.server.buffers import BufferPool

from conftest import ServerProcess
from helpers import assert_eq
from strategies import random_coo
from test_server_observability import scrape

MiB = 1 << 20


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_dropped_buffer_serves_the_next_take_of_its_size():
    pool = BufferPool(64 * MiB)
    first = pool.take(8 * MiB)
    assert (first.dtype, first.shape, first.flags.writeable) == (np.uint8, (8 * MiB,), True)
    where = address(first)
    del first
    assert pool.free_bytes == 8 * MiB
    again = pool.take(8 * MiB)
    assert address(again) == where and pool.free_bytes == 0
    assert (pool.reused, pool.allocated) == (1, 1)


@pytest.mark.parametrize("keep", [
    lambda buf: buf[16:].view(np.int64).reshape(-1, 2)[::3].T,  # numpy views of views
    lambda buf: np.frombuffer(memoryview(buf)[8:], np.float64),  # an array of a memoryview
    lambda buf: memoryview(buf[1:]),                              # a bare memoryview
], ids=["views", "frombuffer", "memoryview"])
def test_any_view_keeps_the_block_out_of_the_pool(keep):
    pool = BufferPool(64 * MiB)
    buf = pool.take(8 * MiB)
    keeper = keep(buf)
    del buf
    gc.collect()
    assert pool.free_bytes == 0, "the block came back while something could still read it"
    del keeper
    assert pool.free_bytes == 8 * MiB


def test_a_block_serves_requests_up_to_an_eighth_smaller_only():
    pool = BufferPool(64 * MiB)
    where = address(pool.take(8 * MiB))  # dropped at once: pooled
    assert address(pool.take(9 * MiB)) != where          # too small for it
    assert address(pool.take(4 * MiB)) != where          # would waste half of it
    near = pool.take(8 * MiB - MiB // 2)
    assert address(near) == where and near.size == 8 * MiB - MiB // 2


def test_small_buffers_and_a_zero_budget_are_not_pooled():
    pool = BufferPool(64 * MiB)
    pool.take(MiB)
    assert (pool.free_bytes, pool.allocated) == (0, 0)
    off = BufferPool(0)
    off.take(8 * MiB)
    assert (off.free_bytes, off.allocated, off.reused) == (0, 0, 0)


def test_the_pool_keeps_to_its_budget_oldest_out_first():
    pool = BufferPool(20 * MiB)
    a, b, c = pool.take(8 * MiB), pool.take(8 * MiB), pool.take(8 * MiB)
    where = {address(a), address(b), address(c)}
    oldest = address(a)
    del a, b, c  # c's return would make 24 MiB: a, back first, makes room
    assert pool.free_bytes == 16 * MiB
    kept = {address(pool.take(8 * MiB)), address(pool.take(8 * MiB))}
    assert kept == where - {oldest}
    pool.take(32 * MiB)  # dropped at once, but bigger than the whole budget: not kept
    assert pool.free_bytes == 16 * MiB


def test_idle_blocks_are_let_go():
    clock = Clock()
    pool = BufferPool(64 * MiB, idle_seconds=30, clock=clock)
    pool.take(8 * MiB)
    clock.now = 10
    pool.take(16 * MiB)
    assert pool.free_bytes == 24 * MiB
    clock.now = 31
    pool.trim()
    assert pool.free_bytes == 16 * MiB
    clock.now = 41
    pool.trim()
    assert pool.free_bytes == 0


def test_threads_taking_and_dropping_never_share_a_block():
    pool = BufferPool(256 * MiB)
    errors = []

    def work(seed: int):
        rng = np.random.default_rng(seed)
        for _ in range(200):
            size = int(rng.choice([4, 5, 8]) * MiB)
            buf = pool.take(size)
            buf[::4096] = seed  # every page: another holder's writes would show
            if not (buf[::4096] == seed).all():
                errors.append(seed)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert pool.reused > 0 and pool.free_bytes <= 256 * MiB


# ------------------------------------------------------------------ against a server
def coo(nbytes: int, seed: int):
    """A COO tensor of about ``nbytes``: 24 bytes a nonzero (two int64 indices, a float64)."""
    return random_coo(np.random.default_rng(seed), (1000, 1000), nbytes // 24, repeat=False, values={"normal": True})


def takes(s: ServerProcess) -> tuple[int, int]:
    m = scrape(s)
    return (int(m[("sparseserve_buffer_pool_takes_total", (("outcome", "reused"),))]),
            int(m[("sparseserve_buffer_pool_takes_total", (("outcome", "allocated"),))]))


@pytest.fixture(scope="module")
def pooled():
    s = ServerProcess("--buffer-pool-bytes", str(256 * MiB))
    yield s
    s.stop()


@pytest.mark.parametrize("wire", ["grpc", "rest"])
def test_an_upload_reuses_a_deleted_tensors_memory_and_arrives_intact(pooled, wire):
    target = pooled.grpc_target if wire == "grpc" else pooled.http_url
    first, second = coo(24 * MiB, 1), coo(24 * MiB, 2)
    with Client(target, encoding="protobuf") as c:
        c.put(first).delete()
        before = takes(pooled)
        handle = c.put(second)
        after = takes(pooled)
        assert after[0] > before[0], "the second upload got fresh memory"
        back = c.get(handle)
    assert np.array_equal(back.indices, second.indices) and np.array_equal(back.values, second.values)


def test_a_tensor_deleted_mid_get_is_not_overwritten_by_the_next_upload(pooled):
    # 96 MiB, more than gRPC's windows and the socket buffers hold: when the client stops
    # reading, the server is still streaming from the tensor's arrays. No other test uploads
    # arrays of these sizes (64 and 32 MiB), so only the deleted tensor's blocks could serve.
    original, intruder = coo(96 * MiB, 3), coo(96 * MiB, 4)
    with Client(pooled.grpc_target) as c:
        handle = c.put(original)
        stream = c._transport._raw.download(pb.Handle(handle=handle.handle))
        frames = [next(stream)]
        c.delete(handle)
        reused, allocated = takes(pooled)
        c.put(intruder)
        assert takes(pooled) == (reused, allocated + 2), "the upload took blocks a get still reads"
        frames.extend(stream)
    back = assemble(frames)
    assert_eq(back, original, exact=True)


def test_the_pool_flag_is_checked():
    from sparseserve.server.config import config_from_args

    with pytest.raises(SystemExit):
        config_from_args(["--buffer-pool-bytes", "-1"])
    assert config_from_args(["--buffer-pool-bytes", "0"]).buffer_pool_bytes == 0
