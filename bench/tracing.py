"""Tracing's cost to a small call: the p50 latency of a 100-entry reorder over gRPC and REST
(protobuf and JSON bodies) against a server without tracing and one started with
--otlp-endpoint, exporting every span (OpenTelemetry's batch processor) to an OTLP/gRPC receiver
on this host; the same again with the caller holding a current span, so the SDK sends
``traceparent`` and the server continues the trace; and a third server tracing one call in ten
(OpenTelemetry's ``OTEL_TRACES_SAMPLER=parentbased_traceidratio``, ``OTEL_TRACES_SAMPLER_ARG=0.1``).
The servers are up at once and the contenders take turns in every round; each figure is the
median of the rounds' p50s.
``python -m bench.tracing --calls 300 --rounds 3`` for a quicker run.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import time
from concurrent import futures
from typing import Callable, Iterator

import grpc
import numpy as np
from opentelemetry.sdk.trace import TracerProvider

from sparseserve import Client, SparseTensor

from ._results import figure, record
from ._server import BenchServer

WIRES = ("gRPC", "REST + protobuf", "REST + JSON")
OFF, ON, SAMPLED = "tracing off", "tracing on (OTLP export)", "tracing on, 1 call in 10 sampled"
# The caller's side: an application's span, made by a provider that keeps nothing.
CALLER = TracerProvider().get_tracer("bench.tracing")


class Receiver:
    """An OTLP/gRPC endpoint that takes each export and answers it unread (a collector's work is
    not the server's cost), counting what it was sent."""

    def __init__(self):
        self.requests = self.bytes = 0
        self.server = grpc.server(futures.ThreadPoolExecutor(1))
        handler = grpc.unary_unary_rpc_method_handler(self._export)  # bytes in, bytes out
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.trace.v1.TraceService", {"Export": handler}),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _export(self, request: bytes, context) -> bytes:
        self.requests += 1
        self.bytes += len(request)
        return b""  # an empty ExportTraceServiceResponse


def client(server: BenchServer, wire: str) -> Client:
    if wire == "gRPC":
        return Client(server.grpc_target)
    return Client(server.http_url, encoding="protobuf" if wire == "REST + protobuf" else "json")


@contextlib.contextmanager
def caller_span(traced: bool) -> Iterator[None]:
    if not traced:
        yield
        return
    with CALLER.start_as_current_span("caller"):
        yield


def p50_ms(call: Callable[[], object], calls: int, traced: bool) -> float:
    times = []
    with caller_span(traced):
        for _ in range(calls):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
    return statistics.median(times[len(times) // 10:]) * 1e3  # the first tenth warms the connection


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing")
    parser.add_argument("--nnz", type=int, default=100, help="entries of the small reorder")
    parser.add_argument("--calls", type=int, default=1000, help="calls per p50")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, the contenders taking turns in each")
    args = parser.parse_args()

    rng = np.random.default_rng(1)
    small = SparseTensor(indices=rng.integers(0, 1000, (args.nnz, 2)), values=rng.standard_normal(args.nnz),
                         dense_shape=[1000, 1000])
    receiver = Receiver()
    # (server, caller has a span); a caller's sampled span would have the third server trace every call
    contenders = [(OFF, False), (ON, False), (SAMPLED, False), (OFF, True), (ON, True)]
    p50s: dict[tuple[str, str, bool], list[float]] = {}
    endpoint = ("--otlp-endpoint", f"http://127.0.0.1:{receiver.port}")
    sampler = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"}
    with BenchServer() as off, BenchServer(*endpoint) as on, BenchServer(*endpoint, env_overrides=sampler) as sampled:
        servers = {OFF: off, ON: on, SAMPLED: sampled}
        clients = {(name, wire): client(server, wire) for name, server in servers.items() for wire in WIRES}
        for c in clients.values():
            c.reorder(small)  # the catalogue, the connection, the kernel
        for _ in range(args.rounds):
            for wire in WIRES:
                for name, traced in contenders:
                    p50s.setdefault((wire, name, traced), []).append(
                        p50_ms(functools.partial(clients[name, wire].reorder, small), args.calls, traced))
        for c in clients.values():
            c.close()
    receiver.server.stop(1)
    assert receiver.requests > 0, "the traced server exported nothing"

    ms = {key: statistics.median(values) for key, values in p50s.items()}
    sizes = {"nnz": args.nnz, "calls": args.calls}
    rows = []
    print(f"\n{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, servers on the same host; "
          f"{receiver.requests} exports, {receiver.bytes / 1e6:.1f} MB of spans received\n")
    print("| reorder of 100 nonzeros, p50 | tracing off | tracing on | cost | 1 in 10 sampled | cost | "
          "off, caller span | on, caller span | cost |")
    print("|---|---|---|---|---|---|---|---|---|")
    for wire in WIRES:
        base, traced_off = ms[wire, OFF, False], ms[wire, OFF, True]
        plain_on, traced_on, sampled_on = ms[wire, ON, False], ms[wire, ON, True], ms[wire, SAMPLED, False]
        print(f"| {wire} | {base:.3f} ms | {plain_on:.3f} ms | {(plain_on / base - 1) * 100:+.0f}% | "
              f"{sampled_on:.3f} ms | {(sampled_on / base - 1) * 100:+.0f}% | "
              f"{traced_off:.3f} ms | {traced_on:.3f} ms | {(traced_on / base - 1) * 100:+.0f}% |")
        rows += [
            figure(f"reorder of 100 nonzeros, p50, {wire}, tracing on", plain_on / 1e3, OFF, base / 1e3,
                   sizes=sizes, note="no current span in the caller: a new trace per call"),
            figure(f"reorder of 100 nonzeros, p50, {wire}, tracing on, caller span", traced_on / 1e3, OFF,
                   base / 1e3, sizes=sizes, note="the SDK sends traceparent, the server continues the trace"),
            figure(f"reorder of 100 nonzeros, p50, {wire}, tracing on, 1 call in 10 sampled", sampled_on / 1e3, OFF,
                   base / 1e3, sizes=sizes, note="OTEL_TRACES_SAMPLER=parentbased_traceidratio, ARG=0.1"),
            figure(f"reorder of 100 nonzeros, p50, {wire}, tracing off, caller span", traced_off / 1e3, OFF,
                   base / 1e3, sizes=sizes, note="the SDK's traceparent alone (the server ignores it)"),
        ]
    record("tracing", rows, about=__doc__.split("\n\n")[0].replace("\n", " "), nnz=args.nnz, calls=args.calls,
           rounds=args.rounds)


if __name__ == "__main__":
    main()
