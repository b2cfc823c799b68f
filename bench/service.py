"""Service benchmark: tensors over the wires, small-call latency and throughput, startup.

A real server process on loopback, driven by the SDK; a raw TCP socket moving the
same bytes to another process is the yardstick for transfers.
``python -m bench.service --mb 256 --no-cold`` for a quicker run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
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

from sparseserve import AsyncClient, Client, SparseTensor, keep_transfer_buffers
from sparseserve.core.wire import GRPC_WINDOW_OPTIONS
from sparseserve.core.codec import DEFAULT_CHUNK_BYTES, iter_chunks
from sparseserve.core.frames import execute_request_bytes
from sparseserve.server.config import MAX_REQUEST_BYTES_LIMIT

from ._results import figure, record
from ._server import BenchServer

# The SDK side of these transfers keeps the memory gRPC frees (docs/sdk.md), as a program
# moving gigabytes would opt to: the figures before that became opt-in were made so.
keep_transfer_buffers()

# The receiving side of the raw-socket yardstick: a separate process, as the server is.
# It receives 4 MiB at a time into one reused buffer, or ("fresh") each byte into its place in
# a new buffer of the whole size, as a get's receiver must: that one pays the first touch of
# every page, which on this VM costs from a fraction of a second to seconds per GB.
_SINK = """
import socket, sys
import numpy as np
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
total, fresh = int(sys.argv[1]), sys.argv[2] == "fresh"
step = 1 << 22
view = memoryview(np.empty(total if fresh else step, np.uint8)); got = 0
while got < total:
    got += c.recv_into(view[got:got + step] if fresh else view, min(step, total - got))
c.sendall(b"k")
"""


# The yardsticks of gRPC itself: a grpc.aio server answering every call with fixed bytes,
# driven by grpcio's own client with requests of a reorder's size; the same server receiving
# a put's stream of frames and dropping them; and sending a get's frames, which the client
# drops, in the same run. What sparseserve adds to a call, a put or a get is the difference
# (the floor moves by half between runs here).
_ECHO = """
import asyncio, sys, grpc
from sparseserve import keep_transfer_buffers
keep_transfer_buffers()  # glibc thresholds kept, as the bench client keeps them (a 1 GB stream faulted 140,000 pages)
reply = bytes(int(sys.argv[1]))
async def echo(request, context):
    return reply
async def sink(frames, context):
    async for frame in frames:
        pass
    return b""
async def source(request, context):  # request: the frame count and size, 8 bytes each
    frame = bytes(int.from_bytes(request[8:], "little"))
    for _ in range(int.from_bytes(request[:8], "little")):
        await context.write(frame)
async def main():
    server = grpc.aio.server(options=[("grpc.http2.lookahead_bytes", 16 << 20)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "bench.Echo", {"Call": grpc.unary_unary_rpc_method_handler(echo),
                       "Sink": grpc.stream_unary_rpc_method_handler(sink),
                       "Source": grpc.unary_stream_rpc_method_handler(source)}),))
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

    def stream_gbs(self, tensor: SparseTensor, repeat: int = 3) -> tuple[float, float]:
        """Best GB/s of ``repeat`` streams (after one warm-up), through a channel set as the
        SDK's: up, the frames ``put`` sends for ``tensor``; down, as many chunk-sized frames as
        ``get`` receives."""
        import grpc

        channel = grpc.insecure_channel(self.target, options=GRPC_WINDOW_OPTIONS)
        sink, source = channel.stream_unary("/bench.Echo/Sink"), channel.unary_stream("/bench.Echo/Source")
        frames = -(-tensor.nbytes // DEFAULT_CHUNK_BYTES)
        request = frames.to_bytes(8, "little") + DEFAULT_CHUNK_BYTES.to_bytes(8, "little")

        def best_gbs(transfer: Callable[[], object]) -> float:
            seconds = []
            for _ in range(repeat + 1):
                start = time.perf_counter()
                transfer()
                seconds.append(time.perf_counter() - start)
            return tensor.nbytes / min(seconds[1:]) / 1e9

        try:
            return (best_gbs(lambda: sink(iter_chunks(tensor))),
                    best_gbs(lambda: collections.deque(source(request), maxlen=0)))
        finally:
            channel.close()

    def __enter__(self) -> "EchoServer":
        return self

    def __exit__(self, *_exc) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def raw_tcp_gbs(payload: memoryview, fresh: bool = False, repeat: int = 3) -> float:
    """Best GB/s of ``repeat`` sends to a new sink process (best of, as the transfers are)."""
    rates = []
    for _ in range(repeat):
        sink = subprocess.Popen([sys.executable, "-c", _SINK, str(len(payload)), "fresh" if fresh else "reuse"],
                                stdout=subprocess.PIPE, text=True)
        port = int(sink.stdout.readline())
        with socket.create_connection(("127.0.0.1", port)) as conn:
            start = time.perf_counter()
            conn.sendall(payload)
            conn.recv(1)
            rates.append(len(payload) / (time.perf_counter() - start) / 1e9)
        sink.wait(30)
    return max(rates)


def coo_of_bytes(nbytes: int) -> SparseTensor:
    nnz = nbytes // 24  # two int64 indices and one float64 value per entry
    rng = np.random.default_rng(7)
    indices = np.empty((nnz, 2), np.int64)
    indices[:, 0] = np.arange(nnz) // 1000
    indices[:, 1] = rng.integers(0, 1_000_000, nnz)
    return SparseTensor(indices=indices, values=rng.standard_normal(nnz),
                        dense_shape=[nnz // 1000 + 1, 1_000_000])


def transfer_gbs(client: Client, tensor: SparseTensor, repeat: int = 3) -> tuple[float, float, float]:
    """Best put and get GB/s of ``repeat`` each, after one warm-up of each, puts back to back and
    gets back to back; and the warm-up put's GB/s, the one the server's pool of upload buffers
    could not serve. The order matters on this VM: memory freed for more than ~2 s goes back to
    the host (virtio-balloon free page reporting), and touching a gigabyte of it again costs
    1.3-3.8 s of host faults, against 0.1 s for memory freed just before. The raw-socket
    yardstick's sinks also run back to back, so both see recently freed memory."""
    ups, downs = [], []
    for _ in range(repeat + 1):
        start = time.perf_counter()
        handle = client.put(tensor)
        ups.append(time.perf_counter() - start)
        if len(ups) <= repeat:
            client.delete(handle)
    for _ in range(repeat + 1):
        start = time.perf_counter()
        back = client.get(handle)
        downs.append(time.perf_counter() - start)
        assert np.array_equal(back.values, tensor.values), "the tensor came back changed"
        del back
    client.delete(handle)
    best_up, best_down, first_up = min(ups[1:]), min(downs[1:]), ups[0]
    return tensor.nbytes / best_up / 1e9, tensor.nbytes / best_down / 1e9, tensor.nbytes / first_up / 1e9


def p50_ms(call: Callable[[], object], calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return _p50_ms(times)


def async_p50_ms(target: str, tensor: SparseTensor, calls: int, **options) -> float:
    """``p50_ms`` of an ``AsyncClient``'s reorder, awaited one at a time."""
    async def main() -> list[float]:
        times = []
        async with AsyncClient(target, **options) as c:
            for _ in range(calls):
                start = time.perf_counter()
                await c.call("reorder", sp_input=tensor)
                times.append(time.perf_counter() - start)
        return times

    return _p50_ms(asyncio.run(main()))


def _p50_ms(times: list[float]) -> float:
    return statistics.median(times[len(times) // 10:]) * 1e3  # the first tenth warms the connection


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


def interleaved(rounds: int, **measure: Callable[[], float]) -> dict[str, list[float]]:
    """Each measure taken ``rounds`` times, taking turns: this machine's speed drifts from minute
    to minute, and taking turns lets every measure see the same drift."""
    figures: dict[str, list[float]] = {name: [] for name in measure}
    for _ in range(rounds):
        for name, take in measure.items():
            figures[name].append(take())
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.service")
    parser.add_argument("--mb", type=int, default=1000, help="size of the transferred COO tensor")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of the gRPC p50 and calls/s measures (medians reported)")
    parser.add_argument("--cold", action=argparse.BooleanOptionalAction, default=True,
                        help="measure a start with an empty numba cache (minutes: every kernel compiles)")
    args = parser.parse_args()

    tensor = coo_of_bytes(args.mb * 1_000_000)
    rng = np.random.default_rng(0)
    small = SparseTensor(indices=rng.integers(0, 100, (100, 2)), values=rng.standard_normal(100),
                         dense_shape=[100, 100])
    cold_s = None
    if args.cold:
        with tempfile.TemporaryDirectory() as cache:  # an empty numba cache: the cold start
            cold = BenchServer(env_overrides={"NUMBA_CACHE_DIR": cache}, timeout=1800.0)
            cold.stop()
            cold_s = cold.startup_s
    # REST moves a tensor in one body: let the request limit and the store hold it.
    body_room = str(min(tensor.nbytes + (64 << 20), MAX_REQUEST_BYTES_LIMIT))
    with BenchServer("--max-request-bytes", body_room, "--store-bytes", str(4 * tensor.nbytes)) as server:
        payload = memoryview(np.concatenate([tensor.indices.reshape(-1).view(np.uint8),
                                             tensor.values.view(np.uint8)]))
        tcp, tcp_fresh = raw_tcp_gbs(payload), raw_tcp_gbs(payload, fresh=True)
        del payload
        calls_each = max(1, 4000 // args.clients)
        with Client(server.grpc_target) as c:
            grpc_up, grpc_down, grpc_first_up = transfer_gbs(c, tensor)
        with EchoServer(0) as echo:
            stream_up, stream_down = echo.stream_gbs(tensor)
        with Client(server.http_url, encoding="protobuf") as c:
            rest_up, rest_down, rest_first_up = transfer_gbs(c, tensor)
        with Client(server.http_url, encoding="json") as c:
            json_p50 = p50_ms(functools.partial(c.reorder, small), args.calls)
        async_json_p50 = async_p50_ms(server.http_url, small, args.calls, encoding="json")
        warm = server.startup_s
        request = execute_request_bytes("reorder", {"sp_input": small}, False)
        with EchoServer(len(request)) as echo, Client(server.grpc_target) as c:
            ours_call, bare_call = functools.partial(c.reorder, small), functools.partial(echo.call(), request)
            latencies = interleaved(args.rounds, ours=lambda: p50_ms(ours_call, args.calls),
                                    bare=lambda: p50_ms(bare_call, args.calls))
            rates = interleaved(
                args.rounds,
                ours=lambda: reorder_calls_per_second(server.grpc_target, small, args.clients, calls_each),
                bare=lambda: calls_per_second([functools.partial(echo.call(), request)
                                               for _ in range(args.clients)], calls_each))
    grpc_p50, echo_p50 = statistics.median(latencies["ours"]), statistics.median(latencies["bare"])
    rate, echo_rate = statistics.median(rates["ours"]), statistics.median(rates["bare"])

    print(f"\n{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, loopback; "
          f"a {tensor.nbytes / 1e6:,.0f} MB COO tensor\n")
    print("| measure | value |")
    print("|---|---|")
    print(f"| raw TCP socket, same bytes | {tcp:.2f} GB/s |")
    print(f"| put over gRPC | {grpc_up:.2f} GB/s ({grpc_up / tcp:.0%} of TCP) |")
    print(f"| first put over gRPC, into fresh memory | {grpc_first_up:.2f} GB/s |")
    print(f"| bare gRPC stream of the same frames, dropped on arrival | {stream_up:.2f} GB/s (put is "
          f"{grpc_up / stream_up:.0%} of it) |")
    print(f"| raw TCP socket, same bytes into a fresh buffer | {tcp_fresh:.2f} GB/s |")
    print(f"| get over gRPC | {grpc_down:.2f} GB/s ({grpc_down / tcp:.0%} of TCP; "
          f"{grpc_down / tcp_fresh:.0%} of TCP into a fresh buffer) |")
    print(f"| bare gRPC stream of as many 1 MiB frames, dropped on arrival | {stream_down:.2f} GB/s (get is "
          f"{grpc_down / stream_down:.0%} of it) |")
    print(f"| put over REST (protobuf body) | {rest_up:.2f} GB/s (first, into fresh memory: {rest_first_up:.2f}) |")
    print(f"| get over REST (protobuf body) | {rest_down:.2f} GB/s |")
    ms = {name: f"{min(r):.2f}–{max(r):.2f}" for name, r in latencies.items()}
    print(f"| bare gRPC echo of a reorder's bytes, p50, median of {args.rounds} | {echo_p50:.2f} ms "
          f"(rounds {ms['bare']}) |")
    print(f"| reorder of 100 nonzeros, p50, gRPC, median of {args.rounds} | {grpc_p50:.2f} ms "
          f"(bare gRPC + {grpc_p50 - echo_p50:.2f}; rounds {ms['ours']}) |")
    print(f"| reorder of 100 nonzeros, p50, REST + JSON | {json_p50:.2f} ms |")
    print(f"| reorder of 100 nonzeros, p50, REST + JSON, AsyncClient | {async_json_p50:.2f} ms |")
    spread = {name: f"{min(r):,.0f}–{max(r):,.0f}" for name, r in rates.items()}
    print(f"| bare gRPC echo calls/s, {args.clients} clients, median of {args.rounds} | {echo_rate:,.0f} "
          f"(rounds {spread['bare']}) |")
    print(f"| reorder calls/s, {args.clients} gRPC clients, median of {args.rounds} | {rate:,.0f} "
          f"({rate / echo_rate:.0%} of bare gRPC; rounds {spread['ours']}) |")
    print(f"| serve to ready, numba cache warm | {warm:.1f} s |")
    if cold_s is not None:
        print(f"| serve to ready, numba cache cold | {cold_s:.1f} s |")

    moved = {"bytes": tensor.nbytes}
    tcp_name = "raw TCP socket, same bytes"
    small_calls = {"nnz": 100, "calls": args.calls}
    p50_note = f"median of {args.rounds} rounds: {ms['ours']} ms, bare {ms['bare']} ms"
    figures = [
        figure("put over gRPC", grpc_up, tcp_name, tcp, unit="GB/s", sizes=moved),
        figure("put over gRPC", grpc_up, "bare gRPC stream of the same frames", stream_up, unit="GB/s", sizes=moved),
        figure("first put over gRPC, into fresh memory", grpc_first_up, unit="GB/s", sizes=moved),
        figure("get over gRPC", grpc_down, tcp_name, tcp, unit="GB/s", sizes=moved),
        figure("get over gRPC", grpc_down, "raw TCP socket into a fresh buffer", tcp_fresh, unit="GB/s", sizes=moved),
        figure("get over gRPC", grpc_down, "bare gRPC stream of 1 MiB frames", stream_down, unit="GB/s", sizes=moved),
        figure("put over REST (protobuf body)", rest_up, tcp_name, tcp, unit="GB/s", sizes=moved),
        figure("first put over REST, into fresh memory", rest_first_up, unit="GB/s", sizes=moved),
        figure("get over REST (protobuf body)", rest_down, tcp_name, tcp, unit="GB/s", sizes=moved),
        figure("reorder of 100 nonzeros, p50, gRPC", grpc_p50 / 1e3, "bare gRPC echo of its bytes", echo_p50 / 1e3,
               sizes=small_calls, note=p50_note),
        figure("reorder of 100 nonzeros, p50, REST + JSON", json_p50 / 1e3, sizes=small_calls),
        figure("reorder of 100 nonzeros, p50, REST + JSON, AsyncClient", async_json_p50 / 1e3, sizes=small_calls),
        figure(f"reorder calls/s, {args.clients} gRPC clients", rate, "bare gRPC echo", echo_rate, unit="calls/s",
               sizes={"clients": args.clients, "calls_each": calls_each},
               note=f"median of {args.rounds} rounds: {spread['ours']}, bare {spread['bare']}"),
        figure("serve to ready, numba cache warm", warm),
    ]
    if cold_s is not None:
        figures.append(figure("serve to ready, numba cache cold", cold_s))
    record("service", figures, about=f"A real server on loopback driven by the SDK: a {tensor.nbytes / 1e6:,.0f} MB "
           "COO tensor put and got over gRPC and REST against a raw TCP socket and bare gRPC streams moving the "
           "same bytes; small-call latency and throughput against a bare grpc.aio echo of the same bytes; "
           "time to ready", mb=args.mb, calls=args.calls, clients=args.clients, rounds=args.rounds, cold=args.cold)


if __name__ == "__main__":
    main()
