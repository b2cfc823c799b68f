"""The GPU backend's kernels (CuPy) against the CPU kernels on the same data, in one run: each op
through ``ArrayBackend.run`` with its inputs already on the device (as a held handle's are on a
``--device cuda`` worker), synchronized, against ``op.run("cpu")`` on the host arrays; answers
checked equal first, fallbacks refused. Needs CuPy and a GPU: without them it says so and stops.

``python -m bench.gpu`` (``--scale 0.1`` for a quick run). Not in ``make bench``: the CPU
machines it runs on have no GPU; docs/gpu.md has the figures of the last run on one.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sparseserve import SparseTensor


def _matrix(n: int, nnz: int, seed: int) -> SparseTensor:
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.integers(0, n, nnz))
    cols = rng.integers(0, n, nnz)
    ptr = np.zeros(n + 1, np.int64)
    np.add.at(ptr, rows + 1, 1)
    return SparseTensor(layout="csr", compressed_indices=np.cumsum(ptr), plain_indices=cols,
                        values=rng.standard_normal(nnz), dense_shape=[n, n])


def _coo(t: SparseTensor) -> SparseTensor:
    rows = np.repeat(np.arange(t.dense_shape[0]), np.diff(t.compressed_indices))
    return SparseTensor(indices=np.stack([rows, t.plain_indices], axis=1), values=t.values,
                        dense_shape=t.dense_shape, coalesced=False)


def _best(fn, repeat: int, sync=lambda: None) -> float:
    fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def run(scale: float = 1.0, repeat: int = 5) -> None:
    from sparseserve.server.device import ArrayBackend, GpuUnavailable
    from sparseserve.server.ops import REGISTRY

    try:
        be = ArrayBackend.cupy()
    except GpuUnavailable as exc:
        print(f"no GPU here ({exc}): nothing to measure")
        return
    fallbacks: list[tuple[str, str]] = []
    be.on_fallback = lambda op, reason: fallbacks.append((op, reason))
    sync = be.xp.cuda.Device().synchronize
    n, nnz = int(1_000_000 * scale), int(10_000_000 * scale)
    a = _matrix(n, nnz, 1)
    coo = _coo(a)
    rng = np.random.default_rng(2)
    cases = [
        ("matmul", "SpMV, CSR", {"a": a, "b": rng.standard_normal(n)}),
        ("matmul", "SpMM, CSR, 16 columns", {"a": a, "b": rng.standard_normal((n, 16))}),
        ("mm", "mm(reduce='mean'), 16 columns", {"mat1": a, "mat2": rng.standard_normal((n, 16)), "reduce": "mean"}),
        ("reduce_sum", "reduce_sum(axis=1), COO", {"sp_input": coo, "axis": [1]}),
        ("coalesce", "coalesce, COO", {"sp_input": coo}),
        ("transpose", "transpose, CSR", {"sp_input": a}),
        ("convert", "CSR to COO", {"sp_input": a, "layout": "coo"}),
    ]
    device = be.xp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"n {n:,}, nnz {nnz:,}, float64; best of {repeat}; device: {device}\n")
    print("| op | case | CPU kernels (ms) | GPU kernels (ms) | CPU / GPU |")
    print("|---|---|---|---|---|")
    for name, case, args in cases:
        op = REGISTRY.get(name)
        plan = op.plan(op.bind(args))
        on_device = plan.with_args(**{k: be.to_device(v) for k, v in plan.args.items()})
        got = be.run(op, on_device)
        assert not fallbacks, fallbacks
        want = op.run_plan("cpu", plan)
        for g, w in zip(got, want):
            host = be.to_host(g)
            if isinstance(w, SparseTensor):  # compared as scipy matrices: never densified
                assert abs(host.to_scipy() - w.to_scipy()).max() <= 1e-9
            else:
                np.testing.assert_allclose(host, w, rtol=1e-9, atol=1e-9)
        cpu_s = _best(lambda op=op, plan=plan: op.run_plan("cpu", plan), repeat)
        gpu_s = _best(lambda op=op, on_device=on_device: be.run(op, on_device), repeat, sync)
        print(f"| {name} | {case} | {1e3 * cpu_s:.2f} | {1e3 * gpu_s:.3f} | {cpu_s / gpu_s:.1f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of 1M rows and 10M entries")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    run(args.scale, args.repeat)


if __name__ == "__main__":
    main()
