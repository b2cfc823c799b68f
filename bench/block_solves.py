"""What the solvers' fixed summation order costs, and what a block of right-hand sides gains.

1. The same bits on every CPU (issue 37): the SpMV rows and the dot products of the solvers are
   compiled without fastmath (kernels/solvers.py). Beside each, the same Python function
   compiled with the flags they had before (``reassoc``, ``contract``, ...) on the same data in
   the same run: what the fixed order costs.
2. ``cg`` with a block b [n, k]: the columns' iterations side by side, the matrix read once per
   iteration for all of them (``spmv_dot_lockstep``), against the same k solves one after another
   and scipy's cg column by column, on a 2-D Poisson matrix (which packs into 3 bytes an entry)
   and a 3-D 27-point stencil with distinct values (which does not: 12 bytes an entry), Jacobi,
   rtol 1e-8. Answers checked equal (ours bit for bit) before timing.

``python -m bench.block_solves --scale 0.5`` for a quicker run.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sparseserve import SparseTensor
from ._results import figure, record
from ._timing import best_of_each

FAST = {"reassoc", "contract", "nsz", "arcp"}  # the flags the solver kernels had before issue 37


def poisson_2d(k: int):
    import scipy.sparse as sp

    t = sp.diags_array([-np.ones(k - 1), 2 * np.ones(k), -np.ones(k - 1)], offsets=[-1, 0, 1])
    return sp.csr_array(sp.kron(t, sp.eye_array(k)) + sp.kron(sp.eye_array(k), t))


def stencil_27(k: int, seed: int = 0):
    """A 3-D 27-point stencil on a k^3 grid, symmetric positive definite, its off-diagonal
    values drawn (so more than 256 distinct: it stays CSR)."""
    import scipy.sparse as sp

    line = sp.diags_array([np.ones(k - 1), np.ones(k), np.ones(k - 1)], offsets=[-1, 0, 1])
    pattern = sp.csr_array(sp.kron(sp.kron(line, line), line))
    rng = np.random.default_rng(seed)
    upper = sp.triu(pattern, 1).tocsr()
    upper.data = -rng.uniform(0.5, 1.0, upper.nnz)
    off = upper + upper.T
    return sp.csr_array(off + sp.diags_array(-off.sum(axis=1) + 0.01))


def _rows_case(name: str, a, rng, reassociated_rows) -> dict:
    from sparseserve.kernels import linalg as lk

    ptr, idx, vals = a.indptr.astype(np.int32), a.indices.astype(np.int32), a.data
    n = a.shape[0]
    x, y = rng.standard_normal(n), np.empty(n)
    best = best_of_each({"fixed": lambda: lk.spmv_rows(ptr, idx, vals, x, y, 0, n),
                         "reassoc": lambda: reassociated_rows(ptr, idx, vals, x, y, 0, n)}, repeat=15)
    print(f"spmv_rows {name}: fixed {best['fixed'] * 1e3:.1f} ms, reassoc {best['reassoc'] * 1e3:.1f} ms")
    return figure(f"SpMV rows in a fixed order, {name}", best["fixed"], "fastmath reassoc", best["reassoc"],
                  sizes={"n": n, "nnz": int(a.nnz)})


def kernel_rows() -> list[dict]:
    """Each fixed-order kernel against itself compiled with FAST, same data, same run."""
    import scipy.sparse as sp
    from numba import njit

    from sparseserve.kernels import linalg as lk
    from sparseserve.kernels import solvers as sk

    rng = np.random.default_rng(0)
    rows = []
    reassociated_rows = njit(nogil=True, fastmath=FAST)(lk.spmv_rows.py_func)
    reassociated_dot = njit(nogil=True, fastmath=FAST)(sk._dot_range.py_func)
    matrices = {"2-D Poisson 1000^2": poisson_2d(1000),
                "random 1M x 1M, 10 a row": sp.random_array((1_000_000, 1_000_000), density=1e-5, format="csr",
                                                            rng=rng)}
    for name, a in matrices.items():
        rows.append(_rows_case(name, a, rng, reassociated_rows))
    x, y = rng.standard_normal(1_000_000), rng.standard_normal(1_000_000)
    best = best_of_each({"fixed": lambda: sk._dot_range(x, y, 0, x.size),
                         "reassoc": lambda: reassociated_dot(x, y, 0, x.size)}, repeat=30)
    rows.append(figure("dot product in four lanes, 1M", best["fixed"], "fastmath reassoc", best["reassoc"],
                       sizes={"n": x.size}))
    print(f"dot 1M: four lanes {best['fixed'] * 1e3:.3f} ms, reassoc {best['reassoc'] * 1e3:.3f} ms")
    return rows


def _block_case(name: str, a, k: int, op) -> list[dict]:
    import scipy.sparse.linalg as spla

    n = a.shape[0]
    t = SparseTensor(layout="csr", compressed_indices=a.indptr.astype(np.int64),
                     plain_indices=a.indices.astype(np.int64), values=a.data, dense_shape=list(a.shape))
    for array in t.arrays():  # held, as a handle is: its CSR and Jacobi kept
        array.flags.writeable = False
    b = np.random.default_rng(1).standard_normal((n, k))

    def block():
        return op.run("cpu", op.bind({"a": t, "b": b, "rtol": 1e-8, "preconditioner": "jacobi"}))

    def loop():
        return [op.run("cpu", op.bind({"a": t, "b": b[:, j], "rtol": 1e-8, "preconditioner": "jacobi"}))
                for j in range(k)]

    diagonal = a.diagonal()
    dinv = spla.LinearOperator(a.shape, matvec=lambda r: r / diagonal, dtype=a.dtype)

    def scipy_loop():
        return [spla.cg(a, b[:, j], rtol=1e-8, M=dinv) for j in range(k)]

    x_block = block()[0]
    for j, alone in enumerate(loop()):
        if not np.array_equal(x_block[:, j], alone[0]):
            raise SystemExit(f"{name}: column {j} of the block differs from its solve alone")
    best = best_of_each({"block": block, "loop": loop}, repeat=2, warm_up=False)
    start = time.perf_counter()
    scipy_loop()
    peer = time.perf_counter() - start
    sizes = {"n": n, "nnz": int(a.nnz), "k": k}
    print(f"{name}, k = {k}: block {best['block']:.2f} s, one by one {best['loop']:.2f} s "
          f"({best['loop'] / best['block']:.2f}x), scipy {peer:.2f} s ({peer / best['block']:.2f}x)")
    return [figure(f"cg + Jacobi, b [n, {k}], {name}", best["block"], "the same k solves one by one", best["loop"],
                   sizes=sizes),
            figure(f"cg + Jacobi, b [n, {k}], {name}", best["block"], "scipy cg column by column", peer, sizes=sizes)]


def block_rows(scale: float, k: int) -> list[dict]:
    from sparseserve.server.ops import REGISTRY

    op = REGISTRY.get("cg")
    rows: list[dict] = []
    for name, a in {f"2-D Poisson {int(500 * scale)}^2": poisson_2d(int(500 * scale)),
                    f"3-D 27-point {int(60 * scale)}^3": stencil_27(int(60 * scale))}.items():
        rows += _block_case(name, a, k, op)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.block_solves")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--k", type=int, default=8)
    args = parser.parse_args()
    rows = kernel_rows() + block_rows(args.scale, args.k)
    record("block_solves", rows, about="The solver kernels in their fixed summation order against the same "
           "functions compiled with fastmath reassoc (same data, same run); cg with a block of right-hand sides "
           "(columns side by side, one matrix pass per iteration) against the same solves one by one and scipy's "
           "cg column by column", scale=args.scale, k=args.k)


if __name__ == "__main__":
    main()
