"""What a Dask worker runs on the blocks of a partitioned tensor: one op call on a block, as
the server runs a call (bound, validated, its result size held to the limit), and the steps
of the plans that combine blocks (``server/partition.py``, ``server/cluster.py``).

Workers import this module by name to run what the cluster submits; importing it loads the
op catalogue.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sparseserve import kernels
from sparseserve.core.tensor import SparseTensor

from .limits import check_result_bytes
from .ops import REGISTRY
from .partition import split_rows, stack_rows
from .trust import trust

__all__ = ["run_block", "reduce_partial", "dense_total", "reduce_combine", "transpose_pieces", "merge_pieces"]


def run_block(op_name: str, args: dict[str, Any], max_result_bytes: int) -> Any:
    """One call of a single-output op's CPU kernel, as the server runs it: arguments bound
    and validated, the declared result size checked, then the kernel. Runs on a Dask worker."""
    op = REGISTRY.get(op_name)
    bound = op.bind(args)
    if op.result_bytes is not None:
        check_result_bytes(op, op.result_bytes(**bound), max_result_bytes)
    return trust(op.run("cpu", bound)[0])


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
    return trust(SparseTensor(indices=indices, values=values, dense_shape=first.dense_shape,
                              coalesced=all(p.coalesced for p in pieces)))
