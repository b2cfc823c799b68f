"""Server-side batching (--batch-window-ms): merged answers equal unbatched ones.

In-process, a ``Service`` with batching drives concurrent calls and counts the kernel
calls they cost (merging happened, groups split where they must, max_batch and the entry
limit flush early, a bad call fails alone, cancelled callers and merged errors). Over the
wires, a real batching server answers many concurrent SDK calls exactly as the session's
unbatched server does.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparseserve import InvalidArgumentError, SparseTensor, kernels
from sparseserve.core.dtypes import DTYPE_NAMES
from sparseserve.core.tensor import HandleRef
from sparseserve.errors import InternalError
from sparseserve.server import batching
from sparseserve.server.config import ServerConfig
from sparseserve.server.ops import REGISTRY
from sparseserve.server.service import Service
from conftest import WIRES, ServerProcess, make_client
from helpers import assert_eq
from strategies import random_coo

BATCHABLE = ("reorder", "coalesce")
SETTINGS = settings(max_examples=40, deadline=None)
VALUES = {"low": -100, "high": 99, "normal": True}


# ----------------------------------------------------------------- helpers
def random_tensor(rng, shape, sparse_ndim, dtype, nnz, span=None) -> SparseTensor:
    """COO with ``nnz`` entries; indices drawn below ``span`` (small spans repeat often); floats
    standard normal: their sums are inexact, so any change of summation order shows."""
    return random_coo(rng, shape, nnz, dtype, sparse_ndim, span=span, repeat=False, values=VALUES)


def alone(op: str, tensor: SparseTensor) -> SparseTensor:
    """The op run on this tensor by itself, as an unbatched server runs it."""
    definition = REGISTRY.get(op)
    return definition.run("cpu", definition.bind({"sp_input": tensor}))[0]


@contextmanager
def batching_service(window_ms: float = 20, max_batch: int = 64):
    service = Service(ServerConfig(batch_window_ms=window_ms, max_batch=max_batch), REGISTRY)
    try:
        yield service
    finally:
        service.close()


def run_all(service: Service, calls: list[tuple[str, dict]], keep: bool = False) -> list:
    """Every call at once on one event loop; results, or the exceptions raised."""
    async def main():
        return await asyncio.gather(*(service.execute(op, args, keep, "") for op, args in calls),
                                    return_exceptions=True)

    return asyncio.run(main())


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts calls of the reorder and coalesce kernels by name."""
    counts: Counter = Counter()
    for name in BATCHABLE:
        real = getattr(kernels, name)

        def counted(*args, _real=real, _name=name):
            counts[_name] += 1
            return _real(*args)

        monkeypatch.setattr(kernels, name, counted)
    return counts


# ----------------------------------------------------------- in-process
def test_off_by_default():
    service = Service(ServerConfig(), REGISTRY)
    assert service.batcher is None
    service.close()
    assert {op.name for op in REGISTRY if op.batchable} == set(BATCHABLE)


@pytest.mark.parametrize("op", BATCHABLE)
def test_concurrent_calls_merge_into_one_kernel_call(op, kernel_calls):
    rng = np.random.default_rng(1)
    tensors = [random_tensor(rng, (int(rng.integers(1, 6)), int(rng.integers(1, 6))), 2, "float64",
                             int(rng.integers(0, 15)), span=3) for _ in range(16)]
    tensors.append(random_tensor(rng, (0, 4), 2, "float64", 0))  # empty, a zero dimension
    with batching_service() as service:
        results = run_all(service, [(op, {"sp_input": t}) for t in tensors])
        assert (service.batcher.merged_batches, service.batcher.merged_calls) == (1, len(tensors))
    assert kernel_calls[op] == 1
    for t, result in zip(tensors, results, strict=True):
        [(name, got)] = result
        assert name == "output"
        assert_eq(got, alone(op, t), bitwise=True, coalesced=True, layout="coo")


@st.composite
def call_sets(draw):
    """2 to 12 calls of mixed dtypes, sparse ranks, hybrid dims, duplicates and empties."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtypes = draw(st.lists(st.sampled_from(DTYPE_NAMES), min_size=1, max_size=2, unique=True))
    calls = []
    for _ in range(draw(st.integers(2, 12))):
        sparse_ndim = draw(st.integers(1, 3))
        dense = draw(st.sampled_from([(), (), (2,), (0,)]))
        shape = tuple(draw(st.integers(0, 5)) for _ in range(sparse_ndim)) + dense
        calls.append(random_tensor(rng, shape, sparse_ndim, draw(st.sampled_from(dtypes)),
                                   draw(st.integers(0, 20)), span=draw(st.sampled_from([2, None]))))
    return draw(st.sampled_from(BATCHABLE)), calls


@SETTINGS
@given(call_sets())
def test_batched_equals_unbatched(case):
    op, tensors = case
    with batching_service(window_ms=5) as service:
        results = run_all(service, [(op, {"sp_input": t}) for t in tensors])
        batcher = service.batcher
        groups = Counter((t.dtype, t.sparse_ndim, tuple(t.dense_shape[t.sparse_ndim:])) for t in tensors)
        # Each group of compatible calls costs one kernel call; a group of one runs alone.
        assert batcher.merged_batches == sum(1 for n in groups.values() if n > 1)
        assert batcher.merged_calls == sum(n for n in groups.values() if n > 1)
        assert batcher.single_calls == sum(1 for n in groups.values() if n == 1)
    for t, result in zip(tensors, results, strict=True):
        assert_eq(result[0][1], alone(op, t), bitwise=True, coalesced=True, layout="coo")


def test_single_call_runs_unbatched(kernel_calls):
    t = random_tensor(np.random.default_rng(2), (4, 4), 2, "float32", 6)
    with batching_service() as service:
        [result] = run_all(service, [("reorder", {"sp_input": t})])
        assert (service.batcher.merged_batches, service.batcher.single_calls) == (0, 1)
    assert kernel_calls["reorder"] == 1
    assert_eq(result[0][1], alone("reorder", t), bitwise=True, coalesced=True, layout="coo")


def test_max_batch_flushes_without_waiting_for_the_window(kernel_calls):
    rng = np.random.default_rng(3)
    tensors = [random_tensor(rng, (3, 3), 2, "int32", 4) for _ in range(10)]
    with batching_service(window_ms=60_000, max_batch=5) as service:
        async def main():  # a minute's window: only max_batch can answer within the timeout
            return await asyncio.wait_for(asyncio.gather(
                *(service.execute("coalesce", {"sp_input": t}, False, "") for t in tensors)), 10)

        results = asyncio.run(main())
        assert (service.batcher.merged_batches, service.batcher.merged_calls) == (2, 10)
    assert kernel_calls["coalesce"] == 2
    for t, result in zip(tensors, results, strict=True):
        assert_eq(result[0][1], alone("coalesce", t), bitwise=True, coalesced=True, layout="coo")


def test_entry_limit_starts_a_new_batch(monkeypatch, kernel_calls):
    # Merged calls stay on the kernels' sequential path; a small limit shows the cut.
    monkeypatch.setattr(batching, "MERGED_NNZ_LIMIT", 10)
    rng = np.random.default_rng(4)
    tensors = [random_tensor(rng, (9, 9), 2, "float64", 4) for _ in range(5)]
    with batching_service() as service:
        results = run_all(service, [("reorder", {"sp_input": t}) for t in tensors])
        assert (service.batcher.merged_batches, service.batcher.single_calls) == (2, 1)
    assert kernel_calls["reorder"] == 3
    for t, result in zip(tensors, results, strict=True):
        assert_eq(result[0][1], alone("reorder", t), bitwise=True, coalesced=True, layout="coo")


def test_large_calls_are_not_merged(kernel_calls):
    rng = np.random.default_rng(5)
    big = [random_tensor(rng, (100, 100), 2, "float64", 4000) for _ in range(2)]  # 96 kB each
    with batching_service() as service:
        results = run_all(service, [("coalesce", {"sp_input": t}) for t in big])
        assert service.batcher.merged_batches == 0
    assert kernel_calls["coalesce"] == 2
    for t, result in zip(big, results, strict=True):
        assert_eq(result[0][1], alone("coalesce", t), bitwise=True, coalesced=True, layout="coo")


def test_stacked_shape_past_int64_runs_each_alone(kernel_calls):
    wide = [SparseTensor(indices=[[1 << 40, 0], [0, 0], [1 << 40, 0]], values=[1.0, 2.0, 3.0],
                         dense_shape=[(1 << 40) + 1, 1]),
            SparseTensor(indices=[[0, 1 << 40], [0, 5]], values=[4.0, 5.0], dense_shape=[1, (1 << 40) + 1])]
    assert batching.merged_shape(wide) is None  # 2 * 2**40 * 2**40 keys do not fit
    with batching_service() as service:
        results = run_all(service, [("coalesce", {"sp_input": t}) for t in wide])
        assert (service.batcher.merged_batches, service.batcher.single_calls) == (0, 2)
    assert kernel_calls["coalesce"] == 2
    for t, result in zip(wide, results, strict=True):
        assert_eq(result[0][1], alone("coalesce", t), bitwise=True, coalesced=True, layout="coo")


def test_bad_call_fails_alone(kernel_calls):
    rng = np.random.default_rng(6)
    good = [random_tensor(rng, (5, 5), 2, "float64", 8) for _ in range(6)]
    out_of_range = SparseTensor(indices=[[0, 9]], values=[1.0], dense_shape=[5, 5])
    csr = SparseTensor(layout="csr", compressed_indices=[0, 1, 1], plain_indices=[0], values=[1.0],
                       dense_shape=[2, 2])
    calls = [("reorder", {"sp_input": t}) for t in good]
    calls[2:2] = [("reorder", {"sp_input": out_of_range}), ("reorder", {"sp_input": csr}),
                  ("reorder", {"sp_input": good[0], "axis": 1}), ("reorder", {})]
    with batching_service() as service:
        results = run_all(service, calls)
        assert (service.batcher.merged_batches, service.batcher.merged_calls) == (1, len(good))
    # A CSR tensor is never merged (batches are COO): it runs alone and gets its own answer.
    answer, want = results[3][0][1], alone("reorder", csr)
    assert_eq(answer, want, exact=True, layout="csr")
    bad = results[2:3] + results[4:6]
    expected = [(InvalidArgumentError, "INDEX_OUT_OF_RANGE"), (InvalidArgumentError, "UNKNOWN_ARGUMENT"),
                (InvalidArgumentError, "MISSING_ARGUMENT")]
    for error, (cls, reason) in zip(bad, expected, strict=True):
        assert isinstance(error, cls), error
        assert reason is None or error.reason == reason
    assert "sp_input" in str(bad[0])
    assert kernel_calls["reorder"] == 1
    for t, result in zip(good, results[:2] + results[6:], strict=True):
        assert_eq(result[0][1], alone("reorder", t), bitwise=True, coalesced=True, layout="coo")


def test_error_in_merged_call_reaches_every_caller(monkeypatch):
    def broken(*args):
        raise RuntimeError("kernel bug")

    monkeypatch.setattr(kernels, "coalesce", broken)
    tensors = [random_tensor(np.random.default_rng(7), (3, 3), 2, "float64", 3) for _ in range(4)]
    with batching_service() as service:
        results = run_all(service, [("coalesce", {"sp_input": t}) for t in tensors])
    assert all(isinstance(r, InternalError) and "kernel bug" in str(r) for r in results), results


def test_cancelled_caller_does_not_break_the_batch(kernel_calls):
    rng = np.random.default_rng(8)
    tensors = [random_tensor(rng, (6, 6), 2, "complex128", 5) for _ in range(5)]
    with batching_service(window_ms=50) as service:
        async def main():
            tasks = [asyncio.create_task(service.execute("coalesce", {"sp_input": t}, False, ""))
                     for t in tensors]
            await asyncio.sleep(0.01)  # all are waiting in the window
            tasks[1].cancel()
            return await asyncio.gather(*tasks, return_exceptions=True)

        results = asyncio.run(main())
        assert (service.batcher.merged_batches, service.batcher.merged_calls) == (1, 4)
    assert isinstance(results[1], asyncio.CancelledError)
    assert kernel_calls["coalesce"] == 1
    for i, (t, result) in enumerate(zip(tensors, results, strict=True)):
        if i != 1:
            assert_eq(result[0][1], alone("coalesce", t), bitwise=True, coalesced=True, layout="coo")


def test_keep_stores_each_callers_own_result():
    rng = np.random.default_rng(9)
    tensors = [random_tensor(rng, (4, 7), 2, "int64", 9, span=2) for _ in range(6)]
    with batching_service() as service:
        results = run_all(service, [("coalesce", {"sp_input": t}) for t in tensors], keep=True)
        assert service.batcher.merged_calls == len(tensors)
        for t, [(name, ref)] in zip(tensors, results, strict=True):
            assert name == "output" and isinstance(ref, HandleRef)
            assert_eq(asyncio.run(service.get(ref.handle, "")), alone("coalesce", t), bitwise=True, coalesced=True,
                      layout="coo")


def test_merge_and_split_round_trip():
    rng = np.random.default_rng(10)
    tensors = [random_tensor(rng, (2, 5, 3), 2, "float32", 4), random_tensor(rng, (6, 1, 3), 2, "float32", 0),
               random_tensor(rng, (3, 3, 3), 2, "float32", 7)]
    shape = batching.merged_shape(tensors)
    assert shape == (3, 6, 5, 3)
    merged = batching.merge_coo(tensors, shape)
    merged.validate("merged")
    assert merged.indices[:, 0].tolist() == [0] * 4 + [2] * 7
    for t, part in zip(tensors, batching.split_coo(merged, tensors, "test"), strict=True):
        assert_eq(part, t, bitwise=True, coalesced=True, layout="coo")


# ------------------------------------------------------------ over the wires
@pytest.fixture(scope="module")
def batched():
    srv = ServerProcess("--batch-window-ms", "20")
    yield srv
    code = srv.stop()
    assert code == 0, f"server exited with {code}: {srv.log()}"


def concurrently(fn, n: int) -> list:
    """fn(i) for i < n on n threads released together; results, or the exceptions raised."""
    results: list = [None] * n
    barrier = threading.Barrier(n)

    def worker(i):
        barrier.wait()
        try:
            results[i] = fn(i)
        except Exception as exc:  # handed to the test to assert on
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def wire_tensors(seed: int, n: int) -> list[SparseTensor]:
    rng = np.random.default_rng(seed)
    dtypes = ("float64", "float32", "int16", "bool", "complex64")
    out = []
    for i in range(n):
        sparse_ndim = 1 + i % 3
        shape = tuple(int(d) for d in rng.integers(1, 6, sparse_ndim)) + ((2,) if i % 4 == 3 else ())
        nnz = int(rng.integers(1, 12)) if i % 7 else 0
        # An empty complex tensor is refused by the JSON wire itself (BAD_JSON_TENSOR, with or
        # without batching): the in-process tests cover it.
        dtype = "float64" if nnz == 0 else dtypes[i % len(dtypes)]
        out.append(random_tensor(rng, shape, sparse_ndim, dtype, nnz, span=2))
    return out


@pytest.mark.parametrize("wire", WIRES)
def test_wire_answers_equal_unbatched_server(batched, server, wire):
    tensors = wire_tensors(11, 24)
    ops = [BATCHABLE[i % 2] for i in range(len(tensors))]
    clients = [make_client(batched, wire) for _ in tensors]
    try:
        got = concurrently(lambda i: getattr(clients[i], ops[i])(tensors[i]), len(tensors))
    finally:
        for c in clients:
            c.close()
    with make_client(server, wire) as plain:
        for op, t, result in zip(ops, tensors, got, strict=True):
            assert_eq(result, getattr(plain, op)(t), bitwise=True, coalesced=True, layout="coo")


def test_wire_bad_call_fails_alone_and_keep_works(batched, server):
    tensors = wire_tensors(12, 12)
    tensors[5] = SparseTensor(indices=[[3, 0]], values=[1.0], dense_shape=[2, 2])
    clients = [make_client(batched, "grpc") for _ in tensors]
    try:
        got = concurrently(lambda i: clients[i].coalesce(tensors[i], keep=True).get(), len(tensors))
    finally:
        for c in clients:
            c.close()
    assert isinstance(got[5], InvalidArgumentError) and got[5].reason == "INDEX_OUT_OF_RANGE", got[5]
    with make_client(server, "grpc") as plain:
        for i, (t, result) in enumerate(zip(tensors, got, strict=True)):
            if i != 5:
                assert_eq(result, plain.coalesce(t), bitwise=True, coalesced=True, layout="coo")


def test_batch_key_separates_what_must_not_merge():
    t = SparseTensor(indices=[[0, 1]], values=[1.0], dense_shape=[2, 2])
    def key(op, **args):
        return batching.batch_key(REGISTRY.get(op), REGISTRY.get(op).bind(args))

    assert key("to_dense", sp_input=t) is None  # a dense output sized by the shape
    assert key("add", a=t, b=t) is None  # two tensors
    assert key("map_values", sp_input=t, fn="neg") != key("map_values", sp_input=t, fn="abs")
    assert key("reorder", sp_input=t) == key("reorder", sp_input=SparseTensor(
        indices=[[5, 0], [1, 1]], values=[2.0, 3.0], dense_shape=[9, 3]))
    hybrid = SparseTensor(indices=[[0]], values=[[1.0, 2.0]], dense_shape=[2, 2])
    assert key("reorder", sp_input=t) != key("reorder", sp_input=hybrid)
    assert key("reorder", sp_input=t) != key("reorder", sp_input=SparseTensor(
        indices=[[0, 1]], values=np.ones(1, np.float32), dense_shape=[2, 2]))
