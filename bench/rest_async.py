"""``AsyncClient`` over REST: its calls run in worker threads over the blocking
``_http.Connections`` (the SDK's ``AsyncRestTransport``) against asyncio connections of our own
(``_http_async.AsyncConnections``), on the same server in the same run, the two taking turns in
every round (``_timing``).

Measured: small calls awaited one at a time (wall time and the client's CPU per call, both
encodings), many small calls in flight at once (calls/s), and a large get (GB/s).
``python -m bench.rest_async --mb 64 --repeat 3`` for a quicker run.

This benchmark decided against the asyncio connections (docs/sdk.md has the numbers), and
their module left the SDK; the contender reads it back from the last commit that had it
(``LOOP_MODULE``, with git), so the comparison can be made again.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import numpy as np

from sparseserve import AsyncClient, SparseTensor, _wire
from sparseserve._transport import Outputs, Settings, Tensor
from sparseserve._transport_rest import AsyncRestTransport

from ._results import figure, record
from ._server import BenchServer
from ._timing import best_of_each
from .service import coo_of_bytes

THREADS = "worker threads over _http"
LOOP = "asyncio connections (_http_async)"
LOOP_MODULE = "250bb7f7db5f59dcec00ebb258093943e34f6b83:client/_http_async.py"


def async_connections() -> type:
    """``AsyncConnections`` of ``LOOP_MODULE``, as the package's module ``_http_async``."""
    source = subprocess.run(["git", "show", LOOP_MODULE], cwd=Path(__file__).resolve().parent, check=True,
                            capture_output=True, text=True).stdout
    # Its relative imports take four names of today's _http, which keeps them.
    namespace: dict[str, Any] = {"__name__": "sparseserve._http_async", "__package__": "sparseserve"}
    exec(compile(source, LOOP_MODULE, "exec"), namespace)
    return namespace["AsyncConnections"]


class LoopTransport(AsyncRestTransport):
    """The contender: Execute and get on ``AsyncConnections``, on the event loop itself (put and
    delete, which only set up the tensor, stay in threads)."""

    def __init__(self, settings: Settings, connections: type):
        super().__init__(settings)
        headers = _wire.http_headers(settings.token, settings.encoding, settings.timeout)
        self._connections = connections(settings.address, headers=headers, timeout=settings.timeout, context=None)

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        response = await self._connections.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise _wire.http_error(response.status_code, bytes(response.content))
        return response

    async def execute(self, op: str, args: dict[str, Any], keep: bool, request_id: str | None) -> Outputs:
        encoding = self.settings.encoding
        response = await self._request("POST", f"/v1/ops/{op}", **_wire.rest_execute(op, args, keep, encoding))
        return _wire.rest_outputs(response.content, encoding)

    async def get(self, handle: str) -> Tensor:
        response = await self._request("GET", f"/v1/tensors/{handle}")
        return _wire.decode_rest_tensor(response.content, response.headers.get("content-type", ""))

    async def close(self) -> None:
        self._connections.close()
        await super().close()


def clients(url: str, connections: type, **options: Any) -> dict[str, AsyncClient]:
    """One client of each kind, on the same server."""
    threads, loop = AsyncClient(url, **options), AsyncClient(url, **options)
    loop._transport = LoopTransport(loop._settings, connections)
    return {THREADS: threads, LOOP: loop}


def small_tensor(nnz: int) -> SparseTensor:
    rng = np.random.default_rng(1)
    return SparseTensor(indices=rng.integers(0, 1000, (nnz, 2)), values=rng.standard_normal(nnz),
                        dense_shape=[1000, 1000])


def interleaved(loop: asyncio.AbstractEventLoop, runs: dict[str, Callable[[], Awaitable[object]]],
                repeat: int) -> tuple[dict[str, float], dict[str, float]]:
    """(best wall seconds, best client CPU seconds) of each contender's run, turns taken."""
    cpu = {name: float("inf") for name in runs}

    def timed(name: str) -> Callable[[], object]:
        def run() -> object:
            start = time.process_time()
            loop.run_until_complete(runs[name]())
            cpu[name] = min(cpu[name], time.process_time() - start)
            return None
        return run

    wall = best_of_each({name: timed(name) for name in runs}, repeat)
    return wall, cpu


def sequential_calls(c: AsyncClient, tensor: SparseTensor, calls: int) -> Callable[[], Awaitable[object]]:
    async def run() -> None:
        for _ in range(calls):
            await c.call("reorder", sp_input=tensor)
    return run


def calls_in_flight(c: AsyncClient, tensor: SparseTensor, calls: int) -> Callable[[], Awaitable[object]]:
    async def run() -> None:
        await asyncio.gather(*(c.call("reorder", sp_input=tensor) for _ in range(calls)))
    return run


def one_get(c: AsyncClient, handle: str, expected: SparseTensor) -> Callable[[], Awaitable[object]]:
    async def run() -> None:
        back = await c.get(handle)
        assert back.nnz == expected.nnz, "the tensor came back changed"
    return run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.rest_async")
    parser.add_argument("--nnz", type=int, default=100, help="entries of the small reorder")
    parser.add_argument("--calls", type=int, default=200, help="small calls per timed run")
    parser.add_argument("--in-flight", type=int, default=64, help="small calls gathered at once")
    parser.add_argument("--mb", type=int, default=256, help="size of the tensor got")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    small, big = small_tensor(args.nnz), coo_of_bytes(args.mb * 1_000_000)
    connections = async_connections()
    loop = asyncio.new_event_loop()
    rows = []
    with BenchServer("--store-bytes", str(4 * big.nbytes)) as server:
        for encoding in ("protobuf", "json"):
            pair = clients(server.http_url, connections, encoding=encoding)
            wall, cpu = interleaved(loop, {k: sequential_calls(c, small, args.calls) for k, c in pair.items()},
                                    args.repeat)
            for what, seconds in (("wall", wall), ("client CPU", cpu)):
                rows.append(figure(f"{encoding} reorder, one at a time: {what} per call",
                                   seconds[THREADS] / args.calls, LOOP, seconds[LOOP] / args.calls,
                                   sizes={"nnz": args.nnz, "calls": args.calls}))
            wall, cpu = interleaved(loop, {k: calls_in_flight(c, small, args.in_flight) for k, c in pair.items()},
                                    args.repeat)
            rows.append(figure(f"{encoding} reorder, {args.in_flight} in flight", args.in_flight / wall[THREADS],
                               LOOP, args.in_flight / wall[LOOP], unit="calls/s",
                               sizes={"nnz": args.nnz, "calls": args.in_flight}))
            rows.append(figure(f"{encoding} reorder, {args.in_flight} in flight: client CPU per call",
                               cpu[THREADS] / args.in_flight, LOOP, cpu[LOOP] / args.in_flight,
                               sizes={"nnz": args.nnz, "calls": args.in_flight}))
            if encoding == "protobuf":
                handle = loop.run_until_complete(pair[THREADS].put(big)).handle
                wall, cpu = interleaved(loop, {k: one_get(c, handle, big) for k, c in pair.items()}, args.repeat)
                rows.append(figure("protobuf get", big.nbytes / wall[THREADS] / 1e9, LOOP,
                                   big.nbytes / wall[LOOP] / 1e9, unit="GB/s", sizes={"bytes": big.nbytes}))
                rows.append(figure("protobuf get: client CPU", cpu[THREADS], LOOP, cpu[LOOP],
                                   sizes={"bytes": big.nbytes}))
                loop.run_until_complete(pair[THREADS].delete(handle))
            for c in pair.values():
                loop.run_until_complete(c.close())
    loop.close()

    print(f"\n{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, server on the same host\n")
    print(f"| case | {THREADS} | {LOOP} | ratio |")
    print("|---|---|---|---|")
    for row in rows:
        unit = row["unit"]
        scale, shown = (1e3, "ms") if unit == "s" else (1, unit)
        print(f"| {row['case']} | {row['ours'] * scale:.3f} {shown} | {row['peer_value'] * scale:.3f} {shown} "
              f"| {row['ratio']:.2f}x |")
    record("rest_async", rows, about=__doc__.split("\n\n")[0].replace("\n", " "), nnz=args.nnz,
           calls=args.calls, in_flight=args.in_flight, mb=args.mb, repeat=args.repeat)


if __name__ == "__main__":
    main()
