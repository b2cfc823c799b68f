"""The GPU backend's plumbing: ``--device``, handles kept in device memory, results sent from
the host, CPU fallbacks logged and counted, pipelines and batching on a GPU worker.

The backend runs here on numpy and scipy.sparse in CuPy's place (``ArrayBackend.numpy_stand_in``):
the same dispatch, copies and store accounting a GPU worker does. With CuPy and a GPU present,
every test here runs on CuPy as well. Last, which ops have GPU kernels (each op's own tests are in
test_gpu_<module>.py, named after server/ops/<module>.py) and that no kernel writes its input."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import subprocess
import sys
import threading

import httpx
import numpy as np
import pytest

from sparseserve import Client, SparseTensor
from sparseserve.core.tensor import HandleRef, OutputRef
from sparseserve.errors import ResourceExhaustedError
from sparseserve.server.batching import batch_key
from sparseserve.server.config import ServerConfig
from sparseserve.server.device import ArrayBackend, DeviceTensor, Fallback, GpuKernel, GpuUnavailable
from sparseserve.server.ops import REGISTRY
from sparseserve.server.service import Service

from conftest import ServerProcess
from helpers import assert_eq
from strategies import random_coo

# The be and calls fixtures of _gpu_calls.py: each test on numpy standing in for CuPy, and on CuPy
# where a GPU is.
pytest_plugins = ["_gpu_calls"]


@pytest.fixture
def gpu(array_backend):
    service = Service(ServerConfig(batch_window_ms=0), REGISTRY, backend=array_backend)
    yield service
    service.close()


@pytest.fixture(scope="module")
def cpu():
    service = Service(ServerConfig(), REGISTRY, backend=None)
    yield service
    service.close()


def sample(n: int = 40, seed: int = 0) -> SparseTensor:
    """Unsorted float64 COO with repeated entries."""
    return random_coo(np.random.default_rng(seed), (6, 6), n, values={"normal": True})


def execute(service: Service, op: str, args: dict, keep: bool = False):
    return dict(asyncio.run(service.execute(op, args, keep, "")))


def fallbacks(service: Service) -> dict[tuple[str, str], float]:
    counts = {}
    for metric in service.metrics.registry.collect():
        if metric.name == "sparseserve_device_fallbacks":
            for s in metric.samples:
                if s.name.endswith("_total"):
                    counts[(s.labels["op"], s.labels["reason"])] = s.value
    return counts


def test_put_keeps_the_tensor_in_device_memory_and_the_store_counts_its_bytes(gpu):
    st = sample()
    handle, nbytes = asyncio.run(gpu.put(st, ""))
    stored = gpu.store.get(handle, "")
    assert type(stored) is DeviceTensor
    assert isinstance(stored.values, gpu.backend.xp.ndarray)
    assert nbytes == stored.nbytes == st.nbytes
    assert gpu.store.stats() == (1, nbytes)
    fetched = asyncio.run(gpu.get(handle, ""))  # a fetch copies it to the host for the wire
    assert type(fetched) is SparseTensor and isinstance(fetched.values, np.ndarray)
    assert_eq(fetched, st, exact=True)


def test_kept_results_stay_on_the_device_and_answers_leave_from_the_host(gpu, cpu):
    st = sample()
    kept = execute(gpu, "coalesce", {"sp_input": st}, keep=True)["output"]
    assert isinstance(kept, HandleRef)
    assert type(gpu.store.get(kept.handle, "")) is DeviceTensor
    dense = execute(gpu, "to_dense", {"sp_input": kept})["output"]
    assert type(dense) is np.ndarray
    expected = execute(cpu, "to_dense", {"sp_input": execute(cpu, "coalesce", {"sp_input": st})["output"]})["output"]
    np.testing.assert_allclose(dense, expected, rtol=1e-12)
    assert not fallbacks(gpu), "coalesce and to_dense have GPU kernels"


def test_an_op_without_a_gpu_kernel_runs_on_the_cpu_logged_and_counted(gpu, cpu, caplog):
    assert "cuda" not in REGISTRY.get("slice").kernels
    h = execute(gpu, "coalesce", {"sp_input": sample()}, keep=True)["output"]  # a tensor in device memory
    with caplog.at_level(logging.INFO, logger="sparseserve.device"):
        got = execute(gpu, "slice", {"sp_input": h, "start": [1, 0], "size": [4, 5]})["output"]
    held = asyncio.run(gpu.get(h.handle, ""))
    want = execute(cpu, "slice", {"sp_input": held, "start": [1, 0], "size": [4, 5]})["output"]
    assert type(got) is SparseTensor
    assert_eq(got, want, exact=True)
    assert fallbacks(gpu) == {("slice", "no_gpu_kernel"): 1.0}
    assert any("op slice runs on the CPU: no_gpu_kernel" in r.getMessage() for r in caplog.records)
    assert b'sparseserve_device_fallbacks_total{op="slice",reason="no_gpu_kernel"} 1.0' in gpu.metrics.render()


class OutOfMemoryError(Exception):
    """What CuPy raises when device memory runs out (matched by name: CuPy is not imported here)."""


@pytest.mark.parametrize("failure, reason", [
    (Fallback("too_big_for_the_device"), "too_big_for_the_device"),  # the kernel declines the call
    (OutOfMemoryError("out of memory allocating 8,388,608 bytes"), "device_memory"),  # the device is full
])
def test_a_gpu_kernel_that_cannot_finish_hands_the_call_to_the_cpu_kernel(gpu, cpu, monkeypatch, failure, reason):
    op = REGISTRY.get("coalesce")

    def fails(be, **bound):
        raise failure

    monkeypatch.setitem(op.kernels, "cuda", GpuKernel(fails))
    st = sample()
    got = execute(gpu, "coalesce", {"sp_input": st})["output"]
    want = execute(cpu, "coalesce", {"sp_input": st})["output"]
    assert_eq(got, want, exact=True)
    assert fallbacks(gpu) == {("coalesce", reason): 1.0}


def test_a_call_the_gpu_kernel_does_not_support_gives_the_cpu_answer(gpu, cpu):
    # int64 values: CuPy's sparse matrices hold bool, float and complex only.
    st = SparseTensor(indices=[[0, 0], [1, 1], [2, 0]], values=np.array([3, -4, 5], np.int64), dense_shape=[3, 2])
    x = np.array([7, 11], np.int64)
    got = execute(gpu, "matmul", {"a": st, "b": x})["output"]
    np.testing.assert_array_equal(got, execute(cpu, "matmul", {"a": st, "b": x})["output"])
    assert [op for op, _ in fallbacks(gpu)] == ["matmul"]


def test_a_pipeline_keeps_intermediates_on_the_device_and_returns_host_outputs(gpu, cpu):
    h = execute(gpu, "coalesce", {"sp_input": sample()}, keep=True)["output"]
    steps = [("t", "transpose", {"sp_input": h}), ("d", "to_dense", {"sp_input": OutputRef("t.output")})]
    out = dict(asyncio.run(gpu.execute_pipeline(steps, ["d.output"], False, "")))
    assert type(out["d.output"]) is np.ndarray
    held = asyncio.run(gpu.get(h.handle, ""))
    np.testing.assert_allclose(out["d.output"], cpu_dense_transposed(cpu, held), rtol=1e-12)


def cpu_dense_transposed(cpu, st):
    return execute(cpu, "to_dense", {"sp_input": execute(cpu, "transpose", {"sp_input": st})["output"]})["output"]


def test_a_result_size_estimate_that_cannot_read_device_arrays_reads_a_host_copy(gpu, cpu, monkeypatch):
    # CuPy raises TypeError when numpy is handed a device array; fill_empty_rows' estimate counts
    # rows with numpy. Here the estimate refuses DeviceTensors as CuPy's arrays would.
    op = REGISTRY.get("fill_empty_rows")
    estimate = op.result_bytes

    def refuses_device_arrays(sp_input, **rest):
        if isinstance(sp_input, DeviceTensor):
            raise TypeError("Implicit conversion to a NumPy array is not allowed")
        return estimate(sp_input=sp_input, **rest)

    monkeypatch.setitem(REGISTRY.ops, "fill_empty_rows", dataclasses.replace(op, result_bytes=refuses_device_arrays))
    h = execute(gpu, "coalesce", {"sp_input": sample()}, keep=True)["output"]
    got = execute(gpu, "fill_empty_rows", {"sp_input": h, "default_value": 0.0})
    want = execute(cpu, "fill_empty_rows", {"sp_input": asyncio.run(gpu.get(h.handle, "")), "default_value": 0.0})
    np.testing.assert_array_equal(got["output"].indices, want["output"].indices)
    np.testing.assert_array_equal(got["empty_row_indicator"], want["empty_row_indicator"])
    small = gpu.config.__class__(max_result_bytes=16)
    monkeypatch.setattr(gpu, "config", small)
    with pytest.raises(ResourceExhaustedError) as info:  # the check still runs, on the host copy
        execute(gpu, "fill_empty_rows", {"sp_input": h, "default_value": 0.0})
    assert info.value.reason == "RESULT_TOO_LARGE"


def test_a_large_answer_leaves_the_device_in_a_kernel_thread_not_on_the_event_loop(gpu, monkeypatch):
    big = sample(n=20_000)  # past INLINE_BYTES: the work runs in the kernel pool
    copied_in = []
    to_host = gpu.backend.to_host

    def recording_to_host(value):
        if isinstance(value, DeviceTensor):
            copied_in.append(threading.current_thread().name)
        return to_host(value)

    monkeypatch.setattr(gpu.backend, "to_host", recording_to_host)
    out = execute(gpu, "coalesce", {"sp_input": big})["output"]
    assert type(out) is SparseTensor
    assert copied_in and all(name.startswith("sparseserve-kernel") for name in copied_in), copied_in


def test_a_device_handle_is_never_merged_into_a_batch(gpu):
    op = REGISTRY.get("reorder")
    host = op.bind({"sp_input": sample()})
    assert batch_key(op, host) is not None
    on_device = op.bind({"sp_input": gpu.backend.to_device(sample())})
    assert batch_key(op, on_device) is None


def test_a_merged_batch_on_a_gpu_worker_is_split_on_the_host_and_equals_single_calls(array_backend, cpu, monkeypatch):
    from sparseserve.server import batching

    service = Service(ServerConfig(batch_window_ms=50, max_batch=4), REGISTRY, backend=array_backend)
    split_inputs = []
    split = batching.split_coo
    monkeypatch.setattr(batching, "split_coo", lambda value, *a: split_inputs.append(type(value)) or split(value, *a))
    tensors = [sample(n=30, seed=seed) for seed in range(4)]

    async def together():
        return await asyncio.gather(*(service.execute("coalesce", {"sp_input": t}, False, "") for t in tensors))

    try:
        answers = asyncio.run(together())
    finally:
        service.close()
    assert service.batcher.merged_batches == 1 and split_inputs == [SparseTensor]
    for t, answer in zip(tensors, answers, strict=True):
        got, want = dict(answer)["output"], execute(cpu, "coalesce", {"sp_input": t})["output"]
        assert type(got) is SparseTensor
        assert_eq(got, want, rtol=1e-12, atol=0)


def test_warm_up_runs_the_common_calls_on_the_gpu_kernels(gpu, monkeypatch):
    ran = []
    run = gpu.backend.run
    monkeypatch.setattr(gpu.backend, "run", lambda op, bound: ran.append(op.name) or run(op, bound))
    gpu.warm_up()
    assert gpu.ready
    assert {"coalesce", "convert", "reorder", "to_dense", "transpose", "reduce_sum", "matmul"} <= set(ran)
    assert not fallbacks(gpu), "every warm-up call takes the GPU path"


def test_device_cuda_without_a_gpu_stops_with_a_clear_message():
    try:
        ArrayBackend.cupy()
        pytest.skip("this host has CuPy and a GPU: --device cuda starts")
    except GpuUnavailable:
        pass
    proc = subprocess.run([sys.executable, "-m", "sparseserve.cli", "serve", "--device", "cuda",
                           "--grpc-port", "0", "--http-port", "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "--device cuda:" in proc.stderr and "--device cpu" in proc.stderr, proc.stderr


def test_device_auto_picks_what_the_host_has_and_says_so_on_both_wires():
    try:
        ArrayBackend.cupy()
        expected = "cuda"
    except GpuUnavailable:
        expected = "cpu"
    srv = ServerProcess("--device", "auto")
    try:
        assert srv.events[0]["device"] == expected  # the "listening" line
        assert httpx.get(f"{srv.http_url}/readyz").json() == {"status": "ready", "device": expected}
        assert httpx.get(f"{srv.http_url}/v1/ops").json()["device"] == expected
        with Client(srv.grpc_target) as c:
            c.list_ops()
            assert c.device == expected
    finally:
        assert srv.stop() == 0


# ------------------------------------------------------------------ coverage of the registry
GPU_OPS = {"add", "coalesce", "convert", "div", "map_values", "matmul", "mul", "reduce_max", "reduce_sum", "reorder",
           "to_dense", "transpose", "with_values",
           # tests/gpu/test_gpu_segment.py, test_gpu_aggregate.py and test_gpu_gather.py hold these
           "segment_sum", "segment_mean", "segment_sqrt_n", "mm", "index_select"}


def test_the_ops_with_gpu_kernels():
    assert {op.name for op in REGISTRY if "cuda" in op.kernels} == GPU_OPS


def test_inputs_are_never_written(calls):
    """The stand-in passes the bound (read-only) arrays straight to the kernels: a kernel that
    wrote its input would raise here. Kept device tensors are shared the same way."""
    rng = np.random.default_rng(21)
    t = random_coo(rng, (6, 6), 20, "float64")
    bound = REGISTRY.get("coalesce").bind({"sp_input": t})
    assert not bound["sp_input"].values.flags.writeable
    before = bound["sp_input"].values.copy()
    matmul, coalesce = REGISTRY.get("matmul"), REGISTRY.get("coalesce")
    calls.be.run(matmul, matmul.plan(matmul.bind({"a": bound["sp_input"], "b": np.ones(6)})))
    calls.be.run(coalesce, coalesce.plan(bound))
    np.testing.assert_array_equal(bound["sp_input"].values, before)
