"""In-process kernel benchmarks against scipy, numpy and (when installed) PyTorch.

Same data, same run; prints seconds and ratios (peer time / our time: above 1
means sparseserve is faster). Peers are optional: a missing one is reported
and skipped. ``python -m bench --nnz 1000000`` for a quicker run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform

import numpy as np

from sparseserve import kernels
from ._results import figure, record
from ._timing import best_of


def coo_data(nnz: int, n: int, dup_fraction: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, n, size=(nnz, 2), dtype=np.int64)
    dups = int(nnz * dup_fraction)
    indices[nnz - dups:] = indices[rng.integers(0, nnz - dups, dups)]
    return indices, rng.standard_normal(nnz)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--nnz", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=100_000)
    parser.add_argument("--dense", type=int, default=4_000, help="side of the dense square")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows: list[tuple[str, str, float, float]] = []

    indices, values = coo_data(args.nnz, args.dim, 0.10)
    shape = (args.dim, args.dim)
    ours = best_of(lambda: kernels.coalesce(indices, values, shape), args.repeat)
    try:
        import scipy.sparse as sp

        peer = best_of(lambda: sp.coo_matrix((values, (indices[:, 0], indices[:, 1])), shape=shape).tocsr(),
                       args.repeat)
        rows.append(("coalesce", "scipy coo.tocsr()", ours, peer))
    except ImportError:
        print("scipy not installed: skipping the scipy peer")
    try:
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
        ti, tv = torch.from_numpy(indices.T.copy()), torch.from_numpy(values)
        peer = best_of(lambda: torch.sparse_coo_tensor(ti, tv, shape).coalesce(), args.repeat)
        rows.append(("coalesce", "torch coalesce()", ours, peer))
    except ImportError:
        print("torch not installed: skipping the torch peer (pip install torch==2.13.0)")

    ours = best_of(lambda: kernels.reorder(indices, values, shape), args.repeat)
    peer = best_of(lambda: (lambda o: (indices[o], values[o]))(np.lexsort(indices.T[::-1])), args.repeat)
    rows.append(("reorder", "np.lexsort + gather", ours, peer))

    # Bandwidth-bound ops, at 10% density: effective GB/s (bytes each op must read and write)
    # against a numpy copy's GB/s (it reads and writes its bytes once) in the same run.
    rng = np.random.default_rng(1)
    dense = np.where(rng.random((args.dense, args.dense)) < 0.1, 1.0, 0.0)
    di, dv = kernels.from_dense(dense, 2)
    copy = best_of(lambda: dense.copy(), args.repeat)
    copy_gbs = 2 * dense.nbytes / copy / 1e9
    sparse_bytes = di.nbytes + dv.nbytes
    band: list[tuple[str, int, float]] = []
    ours = best_of(lambda: kernels.to_dense(di, dv, dense.shape, 0.0, True), args.repeat)
    band.append(("to_dense", dense.nbytes + sparse_bytes, ours))
    ours = best_of(lambda: kernels.from_dense(dense, 2), args.repeat)
    band.append(("from_dense", dense.nbytes + sparse_bytes, ours))

    from sparseserve import SparseTensor
    from sparseserve.server.ops import REGISTRY

    mul = REGISTRY.get("mul")
    bound = mul.bind({"sp_input": SparseTensor(indices=di, values=dv, dense_shape=dense.shape),
                      "dense": dense})
    ours = best_of(lambda: mul.run("cpu", bound), args.repeat)
    # mul reads the dense operand only at stored entries: count the 64-byte lines it touches.
    lines = np.unique((di[:, 0] * dense.shape[1] + di[:, 1]) * dense.itemsize // 64).size * 64
    band.append(("mul (sparse * dense)", sparse_bytes + dv.nbytes + lines, ours))

    print(f"\n{datetime.date.today()} on {platform.machine()} with {os.cpu_count()} cores, "
          f"{platform.python_implementation()} {platform.python_version()}; "
          f"nnz={args.nnz:,} in {args.dim:,}^2 (10% duplicates), dense {args.dense:,}^2 float64\n")
    print("| op | peer | sparseserve (s) | peer (s) | peer / sparseserve |")
    print("|---|---|---|---|---|")
    for op, peer_name, ours, peer in rows:
        print(f"| {op} | {peer_name} | {ours:.4f} | {peer:.4f} | {peer / ours:.2f}x |")
    print(f"\nMemory bandwidth: a numpy copy of the {args.dense:,}^2 float64 array runs at "
          f"{copy_gbs:.1f} GB/s (read + write).\n")
    print("| op | bytes read + written | sparseserve (s) | GB/s | share of copy GB/s |")
    print("|---|---|---|---|---|")
    for op, nbytes, seconds in band:
        gbs = nbytes / seconds / 1e9
        print(f"| {op} | {nbytes / 1e6:,.0f} MB | {seconds:.4f} | {gbs:.1f} | {gbs / copy_gbs:.0%} |")
    entries = {"nnz": args.nnz, "dim": args.dim}
    record("kernels", [figure(op, ours, peer_name, peer, sizes=entries) for op, peer_name, ours, peer in rows]
           + [figure(op, nbytes / seconds / 1e9, "numpy copy", copy_gbs, unit="GB/s",
                     sizes={"dense_side": args.dense, "bytes": nbytes}) for op, nbytes, seconds in band],
           about=f"coalesce and reorder of {args.nnz:,} random entries in {args.dim:,}² (10% repeated), float64; "
                 f"to_dense, from_dense and mul on a {args.dense:,}² float64 array at 10% density, in GB/s of "
                 "the bytes each must read and write against a numpy copy's in the same run",
           nnz=args.nnz, dim=args.dim, dense=args.dense, repeat=args.repeat)


if __name__ == "__main__":
    main()
