"""The Krylov solvers: ``cg`` with Jacobi on the 2-D Poisson matrix of a k x k grid (the issue's
1,000 x 1,000: a million unknowns, ~5M entries) to rtol = 1e-8, ours through the op registry in
process and through a real server with the matrix held by handle, against
``scipy.sparse.linalg.cg`` in process on the same matrix with the same preconditioner (same
iteration count, within one, asserted). Beside them, the same solve by scipy's cg on
``sparseserve.linalg.aslinearoperator(handle)`` (its Jacobi applied locally), one round trip per
product: what the server-side loop saves.

And the same cg on the matrix partitioned over a Dask LocalCluster of 2 worker processes
(loopback), through ``Service.execute`` with a handle, against the single node's on the same
matrix in the same run: milliseconds per iteration, each measured as the difference between
solves of two fixed iteration counts (rtol 0, so both run to maxiter), so what a solve pays once
(the blocks' actors made, the last residual) is apart; answers checked equal first.

And multigrid, the issue's question (time to answer): cg with ``preconditioner="amg"`` to rtol 1e-8
through a real server with the matrix held by handle, its first solve (the hierarchy built, then
kept with the handle) against scipy's cg with Jacobi in process and against pyamg's
``smoothed_aggregation_solver(A).solve(b, tol=1e-8, accel="cg")`` in process, setup and solve; and
a later solve (the hierarchy kept) against pyamg's solve phase alone. The iteration counts are
checked within 10% of pyamg's and the answers against its.

``python -m bench.solvers --scale 0.25`` for a quicker run (a 500 x 500 grid);
``--partitioned-only`` runs the partitioned comparison alone and records nothing; ``--amg-only``
runs the multigrid comparison alone (printed, not recorded).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import logging
import math
import os
import platform
import time
from typing import Any

import numpy as np

from sparseserve import SparseTensor
from ._results import figure, record
from ._timing import best_of_each

RTOL = 1e-8
# Fixed iteration counts of the partitioned comparison: per iteration = time difference / count difference.
SHORT_SOLVE, LONG_SOLVE = 10, 110


def poisson(k: int):
    """The 5-point Laplacian of a k x k grid as a scipy CSR with int32 indices."""
    import scipy.sparse as sp

    t = sp.diags_array([-np.ones(k - 1), 2 * np.ones(k), -np.ones(k - 1)], offsets=[-1, 0, 1])
    a = sp.csr_array(sp.kron(t, sp.eye_array(k)) + sp.kron(sp.eye_array(k), t))
    a.indices, a.indptr = a.indices.astype(np.int32), a.indptr.astype(np.int32)
    return a


def tensor_of(a) -> SparseTensor:
    return SparseTensor(layout="csr", compressed_indices=a.indptr, plain_indices=a.indices, values=a.data,
                        dense_shape=list(a.shape))


def scipy_cg(a, b, operator=None):
    """scipy's cg with Jacobi on ``a``, or on ``operator`` (a LinearOperator of it): (x, info, iterations)."""
    from scipy.sparse import linalg as spla

    dinv = 1 / a.diagonal()
    m = spla.LinearOperator(a.shape, matvec=lambda r: dinv * r.ravel(), dtype=a.dtype)
    count = [0]

    def callback(_):
        count[0] += 1
    x, info = spla.cg(a if operator is None else operator, b, rtol=RTOL, M=m, callback=callback)
    return x, info, count[0]


def ours_cg(t: SparseTensor, b):
    from sparseserve.server.ops import REGISTRY

    op = REGISTRY.get("cg")
    x, info, iterations, _ = op.run("cpu", op.bind({"a": t, "b": b, "rtol": RTOL, "preconditioner": "jacobi"}))
    return x, int(info), int(iterations)


def run(scale: float = 1.0, repeat: int = 1, service: bool = True, partitions: int = 2,
        partitioned_only: bool = False, amg_only: bool = False) -> None:
    k = max(10, int(round(1000 * math.sqrt(scale))))
    a = poisson(k)
    t = tensor_of(a)
    n = a.shape[0]
    b = np.ones(n)
    if amg_only:
        start = time.perf_counter()
        _, info, its_scipy = scipy_cg(a, b)
        _report_amg(k, _amg(a, t, b, repeat), time.perf_counter() - start, its_scipy)
        return
    spread = _partitioned_per_iteration(t, b, partitions, repeat) if partitions else {}
    if spread:
        _report_partitioned(k, spread)
    if partitioned_only:
        return
    x_ours, info_ours, its_ours = ours_cg(t, b)
    x_scipy, info_scipy, its_scipy = scipy_cg(a, b)
    assert info_ours == info_scipy == 0, (info_ours, info_scipy)
    assert abs(its_ours - its_scipy) <= 1, (its_ours, its_scipy)
    assert np.allclose(x_ours, x_scipy, rtol=1e-6, atol=1e-8 * np.linalg.norm(x_scipy))
    contenders = {"ours": lambda: ours_cg(t, b), "scipy": lambda: scipy_cg(a, b)}
    server_figures: dict[str, float] = {}
    if service:
        from sparseserve import Client

        from ._server import BenchServer

        room = str(2 * t.nbytes + (64 << 20))
        with BenchServer("--max-request-bytes", room, "--store-bytes", str(4 * t.nbytes)) as server, \
                Client(server.grpc_target, timeout=3600) as c:
            handle = c.put(t)
            try:
                def served():
                    x, info, iterations, _ = c.cg(handle, b, rtol=RTOL, preconditioner="jacobi")
                    assert int(info) == 0 and abs(int(iterations) - its_scipy) <= 1
                contenders["service"] = served
                best = best_of_each(contenders, repeat, warm_up=False)
                server_figures["round_trip"] = _through_linear_operator(c, handle, a, b, its_scipy)
            finally:
                c.delete(handle)
    else:
        best = best_of_each(contenders, repeat, warm_up=False)
    amg = _amg(a, t, b, repeat) if service else {}
    _report(k, n, a.nnz, its_ours, its_scipy, best, server_figures, scale, repeat, service, spread, amg)


# ------------------------------------------------------------------ multigrid: the time to answer
def _amg(a, t: SparseTensor, b: np.ndarray, repeat: int) -> dict[str, Any]:
    """Seconds of pyamg's setup and solve in process, and of our first solve (hierarchy built)
    and a later one (hierarchy kept) through a real server with the matrix held by handle, each
    the best of ``repeat`` (a fresh handle for each first solve); iteration counts and answers
    checked against pyamg's."""
    import pyamg

    from sparseserve import Client

    from ._server import BenchServer

    residuals: list[float] = []
    ml = pyamg.smoothed_aggregation_solver(a)
    x_pyamg = ml.solve(b, tol=RTOL, accel="cg", residuals=residuals)
    its_pyamg = len(residuals) - 1
    best = best_of_each({"pyamg setup": lambda: pyamg.smoothed_aggregation_solver(a),
                         "pyamg solve": lambda: ml.solve(b, tol=RTOL, accel="cg")}, repeat, warm_up=False)
    figures: dict[str, Any] = {"pyamg setup": best["pyamg setup"], "pyamg solve": best["pyamg solve"],
                               "pyamg iterations": its_pyamg, "levels": [lv.A.shape[0] for lv in ml.levels],
                               "operator complexity": ml.operator_complexity()}
    room = str(2 * t.nbytes + (64 << 20))
    with BenchServer("--max-request-bytes", room, "--store-bytes", str(8 * t.nbytes)) as server, \
            Client(server.grpc_target, timeout=3600) as c:
        small = tensor_of(poisson(64))  # pyamg imported and every kernel loaded before the clock runs
        c.cg(small, np.ones(64 * 64), rtol=RTOL, preconditioner="amg")
        first = later = math.inf
        for _ in range(repeat):
            handle = c.put(t)
            try:
                for solve in ("first", "later"):
                    start = time.perf_counter()
                    x, info, iterations, _ = c.cg(handle, b, rtol=RTOL, preconditioner="amg")
                    seconds = time.perf_counter() - start
                    if solve == "first":
                        first = min(first, seconds)
                    else:
                        later = min(later, seconds)
                    assert int(info) == 0 and abs(int(iterations) - its_pyamg) <= max(1, 0.1 * its_pyamg), \
                        (int(iterations), its_pyamg)
                    assert np.linalg.norm(x - x_pyamg) <= 1e-6 * np.linalg.norm(x_pyamg)
            finally:
                c.delete(handle)
    figures.update({"first": first, "later": later, "iterations": int(iterations)})
    return figures


def _report_amg(k: int, amg: dict[str, Any], scipy_jacobi: float, its_jacobi: int) -> list[dict[str, Any]]:
    """The multigrid table, printed; its rows for the results file."""
    pyamg_total = amg["pyamg setup"] + amg["pyamg solve"]
    print(f"\nmultigrid, Poisson {k} x {k}, rtol {RTOL:g}: pyamg's hierarchy {amg['levels']} (operator complexity "
          f"{amg['operator complexity']:.3f}); iterations: cg + AMG ours {amg['iterations']}, pyamg "
          f"{amg['pyamg iterations']}; cg + Jacobi {its_jacobi}\n")
    print("| solve | seconds | ours (first solve) is | target |")
    print("|---|---|---|---|")
    print(f"| scipy cg + Jacobi, in process | {scipy_jacobi:.3f} | {scipy_jacobi / amg['first']:.1f}x faster | 10x |")
    print(f"| pyamg setup + solve (accel='cg'), in process | {pyamg_total:.3f} "
          f"(setup {amg['pyamg setup']:.3f}) | {pyamg_total / amg['first']:.2f}x faster | 1.5x |")
    print(f"| ours: c.cg(handle, b, preconditioner='amg'), first solve (hierarchy built) | {amg['first']:.3f} | | |")
    print(f"| ours: later solve (hierarchy kept) | {amg['later']:.3f} | {amg['pyamg solve'] / amg['later']:.2f}x "
          f"pyamg's solve phase ({amg['pyamg solve']:.3f} s) | 2x |")
    sizes = {"n": k * k, "iterations": amg["iterations"]}
    first_case = f"cg + AMG, Poisson {k}^2, first solve (hierarchy built), c.cg(handle) over gRPC"
    return [figure(first_case, amg["first"], "scipy cg + Jacobi", scipy_jacobi, sizes=sizes),
            figure(first_case, amg["first"], "pyamg setup + solve", pyamg_total, sizes=sizes),
            figure(f"cg + AMG, Poisson {k}^2, later solve (hierarchy kept), c.cg(handle) over gRPC", amg["later"],
                   "pyamg solve", amg["pyamg solve"], sizes=sizes)]


def _partitioned_per_iteration(t: SparseTensor, b: np.ndarray, partitions: int, repeat: int) -> dict[str, Any]:
    """Seconds per cg + Jacobi iteration through ``Service.execute`` with a handle: the matrix
    partitioned over a LocalCluster of 2 worker processes, and on one node; and what a solve
    pays once on each. Empty where dask.distributed is not installed."""
    try:
        from distributed import LocalCluster
    except ImportError:
        print("dask.distributed is not installed (pip install 'sparseserve[distributed]'): partitioned cg skipped")
        return {}
    from sparseserve.core.tensor import HandleRef
    from sparseserve.server.config import ServerConfig
    from sparseserve.server.ops import REGISTRY
    from sparseserve.server.service import Service

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=logging.ERROR) as cluster:
        services = {"partitioned": Service(ServerConfig(dask_scheduler=cluster.scheduler_address,
                                                        max_result_bytes=8 << 30), REGISTRY),
                    "single": Service(ServerConfig(max_result_bytes=8 << 30), REGISTRY)}
        try:
            handles = {name: HandleRef(asyncio.run(svc.put(t, "", partitions if name == "partitioned" else 0))[0])
                       for name, svc in services.items()}

            def solve(name: str, iterations: int):
                args = {"a": handles[name], "b": b, "rtol": 0.0, "maxiter": iterations, "preconditioner": "jacobi"}
                return dict(asyncio.run(services[name].execute("cg", args, False, "")))

            got, want = solve("partitioned", LONG_SOLVE), solve("single", LONG_SOLVE)
            assert int(got["iterations"]) == int(want["iterations"]) == LONG_SOLVE
            np.testing.assert_allclose(got["x"], want["x"], rtol=1e-12, atol=0)
            same = bool(np.array_equal(got["x"], want["x"]))
            best = best_of_each({f"{name} {count}": (lambda name=name, count=count: solve(name, count))
                                 for name in services for count in (SHORT_SOLVE, LONG_SOLVE)}, repeat, warm_up=False)
        finally:
            for svc in services.values():
                svc.close()
    figures: dict[str, Any] = {"partitions": partitions, "bit_for_bit": same}
    for name in services:
        per = (best[f"{name} {LONG_SOLVE}"] - best[f"{name} {SHORT_SOLVE}"]) / (LONG_SOLVE - SHORT_SOLVE)
        figures[name] = per
        figures[f"{name} once"] = best[f"{name} {SHORT_SOLVE}"] - SHORT_SOLVE * per
    return figures


def _report_partitioned(k: int, spread: dict[str, Any]) -> None:
    ms = {name: 1e3 * spread[name] for name in ("partitioned", "single", "partitioned once", "single once")}
    print(f"\ncg + Jacobi on the Poisson {k} x {k} matrix through Service.execute with a handle, per iteration: "
          f"partitioned in {spread['partitions']} blocks over 2 Dask worker processes {ms['partitioned']:.2f} ms, "
          f"one node {ms['single']:.2f} ms ({ms['partitioned'] / ms['single']:.1f}x); once a solve: "
          f"{ms['partitioned once']:.0f} ms partitioned, {ms['single once']:.0f} ms one node; "
          f"x bit for bit equal: {spread['bit_for_bit']}")


def _through_linear_operator(c, handle, a, b, iterations: int) -> float:
    """Seconds of the whole solve by scipy's cg on ``aslinearoperator(handle)``: every product a
    ``matmul`` round trip (run once: at the issue's size it takes about a minute)."""
    from scipy.sparse import linalg as spla

    from sparseserve import linalg

    operator = linalg.aslinearoperator(handle)
    spla.cg(operator, b, maxiter=2)  # the connection and the server's threads warm
    start = time.perf_counter()
    _, info, its = scipy_cg(a, b, operator)
    seconds = time.perf_counter() - start
    assert info == 0 and abs(its - iterations) <= 1, (info, its, iterations)
    return seconds


def _report(k, n, nnz, its_ours, its_scipy, best, server_figures, scale, repeat, service, spread, amg) -> None:
    print(f"\n{datetime.date.today()} on {platform.machine()} with {os.cpu_count()} cores, "
          f"{platform.python_implementation()} {platform.python_version()}; cg + Jacobi, 2-D Poisson {k} x {k} "
          f"({n:,} unknowns, {nnz:,} entries), rtol {RTOL:g}; iterations: ours {its_ours}, scipy {its_scipy}\n")
    print("| solve | seconds | per iteration (ms) | scipy / this |")
    print("|---|---|---|---|")
    rows = [("scipy.sparse.linalg.cg in process", best["scipy"]), ("cg op in process", best["ours"])]
    if "service" in best:
        rows.append(("c.cg(handle, b) over gRPC", best["service"]))
    for name, seconds in rows:
        print(f"| {name} | {seconds:.3f} | {1e3 * seconds / its_scipy:.2f} | {best['scipy'] / seconds:.2f}x |")
    sizes = {"n": n, "nnz": nnz, "iterations": its_ours}
    figures = [figure(f"cg + Jacobi, Poisson {k}^2, in process", best["ours"], "scipy cg", best["scipy"],
                      sizes=sizes)]
    if "service" in best:
        figures.append(figure(f"cg + Jacobi, Poisson {k}^2, c.cg(handle) over gRPC", best["service"],
                              "scipy cg", best["scipy"], sizes=sizes))
    if "round_trip" in server_figures:
        driven = server_figures["round_trip"]
        print(f"| scipy's cg on linalg.aslinearoperator(handle), a round trip per product | {driven:.3f} | "
              f"{1e3 * driven / its_scipy:.2f} | {best['scipy'] / driven:.2f}x |")
        print(f"\nthe server-side loop (c.cg) is {driven / best['service']:.1f}x as fast as scipy's loop driving "
              "the server")
        figures.append(figure(f"cg + Jacobi, Poisson {k}^2, c.cg(handle) over gRPC", best["service"],
                              "scipy cg on aslinearoperator(handle)", driven, sizes=sizes))
    if spread:
        figures.append(figure(f"cg iteration, Poisson {k}^2, partitioned ({spread['partitions']} blocks, 2 Dask "
                              "workers), Service.execute", spread["partitioned"], "the same on one node",
                              spread["single"], sizes={"n": n, "partitions": int(spread["partitions"])}))
    if amg:
        figures.extend(_report_amg(k, amg, best["scipy"], its_scipy))
    record("solvers", figures, about="cg with Jacobi to rtol 1e-8 on the 2-D Poisson matrix, float64 CSR with "
           "int32 indices: the op in process and over gRPC with the matrix held by handle, against scipy's cg "
           "in process (same iterations, within one); scipy's cg on aslinearoperator(handle), a round trip per "
           "product; "
           "per iteration, the matrix partitioned over 2 Dask worker processes against one node; and cg with "
           "preconditioner='amg' over gRPC, the matrix held by handle, its first solve (hierarchy built) against "
           "scipy's cg + Jacobi and pyamg's setup + solve (accel='cg') in process, a later solve against pyamg's "
           "solve phase",
           scale=scale, repeat=repeat, service=service)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.solvers")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the issue's unknowns")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-service", action="store_true", help="skip the server benchmarks")
    parser.add_argument("--partitions", type=int, default=2, help="blocks of the partitioned cg (0: skip it)")
    parser.add_argument("--partitioned-only", action="store_true",
                        help="only the partitioned cg against one node, printed, not recorded")
    parser.add_argument("--amg-only", action="store_true",
                        help="only multigrid against scipy's cg + Jacobi and pyamg, printed, not recorded")
    args = parser.parse_args()
    run(args.scale, args.repeat, not args.no_service, args.partitions, args.partitioned_only, args.amg_only)


if __name__ == "__main__":
    main()
