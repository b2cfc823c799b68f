"""The 6 smallest eigenpairs of the 2-D Poisson matrix of a 300 x 300 grid (90,000 unknowns), ours
through a real server with the matrix held by handle, against ``scipy.sparse.linalg.eigsh(A, k=6,
sigma=0)`` in process (SuperLU's shift-invert: what a user of scipy reaches for), the eigenvalues
checked equal to scipy's first and the eigenvectors held to its subspace.

Ours is ``sparseserve.linalg.eigsh(A, k=6, sigma=0)``: sigma at the bottom of the spectrum, so
LOBPCG with the multigrid preconditioner; its first call on a fresh handle builds the hierarchy,
a later one finds it kept. Beside it, the same call with ``solver="arpack"``: ARPACK's
shift-invert on a factorization the server makes on the first call and keeps with the handle.

scipy runs twice in each round, with OpenBLAS's threads (its default) and with BLAS on one
thread (threadpoolctl, where installed): on this 2-core machine the default is the slower one
whenever anything else runs; the peer's time is the better of the two.
``python -m bench.eigen --grid 100`` for a quicker run.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import time
from typing import Any, Callable

import numpy as np

from ._results import figure, record

SIGMA = 0.0


def poisson_2d(grid: int):
    """The 5-point Laplacian of a grid x grid mesh (grid^2 unknowns, about 5 entries a row), scipy CSR."""
    import scipy.sparse as sp

    line = sp.diags_array([-np.ones(grid - 1), 4 * np.ones(grid), -np.ones(grid - 1)], offsets=[-1, 0, 1])
    ones = sp.diags_array([-np.ones(grid - 1), -np.ones(grid - 1)], offsets=[-1, 1])
    eye = sp.eye_array(grid)
    return (sp.kron(eye, line) + sp.kron(ones, eye)).tocsr()


def _one_blas_thread():
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(1, user_api="blas")


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _check(a, w, v, w_scipy, v_scipy) -> None:
    """Our pairs against scipy's: eigenvalues to 1e-9 of the spectrum's scale, the same subspace."""
    from scipy.linalg import subspace_angles

    if not np.allclose(w, w_scipy, rtol=0, atol=1e-9 * 8):
        raise SystemExit(f"eigenvalues differ: ours {w}, scipy {w_scipy}")
    angle = float(subspace_angles(v, v_scipy).max())
    if angle > 1e-6:
        raise SystemExit(f"eigenvectors span another subspace than scipy's (largest angle {angle:.2e})")


def run(grid: int, k: int, repeat: int) -> None:
    import scipy.sparse.linalg as sla

    from sparseserve import Client, linalg

    from ._server import BenchServer

    a = poisson_2d(grid)
    n = a.shape[0]

    def scipy_eigsh():
        return sla.eigsh(a, k=k, sigma=SIGMA)

    def scipy_one_thread():
        limit = _one_blas_thread()
        with limit if limit is not None else contextlib.nullcontext():
            return scipy_eigsh()

    w_scipy, v_scipy = scipy_eigsh()
    best: dict[str, float] = {name: math.inf for name in ("scipy", "scipy, BLAS on one thread", "first", "later",
                                                          "arpack first", "arpack later")}
    room = str(64 * a.nnz + (256 << 20))
    with BenchServer("--max-request-bytes", room, "--store-bytes", str(64 * a.nnz + (1 << 30))) as server, \
            Client(server.grpc_target, timeout=3600) as c:
        small = c.put(poisson_2d(30))  # pyamg imported and every kernel loaded before the clock runs
        linalg.eigsh(small, k=k, sigma=SIGMA)
        linalg.eigsh(small, k=k, sigma=SIGMA, solver="arpack")
        small.delete()
        for _ in range(repeat):  # each round: the contenders in turn, a fresh handle for each first call
            for name, fn in (("scipy", scipy_eigsh), ("scipy, BLAS on one thread", scipy_one_thread)):
                seconds, _ = _timed(fn)
                best[name] = min(best[name], seconds)
            for solver, first, later in ((None, "first", "later"), ("arpack", "arpack first", "arpack later")):
                handle = c.put(a)
                try:
                    call = functools.partial(linalg.eigsh, handle, k=k, sigma=SIGMA,
                                             **({} if solver is None else {"solver": solver}))
                    for name in (first, later):
                        seconds, (w, v) = _timed(call)
                        _check(a, w, v, w_scipy, v_scipy)
                        best[name] = min(best[name], seconds)
                finally:
                    handle.delete()
    peer = min(best["scipy"], best["scipy, BLAS on one thread"])
    _report(grid, n, int(a.nnz), k, repeat, best, peer)


def _report(grid: int, n: int, nnz: int, k: int, repeat: int, best: dict[str, float], peer: float) -> None:
    print(f"The {k} smallest eigenpairs of the 2-D Poisson matrix, grid {grid} x {grid}: n = {n:,}, {nnz:,} entries; "
          f"best of {repeat}\n")
    print("| | seconds | scipy / this |")
    print("|---|---|---|")
    for name, label in (("scipy", "scipy eigsh(sigma=0) in process, OpenBLAS threads (its default)"),
                        ("scipy, BLAS on one thread", "scipy eigsh(sigma=0) in process, BLAS on one thread"),
                        ("first", "ours: linalg.eigsh(handle, sigma=0), first call (LOBPCG + AMG, hierarchy built)"),
                        ("later", "ours: a later call (hierarchy kept)"),
                        ("arpack first", "ours: solver='arpack', first call (shift-invert, factorization made)"),
                        ("arpack later", "ours: solver='arpack', a later call (factorization kept)")):
        ratio = "" if name.startswith("scipy") else f"{peer / best[name]:.2f}x"
        print(f"| {label} | {best[name]:.3f} | {ratio} |")
    print(f"\nscipy's better time {peer:.3f} s; target: ours 3x faster: first call {peer / best['first']:.2f}x, "
          f"later {peer / best['later']:.2f}x")
    sizes = {"n": n, "nnz": nnz, "k": k}
    peer_name = "scipy eigsh(sigma=0)"
    rows = [figure(f"eigsh(k={k}) smallest, Poisson {grid}^2, first call (LOBPCG + AMG), handle over gRPC",
                   best["first"], peer_name, peer, sizes=sizes, note="hierarchy built in the call; scipy's "
                   "better of its default and one BLAS thread"),
            figure(f"eigsh(k={k}) smallest, Poisson {grid}^2, later call (hierarchy kept), handle over gRPC",
                   best["later"], peer_name, peer, sizes=sizes),
            figure(f"eigsh(k={k}, sigma=0, solver='arpack'), Poisson {grid}^2, first call (factorization made)",
                   best["arpack first"], peer_name, peer, sizes=sizes),
            figure(f"eigsh(k={k}, sigma=0, solver='arpack'), Poisson {grid}^2, later call (factorization kept)",
                   best["arpack later"], peer_name, peer, sizes=sizes),
            figure(f"scipy eigsh(k={k}, sigma=0), Poisson {grid}^2, OpenBLAS threads against one", best["scipy"],
                   "scipy, BLAS on one thread", best["scipy, BLAS on one thread"], sizes=sizes)]
    record("eigen", rows, about=f"The {k} smallest eigenpairs of the 2-D Poisson matrix: sparseserve.linalg.eigsh("
           "handle, sigma=0) through a real server with the matrix held (LOBPCG preconditioned by algebraic "
           "multigrid; first call building the hierarchy, later calls finding it kept; and solver='arpack', "
           "shift-invert on a factorization kept with the handle) against scipy.sparse.linalg.eigsh(A, sigma=0) in "
           "process (SuperLU shift-invert), its better time of OpenBLAS's threads and one BLAS thread (best of "
           "repeat, contenders taking turns; eigenvalues and eigenvector subspaces checked equal to scipy's)",
           grid=grid, k=k, repeat=repeat)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.eigen")
    parser.add_argument("--grid", type=int, default=300, help="grid side: grid^2 unknowns (the issue's 300)")
    parser.add_argument("--k", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    run(args.grid, args.k, args.repeat)


if __name__ == "__main__":
    main()
