"""Scale-out on Dask (``--dask-scheduler``): a LocalCluster of 2 worker processes on loopback.

Every op with a partitioned plan gives exactly the single-node answer (a second Service without
a cluster computes it from the same tensor); ops without one gather; handles are shared by
replicas and freed on the workers when deleted or evicted; a worker killed mid-request gives
the right answer or a clear error, and the service keeps serving; each tenant makes room from
its own partitioned tensors. The last tests run real servers on the cluster and drive them with
the SDK over both wires, on a cluster that speaks TLS only too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import os
import re
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from distributed import Client, LocalCluster

from sparseserve import AsyncClient
from sparseserve.core.tensor import HandleRef, OutputRef, SparseTensor
from sparseserve.errors import (InvalidArgumentError, NotFoundError, PermissionDeniedError,
                                ResourceExhaustedError, UnavailableError, UnimplementedError)
from sparseserve.server import partition as part
from sparseserve.server.config import ServerConfig
from sparseserve.server.device import ArrayBackend
from sparseserve.server.ops import REGISTRY
from sparseserve.server.service import Service

from conftest import ROOT, ServerProcess, make_client, run_op
from helpers import assert_eq, eventually, example
from strategies import random_coo

SAME = {"exact": True, "coalesced": True, "same_type": True}  # integer values: sums exact in any order

pytestmark = pytest.mark.timeout(600)


def _cluster() -> LocalCluster:
    return LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                        silence_logs=logging.CRITICAL, memory_limit="2GiB")


@pytest.fixture(scope="module")
def cluster():
    with _cluster() as c:
        yield c


@pytest.fixture(scope="module")
def dask(cluster):
    with Client(cluster.scheduler_address, set_as_default=False) as client:
        yield client


@pytest.fixture(scope="module")
def service(cluster):
    s = Service(ServerConfig(dask_scheduler=cluster.scheduler_address, distribute_above_bytes=0), REGISTRY)
    yield s
    s.close()


@pytest.fixture(scope="module")
def single():
    s = Service(ServerConfig(), REGISTRY)
    yield s
    s.close()


def run(coro):
    return asyncio.run(coro)


def execute(svc: Service, op: str, args: dict, keep: bool = False, tenant: str = ""):
    return dict(run(svc.execute(op, args, keep, tenant)))["output"]


def coo(shape, nnz, seed=0, dtype=np.float64, hybrid=(), sort=True) -> SparseTensor:
    """Integer-valued entries: sums are exact in any order, so exact comparison is fair.
    ``sort``: coalesced (distinct positions, sorted, flagged); else repeats in any order."""
    return random_coo(np.random.default_rng(seed), (*shape, *hybrid), nnz, dtype, len(shape), coalesced=sort,
                      values={"low": -4, "high": 4, "halves": False})


def put(svc: Service, tensor, partitions: int = 3, tenant: str = "") -> str:
    return run(svc.put(tensor, tenant, partitions))[0]


def block_keys(svc: Service, handle: str) -> list[str]:
    dt = svc.cluster.lookup(handle, "")
    keys = [f.key for f in dt.blocks]
    del dt
    gc.collect()
    return keys


def held(dask: Client, keys: list[str]) -> list[str]:
    return dask.run_on_scheduler(lambda dask_scheduler: [k for k in keys if k in dask_scheduler.tasks])


# ------------------------------------------------------------------ cutting, without Dask
@pytest.mark.parametrize("tensor", [
    coo((40, 7), 120), coo((40, 3, 5), 150, hybrid=(2,)), coo((40, 7), 120, sort=False),
    SparseTensor(indices=np.zeros((0, 2), np.int64), values=np.zeros(0), dense_shape=(9, 4)),
    np.arange(60.0).reshape(20, 3)], ids=["coo", "hybrid", "unsorted", "empty", "dense"])
def test_split_then_join_gives_the_tensor_back(tensor):
    bounds = part.row_bounds(tensor, 4)
    assert bounds[0] == 0 and bounds[-1] == part.rows_of(tensor) and bounds == sorted(set(bounds))
    blocks = part.split_rows(tensor, bounds)
    assert [part.rows_of(b) for b in blocks] == np.diff(bounds).tolist()
    joined = part.join_rows(blocks, bounds)
    if isinstance(tensor, SparseTensor) and not tensor.coalesced and tensor.nnz:
        # Entries come back grouped by block, each group in its original order.
        order = np.argsort(np.searchsorted(bounds[1:-1], tensor.indices[:, 0], side="right"), kind="stable")
        tensor = SparseTensor(indices=tensor.indices[order], values=tensor.values[order],
                              dense_shape=tensor.dense_shape)
    assert_eq(joined, tensor, **SAME)


def test_csr_blocks_join_back_and_balance_entries():
    dense = np.zeros((30, 8))
    dense[:3] = 1.0  # three heavy rows, then a light tail
    dense[3:, 0] = 2.0
    t = REGISTRY.get("convert").run("cpu", REGISTRY.get("convert").bind(
        {"sp_input": REGISTRY.get("from_dense").run("cpu", {"tensor": dense, "sparse_dim": None})[0],
         "layout": "csr"}))[0]
    bounds = part.row_bounds(t, 2)
    blocks = part.split_rows(t, bounds)
    nnz = [b.nnz for b in blocks]
    assert abs(nnz[0] - nnz[1]) <= 8, nnz  # by entries, not rows: an even row split gives 31 vs 15
    assert_eq(part.join_rows(blocks, bounds), t, **SAME)


# ------------------------------------------------------------------ every plan vs one node
A = coo((300, 40), 1500, seed=1)
A3 = coo((30, 20, 10), 900, seed=2)
AH = coo((60, 9), 200, seed=3, hybrid=(3,))
UNSORTED = coo((300, 40), 1500, seed=4, sort=False)
_rng = np.random.default_rng(5)

CASES = [
    ("matmul", "a", A, {"b": _rng.integers(-3, 4, 40).astype(np.float64)}),
    ("matmul", "a", A, {"b": _rng.integers(-3, 4, (40, 5)).astype(np.float64)}),
    ("matmul", "a", A, {"b": _rng.integers(-3, 4, (5, 40)).astype(np.float64), "adjoint_b": True}),
    ("matmul", "a", A3, {"b": _rng.integers(-3, 4, (30, 10, 2)).astype(np.float64)}),
    ("matmul", "a", A, {"b": _rng.integers(-3, 4, (300, 2)).astype(np.float64), "adjoint_a": True}),  # gathers
    ("reduce_sum", "sp_input", A, {}),
    ("reduce_sum", "sp_input", A, {"axis": [0]}),
    ("reduce_sum", "sp_input", A, {"axis": [1]}),
    ("reduce_sum", "sp_input", A3, {"axis": [0, 2], "keepdims": True}),
    ("reduce_sum", "sp_input", A3, {"axis": [0], "output_is_sparse": True}),
    ("reduce_sum", "sp_input", AH, {"axis": [0, 2]}),
    ("reduce_max", "sp_input", A, {}),
    ("reduce_max", "sp_input", A, {"axis": [-2], "output_is_sparse": True}),
    ("reduce_max", "sp_input", A3, {"axis": [1], "output_is_sparse": True}),
    ("reduce_max", "sp_input", AH, {"axis": [0, 1], "keepdims": True}),
    ("mul", "sp_input", A, {"dense": _rng.integers(-3, 4, (300, 40)).astype(np.float64)}),
    ("mul", "sp_input", A, {"dense": _rng.integers(-3, 4, 40).astype(np.float64)}),
    ("mul", "sp_input", A, {"dense": _rng.integers(-3, 4, (1, 40)).astype(np.float64)}),
    ("div", "sp_input", A, {"dense": _rng.integers(1, 4, (300, 40)).astype(np.float64)}),
    ("map_values", "sp_input", A, {"fn": "abs"}),
    ("with_values", "sp_input", A, {"new_values": np.arange(A.nnz, dtype=np.float32)}),
    ("with_values", "sp_input", AH, {"new_values": np.ones((AH.nnz, 3), np.int32)}),
    ("retain", "sp_input", A, {"to_retain": np.arange(A.nnz) % 3 == 0}),
    ("to_dense", "sp_input", A, {}),
    ("to_dense", "sp_input", AH, {"default_value": 7}),
    ("transpose", "sp_input", A, {}),
    ("transpose", "sp_input", A3, {"perm": [2, 0, 1]}),
    ("transpose", "sp_input", A3, {"perm": [0, 2, 1]}),  # the leading axis stays: row-wise
    ("transpose", "sp_input", AH, {"perm": [1, 0, 2]}),
    ("coalesce", "sp_input", UNSORTED, {}),
    ("reorder", "sp_input", UNSORTED, {}),
    ("softmax", "sp_input", A, {}),  # no plan: gathered
]


@pytest.mark.parametrize("op,arg,tensor,args", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_partitioned_op_equals_single_node(service, single, op, arg, tensor, args):
    handle = put(service, tensor)
    got = execute(service, op, {arg: HandleRef(handle), **args})
    want = execute(single, op, {arg: tensor, **args})
    if op == "coalesce" or op == "reorder":
        # The partitioned tensor is what get returns (entries grouped by block): the reference too.
        want = execute(single, op, {arg: run(service.get(handle, "")), **args})
    assert_eq(got, want, **SAME)


@pytest.mark.parametrize("partitions", [2, 5, 7])
def test_reduction_trees_of_any_depth(service, single, partitions):
    ints = coo((300, 40), 1500, seed=6, dtype=np.int32)
    handle = HandleRef(put(service, ints, partitions=partitions))
    for op in ("reduce_sum", "reduce_max"):
        for args in ({}, {"axis": [0]}, {"axis": [0], "keepdims": True}, {"axis": [0], "output_is_sparse": True}):
            assert_eq(execute(service, op, {"sp_input": handle, **args}),
                      execute(single, op, {"sp_input": ints, **args}), **SAME)


def test_csr_matmul_and_reduction(service, single):
    csr = execute(single, "convert", {"sp_input": A, "layout": "csr"})
    handle = put(service, csr, partitions=2)
    assert_eq(run(service.get(handle, "")), csr, **SAME)
    b = _rng.integers(-3, 4, (40, 3)).astype(np.float64)
    assert_eq(execute(service, "matmul", {"a": HandleRef(handle), "b": b}),
              execute(single, "matmul", {"a": csr, "b": b}), **SAME)
    assert_eq(execute(service, "reduce_sum", {"sp_input": HandleRef(handle), "axis": [0]}),
              execute(single, "reduce_sum", {"sp_input": csr, "axis": [0]}), **SAME)


def test_what_the_scheduler_holds_per_handle_is_small(service, dask):
    """Metadata, not a stand-in: a stand-in's zero-stride arrays would pickle at full size."""
    import pickle

    rows = 4_000_000
    ptr = np.zeros(rows + 1, np.int64)
    ptr[1:] = 1
    tall = SparseTensor(layout="csr", compressed_indices=ptr, plain_indices=np.zeros(1, np.int64),
                        values=np.ones(1), dense_shape=[rows, 3])
    handle = put(service, tall, partitions=2)
    record = dask.get_dataset(handle)
    assert len(pickle.dumps({k: v for k, v in record.items() if k != "blocks"})) < 4096
    assert run(service.get(handle, "")).dense_shape == (rows, 3)


def test_concat_along_rows_mixes_partitioned_and_inline(service, single):
    b = coo((50, 40), 200, seed=9)
    handle = put(service, A)
    got = execute(service, "concat", {"axis": 0, "sp_inputs": [HandleRef(handle), b, HandleRef(handle)]})
    assert_eq(got, execute(single, "concat", {"axis": 0, "sp_inputs": [A, b, A]}), **SAME)
    # Along another axis there is no plan: gathered, same answer.
    c = coo((300, 5), 100, seed=10)
    assert_eq(execute(service, "concat", {"axis": 1, "sp_inputs": [HandleRef(handle), c]}),
              execute(single, "concat", {"axis": 1, "sp_inputs": [A, c]}), **SAME)


def test_kept_results_stay_partitioned_and_chain(service, single):
    handle = put(service, A3)
    kept = execute(service, "transpose", {"sp_input": HandleRef(handle), "perm": [1, 0, 2]}, keep=True)
    assert service.cluster.holds(service.cluster.lookup(kept.handle, ""))
    summed = execute(service, "reduce_sum", {"sp_input": kept, "axis": [0, 1]})
    want_t = execute(single, "transpose", {"sp_input": A3, "perm": [1, 0, 2]})
    assert_eq(summed, execute(single, "reduce_sum", {"sp_input": want_t, "axis": [0, 1]}), **SAME)
    assert_eq(run(service.get(kept.handle, "")), want_t, **SAME)
    # What the kept handle says it holds (the SDK's RemoteTensor reads it): the whole tensor's.
    info = kept.info
    assert (info.layout, info.dtype, info.shape, info.nnz) == ("coo", want_t.dtype, want_t.dense_shape, want_t.nnz)


def test_pipelines_gather_partitioned_inputs(service, single):
    handle = put(service, A)
    steps = [("t", "transpose", {"sp_input": HandleRef(handle)}),
             ("s", "reduce_sum", {"sp_input": OutputRef("t.output"), "axis": [1]})]
    got = dict(run(service.execute_pipeline(steps, ["s.output"], False, "")))["s.output"]
    assert_eq(got, execute(single, "reduce_sum", {"sp_input": execute(single, "transpose", {"sp_input": A}),
                                                   "axis": [1]}), **SAME)


# ------------------------------------------------------------------ refusals
def test_argument_errors_name_the_argument_before_any_block_runs(service, single):
    handle = HandleRef(put(service, A))
    with pytest.raises(InvalidArgumentError, match="new_values") as err:
        execute(service, "with_values", {"sp_input": handle, "new_values": np.ones(A.nnz - 1)})
    assert err.value.reason == "SHAPE_MISMATCH"
    bad = np.ones((7, 40))  # broadcasts to no block: the single node's own message, whole shape
    with pytest.raises(InvalidArgumentError) as want:
        execute(single, "mul", {"sp_input": A, "dense": bad})
    with pytest.raises(InvalidArgumentError) as got:
        execute(service, "mul", {"sp_input": handle, "dense": bad})
    assert (got.value.reason, got.value.message) == (want.value.reason, want.value.message)
    with pytest.raises(InvalidArgumentError) as got:
        execute(service, "reduce_sum", {"sp_input": handle, "axis": [5]})
    assert got.value.reason == "AXIS_OUT_OF_RANGE"
    with pytest.raises(InvalidArgumentError, match="inner|dimension|shape"):
        execute(service, "matmul", {"a": handle, "b": np.ones(41)})


def test_a_refusal_added_to_a_check_reaches_every_device_and_the_cluster(service, single, monkeypatch):
    """One rule, one place: a refusal written once, in mul's check, is made on the CPU, on a GPU
    worker (the numpy stand-in) before its kernel is asked, and on a partitioned tensor before
    any block works, with one message (the whole shape) everywhere."""
    op = REGISTRY.get("mul")

    def check(sp_input, dense):
        if dense.dtype == np.float16:
            raise UnimplementedError(f"mul does not take a float16 dense (shape {list(sp_input.dense_shape)})",
                                     reason="UNSUPPORTED_DTYPE")
        return op.check(sp_input, dense)

    gpu_calls = []
    gpu_kernel = op.kernels["cuda"]
    monkeypatch.setitem(REGISTRY.ops, "mul", dataclasses.replace(op, check=check, kernels={
        **op.kernels, "cuda": dataclasses.replace(gpu_kernel, fn=lambda *a, **k: gpu_calls.append(1))}))
    gpu = Service(ServerConfig(batch_window_ms=0), REGISTRY, backend=ArrayBackend.numpy_stand_in())
    fallbacks = []
    gpu.backend.on_fallback = lambda name, reason: fallbacks.append((name, reason))
    try:
        handle = HandleRef(put(service, A))
        half = np.ones(40, np.float16)
        messages = set()
        for svc, sp_input in ((single, A), (gpu, A), (service, handle)):
            with pytest.raises(UnimplementedError) as err:
                execute(svc, "mul", {"sp_input": sp_input, "dense": half})
            assert err.value.reason == "UNSUPPORTED_DTYPE"
            messages.add(err.value.message)
        assert messages == {f"mul does not take a float16 dense (shape {list(A.dense_shape)})"}
        assert not gpu_calls and not fallbacks  # refused before the device was asked
        assert_eq(execute(service, "mul", {"sp_input": handle, "dense": np.ones(40)}), A, exact=True)
    finally:
        gpu.close()


def test_gathering_is_bounded_by_the_result_limit(cluster):
    svc = Service(ServerConfig(dask_scheduler=cluster.scheduler_address, distribute_above_bytes=0,
                               max_result_bytes=20_000), REGISTRY)
    try:
        handle = HandleRef(put(svc, A, partitions=6))  # 1500 entries: 36 kB; 300 dense rows: 96 kB
        with pytest.raises(ResourceExhaustedError) as err:  # no plan: would gather the whole tensor
            execute(svc, "softmax", {"sp_input": handle})
        assert err.value.reason == "RESULT_TOO_LARGE" and "--max-result-bytes" in err.value.message
        with pytest.raises(ResourceExhaustedError):
            run(svc.get(handle.handle, ""))
        # Answers computed on the blocks are measured on the workers before they are fetched:
        # dense (96 kB) and sparse (36 kB, counted by the size SparseTensor tells Dask).
        for op, args in (("to_dense", {}), ("mul", {"dense": np.ones(40)})):
            with pytest.raises(ResourceExhaustedError) as err:
                execute(svc, op, {"sp_input": handle, **args})
            assert err.value.reason == "RESULT_TOO_LARGE"
        # Kept, a dense result stays in blocks that each fit; only fetching it whole is refused.
        kept = execute(svc, "to_dense", {"sp_input": handle}, keep=True)  # about 16 kB a block
        with pytest.raises(ResourceExhaustedError):
            run(svc.get(kept.handle, ""))
        # Ops that run on the blocks still answer: only their small results come back.
        assert execute(svc, "reduce_sum", {"sp_input": handle}) == A.values.sum()
    finally:
        svc.close()


def test_put_refusals(service, single):
    with pytest.raises(UnimplementedError) as err:
        run(single.put(A, "", 2))
    assert err.value.reason == "NO_CLUSTER"
    for bad in (-1, 5000, 1.5, True):
        with pytest.raises(InvalidArgumentError) as err:
            run(service.put(A, "", bad))
        assert err.value.reason == "BAD_PARTITIONS"
    bsr = execute(single, "convert", {"sp_input": coo((8, 8), 20), "layout": "bsr", "blocksize": [2, 2]})
    with pytest.raises(UnimplementedError) as err:
        run(service.put(bsr, "", 2))
    assert err.value.reason == "NOT_PARTITIONABLE"


def test_big_tensors_are_partitioned_without_asking(cluster):
    svc = Service(ServerConfig(dask_scheduler=cluster.scheduler_address, distribute_above_bytes=10_000), REGISTRY)
    try:
        small, big = coo((20, 5), 10), A
        h_small, h_big = put(svc, small, 0), put(svc, big, 0)
        assert svc.store.stats()[0] == 1  # the small one is here, the big one on the workers
        assert svc.store.get(h_small, "") is not None
        assert len(svc.cluster.lookup(h_big, "").blocks) == 2  # one per worker thread
        assert_eq(run(svc.get(h_big, "")), big, **SAME)
        kept = execute(svc, "to_dense", {"sp_input": HandleRef(h_big)}, keep=True)  # a big result too
        assert svc.cluster.holds(svc.cluster.lookup(kept.handle, ""))
    finally:
        svc.close()


# ------------------------------------------------------------------ handles
def test_replicas_share_handles_and_delete_frees_the_blocks(cluster, dask, single):
    a = Service(ServerConfig(dask_scheduler=cluster.scheduler_address), REGISTRY)
    b = Service(ServerConfig(dask_scheduler=cluster.scheduler_address), REGISTRY)
    try:
        handle = put(a, A)
        keys = block_keys(a, handle)
        assert len(held(dask, keys)) == 3
        v = np.arange(40.0)
        assert_eq(execute(b, "matmul", {"a": HandleRef(handle), "b": v}),
                  execute(single, "matmul", {"a": A, "b": v}), **SAME)
        with pytest.raises(PermissionDeniedError):
            run(b.get(handle, "someone-else"))
        run(b.delete(handle, ""))  # through the other replica
        for svc in (a, b):
            with pytest.raises(NotFoundError):
                run(svc.get(handle, ""))
        eventually(lambda: not held(dask, keys))
    finally:
        a.close()
        b.close()


def test_eviction_and_expiry_free_the_blocks(cluster, dask):
    clock = [0.0]
    svc = Service(ServerConfig(dask_scheduler=cluster.scheduler_address, dask_store_bytes=50_000,
                               store_ttl=100), REGISTRY)
    svc.cluster.store._clock = lambda: clock[0]
    try:
        first = put(svc, A)  # 36 kB each: the second pushes the first out
        first_keys = block_keys(svc, first)
        second = put(svc, coo((300, 40), 1500, seed=11))
        eventually(lambda: not held(dask, first_keys))
        with pytest.raises(NotFoundError):
            run(svc.get(first, ""))
        with pytest.raises(ResourceExhaustedError, match="--dask-store-bytes") as err:
            put(svc, coo((900, 40), 4000, seed=13))  # bigger than the whole budget: refused, not stored
        assert err.value.reason == "STORE_BUDGET"
        second_keys = block_keys(svc, second)
        clock[0] = 1000.0  # past the TTL: gone at the next look at the store
        svc.cluster.store.stats()
        eventually(lambda: not held(dask, second_keys))
    finally:
        svc.close()


def test_each_tenant_makes_room_from_its_own_partitioned_tensors(cluster, dask):
    """--tenant-dask-store-bytes: a tenant over its budget loses its own least recently used
    partitioned tensors (their blocks freed on the workers), never another tenant's; a tensor
    bigger than the budget is refused (TENANT_QUOTA, HTTP 429), as in the local store."""
    svc = Service(ServerConfig(dask_scheduler=cluster.scheduler_address, dask_store_bytes=1 << 20,
                               tenant_dask_store_bytes=80_000), REGISTRY)
    try:
        b_first = put(svc, A, tenant="b")  # 36 kB each
        a_first = put(svc, A, tenant="a")
        a_second = put(svc, coo((300, 40), 1500, seed=11), tenant="a")
        run(svc.get(a_first, "a"))  # used: now a_second is a's least recently used
        a_second_keys = block_keys_of(dask, a_second)
        a_third = put(svc, coo((300, 40), 1500, seed=14), tenant="a")  # a is over: its own oldest goes
        eventually(lambda: not held(dask, a_second_keys))  # unpublished by a thread of the replica's
        with pytest.raises(NotFoundError):
            run(svc.get(a_second, "a"))
        for handle, tenant in ((a_first, "a"), (a_third, "a"), (b_first, "b")):
            assert run(svc.get(handle, tenant)).nnz == 1500
        # b's kept results push out only b's own.
        b_first_keys = block_keys_of(dask, b_first)
        kept = execute(svc, "transpose", {"sp_input": HandleRef(b_first)}, keep=True, tenant="b")
        b_second = execute(svc, "reorder", {"sp_input": kept}, keep=True, tenant="b")
        eventually(lambda: not held(dask, b_first_keys))
        with pytest.raises(NotFoundError):
            run(svc.get(b_first, "b"))
        assert run(svc.get(b_second.handle, "b")).nnz == 1500 and run(svc.get(a_third, "a")).nnz == 1500
        # Bigger than one tenant's budget: refused, put or kept, naming the flag.
        big = coo((900, 40), 4000, seed=13)  # 96 kB
        with pytest.raises(ResourceExhaustedError, match="--tenant-dask-store-bytes") as err:
            put(svc, big, tenant="a")
        assert err.value.reason == "TENANT_QUOTA" and err.value.http_status == 429
        with pytest.raises(ResourceExhaustedError, match="--tenant-dask-store-bytes"):
            execute(svc, "to_dense", {"sp_input": HandleRef(a_first)}, keep=True, tenant="a")  # 96 kB dense
        assert run(svc.get(a_first, "a")).nnz == 1500 and run(svc.get(a_third, "a")).nnz == 1500
        assert run(svc.get(b_second.handle, "b")).nnz == 1500
    finally:
        svc.close()


def test_a_closed_dask_client_is_replaced_on_the_next_call(cluster, single):
    """Dask closes a client for good once its scheduler has been away past the reconnect
    timeout; the replica connects again rather than failing every later call."""
    svc = Service(ServerConfig(dask_scheduler=cluster.scheduler_address), REGISTRY)
    try:
        svc.cluster.client.close()
        handle = put(svc, A)
        v = np.arange(40.0)
        assert_eq(execute(svc, "matmul", {"a": HandleRef(handle), "b": v}),
                  execute(single, "matmul", {"a": A, "b": v}), **SAME)
    finally:
        svc.close()


# ------------------------------------------------------------------ a worker dies
def test_a_worker_killed_mid_request_gives_the_answer_or_a_clear_error():
    with _cluster() as c, Client(c.scheduler_address, set_as_default=False) as dask:
        svc = Service(ServerConfig(dask_scheduler=c.scheduler_address), REGISTRY)
        try:
            big = coo((20_000, 500), 400_000, seed=12)
            v = np.arange(500.0) % 7
            want = execute(Service(ServerConfig(), REGISTRY), "matmul", {"a": big, "b": v})
            handle = HandleRef(put(svc, big, partitions=8))
            outcomes, stop = [], threading.Event()

            def calls():
                while not stop.is_set():
                    try:
                        outcomes.append(execute(svc, "matmul", {"a": handle, "b": v}))
                    except UnavailableError as err:
                        outcomes.append(err)

            thread = threading.Thread(target=calls)
            thread.start()
            eventually(lambda: len(outcomes) >= 2)
            victim = next(iter(dask.run(os.getpid).values()))
            os.kill(victim, signal.SIGKILL)
            eventually(lambda: any(isinstance(o, UnavailableError) for o in outcomes), timeout=60)
            stop.set()
            thread.join(120)
            assert not thread.is_alive()
            errors = [o for o in outcomes if isinstance(o, UnavailableError)]
            answers = [o for o in outcomes if not isinstance(o, UnavailableError)]
            assert answers, "no call answered before the kill"
            for answer in answers:  # never a wrong answer
                np.testing.assert_array_equal(answer, want)
            for err in errors:
                assert err.reason in ("WORKER_LOST", "CLUSTER_UNAVAILABLE") and "Dask" in err.message
            # The service keeps serving: a new tensor works on the workers that are left (and the
            # replacement the nanny starts).
            again = HandleRef(put(svc, big, partitions=4))
            np.testing.assert_array_equal(execute(svc, "matmul", {"a": again, "b": v}), want)
        finally:
            svc.close()


# ------------------------------------------------------------------ real servers, the SDK
def test_servers_on_one_cluster_over_both_wires(cluster, dask):
    flags = ("--dask-scheduler", cluster.scheduler_address, "--distribute-above-bytes", "0")
    first, second = ServerProcess(*flags, wait=False), ServerProcess(*flags, wait=False)  # starting at once
    try:
        first.started()
        second.started()
        with make_client(first, "grpc") as grpc_client, make_client(second, "rest-json") as rest_client:
            put_progress, get_progress = [], []
            handle = grpc_client.put(A, partitions=2, progress=lambda *done_total: put_progress.append(done_total))
            # A partitioned transfer reports as any other: from nothing to every byte, never back.
            assert put_progress[0] == (0, handle.nbytes) and put_progress[-1] == (handle.nbytes, handle.nbytes)
            got = rest_client.get(handle, progress=lambda *done_total: get_progress.append(done_total))
            np.testing.assert_array_equal(got.to_dense(), A.to_dense())  # (JSON carries no coalesced flag)
            done, total = zip(*get_progress)
            assert done[0] == 0 and done[-1] == total[0] > 0 and list(done) == sorted(done), get_progress
            v = np.arange(40.0)
            np.testing.assert_array_equal(rest_client.matmul(handle, v), A.to_dense() @ v)
            np.testing.assert_array_equal(rest_client.reduce_sum(handle, axis=[0]), A.to_dense().sum(axis=0))
            mask = np.arange(A.nnz) % 2 == 0  # a JSON list, cut by the blocks' entries
            kept_half = rest_client.retain(handle, mask)
            want = run_op("retain", sp_input=A, to_retain=mask)
            assert np.array_equal(kept_half.indices, want.indices) and np.array_equal(kept_half.values, want.values)
            rest_handle = rest_client.put(AH, partitions=3)
            # JSON carries no coalesced flag: the tensor as it arrived.
            assert_eq(grpc_client.get(rest_handle), SparseTensor(indices=AH.indices, values=AH.values,
                                                                 dense_shape=AH.dense_shape), **SAME)
            kept = grpc_client.transpose(handle, keep=True)
            assert_eq(grpc_client.get(kept), run_op("transpose", sp_input=A), **SAME)
            for wire_client in (grpc_client, rest_client):
                with pytest.raises(InvalidArgumentError) as err:
                    wire_client.put(A, partitions=-2)
                assert err.value.reason == "BAD_PARTITIONS"
            async def async_put():
                async with AsyncClient(second.http_url) as c:  # protobuf body, partitions in the query
                    return await c.put(A3, partitions=2)

            async_handle = run(async_put())
            assert len(block_keys_of(dask, async_handle.handle)) == 2
            assert_eq(grpc_client.get(async_handle), A3, **SAME)
            keys = block_keys_of(dask, handle.handle)
            rest_client.delete(handle)
            with pytest.raises(NotFoundError):
                grpc_client.get(handle)
            eventually(lambda: not held(dask, keys))
    finally:
        first.stop()
        second.stop()


def block_keys_of(dask: Client, handle: str) -> list[str]:
    """The keys of a published handle's blocks, read from the scheduler."""
    return dask.run_on_scheduler(lambda dask_scheduler: [
        t.key for t in dask_scheduler.tasks.values()
        if any(c.client_key == f"published-{handle}" for c in t.who_wants)])


# ------------------------------------------------------------------ TLS to the Dask cluster
@pytest.fixture(scope="module")
def dask_tls(tmp_path_factory):
    """A Dask CA and certificates signed by it for the scheduler and the workers (each dials the
    other, so for both ends of a connection) and for a replica; a replica certificate of another CA."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    from certificates import Authority

    directory = tmp_path_factory.mktemp("dask-tls")
    authority, stranger = Authority(directory, "dask"), Authority(directory, "stranger")

    def named(cn):
        return [x509.NameAttribute(NameOID.COMMON_NAME, cn)]

    return {"ca": str(authority.path),
            "scheduler": authority.issue("scheduler", named("dask-scheduler"), server=True, client=True),
            "worker": authority.issue("worker", named("dask-worker"), server=True, client=True),
            "replica": authority.issue("replica", named("sparseserve"), client=True),
            "stranger": stranger.issue("stranger", named("sparseserve"), client=True)}


@pytest.fixture(scope="module")
def tls_cluster(dask_tls):
    from distributed.security import Security

    (scheduler_cert, scheduler_key), (worker_cert, worker_key) = dask_tls["scheduler"], dask_tls["worker"]
    # The cluster object itself talks to its scheduler as a client: with a worker's certificate.
    security = Security(tls_ca_file=dask_tls["ca"], tls_scheduler_cert=scheduler_cert,
                        tls_scheduler_key=scheduler_key, tls_worker_cert=worker_cert, tls_worker_key=worker_key,
                        tls_client_cert=worker_cert, tls_client_key=worker_key, require_encryption=True)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, protocol="tls",
                      security=security, silence_logs=logging.CRITICAL, memory_limit="1GiB") as c:
        assert c.scheduler_address.startswith("tls://")
        yield c


def tls_flags(dask_tls, who: str = "replica") -> list[str]:
    cert, key = dask_tls[who]
    return ["--dask-tls-ca", dask_tls["ca"], "--dask-tls-cert", cert, "--dask-tls-key", key]


def test_replicas_speak_tls_to_the_dask_cluster(tls_cluster, dask_tls):
    """Over tls:// with the replica's certificate: two replicas share a partitioned handle whose
    blocks live on TLS-only workers, with exact answers over both wires."""
    flags = ("--dask-scheduler", tls_cluster.scheduler_address, *tls_flags(dask_tls))
    first, second = ServerProcess(*flags, wait=False), ServerProcess(*flags, wait=False)  # starting at once
    try:
        first.started()
        second.started()
        with make_client(first, "grpc") as grpc_client, make_client(second, "rest-json") as rest_client:
            handle = grpc_client.put(A, partitions=2)
            v = np.arange(40.0)
            np.testing.assert_array_equal(rest_client.matmul(handle, v), A.to_dense() @ v)
            np.testing.assert_array_equal(rest_client.reduce_sum(handle, axis=[0]), A.to_dense().sum(axis=0))
            assert_eq(rest_client.get(handle), SparseTensor(indices=A.indices, values=A.values,
                                                            dense_shape=A.dense_shape), **SAME)
            rest_client.delete(handle)
            with pytest.raises(NotFoundError):
                grpc_client.get(handle)
    finally:
        assert first.stop() == 0, first.log()
        assert second.stop() == 0, second.log()


@pytest.mark.parametrize("case", ["another-ca", "plaintext"])
def test_a_replica_the_tls_cluster_does_not_trust_stops_at_start(tls_cluster, dask_tls, case):
    address = tls_cluster.scheduler_address
    flags = (["--dask-scheduler", address, *tls_flags(dask_tls, "stranger")] if case == "another-ca" else
             ["--dask-scheduler", address.replace("tls://", "tcp://")])
    with pytest.raises(RuntimeError, match="cannot reach the Dask scheduler") as err:
        ServerProcess(*flags, timeout=120)
    assert f"--dask-scheduler {flags[1]}" in str(err.value)


def test_dask_tls_flags_go_together_with_a_tls_scheduler(dask_tls, capsys):
    from sparseserve.server.config import config_from_args

    cert, key = dask_tls["replica"]
    cases = [
        (tls_flags(dask_tls), "give --dask-scheduler too"),
        (["--dask-scheduler", "tls://127.0.0.1:8786"], "speaks TLS: give --dask-tls-ca"),
        (["--dask-scheduler", "tcp://127.0.0.1:8786", *tls_flags(dask_tls)], "is not a tls:// address"),
        (["--dask-scheduler", "tls://127.0.0.1:8786", "--dask-tls-cert", cert, "--dask-tls-key", key],
         "need --dask-tls-ca too"),
        (["--dask-scheduler", "tls://127.0.0.1:8786", "--dask-tls-ca", dask_tls["ca"], "--dask-tls-cert", cert,
          "--dask-tls-key", dask_tls["stranger"][1]], "certificate and its key"),
    ]
    for argv, words in cases:
        with pytest.raises(SystemExit):
            config_from_args(argv)
        assert words in capsys.readouterr().err, argv
    config = config_from_args(["--dask-scheduler", "tls://127.0.0.1:8786", *tls_flags(dask_tls)])
    assert (config.dask_tls_ca, config.dask_tls_cert, config.dask_tls_key) == (dask_tls["ca"], cert, key)


def test_readme_example_prints_what_it_says(cluster):
    code, printed = example("docs/scale-out.md", "scale-out"), example("docs/scale-out.md", "scale-out-output")
    server = ServerProcess("--dask-scheduler", cluster.scheduler_address)
    try:
        code = code.replace("localhost:50051", server.grpc_target)
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        assert result.stdout == printed
    finally:
        server.stop()


def test_readme_lists_exactly_the_ops_with_a_plan():
    readme = (ROOT / "docs" / "scale-out.md").read_text()
    table = readme.split("**Which ops run where the blocks are.**")[1].split("\n\n")[1]
    listed = set(re.findall(r"`(\w+)`", "\n".join(row.split("|")[1] for row in table.splitlines()[2:])))
    assert listed == {op.name for op in REGISTRY if "dask" in op.kernels}


def test_without_a_scheduler_dask_is_never_imported():
    code = ("import asyncio, sys\n"
            "from sparseserve.server.app import serve\n"
            "from sparseserve.server.config import ServerConfig\n"
            "from sparseserve.server.ops import REGISTRY\n"
            "from sparseserve.server.service import Service\n"
            "from sparseserve import SparseTensor\n"
            "s = Service(ServerConfig(), REGISTRY)\n"
            "t = SparseTensor(indices=[[1, 0]], values=[2.0], dense_shape=[3, 3])\n"
            "asyncio.run(s.put(t, ''))\n"
            "asyncio.run(s.execute('reduce_sum', {'sp_input': t}, False, ''))\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"


def test_an_unreachable_scheduler_stops_the_server_at_start_with_the_reason():
    with pytest.raises(RuntimeError, match="cannot reach the Dask scheduler") as err:
        ServerProcess("--dask-scheduler", "tcp://127.0.0.1:1", "--dask-connect-timeout", "1", timeout=120)
    assert "--dask-scheduler tcp://127.0.0.1:1" in str(err.value)
