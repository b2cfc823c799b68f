"""index_select benchmark: 100,000 random rows (dim 0) of a 1,000,000 x 1,000,000 float32 matrix
with 10,000,000 entries, in-process: ours on COO and on CSR against torch.index_select on the
same matrix as a (coalesced) torch COO tensor, torch on 2 threads.

Same data, same run, best of ``--repeat`` runs; ratios are torch's time / ours (above 1:
sparseserve is faster). ``python -m bench.index_select --scale 0.1`` for a quicker run.
"""

from __future__ import annotations

import argparse

import numpy as np

from sparseserve import SparseTensor
from ._timing import best_of


def matrix(n: int, nnz: int, seed: int = 0) -> SparseTensor:
    """A coalesced n x n COO matrix with ``nnz`` uniformly placed float32 entries."""
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, n * n, size=nnz + nnz // 50, dtype=np.int64))
    keys = np.sort(rng.choice(keys, size=min(nnz, keys.size), replace=False))
    indices = np.stack([keys // n, keys % n], axis=1)
    values = rng.standard_normal(keys.size).astype(np.float32)
    return SparseTensor(indices=indices, values=values, dense_shape=[n, n], coalesced=True)


def _op(name: str, **args):
    from sparseserve.server.ops import REGISTRY

    op = REGISTRY.get(name)
    bound = op.bind(args)
    return lambda: op.run("cpu", bound)[0]


def run(scale: float = 1.0, repeat: int = 5) -> list[tuple[str, float]]:
    import torch

    torch.set_num_threads(2)
    n, nnz, rows = int(1_000_000 * scale), int(10_000_000 * scale), int(100_000 * scale)
    coo = matrix(n, nnz)
    csr = _op("convert", sp_input=coo, layout="csr")()
    index = np.random.default_rng(1).integers(0, n, size=rows, dtype=np.int64)
    t_coo = torch.sparse_coo_tensor(torch.from_numpy(coo.indices.T.copy()), torch.from_numpy(coo.values),
                                    size=(n, n), is_coalesced=True)
    t_index = torch.from_numpy(index)

    ours_coo = _op("index_select", input=coo, dim=0, index=index)
    ours_csr = _op("index_select", input=csr, dim=0, index=index)
    # Same answer as torch's before any timing.
    want = torch.index_select(t_coo, 0, t_index)
    got = ours_coo()
    assert np.array_equal(got.indices, want._indices().numpy().T), "COO indices differ from torch's"
    assert np.array_equal(got.values, want._values().numpy()), "COO values differ from torch's"

    t_torch = best_of(lambda: torch.index_select(t_coo, 0, t_index), repeat)
    t_coo_ours = best_of(ours_coo, repeat)
    t_csr_ours = best_of(ours_csr, repeat)
    print(f"index_select: {rows:,} random rows (dim 0) of a {n:,} x {n:,} float32 matrix, "
          f"{coo.nnz:,} entries -> {got.nnz:,} entries; best of {repeat}")
    print(f"  torch.index_select, COO (2 threads) {t_torch * 1e3:9.2f} ms")
    print(f"  sparseserve, COO                    {t_coo_ours * 1e3:9.2f} ms   torch / ours = {t_torch / t_coo_ours:6.2f}x")
    print(f"  sparseserve, CSR                    {t_csr_ours * 1e3:9.2f} ms   torch / ours = {t_torch / t_csr_ours:6.2f}x")
    return [("coo", t_torch / t_coo_ours), ("csr", t_torch / t_csr_ours)]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.index_select")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the default sizes")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    run(args.scale, args.repeat)


if __name__ == "__main__":
    main()
