"""Service benchmark: tensors over the wires, small-call latency and throughput, startup.

A real server process on loopback, driven by the SDK; a raw TCP socket moving the
same bytes to another process is the yardstick for transfers.
``python -m bench.service --mb 256`` for a quicker run.
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable

import numpy as np

from sparseserve import Client, SparseTensor
from sparseserve._frames import execute_request_bytes
from sparseserve.server.config import MAX_REQUEST_BYTES_LIMIT

from ._server import BenchServer

# The receiving side of the raw-socket yardstick: a separate process, as the server is.
_SINK = """
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
total = int(sys.argv[1]); buf = bytearray(1 << 22); view = memoryview(buf); got = 0
while got < total:
    got += c.recv_into(view, min(len(buf), total - got))
c.sendall(b"k")
"""


# The yardstick of small calls: a grpc.aio server answering every call with fixed bytes,
# driven by grpcio's own client with requests of a reorder's size, in the same run. What
# sparseserve adds to a call is the difference (the floor moves by half between runs here).
_ECHO = """
import asyncio, sys, grpc
reply = bytes(int(sys.argv[1]))
async def echo(request, context):
    return reply
async def main():
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "bench.Echo", {"Call": grpc.unary_unary_rpc_method_handler(echo)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()
asyncio.run(main())
"""


class EchoServer:
    """The bare gRPC server of ``_ECHO`` in its own process; ``call()`` makes a stub."""

    def __init__(self, reply_bytes: int):
        self.proc = subprocess.Popen([sys.executable, "-c", _ECHO, str(reply_bytes)], stdout=subprocess.PIPE,
                                     text=True)
        self.target = f"127.0.0.1:{int(self.proc.stdout.readline())}"

    def call(self):
        import grpc

        return grpc.insecure_channel(self.target).unary_unary("/bench.Echo/Call")

    def __enter__(self) -> "EchoServer":
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def raw_tcp_gbs(payload: memoryview) -> float:
    sink = subprocess.Popen([sys.executable, "-c", _SINK, str(len(payload))], stdout=subprocess.PIPE, text=True)
    port = int(sink.stdout.readline())
    with socket.create_connection(("127.0.0.1", port)) as conn:
        start = time.perf_counter()
        conn.sendall(payload)
        conn.recv(1)
        seconds = time.perf_counter() - start
    sink.wait(30)
    return len(payload) / seconds / 1e9


def coo_of_bytes(nbytes: int) -> SparseTensor:
    nnz = nbytes // 24  # two int64 indices and one float64 value per entry
    rng = np.random.default_rng(7)
    indices = np.empty((nnz, 2), np.int64)
    indices[:, 0] = np.arange(nnz) // 1000
    indices[:, 1] = rng.integers(0, 1_000_000, nnz)
    return SparseTensor(indices=indices, values=rng.standard_normal(nnz),
                        dense_shape=[nnz // 1000 + 1, 1_000_000])


def transfer_gbs(client: Client, tensor: SparseTensor, repeat: int = 2) -> tuple[float, float]:
    """Best put and get GB/s after one warm-up round trip. The warm-up matters here: a fresh
    process's first big buffers cost the kernel page faults and huge-page compaction, and
    ran at a third of the speed of every later transfer."""
    ups, downs = [], []
    for _ in range(repeat + 1):
        start = time.perf_counter()
        handle = client.put(tensor)
        ups.append(time.perf_counter() - start)
        start = time.perf_counter()
        back = client.get(handle)
        downs.append(time.perf_counter() - start)
        client.delete(handle)
        assert np.array_equal(back.values, tensor.values), "the tensor came back changed"
        del back
    return tensor.nbytes / min(ups[1:]) / 1e9, tensor.nbytes / min(downs[1:]) / 1e9


def p50_ms(call: Callable[[], object], calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times[calls // 10:]) * 1e3  # the first tenth warms the connection


def calls_per_second(calls: list[Callable[[], object]], calls_each: int, warm_calls: int = 20) -> float:
    """Calls/s of ``calls`` (one per client, each its own connection) made from one thread each,
    after ``warm_calls`` from each (a new connection's first calls run slower)."""
    for call in calls:
        for _ in range(warm_calls):
            call()
    barrier = threading.Barrier(len(calls) + 1)

    def worker(call: Callable[[], object]) -> None:
        barrier.wait()
        for _ in range(calls_each):
            call()

    threads = [threading.Thread(target=worker, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    return len(calls) * calls_each / seconds


def reorder_calls_per_second(target: str, tensor: SparseTensor, clients: int, calls_each: int) -> float:
    sdk = [Client(target) for _ in range(clients)]
    try:
        return calls_per_second([functools.partial(c.reorder, tensor) for c in sdk], calls_each)
    finally:
        for c in sdk:
            c.close()


def interleaved_rates(rounds: int, **rate_of: Callable[[], float]) -> dict[str, list[float]]:
    """Each rate measured ``rounds`` times, taking turns: this machine's speed drifts from minute
    to minute, and taking turns lets every measure see the same drift."""
    rates: dict[str, list[float]] = {name: [] for name in rate_of}
    for _ in range(rounds):
        for name, rate in rate_of.items():
            rates[name].append(rate())
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.service")
    parser.add_argument("--mb", type=int, default=1000, help="size of the transferred COO tensor")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the calls/s measures (medians reported)")
    args = parser.parse_args()

    tensor = coo_of_bytes(args.mb * 1_000_000)
    rng = np.random.default_rng(0)
    small = SparseTensor(indices=rng.integers(0, 100, (100, 2)), values=rng.standard_normal(100),
                         dense_shape=[100, 100])
    with tempfile.TemporaryDirectory() as cache:  # an empty numba cache: the cold start
        cold = BenchServer(env_overrides={"NUMBA_CACHE_DIR": cache})
        cold.stop()
    # REST moves a tensor in one body: let the request limit and the store hold it.
    body_room = str(min(tensor.nbytes + (64 << 20), MAX_REQUEST_BYTES_LIMIT))
    with BenchServer("--max-request-bytes", body_room, "--store-bytes", str(4 * tensor.nbytes)) as server:
        tcp = raw_tcp_gbs(memoryview(np.concatenate([tensor.indices.reshape(-1).view(np.uint8),
                                                     tensor.values.view(np.uint8)])))
        calls_each = max(1, 4000 // args.clients)
        with Client(server.grpc_target) as c:
            grpc_up, grpc_down = transfer_gbs(c, tensor)
            grpc_p50 = p50_ms(functools.partial(c.reorder, small), args.calls)
        with Client(server.http_url, encoding="protobuf") as c:
            rest_up, rest_down = transfer_gbs(c, tensor)
        with Client(server.http_url, encoding="json") as c:
            json_p50 = p50_ms(functools.partial(c.reorder, small), args.calls)
        warm = server.startup_s
        request = execute_request_bytes("reorder", {"sp_input": small}, False)
        with EchoServer(len(request)) as echo:
            echo_p50 = p50_ms(functools.partial(echo.call(), request), args.calls)
            rates = interleaved_rates(
                args.rounds,
                ours=lambda: reorder_calls_per_second(server.grpc_target, small, args.clients, calls_each),
                bare=lambda: calls_per_second([functools.partial(echo.call(), request)
                                               for _ in range(args.clients)], calls_each))
    rate, echo_rate = statistics.median(rates["ours"]), statistics.median(rates["bare"])

    print(f"\n{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, loopback; "
          f"a {tensor.nbytes / 1e6:,.0f} MB COO tensor\n")
    print("| measure | value |")
    print("|---|---|")
    print(f"| raw TCP socket, same bytes | {tcp:.2f} GB/s |")
    print(f"| put over gRPC | {grpc_up:.2f} GB/s ({grpc_up / tcp:.0%} of TCP) |")
    print(f"| get over gRPC | {grpc_down:.2f} GB/s ({grpc_down / tcp:.0%} of TCP) |")
    print(f"| put over REST (protobuf body) | {rest_up:.2f} GB/s |")
    print(f"| get over REST (protobuf body) | {rest_down:.2f} GB/s |")
    print(f"| bare gRPC echo of a reorder's bytes, p50 | {echo_p50:.2f} ms |")
    print(f"| reorder of 100 nonzeros, p50, gRPC | {grpc_p50:.2f} ms (bare gRPC + {grpc_p50 - echo_p50:.2f}) |")
    print(f"| reorder of 100 nonzeros, p50, REST + JSON | {json_p50:.2f} ms |")
    spread = {name: f"{min(r):,.0f}–{max(r):,.0f}" for name, r in rates.items()}
    print(f"| bare gRPC echo calls/s, {args.clients} clients, median of {args.rounds} | {echo_rate:,.0f} "
          f"(rounds {spread['bare']}) |")
    print(f"| reorder calls/s, {args.clients} gRPC clients, median of {args.rounds} | {rate:,.0f} "
          f"({rate / echo_rate:.0%} of bare gRPC; rounds {spread['ours']}) |")
    print(f"| serve to ready, numba cache warm | {warm:.1f} s |")
    print(f"| serve to ready, numba cache cold | {cold.startup_s:.1f} s |")


if __name__ == "__main__":
    main()
