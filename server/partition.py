"""Row blocks of a tensor, and how each op runs on them: the Dask-free half of scale-out.

A partitioned tensor is cut along its leading dimension into blocks of consecutive rows
(``bounds[i]:bounds[i + 1]``); each block is an ordinary tensor of its own rows, the leading
index counted from the block's first row. COO (any rank), 2-D CSR and dense tensors can be cut.
Entries keep their order within a block and blocks follow each other, so ``join_rows`` of the
blocks is the tensor ``split_rows`` cut (a COO tensor whose entries are not in row order comes
back grouped by block, each group in its original order).

The plans at the bottom say how an op runs on blocks; each op module declares its own with
``REGISTRY.partitioned`` beside the op. ``server/cluster.py`` carries the plans out on Dask,
and the workers run ``server/blockwork.py``, which uses the cutting and joining here too: so
nothing here imports Dask (which sizes blocks by ``sys.getsizeof``: ``SparseTensor.__sizeof__``
counts its arrays).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from sparseserve.core.tensor import SparseTensor
from sparseserve.core.errors import InvalidArgumentError, ResourceExhaustedError, UnimplementedError
from sparseserve.core.reasons import Reason

__all__ = ["partitionable", "row_bounds", "split_rows", "join_rows", "stack_rows", "rows_of",
           "Rowwise", "Reduction", "Shuffle", "Stack", "Krylov"]


# ------------------------------------------------------------------ cutting and joining
def partitionable(t: Any) -> str | None:
    """Why ``t`` cannot be cut into row blocks (None when it can)."""
    if isinstance(t, SparseTensor):
        if t.layout == "coo":
            return None if t.ndim >= 1 else "a COO tensor of rank 0 has no rows"
        if t.layout == "csr" and t.ndim == 2:
            return None
        return f"a {t.layout} tensor of rank {t.ndim} (COO of any rank, 2-D CSR and dense tensors can be)"
    return None if np.ndim(t) >= 1 else "a dense scalar has no rows"


def rows_of(t: Any) -> int:
    return int(t.dense_shape[0]) if isinstance(t, SparseTensor) else int(np.shape(t)[0])


def row_bounds(t: Any, parts: int) -> list[int]:
    """At most ``parts`` blocks' first rows, and the row count last: about equal numbers of
    stored entries per block (rows of skewed data are not equal work), equal row counts for a
    dense tensor or one with no entries. A row is never split, so a heavy one can merge blocks."""
    rows = rows_of(t)
    parts = max(1, min(int(parts), rows or 1))
    nnz = t.nnz if isinstance(t, SparseTensor) else 0
    if not nnz:
        cuts = [rows * k // parts for k in range(parts + 1)]
    elif t.layout == "csr":
        ptr = t.compressed_indices.astype(np.int64, copy=False)
        targets = [nnz * k // parts for k in range(1, parts)]
        cuts = [0, *np.searchsorted(ptr, targets, side="right").tolist(), rows]
    else:
        kth = [nnz * k // parts for k in range(1, parts)]
        lead = np.partition(t.indices[:, 0], kth) if kth else t.indices[:0, 0]
        cuts = [0, *(int(lead[k]) for k in kth), rows]
    return sorted(set(min(max(int(c), 0), rows) for c in cuts)) if rows else [0, 0]


def split_rows(t: Any, bounds: list[int]) -> list[Any]:
    """The blocks of ``t`` between consecutive ``bounds``."""
    pairs = list(zip(bounds[:-1], bounds[1:]))
    if not isinstance(t, SparseTensor):
        return [np.ascontiguousarray(t[r0:r1]) for r0, r1 in pairs]
    rest = tuple(t.dense_shape[1:])
    if t.layout == "csr":
        ptr = t.compressed_indices
        return [SparseTensor(layout="csr", compressed_indices=ptr[r0:r1 + 1] - ptr[r0],
                             plain_indices=t.plain_indices[ptr[r0]:ptr[r1]], values=t.values[ptr[r0]:ptr[r1]],
                             dense_shape=(r1 - r0, *rest), coalesced=t.coalesced) for r0, r1 in pairs]
    lead = t.indices[:, 0]
    if lead.size < 2 or bool(np.all(lead[1:] >= lead[:-1])):  # row order: each block is a slice
        starts = np.searchsorted(lead, bounds).tolist()
        pieces: list[slice | np.ndarray] = [slice(a, b) for a, b in zip(starts[:-1], starts[1:])]
    else:  # grouped by block, each group in entry order
        block = np.searchsorted(np.asarray(bounds[1:-1]), lead, side="right")
        order = np.argsort(block, kind="stable")
        ends = np.searchsorted(block[order], np.arange(len(pairs) + 1)).tolist()
        pieces = [order[a:b] for a, b in zip(ends[:-1], ends[1:])]
    blocks = []
    for (r0, r1), sel in zip(pairs, pieces):
        indices = t.indices[sel].copy()
        indices[:, 0] -= r0
        blocks.append(SparseTensor(indices=indices, values=t.values[sel], dense_shape=(r1 - r0, *rest),
                                   coalesced=t.coalesced))
    return blocks


def join_rows(blocks: list[Any], bounds: list[int]) -> Any:
    """The tensor whose row blocks are ``blocks``: the inverse of ``split_rows``."""
    first = blocks[0]
    if not isinstance(first, SparseTensor):
        return np.concatenate(blocks) if len(blocks) > 1 else first
    shape = (bounds[-1], *first.dense_shape[1:])
    coalesced = all(b.coalesced for b in blocks)
    values = np.concatenate([b.values for b in blocks])
    if first.layout == "csr":
        nnz = np.cumsum([0] + [b.nnz for b in blocks])
        index_dtype = np.result_type(*(b.compressed_indices.dtype for b in blocks))
        if nnz[-1] > np.iinfo(index_dtype).max:
            index_dtype = np.dtype(np.int64)
        ptr = np.concatenate([blocks[0].compressed_indices[:1].astype(index_dtype)] +
                             [b.compressed_indices[1:].astype(index_dtype) + off for b, off in zip(blocks, nnz)])
        plain = np.concatenate([b.plain_indices.astype(index_dtype, copy=False) for b in blocks])
        return SparseTensor(layout="csr", compressed_indices=ptr, plain_indices=plain, values=values,
                            dense_shape=shape, coalesced=coalesced)
    indices = np.concatenate([b.indices for b in blocks])
    at = 0
    for b, r0 in zip(blocks, bounds):
        indices[at:at + b.nnz, 0] += r0
        at += b.nnz
    return SparseTensor(indices=indices, values=values, dense_shape=shape, coalesced=coalesced)


def stack_rows(parts: list[SparseTensor]) -> SparseTensor:
    """COO tensors of leading size 1 stacked along the leading axis (part i becomes row i)."""
    return join_rows(parts, list(range(len(parts) + 1)))


# ------------------------------------------------------------------ plans, one per op
@dataclass(frozen=True)
class Rowwise:
    """The op runs on each block of ``tensor`` and its answer's blocks are the per-block
    answers, with the same rows. Other arguments go whole to every block, except ``rows``
    (arguments with one slice per block, when ``slice_rows(value, tensor)`` says they have the
    tensor's rows) and ``entries`` (arrays with one row per stored entry, cut like the entries).
    ``applies(**bound)`` may decline a call (it then gathers). Before any block works, the op's
    check runs on the whole tensor's description (``Cluster._checked``): the single node's
    refusals and messages, with the whole shape."""

    tensor: str
    rows: tuple[str, ...] = ()
    entries: tuple[str, ...] = ()
    slice_rows: Callable[[Any, Any], bool] | None = None
    applies: Callable[..., bool] | None = None
    kind: str = "rowwise"


@dataclass(frozen=True)
class Reduction:
    """A reduction: row-wise when the leading axis is kept; otherwise each block reduces to a
    sparse partial and partials combine pairwise up a tree. ``axes`` names the argument that
    holds the reduced axes once checked (sorted, non-negative). ``additive``: a sum, whose
    dense answer is the sum of the blocks' dense partials (no sparse partials to merge)."""

    axes: str = "axis"
    additive: bool = False
    tensor: str = "sp_input"
    kind: str = "reduction"


@dataclass(frozen=True)
class Shuffle:
    """``transpose``: row-wise when the leading axis stays first, else each block's entries are
    sent to the output block that owns their new row. ``perm`` names the argument that holds
    the whole permutation once checked."""

    perm: str = "perm"
    tensor: str = "sp_input"
    kind: str = "shuffle"


@dataclass(frozen=True)
class Stack:
    """``concat`` along the leading axis: the inputs' blocks, one after another. ``axis`` names
    the argument that holds the axis once checked (non-negative)."""

    axis: str = "axis"
    tensors: str = "sp_inputs"
    kind: str = "stack"


@dataclass(frozen=True)
class Krylov:
    """An iterative solver on a partitioned square matrix ``tensor``: the solver's loop runs in
    the replica serving the call, over whole vectors, and each product A @ p is computed where
    the blocks are, every block's worker its own rows. ``solve(make_operator, **args)`` is the
    op's code, given the arguments its check made of the matrix's description (the whole
    shape, so the single-node refusals come before any block works); it calls
    ``make_operator(dtype)`` for the matrix as its loop uses one (``server/cluster.py``'s
    ``BlockOperator``: ``n``, ``dtype``, ``matvec``, ``spmv_dot(s)``, ``jacobi``) and returns the
    op's outputs."""

    solve: Callable[..., tuple[Any, ...]]
    tensor: str = "a"
    kind: str = "krylov"


def entry_count_error(name: str, got: int, nnz: int) -> InvalidArgumentError:
    return InvalidArgumentError(f"{name} has {got} rows; it needs one per stored entry of the partitioned "
                                f"tensor, {nnz}", reason=Reason.SHAPE_MISMATCH)


def not_partitionable(why: str) -> UnimplementedError:
    return UnimplementedError(f"this tensor cannot be partitioned: {why}", reason=Reason.NOT_PARTITIONABLE)


def too_big_to_gather(what: str, nbytes: int, limit: int) -> ResourceExhaustedError:
    return ResourceExhaustedError(
        f"{what} takes {nbytes} bytes, over the result limit of {limit} bytes (--max-result-bytes) "
        "that bounds gathering a partitioned tensor into one process; keep it partitioned (keep=true) "
        "or use an op that runs on its blocks", reason=Reason.RESULT_TOO_LARGE)
