"""Scaling benchmark: how each main kernel's time grows with its work, against scipy and torch
(2 threads) on the same data in the same run, over four decades of size.

A size is the number of entries of the sparse operand (for ``segment_sum``, of the data),
10^3 to 10^7 at half decades (SpGEMM's to 10^6: 10 products an entry, as many entries out).
Matrices hold 10 entries a row at uniform random places, float64, except ``to_dense``'s (10%
dense, so that the dense answer grows as the work does) and ``coalesce``'s (unsorted, 10% of
them repeats, in a square of side √(1000 · size): 10^5 for 10^7 entries, as in ``python -m
bench``). Ours runs in process through the op registry, its arguments bound (validated) outside
the timing as a held handle's are, except ``index_select`` on COO, timed on a new tensor each
call as torch is (no row pointer kept from an earlier call). Every peer's answer is checked
against ours before the timing; the figure is the best of several runs, contenders taking
turns, more runs at small sizes where one takes microseconds.

``python -m bench.scaling --max-size 1000000`` for a quicker run.
"""

from __future__ import annotations

import argparse
import math
import warnings
from typing import Callable, NamedTuple

import numpy as np

from sparseserve import SparseTensor
from ._results import figure, record
from ._timing import best_of_each
from .__main__ import coo_data
from .index_select import _first_calls, _op

Contenders = dict[str, Callable[[], object]]

PER_ROW = 10
SPMM_COLUMNS = 16
SEGMENT_WIDTH = 16


def sizes_up_to(largest: int) -> list[int]:
    """10^3, 3·10^3, 10^4, ... up to ``largest``."""
    return [m * 10**e for e in range(3, 8) for m in (1, 3) if m * 10**e <= largest]


def repeats_at(size: int) -> int:
    """Runs per contender: a best of 3 for the big sizes, up to 50 where a run takes microseconds."""
    return max(3, min(50, 3_000_000 // size))


def _coalesced(rows: int, cols: int, nnz: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``nnz`` distinct row-major positions of a rows × cols matrix, one in each of ``nnz`` equal
    strides (spread uniformly, sorted, no repeats without a rejection pass), with float64 values."""
    stride = rows * cols // nnz
    keys = np.arange(nnz, dtype=np.int64) * stride + rng.integers(0, stride, nnz)
    return np.stack([keys // cols, keys % cols], axis=1), rng.standard_normal(nnz)


def _csr(n: int, seed: int) -> SparseTensor:
    """n × n CSR, ``PER_ROW`` distinct ascending columns in every row, int32 indices."""
    rng = np.random.default_rng(seed)
    cols = np.sort(rng.integers(0, n - PER_ROW + 1, (n, PER_ROW)), axis=1) + np.arange(PER_ROW)
    ptr = np.arange(0, n * PER_ROW + 1, PER_ROW)
    return SparseTensor(layout="csr", compressed_indices=ptr.astype(np.int32),
                        plain_indices=cols.reshape(-1).astype(np.int32), values=rng.standard_normal(n * PER_ROW),
                        dense_shape=[n, n])


def _scipy_csr(a: SparseTensor):
    import scipy.sparse as sp

    return sp.csr_matrix((a.values, a.plain_indices, a.compressed_indices), shape=a.dense_shape)


def _torch_csr(a: SparseTensor):
    import torch

    return torch.sparse_csr_tensor(torch.from_numpy(a.compressed_indices.astype(np.int64)),
                                   torch.from_numpy(a.plain_indices.astype(np.int64)), torch.from_numpy(a.values),
                                   tuple(a.dense_shape), check_invariants=False)


def _torch_coo(indices: np.ndarray, values: np.ndarray, shape, coalesced: bool):
    import torch

    return torch.sparse_coo_tensor(torch.from_numpy(indices.T.copy()), torch.from_numpy(values), tuple(shape),
                                   is_coalesced=coalesced, check_invariants=False)


def spmv(size: int) -> Contenders:
    import torch

    a = _csr(size // PER_ROW, 0)
    x = np.random.default_rng(1).standard_normal(a.dense_shape[1])
    sa, ta, tx = _scipy_csr(a), _torch_csr(a), torch.from_numpy(x)
    return {"sparseserve": _op("matmul", a=a, b=x), "scipy": lambda: sa @ x, "torch": lambda: ta @ tx}


def spmm(size: int) -> Contenders:
    import torch

    a = _csr(size // PER_ROW, 2)
    x = np.random.default_rng(3).standard_normal((a.dense_shape[1], SPMM_COLUMNS))
    sa, ta, tx = _scipy_csr(a), _torch_csr(a), torch.from_numpy(x)
    return {"sparseserve": _op("matmul", a=a, b=x), "scipy": lambda: sa @ x, "torch": lambda: ta @ tx}


def spgemm(size: int) -> Contenders:
    a, b = _csr(size // PER_ROW, 4), _csr(size // PER_ROW, 5)
    sa, sb, ta, tb = _scipy_csr(a), _scipy_csr(b), _torch_csr(a), _torch_csr(b)
    return {"sparseserve": _op("matmul", a=a, b=b), "scipy": lambda: sa @ sb, "torch": lambda: ta @ tb}


def coalesce(size: int) -> Contenders:
    import scipy.sparse as sp

    side = math.isqrt(size * 1000)  # 10^7 entries in 10^5 × 10^5, as ``python -m bench``
    indices, values = coo_data(size, side, 0.10)
    shape = (side, side)
    rows, cols = indices[:, 0], indices[:, 1]
    return {"sparseserve": _op("coalesce", sp_input=SparseTensor(indices=indices, values=values, dense_shape=shape)),
            "scipy": lambda: sp.coo_matrix((values, (rows, cols)), shape=shape).tocsr(),
            "torch": lambda: _torch_coo(indices, values, shape, coalesced=False).coalesce()}


def to_dense(size: int) -> Contenders:
    import scipy.sparse as sp

    side = math.isqrt(size * 10) + 1  # 10% dense
    indices, values = _coalesced(side, side, size, np.random.default_rng(6))
    shape = (side, side)
    sa = sp.coo_matrix((values, (indices[:, 0], indices[:, 1])), shape=shape)
    ta = _torch_coo(indices, values, shape, coalesced=True)
    tensor = SparseTensor(indices=indices, values=values, dense_shape=shape, coalesced=True)
    return {"sparseserve": _op("to_dense", sp_input=tensor), "scipy": sa.toarray, "torch": ta.to_dense}


def segment_sum(size: int) -> Contenders:
    import torch

    rows = size // SEGMENT_WIDTH
    segments = max(1, rows // 10)
    rng = np.random.default_rng(7)
    data = rng.standard_normal((rows, SEGMENT_WIDTH))
    ids = np.sort(rng.integers(0, segments, rows))
    t_data, t_lengths = torch.from_numpy(data), torch.from_numpy(np.bincount(ids, minlength=segments))
    return {"sparseserve": _op("segment_sum", data=data, indices=np.arange(rows), segment_ids=ids,
                               num_segments=segments),
            "torch": lambda: torch.segment_reduce(t_data, "sum", lengths=t_lengths, axis=0, unsafe=True)}


def _selection(size: int) -> tuple[SparseTensor, np.ndarray]:
    """A coalesced n × n COO matrix of ``size`` entries (10 a row) and n / 10 random rows of it."""
    n = size // PER_ROW
    rng = np.random.default_rng(8)
    indices, values = _coalesced(n, n, size, rng)
    matrix = SparseTensor(indices=indices, values=values, dense_shape=[n, n], coalesced=True)
    return matrix, rng.integers(0, n, max(1, n // 10))


def index_select_coo(size: int) -> Contenders:
    import torch

    matrix, index = _selection(size)
    t_matrix, t_index = _torch_coo(matrix.indices, matrix.values, matrix.dense_shape, True), torch.from_numpy(index)
    # One new tensor per call: the answer check (which is the warm-up too) and the timed runs.
    calls = repeats_at(size) + 1
    return {"sparseserve": _first_calls("index_select", "input", matrix, calls, dim=0, index=index),
            "torch": lambda: torch.index_select(t_matrix, 0, t_index)}


def index_select_csr(size: int) -> Contenders:
    matrix, index = _selection(size)
    csr = _op("convert", sp_input=matrix, layout="csr")()
    s_csr = _scipy_csr(csr)
    return {"sparseserve": _op("index_select", input=csr, dim=0, index=index), "scipy": lambda: s_csr[index]}


class Kernel(NamedTuple):
    label: str
    build: Callable[[int], Contenders]  # its contenders at a size
    largest: int = 10**7


# SpGEMM stops at 10^6 entries a side: its work is 10 products an entry (10^7 then, with as many
# entries out), and at 10^7 one call took 10 s here, 150 s for its point.
KERNELS = [
    Kernel("SpMV (CSR @ vector)", spmv),
    Kernel(f"SpMM (CSR @ {SPMM_COLUMNS} columns)", spmm),
    Kernel("SpGEMM (CSR @ CSR)", spgemm, largest=10**6),
    Kernel("coalesce (COO, 10% repeats)", coalesce),
    Kernel("to_dense (COO, 10% dense)", to_dense),
    Kernel(f"segment_sum ({SEGMENT_WIDTH} wide)", segment_sum),
    Kernel("index_select (COO, rows)", index_select_coo),
    Kernel("index_select (CSR, rows)", index_select_csr),
]


def _comparable(answer):
    """A scipy CSR matrix of a sparse answer (ours, scipy's or torch's), a numpy array of a dense one."""
    import scipy.sparse as sp
    import torch

    if isinstance(answer, SparseTensor):
        return answer.to_scipy().tocsr()
    if sp.issparse(answer):
        return answer.tocsr()
    if isinstance(answer, torch.Tensor):
        if answer.layout == torch.sparse_csr:
            return sp.csr_matrix((answer.values().numpy(), answer.col_indices().numpy(),
                                  answer.crow_indices().numpy()), shape=tuple(answer.shape))
        if answer.layout == torch.sparse_coo:
            answer = answer.coalesce()
            rows, cols = answer.indices().numpy()
            return sp.csr_matrix((answer.values().numpy(), (rows, cols)), shape=tuple(answer.shape))
        return answer.numpy()
    return np.asarray(answer)


def check_same(ours, peer, name: str) -> None:
    """Raise unless the peer's answer equals ours (stored entries alike, values to rounding)."""
    import scipy.sparse as sp

    mine, theirs = _comparable(ours), _comparable(peer)
    assert mine.shape == theirs.shape, f"{name}: shape {theirs.shape}, ours {mine.shape}"
    if sp.issparse(mine):
        assert mine.nnz == theirs.nnz, f"{name}: {theirs.nnz} stored entries, ours {mine.nnz}"
        gap = abs(mine - theirs).max() if mine.nnz else 0.0
        scale = abs(theirs).max() if theirs.nnz else 0.0
        assert gap <= 1e-9 * (1 + scale), f"{name}: values differ from ours by up to {gap}"
    else:
        np.testing.assert_allclose(mine, theirs, rtol=1e-9, atol=1e-9, err_msg=name)


def run(largest: int) -> list[dict]:
    import torch

    torch.set_num_threads(2)
    warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
    rows = []
    for kernel in KERNELS:
        for size in sizes_up_to(min(largest, kernel.largest)):
            repeat = repeats_at(size)
            contenders = kernel.build(size)
            ours = contenders["sparseserve"]()
            for name, fn in contenders.items():
                if name != "sparseserve":
                    check_same(ours, fn(), f"{kernel.label} at {size:,}, {name}")
            times = best_of_each(contenders, repeat, warm_up=False)
            print(f"{kernel.label:30s} {size:>12,} " + "  ".join(f"{name} {seconds * 1e3:10.3f} ms"
                                                           for name, seconds in times.items()), flush=True)
            peers = [name for name in times if name != "sparseserve"]
            rows += [figure(kernel.label, times["sparseserve"], peer, times[peer], sizes={"entries": size},
                            note=f"best of {repeat}") for peer in peers]
            del contenders
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scaling")
    parser.add_argument("--max-size", type=int, default=10_000_000, help="the largest size (entries)")
    args = parser.parse_args()
    rows = run(args.max_size)
    record("scaling", rows, about=__doc__.split("\n\n")[0].replace("\n", " "), max_size=args.max_size,
           per_row=PER_ROW, spmm_columns=SPMM_COLUMNS, segment_width=SEGMENT_WIDTH, threads=2)


if __name__ == "__main__":
    main()
