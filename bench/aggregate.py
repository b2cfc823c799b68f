"""GNN aggregation: ``mm(adjacency, features, reduce="mean")`` in-process against PyTorch's
``torch.sparse.mm(csr, x, reduce="mean")`` (2 threads) on the same data in the same run.

A 1,000,000-node graph with 10,000,000 uniformly random edges (CSR, values in [0, 1)) and 64
float32 features per node. Ratios are torch time / our time (above 1: sparseserve is faster);
best of ``--repeat`` runs each. "op, sent" is the whole in-process call as the server makes it for
an adjacency sent with the request (argument binding and validation of the 10M-entry CSR, then
the kernel); "op, stored" the same for an adjacency held by handle (validated once when stored:
the GNN case, one graph and many feature matrices); "kernel" is ``kernels/aggregate.py`` alone,
as torch is timed (with its invariant checks off). int64 indices are what torch builds; int32
ones are what a client sends for a graph this size.
``python -m bench.aggregate --scale 0.1`` for a quicker run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import warnings

import numpy as np

from sparseserve import SparseTensor
from ._results import figure, record
from ._timing import paired


def random_graph(n: int, edges: int, seed: int = 0):
    """CSR (ptr int64, cols int64, float32 values) of ``edges`` uniform (src, dst) pairs,
    columns ascending in each row; repeated edges kept as separate entries."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n, edges)
    dst = rng.integers(0, n, edges)
    order = np.lexsort((dst, src))
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=ptr[1:])
    return ptr, dst[order], rng.random(edges, dtype=np.float32)


def run(scale: float = 1.0, repeat: int = 3, features: int = 64) -> None:
    import torch

    from sparseserve.kernels import aggregate as agk
    from sparseserve.kernels.linalg import balanced_bounds
    from sparseserve.server.validated import validated
    from sparseserve.server.ops import REGISTRY

    warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
    torch.set_num_threads(2)
    n, edges = int(1_000_000 * scale), int(10_000_000 * scale)
    ptr, cols, vals = random_graph(n, edges)
    x = np.random.default_rng(1).standard_normal((n, features), dtype=np.float32)
    tx = torch.from_numpy(x)
    op = REGISTRY.get("mm")
    print(f"\n{datetime.date.today()} on {platform.machine()} with {os.cpu_count()} cores, "
          f"{platform.python_implementation()} {platform.python_version()}, torch {torch.__version__} "
          f"(2 threads); {n:,} nodes, {edges:,} edges, {features} float32 features\n")
    print("| reduce | index | op, sent (s) | op, stored (s) | kernel (s) | torch (s) | torch / op, sent "
          "| torch / op, stored | torch / kernel |")
    print("|---|---|---|---|---|---|---|---|---|")
    sizes = {"nodes": n, "edges": edges, "features": features}
    figures = []
    for index in (np.int64, np.int32):
        p, c = ptr.astype(index), cols.astype(index)
        a = SparseTensor(layout="csr", compressed_indices=p, plain_indices=c, values=vals, dense_shape=[n, n])
        stored = validated(a, "mat1")  # as the handle store keeps it
        ta = torch.sparse_csr_tensor(torch.from_numpy(p), torch.from_numpy(c), torch.from_numpy(vals), (n, n),
                                     check_invariants=False)
        for reduce in ("mean", "sum", "amax"):
            if index == np.int32 and reduce != "mean":
                continue
            # Defaults bind this iteration's values (each runs within it; ruff's B023 cannot tell).
            fns = [lambda a=a, reduce=reduce: op.run("cpu", op.bind({"mat1": a, "mat2": x, "reduce": reduce})),
                   lambda stored=stored, reduce=reduce: op.run("cpu", op.bind({"mat1": stored, "mat2": x,
                                                                                "reduce": reduce})),
                   lambda ta=ta, reduce=reduce: torch.sparse.mm(ta, tx, reduce=reduce)]
            if reduce != "sum":  # the sum is matmul's SpMM kernel
                fns.append(lambda p=p, c=c, reduce=reduce: agk.mm_reduce(p, c, vals, x, reduce))
            sent, kept, theirs, *kernel = paired(fns, repeat)
            kernel = kernel[0] if kernel else float("nan")
            got = op.run("cpu", op.bind({"mat1": stored, "mat2": x, "reduce": reduce}))[0]
            want = torch.sparse.mm(ta, tx, reduce=reduce).numpy()
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)  # the same answer
            k_cell = "-" if kernel != kernel else f"{kernel:.3f}"
            kr_cell = "-" if kernel != kernel else f"{theirs / kernel:.2f}x"
            print(f"| {reduce} | {np.dtype(index).name} | {sent:.3f} | {kept:.3f} | {k_cell} | {theirs:.3f} | "
                  f"{theirs / sent:.2f}x | {theirs / kept:.2f}x | {kr_cell} |", flush=True)
            case, peer = f'mm(reduce="{reduce}"), {np.dtype(index).name}', f'torch.sparse.mm(csr, x, reduce="{reduce}")'
            figures += [figure(f"{case}, graph sent with the call", sent, peer, theirs, sizes=sizes),
                        figure(f"{case}, graph held by handle", kept, peer, theirs, sizes=sizes)]
            if not np.isnan(kernel):
                figures.append(figure(f"{case}, kernel alone", kernel, peer, theirs, sizes=sizes))
    # Where the time goes. The floor: a kernel that only touches what the gather must bring in
    # (one load per cache line of every gathered x row, prefetched as ours, nothing computed or
    # written but one float per row); the same mean kernel over entries whose columns walk x in
    # order (x streamed, not gathered); a numpy copy of x (bandwidth yardstick).
    bounds = balanced_bounds(ptr, agk.N_CHUNKS)
    touch = np.empty(n, np.float32)
    seq = np.sort(np.arange(edges, dtype=np.int64) % n)
    floor, ours, streamed, copy = paired([
        lambda: _touch_par(ptr, cols, x, touch, bounds),
        lambda: agk.mm_reduce(ptr, cols, vals, x, "mean"),
        lambda: agk.mm_reduce(ptr, seq, vals, x, "mean"),
        lambda: x.copy()], repeat)
    print(f"\n| the mean over int64 indices | seconds |\n|---|---|\n| kernel | {ours:.3f} |\n"
          f"| floor: touch every gathered cache line, nothing computed | {floor:.3f} |\n"
          f"| kernel, columns in order (x streamed, not gathered) | {streamed:.3f} |\n"
          f"| numpy copy of x ({x.nbytes / 1e6:,.0f} MB) | {copy:.3f} |")
    figures += [figure('mm(reduce="mean") kernel, int64', ours, "floor: touching every gathered cache line", floor,
                       sizes=sizes),
                figure('mm(reduce="mean") kernel, int64, columns in order (x streamed, not gathered)', streamed,
                       "numpy copy of x", copy, sizes={**sizes, "bytes": x.nbytes})]
    record("aggregate", figures, about=f"GNN aggregation: mm(adjacency, features, reduce) in process against "
           f"torch.sparse.mm(csr, x, reduce) (2 threads), a {n:,}-node graph with {edges:,} uniformly random edges "
           f"(CSR, float32 values) and {features} float32 features a node; the graph sent with each call (bound "
           "and validated in the time), held by handle (validated once), or the kernel alone as torch is timed",
           scale=scale, repeat=repeat, features=features)


def _touch_kernels():
    """The floor kernel (compiled here, at bench time; not part of the package)."""
    from numba import njit, prange

    from sparseserve.kernels.aggregate import PREFETCH_ROWS
    from sparseserve.kernels.linalg import U, prefetch

    @njit(nogil=True)
    def touch_rows(ptr, idx, x, out, lo, hi):
        k = x.shape[1]
        flat = x.reshape(-1)
        line = U(max(1, 64 // x.itemsize))
        end = U(ptr[hi]) if hi > lo else U(0)
        for i in range(lo, hi):
            acc = x.dtype.type(0)
            for p in range(U(ptr[i]), U(ptr[i + 1])):
                if p + U(PREFETCH_ROWS) < end:
                    first = U(idx[p + U(PREFETCH_ROWS)]) * U(k)
                    for e in range(first, first + U(k), line):
                        prefetch(flat, e)
                    prefetch(flat, first + U(k) - U(1))
                first = U(idx[p]) * U(k)
                for e in range(first, first + U(k), line):
                    acc += flat[e]
                acc += flat[first + U(k) - U(1)]
            out[i] = acc

    @njit(nogil=True, parallel=True)
    def touch_par(ptr, idx, x, out, bounds):
        for c in prange(bounds.size - 1):
            touch_rows(ptr, idx, x, out, bounds[c], bounds[c + 1])

    return touch_par


def _touch_par(*args):
    global _TOUCH
    if _TOUCH is None:
        _TOUCH = _touch_kernels()
    return _TOUCH(*args)


_TOUCH = None


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.aggregate")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the issue's sizes")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--features", type=int, default=64)
    args = parser.parse_args()
    run(args.scale, args.repeat, args.features)


if __name__ == "__main__":
    main()
