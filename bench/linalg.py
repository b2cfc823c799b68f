"""Linear-algebra benchmarks: SpMV, SpMM, SpGEMM in-process against scipy and PyTorch, and
``matmul`` on a matrix held by handle through a real server over gRPC.

Same data, same run; ratios are peer time / our time (above 1: sparseserve is
faster). Peers are optional: a missing one is reported and skipped.
``python -m bench.linalg --scale 0.1`` for a quicker run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform

import numpy as np

from sparseserve import SparseTensor
from ._results import figure, record
from ._timing import best_of


def random_csr(n: int, per_row: int, seed: int, index_dtype=np.int32) -> SparseTensor:
    """n x n with exactly ``per_row`` uniform columns per row, ascending in each row."""
    rng = np.random.default_rng(seed)
    cols = rng.integers(0, n, size=(n, per_row), dtype=np.int64)
    cols.sort(axis=1)
    ptr = np.arange(0, n * per_row + 1, per_row, dtype=index_dtype)
    return SparseTensor(layout="csr", compressed_indices=ptr, plain_indices=cols.reshape(-1).astype(index_dtype),
                        values=rng.standard_normal(n * per_row), dense_shape=[n, n])


def _matmul(a, b):
    from sparseserve.server.ops import REGISTRY

    op = REGISTRY.get("matmul")
    bound = op.bind({"a": a, "b": b})
    return lambda: op.run("cpu", bound)[0]


def _peers(a: SparseTensor):
    """(scipy matrix or None, torch CSR tensor or None) of ``a``."""
    try:
        import scipy.sparse as sp

        sa = sp.csr_matrix((a.values, a.plain_indices, a.compressed_indices), shape=a.dense_shape)
    except ImportError:
        sa = None
    try:
        import torch

        torch.set_num_threads(2)
        ta = torch.sparse_csr_tensor(torch.from_numpy(a.compressed_indices.astype(np.int64)),
                                     torch.from_numpy(a.plain_indices.astype(np.int64)),
                                     torch.from_numpy(a.values), a.dense_shape, check_invariants=False)
    except ImportError:
        ta = None
    return sa, ta


def _copy_gbs(nbytes: int, repeat: int) -> float:
    """A numpy copy's GB/s (bytes read + written) over ``nbytes``: the yardstick of bandwidth."""
    big = np.ones(nbytes // 8)
    return 2 * big.nbytes / best_of(lambda: big.copy(), repeat) / 1e9


def in_process(scale: float, repeat: int) -> tuple[list, list, float]:
    """(peer rows, bandwidth rows, numpy copy GB/s); a peer row ends with the sizes it ran at."""
    rows, band = [], []
    n = int(2_000_000 * scale)
    a = random_csr(n, 10, 0)
    x = np.random.default_rng(1).standard_normal(n)
    copy_gbs = _copy_gbs(a.nbytes, repeat)
    sa, ta = _peers(a)
    ours = best_of(_matmul(a, x), repeat)
    label, sizes = f"SpMV {n:,}^2, {a.nnz:,} nnz, int32", {"n": n, "nnz": a.nnz}
    if sa is not None:
        rows.append((label, "scipy A @ x", ours, best_of(lambda: sa @ x, repeat), sizes))
    if ta is not None:
        import torch

        tx = torch.from_numpy(x)
        rows.append((label, "torch CSR A @ x (2 threads)", ours, best_of(lambda: ta @ tx, repeat), sizes))
    # SpMV must read the matrix and x and write y once (x's random reads at best once).
    band.append(("SpMV", a.nbytes + 2 * x.nbytes, ours))

    n = int(200_000 * scale)
    a = random_csr(n, 10, 2)
    x = np.random.default_rng(3).standard_normal((n, 64))
    sa, ta = _peers(a)
    ours = best_of(_matmul(a, x), repeat)
    label, sizes = f"SpMM {n:,}^2, {a.nnz:,} nnz @ [{n:,}, 64]", {"n": n, "nnz": a.nnz, "columns": 64}
    if sa is not None:
        rows.append((label, "scipy A @ X", ours, best_of(lambda: sa @ x, repeat), sizes))
    if ta is not None:
        import torch

        tx = torch.from_numpy(x)
        rows.append((label, "torch CSR A @ X (2 threads)", ours, best_of(lambda: ta @ tx, repeat), sizes))
    band.append(("SpMM", a.nbytes + 2 * x.nbytes, ours))

    n = int(100_000 * scale)
    a, b = random_csr(n, 10, 4), random_csr(n, 10, 5)
    ours = best_of(_matmul(a, b), repeat)
    sa, _ = _peers(a)
    sb, _ = _peers(b)
    if sa is not None:
        rows.append((f"SpGEMM {n:,}^2 @ {n:,}^2, 10 nnz/row", "scipy A @ B", ours,
                     best_of(lambda: sa @ sb, repeat), {"n": n, "nnz": a.nnz + b.nnz}))
    return rows, band, copy_gbs


def through_service(scale: float, repeat: int) -> dict[str, float]:
    """``c.matmul(handle, x)`` over gRPC against the in-process op plus x and y at wire speed:
    the seconds of each (``service``, ``kernel``, ``moved``), the put and get GB/s and ``n``."""
    from sparseserve import Client

    from ._server import BenchServer
    from .service import transfer_gbs

    n = int(2_000_000 * scale)
    a = random_csr(n, 10, 0)
    x = np.random.default_rng(1).standard_normal(n)
    kernel = best_of(_matmul(a, x), repeat)
    room = str(2 * a.nbytes + (64 << 20))
    with BenchServer("--max-request-bytes", room, "--store-bytes", str(4 * a.nbytes)) as server, \
            Client(server.grpc_target) as c:
        probe = SparseTensor(indices=np.zeros((n // 2, 1), np.int64), values=np.ones(n // 2), dense_shape=[n])
        up, down, _ = transfer_gbs(c, probe)
        handle = c.put(a)
        try:
            service = best_of(lambda: c.matmul(handle, x), repeat)
        finally:
            c.delete(handle)
    moved = x.nbytes / up / 1e9 + x.nbytes / down / 1e9
    return {"service": service, "kernel": kernel, "moved": moved, "up": up, "down": down, "n": n}


def run(scale: float = 1.0, repeat: int = 5, service: bool = True) -> None:
    """Print the tables (Markdown)."""
    rows, band, copy_gbs = in_process(scale, repeat)
    print(f"\n{datetime.date.today()} on {platform.machine()} with {os.cpu_count()} cores, "
          f"{platform.python_implementation()} {platform.python_version()}; linear algebra, float64\n")
    print("| op | peer | sparseserve (s) | peer (s) | peer / sparseserve |")
    print("|---|---|---|---|---|")
    for op, peer_name, ours, peer, _ in rows:
        print(f"| {op} | {peer_name} | {ours:.4f} | {peer:.4f} | {peer / ours:.2f}x |")
    print(f"\nA numpy copy runs at {copy_gbs:.1f} GB/s (read + write).\n")
    print("| op | bytes read + written | sparseserve (s) | GB/s | share of copy GB/s |")
    print("|---|---|---|---|---|")
    for op, nbytes, seconds in band:
        gbs = nbytes / seconds / 1e9
        print(f"| {op} | {nbytes / 1e6:,.0f} MB | {seconds:.4f} | {gbs:.1f} | {gbs / copy_gbs:.0%} |")
    figures = [figure(op, ours, peer_name, peer, sizes=sizes) for op, peer_name, ours, peer, sizes in rows]
    figures += [figure(op, nbytes / seconds / 1e9, "numpy copy", copy_gbs, unit="GB/s", sizes={"bytes": nbytes})
                for op, nbytes, seconds in band]
    if service:
        s = through_service(scale, repeat)
        print("\n| SpMV through the service | seconds |")
        print("|---|---|")
        print(f"| in-process matmul | {s['kernel']:.4f} |")
        print(f"| x up + y down at {s['up']:.1f} / {s['down']:.1f} GB/s | {s['moved']:.4f} |")
        print(f"| c.matmul(handle, x) over gRPC | {s['service']:.4f} |")
        print(f"| ratio service / (kernel + transfers) | {s['service'] / (s['kernel'] + s['moved']):.2f}x |")
        figures.append(figure("SpMV, c.matmul(handle, x) over gRPC", s["service"],
                              "in-process matmul + x up and y down at put/get speed", s["kernel"] + s["moved"],
                              sizes={"n": s["n"]}, note=f"put {s['up']:.1f}, get {s['down']:.1f} GB/s"))
        figures.append(figure("SpMV, in-process matmul", s["kernel"], sizes={"n": s["n"]}))
    record("linalg", figures, about="SpMV, SpMM and SpGEMM in process against scipy and torch (2 threads), "
           "float64 CSR with int32 indices and uniform random columns; their GB/s against a numpy copy's; "
           "SpMV on a matrix held by handle through a real server over gRPC", scale=scale, repeat=repeat,
           service=service)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.linalg")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the issue's sizes")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-service", action="store_true", help="skip the server benchmark")
    args = parser.parse_args()
    run(args.scale, args.repeat, not args.no_service)


if __name__ == "__main__":
    main()
