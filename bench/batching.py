"""Server-side batching benchmark: small-call throughput with and without --batch-window-ms.

Real servers on loopback, one plain and one per window; concurrent gRPC SDK clients each
send reorders of a 100-nonzero tensor, and the single-client p50 shows what the window
costs a call that has no partner. The last column is the service's own CPU time per call
(``Service.execute`` in this process, 16 calls at a time, no wire): what merging saves
where the wire and the clients do not dominate.
``python -m bench.batching --clients 32 --window-ms 2 10``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import time

import numpy as np

from sparseserve import Client, SparseTensor
from sparseserve.server.config import ServerConfig
from sparseserve.server.ops import REGISTRY
from sparseserve.server.service import Service

from ._results import figure, record
from ._server import BenchServer
from .service import p50_ms, reorder_calls_per_second


def measure(flags: list[str], tensor: SparseTensor, clients: int, calls: int, latency_calls: int):
    with BenchServer(*flags) as server:
        rate = reorder_calls_per_second(server.grpc_target, tensor, clients, max(1, calls // clients))
        with Client(server.grpc_target) as c:
            p50 = p50_ms(functools.partial(c.reorder, tensor), latency_calls)
    return rate, p50


def service_us_per_call(window_ms: float, max_batch: int, tensor: SparseTensor, rounds: int = 60,
                        at_once: int = 16) -> float:
    service = Service(ServerConfig(batch_window_ms=window_ms, max_batch=max_batch), REGISTRY)

    async def burst():
        await asyncio.gather(*(service.execute("reorder", {"sp_input": tensor}, False, "")
                               for _ in range(at_once)))

    async def timed() -> float:
        for _ in range(5):
            await burst()
        best = float("inf")
        for _ in range(5):  # the least of five: other work on the machine only adds
            start = time.process_time()
            for _ in range(rounds):
                await burst()
            best = min(best, time.process_time() - start)
        return best / (rounds * at_once) * 1e6

    try:
        return asyncio.run(timed())
    finally:
        service.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.batching")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--calls", type=int, default=4000, help="calls in all, shared by the clients")
    parser.add_argument("--window-ms", type=float, nargs="+", default=[1.0, 5.0])
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--latency-calls", type=int, default=300)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    small = SparseTensor(indices=rng.integers(0, 100, (100, 2)), values=rng.standard_normal(100),
                         dense_shape=[100, 100])
    from sparseserve import kernels

    kernels.warm_up()  # for the in-process column
    results = {"off": (*measure([], small, args.clients, args.calls, args.latency_calls),
                       service_us_per_call(0, args.max_batch, small))}
    for window in args.window_ms:
        flags = ["--batch-window-ms", str(window), "--max-batch", str(args.max_batch)]
        results[f"{window:g} ms window, max batch {args.max_batch}"] = (
            *measure(flags, small, args.clients, args.calls, args.latency_calls),
            service_us_per_call(window, args.max_batch, small))

    base = results["off"][0]
    print(f"\n{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, loopback; reorder of 100 nonzeros, "
          f"{args.clients} gRPC SDK clients, {args.calls} calls\n")
    print("| server-side batching | calls/s | vs off | p50, one client alone | service CPU per call |")
    print("|---|---|---|---|---|")
    for name, (rate, p50, cpu_us) in results.items():
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f}x | {p50:.2f} ms | {cpu_us:.0f} µs |")

    # Each window against the same server with batching off.
    off_rate, off_p50, off_cpu_us = results.pop("off")
    sizes = {"nnz": 100, "clients": args.clients, "calls": args.calls}
    figures = []
    for name, (rate, p50, cpu_us) in results.items():
        figures += [figure(f"calls/s, {name}", rate, "batching off", off_rate, unit="calls/s", sizes=sizes),
                    figure(f"p50, one client alone, {name}", p50 / 1e3, "batching off", off_p50 / 1e3, sizes=sizes),
                    figure(f"service CPU per call, {name}", cpu_us / 1e6, "batching off", off_cpu_us / 1e6,
                           sizes={"nnz": 100, "at_once": 16})]
    record("batching", figures, about=f"Server-side batching (--batch-window-ms) against none: reorders of a "
           f"100-nonzero tensor from {args.clients} concurrent gRPC SDK clients on loopback, a lone client's "
           "p50, and the service's own CPU per call (Service.execute in process, 16 calls at a time)",
           clients=args.clients, calls=args.calls, window_ms=args.window_ms, max_batch=args.max_batch,
           latency_calls=args.latency_calls)


if __name__ == "__main__":
    main()
