"""Server-side batching of small calls (``--batch-window-ms``, ``--max-batch``).

Concurrent small calls to the same batchable op are merged into one kernel call: the COO
inputs are stacked along a new leading dimension (the new index column is the call's
position in the batch, the shape ``[n, elementwise max of the shapes]``), the op runs once,
and its output is split by that leading column and handed back to each caller with the
caller's own shape.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparseserve.core.tensor import SparseTensor
from sparseserve.core.validate import INT64_MAX
from sparseserve.core.errors import InternalError
from sparseserve.kernels import PARALLEL_MIN

from . import tracing
from .registry import Plan
from .sizes import INLINE_BYTES, arguments_nbytes

__all__ = ["Batcher", "batch_key", "merge_coo", "split_coo"]

log = logging.getLogger("sparseserve.server")

# A merged call stays below the entry count at which kernels switch to their parallel
# path: the sequential path is the one each small call takes alone, so the merged result
# is bit-for-bit the separate ones (a parallel sum may add a run's values in another order).
MERGED_NNZ_LIMIT = PARALLEL_MIN


class Batcher:
    """Merges concurrent small calls to a batchable op arriving within ``window_seconds``.

    Which ops may be batchable: exactly those for which running on the stacked tensor and
    splitting by the leading index column equals running on each tensor alone, bit for bit.
    The op takes one COO tensor argument, its outputs are COO tensors of the input's shape
    sorted by their leading index column, and no entry's result depends on entries of
    another leading index. ``reorder`` and ``coalesce`` qualify: row-major order is
    lexicographic order of the index tuples whatever the shape, a new leading column only
    groups the calls, the sort is stable and sums run over entries of one call only.
    Others do not: ``with_values`` (and ``mul``/``div``/``add`` with a dense operand) take a
    second tensor whose length or broadcast shape belongs to one call; ``reduce_*``,
    ``softmax``, ``transpose``, ``reshape``, ``slice``, ``concat``... move or combine across
    the axes the batch column would shift; ``map_values`` keeps the input's order (no
    leading-column sort to split on) and its numpy loops compute lanes and tails of one
    vector differently, so equality would not be exact; ``to_dense``'s result is sized by
    the merged shape.

    A call is checked (bound, then its op's check) on its own before it joins a batch, so a
    bad call fails alone with its own error. Calls join a group of equal op, non-tensor arguments, dtype,
    sparse_ndim and dense dimensions; the group runs when the window closes, when
    ``max_batch`` calls wait, or when another call would take it to ``MERGED_NNZ_LIMIT``
    entries. A group of one runs unbatched. The merged call goes through ``Service.run``
    (kernel pool, --max-concurrency); an error there reaches every caller of the batch.
    A caller that went away (its task cancelled) is dropped and the others are answered.
    Calls of ``INLINE_BYTES`` or more gain nothing from merging and run as without batching.
    """

    def __init__(self, service, window_seconds: float, max_batch: int):
        self.service = service
        self.window = float(window_seconds)
        self.max_batch = max(1, int(max_batch))
        self._groups: dict[tuple, _Group] = {}
        self._tasks: set[asyncio.Task] = set()
        # Counters for tests and logs: kernel calls that answered several calls, the calls
        # they answered, and calls that ran alone (no partner in the window, or not mergeable).
        self.merged_batches = 0
        self.merged_calls = 0
        self.single_calls = 0

    async def submit(self, op, args: dict[str, Any]) -> list[tuple[str, Any]]:
        """The outputs of ``op`` on the raw (resolved, unvalidated) ``args``, as
        ``Service._compute`` returns them for this call alone."""
        service = self.service
        size = arguments_nbytes(args.values())
        if size >= INLINE_BYTES:
            return await service.run(service._execute_sync, op, args)
        plan = await service.run(service._plan, op, args, nbytes=size)
        key = batch_key(op, plan.bound)
        if key is None:
            self.single_calls += 1
            return await self._alone(op, plan)
        return await self._join(key, op, plan)

    # ------------------------------------------------------------ grouping
    async def _join(self, key: tuple, op, plan: Plan) -> list[tuple[str, Any]]:
        loop = asyncio.get_running_loop()
        arg = key[1]
        tensor = plan.args[arg]
        group = self._groups.get(key)
        if group is not None and group.nnz + tensor.nnz >= MERGED_NNZ_LIMIT:
            self._flush(key, group)
            group = None
        if group is None:
            group = self._groups[key] = _Group(op, arg)
            group.timer = loop.call_later(self.window, self._flush, key, group)
        future = loop.create_future()
        group.calls.append(_Call(plan, tensor, future, tracing.current_link()))
        group.nnz += tensor.nnz
        if len(group.calls) >= self.max_batch:
            self._flush(key, group)
        with tracing.span("batch wait"):  # the window, then the merged call (its "batch" span, linked)
            return await future

    def _flush(self, key: tuple, group: "_Group") -> None:
        if self._groups.get(key) is group:
            del self._groups[key]
        if group.timer is not None:
            group.timer.cancel()
            group.timer = None
        calls = [c for c in group.calls if not c.future.done()]  # done: the caller went away
        group.calls = []
        if not calls:
            return
        task = asyncio.get_running_loop().create_task(self._dispatch(group.op, group.arg, calls))
        self._tasks.add(task)  # the loop holds tasks weakly
        task.add_done_callback(self._tasks.discard)

    # ----------------------------------------------------------- execution
    async def _dispatch(self, op, arg: str, calls: list["_Call"]) -> None:
        shape = merged_shape([c.tensor for c in calls]) if len(calls) > 1 else None
        if shape is None:  # one call, or a stacked shape int64 cannot count: each alone
            self.single_calls += len(calls)
            await asyncio.gather(*(self._answer_alone(op, c) for c in calls))
            return
        try:
            with tracing.batch_span([c.origin for c in calls], len(calls)):
                answers = await self.service.run(self._run_merged, op, arg, calls, shape,
                                                 nbytes=sum(arguments_nbytes([c.tensor]) for c in calls))
        except asyncio.CancelledError:
            for c in calls:
                c.future.cancel()
            raise
        except Exception as exc:
            for c in calls:
                _settle(c.future, error=exc)
            return
        self.merged_batches += 1
        self.merged_calls += len(calls)
        log.debug("%s: %d calls in one kernel call", op.name, len(calls))
        for c, answer in zip(calls, answers):
            _settle(c.future, result=answer)

    async def _answer_alone(self, op, call: "_Call") -> None:
        try:
            _settle(call.future, result=await self._alone(op, call.plan))
        except asyncio.CancelledError:
            call.future.cancel()
            raise
        except Exception as exc:
            _settle(call.future, error=exc)

    async def _alone(self, op, plan: Plan) -> list[tuple[str, Any]]:
        service = self.service
        size = arguments_nbytes(plan.args.values())
        result = service.result_bytes(op, plan, size)
        return await service.run(service._compute, op, plan, nbytes=result)

    def _run_merged(self, op, arg: str, calls: list["_Call"], shape: tuple[int, ...]):
        """One kernel call for the batch; the outputs per caller, in call order."""
        tensors = [c.tensor for c in calls]
        # The merged call checked as any call is (each caller's was): the plan of its shape.
        plan = op.plan({**calls[0].plan.bound, arg: merge_coo(tensors, shape)})
        # Split on the host: a GPU worker's outputs come back from the device first.
        outputs = self.service._compute(op, plan, to_host=True)
        split = [(name, split_coo(value, tensors, op.name)) for name, value in outputs]
        return [[(name, parts[i]) for name, parts in split] for i in range(len(calls))]


@dataclass
class _Call:
    plan: Plan
    tensor: SparseTensor
    future: asyncio.Future
    origin: Any = None  # the caller's span, which the batch's links to (tracing on)


@dataclass
class _Group:
    op: Any
    arg: str
    calls: list[_Call] = field(default_factory=list)
    nnz: int = 0
    timer: asyncio.TimerHandle | None = None


def _settle(future: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    """Answer a caller unless it went away (its future was cancelled with it)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    hash(value)  # TypeError for anything else unhashable: the caller runs alone
    return type(value).__name__, value


_MERGED_ARGUMENT: dict[str, str | None] = {}


def merged_argument(op) -> str | None:
    """The one tensor argument calls of ``op`` are stacked on; None if the op has another
    shape of signature (more tensors, a tensor list, a dense output)."""
    if op.name not in _MERGED_ARGUMENT:
        tensor_args = [a for a in op.args if a.type.is_tensor or a.type.is_tensor_list]
        single = len(tensor_args) == 1 and tensor_args[0].type.is_tensor
        sparse_out = all(out.type == "sparse" for out in op.outputs)
        _MERGED_ARGUMENT[op.name] = tensor_args[0].name if single and sparse_out else None
    return _MERGED_ARGUMENT[op.name]


def batch_key(op, bound: dict[str, Any]) -> tuple | None:
    """What calls must share to be merged, or None when this call cannot be merged."""
    arg = merged_argument(op)
    if arg is None:
        return None
    tensor = bound[arg]
    # type, not isinstance: a GPU worker's DeviceTensor (a handle in device memory) runs alone.
    if type(tensor) is not SparseTensor or tensor.layout != "coo" or tensor.nnz >= MERGED_NNZ_LIMIT:
        return None
    try:
        # bind fills ``bound`` in declaration order, so equal arguments give equal keys.
        others = tuple((name, _hashable(value)) for name, value in bound.items() if name != arg)
    except TypeError:
        return None
    s = tensor.sparse_ndim
    return (op.name, arg, others, tensor.dtype.str, s, tuple(tensor.dense_shape[s:]))


def merged_shape(tensors: list[SparseTensor]) -> tuple[int, ...] | None:
    """``[n, elementwise max of the sparse shapes, dense dims]``, or None when the keys over
    the stacked sparse dimensions or its element count would not fit int64."""
    s = tensors[0].sparse_ndim
    sparse = np.asarray([t.dense_shape[:s] for t in tensors], dtype=np.int64).reshape(len(tensors), s)
    shape = (len(tensors), *(int(d) for d in sparse.max(axis=0)), *tensors[0].dense_shape[s:])
    keys = int(np.prod(shape[:s + 1], dtype=object))
    elements = int(np.prod(shape, dtype=object))
    return shape if max(keys, elements) <= INT64_MAX else None


def merge_coo(tensors: list[SparseTensor], shape: tuple[int, ...]) -> SparseTensor:
    """The tensors stacked along a new leading dimension (their position in ``tensors``)."""
    counts = [t.nnz for t in tensors]
    s = tensors[0].sparse_ndim
    indices = np.empty((sum(counts), s + 1), np.int64)
    indices[:, 0] = np.repeat(np.arange(len(tensors), dtype=np.int64), counts)
    indices[:, 1:] = np.concatenate([t.indices for t in tensors])
    values = np.concatenate([t.values for t in tensors])
    return SparseTensor(indices=indices, values=values, dense_shape=shape,
                        coalesced=all(t.coalesced for t in tensors))


def split_coo(output: SparseTensor, like: list[SparseTensor], op_name: str) -> list[SparseTensor]:
    """A merged output cut back into one tensor per call, each with its call's shape."""
    if not isinstance(output, SparseTensor) or output.layout != "coo":
        raise InternalError(f"{op_name} is declared batchable but returned a {type(output).__name__} "
                            "that is not a COO tensor")
    lead = output.indices[:, 0]
    if lead.size > 1 and bool(np.any(lead[1:] < lead[:-1])):
        raise InternalError(f"{op_name} is declared batchable but its output is not sorted by the "
                            "batch column")
    bounds = np.searchsorted(lead, np.arange(len(like) + 1))
    # Copies, not views of the merged buffers: each answer owns (and is sized by) its arrays.
    return [SparseTensor(indices=np.ascontiguousarray(output.indices[lo:hi, 1:]),
                         values=output.values[lo:hi].copy(), dense_shape=t.dense_shape,
                         coalesced=output.coalesced)
            for t, lo, hi in zip(like, bounds[:-1], bounds[1:])]
