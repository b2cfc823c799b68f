"""index_select benchmark: 100,000 random rows (dim 0) of a 1,000,000 x 1,000,000 float32 matrix
with 10,000,000 entries, in-process: ours on COO and on CSR against torch.index_select on the
same matrix as a (coalesced) torch COO tensor, torch on 2 threads.

COO is timed twice: a first call on a tensor (every call here gets a new tensor object over
the same arrays, so nothing is kept from an earlier one: the run pointer of its row column is
built, a pass over all 10M entries) and a held tensor (one bound tensor, as a handle is, whose
run pointer an earlier call kept).

Same data, same run, best of ``--repeat`` runs; ratios are torch's time / ours (above 1:
sparseserve is faster). ``python -m bench.index_select --scale 0.1`` for a quicker run.
"""

from __future__ import annotations

import argparse

import numpy as np

from sparseserve import SparseTensor
from ._results import figure, record
from ._timing import best_of_each


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


def _first_calls(name: str, tensor_arg: str, tensor: SparseTensor, calls: int, **args):
    """An op called on a new tensor object (the same arrays) each time: nothing an earlier
    call kept with its tensor is found. Bound (validated) ahead, outside the timing."""
    from sparseserve.server.ops import REGISTRY

    op = REGISTRY.get(name)
    pending = [op.bind({tensor_arg: SparseTensor(indices=tensor.indices, values=tensor.values,
                                                 dense_shape=tensor.dense_shape, coalesced=tensor.coalesced),
                        **args}) for _ in range(calls)]
    return lambda: op.run("cpu", pending.pop())[0]


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

    ours_first = _first_calls("index_select", "input", coo, repeat + 2, dim=0, index=index)
    ours_held = _op("index_select", input=coo, dim=0, index=index)
    ours_csr = _op("index_select", input=csr, dim=0, index=index)
    # Same answer as torch's before any timing, from each path.
    want = torch.index_select(t_coo, 0, t_index)
    for got in (ours_first(), ours_held()):
        assert np.array_equal(got.indices, want._indices().numpy().T), "COO indices differ from torch's"
        assert np.array_equal(got.values, want._values().numpy()), "COO values differ from torch's"
    got_csr = ours_csr()
    assert np.array_equal(got_csr.values, want._values().numpy()), "CSR values differ from torch's"

    times = best_of_each({"torch": lambda: torch.index_select(t_coo, 0, t_index), "first": ours_first,
                          "held": ours_held, "csr": ours_csr}, repeat)
    t_torch = times["torch"]
    print(f"index_select: {rows:,} random rows (dim 0) of a {n:,} x {n:,} float32 matrix, "
          f"{coo.nnz:,} entries -> {got.nnz:,} entries; best of {repeat}")
    print(f"  torch.index_select, COO (2 threads)     {t_torch * 1e3:9.2f} ms")
    for key, label in (("first", "COO, first call on the tensor"), ("held", "COO, held tensor"),
                       ("csr", "CSR")):
        print(f"  sparseserve, {label:30s} {times[key] * 1e3:9.2f} ms   torch / ours = {t_torch / times[key]:6.2f}x")
    sizes = {"n": n, "nnz": coo.nnz, "rows": rows, "selected_nnz": got.nnz}
    peer = "torch.index_select on COO (2 threads)"
    record("index_select", [figure("index_select on COO, first call on the tensor", times["first"], peer, t_torch,
                                   sizes=sizes),
                            figure("index_select on COO, held tensor", times["held"], peer, t_torch, sizes=sizes),
                            figure("index_select on CSR (torch has none)", times["csr"], peer, t_torch, sizes=sizes)],
           about=f"index_select of {rows:,} random rows (dim 0) of a {n:,} × {n:,} float32 matrix with {coo.nnz:,} "
                 "entries in process, on COO (a first call on a tensor, which builds its row pointer; a held "
                 "tensor, which keeps it) and on CSR, against torch.index_select on the same matrix as a "
                 "coalesced torch COO tensor",
           scale=scale, repeat=repeat)
    return [(key, t_torch / times[key]) for key in ("first", "held", "csr")]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.index_select")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the default sizes")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    run(args.scale, args.repeat)


if __name__ == "__main__":
    main()
