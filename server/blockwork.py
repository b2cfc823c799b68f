"""What a Dask worker runs on the blocks of a partitioned tensor: one op call on a block, as
the server runs a call (bound, checked, its result size held to the limit), and the steps
of the plans that combine blocks (``server/partition.py``, ``server/cluster.py``).

Workers import this module by name to run what the cluster submits; importing it loads the
op catalogue.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sparseserve import kernels
from sparseserve.core.tensor import SparseTensor
from sparseserve.kernels import solvers as sk

from .limits import check_result_bytes
from .ops import REGISTRY
from .ops.linalg import csr_arrays, matrix_rep
from .partition import split_rows, stack_rows
from .validated import mark_validated

__all__ = ["run_block", "reduce_partial", "dense_total", "reduce_combine", "transpose_pieces", "merge_pieces",
           "SolverRows"]


def run_block(op_name: str, args: dict[str, Any], max_result_bytes: int) -> Any:
    """One call of a single-output op's CPU kernel, as the server runs it: arguments bound,
    the op's check (with the block's shape), the declared result size held to the limit, then
    the kernel. Runs on a Dask worker."""
    op = REGISTRY.get(op_name)
    plan = op.plan(op.bind(args))
    if op.result_bytes is not None:
        check_result_bytes(op, op.result_bytes(**plan.args), max_result_bytes)
    return mark_validated(op.run_plan("cpu", plan)[0])


def reduce_partial(op_name: str, block: SparseTensor, axes: list[int], max_result_bytes: int,
                   dense: bool = False) -> Any:
    """A block reduced over ``axes`` (the leading one among them), keeping them as size 1: a
    sparse tensor, or with ``dense`` (sums only: an absent entry adds nothing) a dense array."""
    return run_block(op_name, {"sp_input": block, "axis": axes, "keepdims": True, "output_is_sparse": not dense},
                     max_result_bytes)


def dense_total(parts: list[np.ndarray], axes: list[int], keepdims: bool) -> np.ndarray:
    """Dense partial sums added, the reduced axes dropped unless ``keepdims``."""
    total = parts[0] if len(parts) == 1 else np.add(*parts)
    return total if keepdims else total.reshape([n for d, n in enumerate(total.shape) if d not in axes])


def reduce_combine(op_name: str, parts: list[SparseTensor], axes: list[int], keepdims: bool,
                   output_is_sparse: bool, max_result_bytes: int) -> Any:
    """Partial reductions stacked along the leading axis and reduced again. With keepdims and a
    sparse output the result is another partial, so the calls nest into a tree."""
    return run_block(op_name, {"sp_input": stack_rows(parts), "axis": axes, "keepdims": keepdims,
                               "output_is_sparse": output_is_sparse}, max_result_bytes)


def transpose_pieces(block: SparseTensor, first_row: int, shape: tuple[int, ...], perm: list[int],
                     new_bounds: list[int], max_result_bytes: int) -> list[SparseTensor]:
    """A block's entries transposed (with their global indices) and cut by the rows of the
    output's blocks: piece j goes to output block j."""
    indices = block.indices.copy()
    indices[:, 0] += first_row
    whole = SparseTensor(indices=indices, values=block.values, dense_shape=shape, coalesced=block.coalesced)
    out = run_block("transpose", {"sp_input": whole, "perm": perm}, max_result_bytes)
    return split_rows(out, new_bounds)  # the output is in row order: every piece is a slice


def merge_pieces(pieces: list[SparseTensor]) -> SparseTensor:
    """Output block j of a transpose from its pieces, in input-block order, re-sorted stably: the
    single-node kernel's order, since its sort is stable over the input's order."""
    first = pieces[0]
    indices = np.concatenate([p.indices for p in pieces])
    values = np.concatenate([p.values for p in pieces])
    indices, values = kernels.reorder(indices, values, first.dense_shape[:first.sparse_ndim])
    return mark_validated(SparseTensor(indices=indices, values=values, dense_shape=first.dense_shape,
                              coalesced=all(p.coalesced for p in pieces)))


class SolverRows:
    """One block's rows of a partitioned square matrix, ready for a solver's products: a Dask
    actor on the worker that holds the block, living for one solve (``cluster.BlockOperator``
    calls it once an iteration). Its CSR arrays are made once, in the solve's dtype. A product
    receives only the span of p that the block's columns reach (for a banded matrix, about its
    own rows), written into a vector of the matrix's width kept here: the block's column
    indices are used as they are, never copied to shift them."""

    def __init__(self, block: SparseTensor, first_row: int, dtype: str):
        ptr, idx, vals = csr_arrays(matrix_rep(block))  # a row block of a checked matrix
        self.csr = sk.Csr(ptr, idx, np.ascontiguousarray(vals, dtype))
        self.first_row = first_row
        self.span = (int(idx.min()), int(idx.max()) + 1) if idx.size else (0, 0)
        self._x = np.zeros(int(block.dense_shape[1]), dtype)

    def columns(self) -> tuple[int, int]:
        """[lo, hi): the columns this block's entries reach, so the part of p it needs."""
        return self.span

    def product(self, p_span: np.ndarray) -> np.ndarray:
        """The block's rows of A @ p, given p[lo:hi] (the SpMV of the single node, row for row)."""
        lo, hi = self.span
        self._x[lo:hi] = p_span
        y = np.empty(self.csr.n, self._x.dtype)
        sk.spmv_into(self.csr, self._x, y)
        return y

    def diagonal(self) -> np.ndarray:
        """The block's rows of diag(A): repeated entries summed in order, as the single node's
        ``kernels.solvers.diagonal`` sums them."""
        ptr, idx, vals = self.csr.ptr, self.csr.idx, self.csr.vals
        rows = np.repeat(np.arange(self.csr.n), np.diff(ptr))
        on = idx == rows + self.first_row
        d = np.zeros(self.csr.n, vals.dtype)
        np.add.at(d, rows[on], vals[on])
        return d
