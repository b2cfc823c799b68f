"""Same-host transfer benchmark: put/get through shared memory next to put/get over gRPC,
for the same tensor and the same server process.

``python -m bench.shm --mb 300`` for a quicker run (the default moves a ~1 GB COO tensor;
the client holds the tensor plus one copy, the server its stored copy plus one segment).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from sparseserve import Client, SparseTensor

from ._results import figure, record
from ._server import BenchServer
from .service import coo_of_bytes, transfer_gbs


def shm_transfer_gbs(target: str, tensor: SparseTensor, repeat: int = 2) -> tuple[float, float]:
    """Best put and get GB/s through shared memory, after one warm-up round trip (as
    ``transfer_gbs``: a fresh process's first big buffers cost page faults)."""
    ups, downs = [], []
    with Client(target) as client:
        for _ in range(repeat + 1):
            start = time.perf_counter()
            handle = client.put(tensor, shared_memory=True)
            ups.append(time.perf_counter() - start)
            start = time.perf_counter()
            back = client.get(handle, shared_memory=True)
            downs.append(time.perf_counter() - start)
            client.delete(handle)
            assert np.array_equal(back.values, tensor.values), "the tensor came back changed"
            del back
    return tensor.nbytes / min(ups[1:]) / 1e9, tensor.nbytes / min(downs[1:]) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.shm")
    parser.add_argument("--mb", type=int, default=1000, help="size of the transferred COO tensor")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    tensor = coo_of_bytes(args.mb * 1_000_000)
    with BenchServer("--store-bytes", str(4 * tensor.nbytes), "--allow-shared-memory") as server:
        shm_up, shm_down = shm_transfer_gbs(server.grpc_target, tensor, args.repeat)
        with Client(server.grpc_target) as c:
            grpc_up, grpc_down, _ = transfer_gbs(c, tensor, args.repeat)

    print(f"\n{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, same host; "
          f"a {tensor.nbytes / 1e6:,.0f} MB COO tensor\n")
    print("| transfer | shared memory | gRPC stream | ratio |")
    print("|---|---|---|---|")
    print(f"| put | {shm_up:.2f} GB/s | {grpc_up:.2f} GB/s | {shm_up / grpc_up:.1f}x |")
    print(f"| get | {shm_down:.2f} GB/s | {grpc_down:.2f} GB/s | {shm_down / grpc_down:.1f}x |")
    moved = {"bytes": tensor.nbytes}
    record("shm", [figure("put through shared memory", shm_up, "put over gRPC", grpc_up, unit="GB/s", sizes=moved),
                   figure("get through shared memory", shm_down, "get over gRPC", grpc_down, unit="GB/s",
                          sizes=moved)],
           about=f"put and get of a {tensor.nbytes / 1e6:,.0f} MB COO tensor through shared memory against the "
                 "same over gRPC, one server process on the same host", mb=args.mb, repeat=args.repeat)


if __name__ == "__main__":
    main()
