"""Scale-out benchmark: SpMV and ``reduce_sum`` on a tensor partitioned over a Dask
LocalCluster of 2 worker processes (loopback), against the single-node kernel, scipy and
PyTorch on the same matrix in the same run.

The partitioned calls go through ``Service.execute`` with a handle, as a request does after
the wire: the scheduler round trips, the vector sent to each block, the per-block kernels and
the gathered answer are all in the time. The fixed cost of that path is measured apart on a
100-row matrix. Ratios are single-node time / partitioned time (above 1: partitioned faster).
``python -m bench.distributed --rows 200000`` for a quicker run.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import logging
import os
import platform
import time

import numpy as np

from sparseserve import SparseTensor
from sparseserve.core.tensor import HandleRef

from ._results import figure, record
from .linalg import best_of, random_csr


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.distributed")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--per-row", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    try:
        from distributed import LocalCluster
    except ImportError:
        print("dask.distributed is not installed (pip install 'sparseserve[distributed]'): skipped")
        return
    from sparseserve.server.config import ServerConfig
    from sparseserve.server.ops import REGISTRY
    from sparseserve.server.service import Service

    a = random_csr(args.rows, args.per_row, seed=0)
    x = np.random.default_rng(1).standard_normal(args.rows)
    tiny = random_csr(100, 4, seed=2)

    def local(op: str, **kw):
        spec = REGISTRY.get(op)
        bound = spec.bind(kw)
        return lambda: spec.run("cpu", bound)[0]

    rows = {}
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=logging.ERROR) as cluster:
        service = Service(ServerConfig(dask_scheduler=cluster.scheduler_address, distribute_above_bytes=0,
                                       max_result_bytes=8 << 30), REGISTRY)
        try:
            def put(t):
                return HandleRef(asyncio.run(service.put(t, "", args.partitions))[0])

            def call(op: str, **kw):
                return lambda: dict(asyncio.run(service.execute(op, kw, False, "")))["output"]

            handle, tiny_handle = put(a), put(tiny)
            start = time.perf_counter()
            put(a)
            put_s = time.perf_counter() - start
            spmv_d, spmv_l = call("matmul", a=handle, b=x), local("matmul", a=a, b=x)
            np.testing.assert_allclose(spmv_d(), spmv_l(), rtol=1e-10, atol=1e-10)
            rows["SpMV (matmul, dense vector)"] = (best_of(spmv_l, args.repeat), best_of(spmv_d, args.repeat),
                                                   _peers_spmv(a, x, args.repeat))
            for axis in (None, [0], [1]):
                red_d = call("reduce_sum", sp_input=handle, axis=axis)
                red_l = local("reduce_sum", sp_input=a, axis=axis)
                np.testing.assert_allclose(red_d(), red_l(), rtol=1e-9, atol=1e-6)
                rows[f"reduce_sum, axis={axis}"] = (best_of(red_l, args.repeat), best_of(red_d, args.repeat),
                                                    _peers_sum(a, axis, args.repeat))
            fixed = best_of(call("matmul", a=tiny_handle, b=np.ones(100)), 20)
        finally:
            service.close()

    print(f"\n{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} cores; "
          f"{args.rows:,} x {args.rows:,} CSR, {args.per_row} per row ({a.nnz:,} nonzeros, "
          f"{a.nbytes / 2**20:.0f} MiB), {args.partitions} partitions over {args.workers} Dask worker "
          f"processes of 1 thread (LocalCluster, loopback)\n")
    print("| op | single node | partitioned | single / partitioned | scipy | torch |")
    print("|---|---|---|---|---|---|")
    for name, (single, dist, (scipy_s, torch_s)) in rows.items():
        print(f"| {name} | {single * 1e3:.1f} ms | {dist * 1e3:.1f} ms | {single / dist:.2f}x | "
              f"{_ms(scipy_s)} | {_ms(torch_s)} |")
    print(f"\nput with {args.partitions} partitions: {put_s:.2f} s ({a.nbytes / put_s / 2**20:.0f} MiB/s, "
          "cutting, sending, checking the blocks on the workers)")
    print(f"fixed cost of a partitioned call (100-row SpMV): {fixed * 1e3:.1f} ms")
    print(f"network per SpMV call: the vector to each block ({x.nbytes / 2**20:.1f} MiB x {args.partitions}) "
          f"and the answer back ({args.rows * 8 / 2**20:.1f} MiB); the {a.nnz:,} nonzeros stay put")
    sizes = {"rows": args.rows, "nnz": a.nnz, "partitions": args.partitions, "workers": args.workers}
    figures = []
    for name, (single, dist, (scipy_s, torch_s)) in rows.items():
        peers = {"scipy": scipy_s, "torch": torch_s}
        figures.append(figure(f"{name}, partitioned", dist, "single node (ours, 2 threads)", single, sizes=sizes))
        for ours_name, ours in (("partitioned", dist), ("single node", single)):
            figures += [figure(f"{name}, {ours_name}", ours, peer, seconds, sizes=sizes)
                        for peer, seconds in peers.items() if seconds is not None]
    figures += [figure(f"put with {args.partitions} partitions", put_s, sizes=sizes,
                       note=f"{a.nbytes / put_s / 2**20:.0f} MiB/s"),
                figure("fixed cost of a partitioned call (100-row SpMV)", fixed, sizes={"rows": 100})]
    record("distributed", figures, about=f"SpMV and reduce_sum on a {args.rows:,} × {args.rows:,} CSR matrix "
           f"({args.per_row} a row) partitioned over a Dask LocalCluster of {args.workers} worker processes of 1 "
           "thread (loopback), called through Service.execute with a handle, against the single-node kernel, scipy "
           "and torch on the same matrix", rows=args.rows, per_row=args.per_row, workers=args.workers,
           partitions=args.partitions, repeat=args.repeat)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _peers_spmv(a: SparseTensor, x: np.ndarray, repeat: int):
    scipy_s = torch_s = None
    try:
        m = _scipy(a)
        scipy_s = best_of(lambda: m @ x, repeat)
    except ImportError:
        pass
    try:
        import torch

        t = torch.sparse_csr_tensor(torch.from_numpy(a.compressed_indices.astype(np.int64)),
                                    torch.from_numpy(a.plain_indices.astype(np.int64)),
                                    torch.from_numpy(a.values), size=tuple(a.dense_shape))
        xt = torch.from_numpy(x)
        torch_s = best_of(lambda: t @ xt, repeat)
    except ImportError:
        pass
    return scipy_s, torch_s


def _peers_sum(a: SparseTensor, axis, repeat: int):
    try:
        m = _scipy(a)
    except ImportError:
        return None, None
    return best_of(lambda: m.sum(axis=None if axis is None else axis[0]), repeat), None


def _scipy(a: SparseTensor):
    """A scipy copy: its sum() merges duplicate entries in place, which would change ``a``."""
    import scipy.sparse as sp

    return sp.csr_matrix((a.values, a.plain_indices, a.compressed_indices), shape=a.dense_shape, copy=True)


if __name__ == "__main__":
    main()
