"""Scale-out on a Dask cluster (``--dask-scheduler``): tensors cut into row blocks held by the
Dask workers, ops run where the blocks are, handles shared by every replica on the cluster.

Imported only when the server is started with a scheduler address, so a server without one
never imports Dask. Every method here blocks on the cluster and runs in the kernel pool.

What lives where:

- A partitioned tensor's blocks are Dask futures in the workers' memory. Its handle names a
  dataset published on the scheduler (the blocks' futures, their row bounds and metadata and
  the owning tenant): any replica connected to the scheduler finds it there, and the published
  dataset is what keeps the blocks alive. Deleting it through any replica unpublishes it, and the
  workers free the blocks.
- The replica that made a handle accounts for it in a store of its own (``--dask-store-bytes``,
  ``--store-ttl``, and per tenant ``--tenant-dask-store-bytes``): evicting or expiring it there
  unpublishes it too.
- With ``--dask-tls-*`` the replica speaks TLS to the scheduler and workers (Dask's ``Security``,
  a ``tls://`` address): it presents its certificate and checks theirs against the CA.
- Plans (``server/partition.py``), declared beside each op, say how it runs on blocks; an op
  without one gathers its partitioned arguments into this process first, within
  ``--max-result-bytes``, or refuses with RESOURCE_EXHAUSTED.
- A solver on a partitioned matrix (``Krylov``) iterates here, on whole vectors; each of its
  products is computed by Dask actors, one per block, made on the workers holding the blocks
  for the length of the solve (``BlockOperator``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import operator
import queue
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

import distributed
from distributed import Client, wait
from distributed.security import Security

from sparseserve.core.tensor import HandleRef, SparseTensor
from sparseserve.kernels import solvers as sk
from sparseserve.core.errors import (InternalError, NotFoundError, PermissionDeniedError, ResourceExhaustedError,
                                SparseServeError, UnavailableError)
from sparseserve.core.reasons import Reason

from . import blockwork
from . import partition as part
from .registry import Plan
from .validated import mark_validated
from .limits import deadline_exceeded, seconds_left
from .ops.solvers import inverse_diagonal
from .sizes import tensor_nbytes
from .store import STORE_REASON, HandleStore, new_handle

__all__ = ["Cluster", "DistributedTensor", "Gathered", "BlockOperator"]

log = logging.getLogger("sparseserve.cluster")

# Whole arguments at least this big are sent to the workers once, not once per block.
_SCATTER_BYTES = 64 << 10


@dataclass
class DistributedTensor:
    """A tensor in row blocks on the Dask workers. ``meta`` describes a block (``block_meta``:
    layout, dtype, trailing shape, flags, the whole tensor's coalesced flag); ``like`` is made
    from it, a stand-in with the whole shape and no entries (its arrays take no memory), which
    is what argument checks read. ``nnz`` and ``nbytes`` are the whole tensor's."""

    blocks: list[Any]  # Dask futures, one per block
    bounds: list[int]
    meta: dict[str, Any]
    block_nnz: list[int]
    nbytes: int

    def __post_init__(self):
        # Never published: a stand-in's zero-stride arrays would be pickled at full size.
        self.like = stand_in(self.meta, self.bounds[-1])

    @property
    def nnz(self) -> int:
        return sum(self.block_nnz)

    @property
    def entry_bounds(self) -> list[int]:
        return np.cumsum([0, *self.block_nnz]).tolist()


@dataclass
class Gathered:
    """``Cluster.execute``'s answer for an op that has no plan for this call: its arguments with
    every partitioned tensor gathered, for the ordinary single-node path."""

    args: dict[str, Any]


def block_meta(block: Any) -> dict[str, Any]:
    """What the replica needs to know of a block without fetching it (runs on a worker)."""
    if isinstance(block, SparseTensor):
        meta = {"layout": block.layout, "shape": tuple(block.dense_shape), "dtype": block.dtype.str,
                "nnz": block.nnz, "nbytes": block.nbytes, "coalesced": block.coalesced,
                "sparse_ndim": block.sparse_ndim}
        if block.layout != "coo":
            meta["index_dtype"] = block.compressed_indices.dtype.str
        return meta
    return {"layout": "dense", "shape": tuple(np.shape(block)), "dtype": block.dtype.str, "nnz": 0,
            "nbytes": int(block.nbytes)}


def _free(dtype, shape) -> np.ndarray:
    """A read-only array of ``shape`` taking no memory (all zeros)."""
    return np.broadcast_to(np.zeros((), dtype), shape)


def stand_in(meta: dict[str, Any], rows: int) -> Any:
    """An entry-less tensor with the shape (``rows`` leading), dtype, layout and flags of ``meta``."""
    shape = (rows, *meta["shape"][1:])
    dtype = np.dtype(meta["dtype"])
    if meta["layout"] == "dense":
        return _free(dtype, shape)
    if meta["layout"] == "coo":
        s = meta["sparse_ndim"]
        t = SparseTensor(indices=np.zeros((0, s), np.int64), values=np.zeros((0, *shape[s:]), dtype),
                         dense_shape=shape, coalesced=meta["coalesced"])
    else:
        index = np.dtype(meta["index_dtype"])
        t = SparseTensor(layout="csr", compressed_indices=_free(index, rows + 1),
                         plain_indices=np.zeros(0, index), values=np.zeros(0, dtype), dense_shape=shape,
                         coalesced=meta["coalesced"])
    return mark_validated(t)


def _distributed_in(value: Any) -> bool:
    if isinstance(value, list):
        return any(isinstance(v, DistributedTensor) for v in value)
    return isinstance(value, DistributedTensor)


class Cluster:
    def __init__(self, config, store_ttl: float):
        self.config = config
        self._reconnecting = threading.Lock()
        try:
            self._client = self._connect()
        except UnavailableError as exc:
            raise SystemExit(f"--dask-scheduler {config.dask_scheduler}: {exc.message}") from None
        budget = config.dask_store_bytes or self.workers_memory() or (1 << 62)
        self._blocks: dict[str, int] = {}  # handle -> its blocks, of those in self.store (for /metrics)
        # Each tenant's partitioned tensors made here, as --tenant-store-bytes does for the local
        # store: a tenant over it makes room from its own, least recently used first.
        self.store = HandleStore(budget, store_ttl, tenant_budget_bytes=config.tenant_dask_store_bytes,
                                 on_drop=self._dropped,
                                 limit="the partitioned tensors' budget (--dask-store-bytes)")
        self._unpublish: queue.SimpleQueue[str] = queue.SimpleQueue()
        threading.Thread(target=self._unpublisher, name="sparseserve-unpublish", daemon=True).start()

    # ----------------------------------------------------------------- cluster
    @property
    def client(self) -> Client:
        """The Dask client; a new one when it has closed, which Dask does for good once the
        scheduler has been unreachable past its reconnect timeout (a restart, say)."""
        if self._client.status in ("closing", "closed"):
            with self._reconnecting:
                if self._client.status in ("closing", "closed"):
                    log.warning("the Dask client closed; connecting to %s again", self.config.dask_scheduler)
                    self._client = self._connect()
        return self._client

    def _connect(self) -> Client:
        try:
            return Client(self.config.dask_scheduler, timeout=self.config.dask_connect_timeout, set_as_default=False,
                          security=self._security())
        except (OSError, TimeoutError) as exc:
            raise UnavailableError(f"cannot reach the Dask scheduler ({exc})",
                                   reason=Reason.CLUSTER_UNAVAILABLE) from None

    def _security(self) -> Security | None:
        """TLS to the scheduler and workers (--dask-tls-*; the flags' check makes the address
        tls://): this replica's certificate, the CA theirs must be signed by, and no plaintext
        comm at all. None: Dask's own configuration (plain tcp:// unless it says otherwise)."""
        config = self.config
        if not config.dask_tls_cert:
            return None
        return Security(tls_ca_file=config.dask_tls_ca, tls_client_cert=config.dask_tls_cert,
                        tls_client_key=config.dask_tls_key, require_encryption=True)

    def workers_memory(self) -> int:
        """The memory limits of the workers connected now, added up (0 when they set none)."""
        workers = self.client.scheduler_info().get("workers", {})
        return sum(int(w.get("memory_limit") or 0) for w in workers.values())

    def default_partitions(self) -> int:
        """One block per worker thread: every worker busy, no more tasks than it takes."""
        workers = self.client.scheduler_info().get("workers", {})
        return max(1, sum(int(w.get("nthreads") or 1) for w in workers.values()))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close(timeout=2)

    # ------------------------------------------------------------- handles
    def put(self, tensor: Any, tenant: str, partitions: int) -> tuple[str, int]:
        """Cut ``tensor`` into at most ``partitions`` row blocks, send them to the workers and
        publish them under a new handle."""
        self._check_budgets(tensor_nbytes(tensor))  # before a byte goes to the workers
        with _dask_errors("storing a partitioned tensor"):
            bounds = part.row_bounds(tensor, partitions)
            blocks = self.client.scatter(part.split_rows(tensor, bounds), hash=False)
            # Validated here once, then remembered as checked in the worker that holds each block.
            checked = self.client.map(_checked_block, blocks, pure=False)
            del blocks
            return self.keep(self._distributed(checked, bounds), tenant)

    def keep(self, dt: DistributedTensor, tenant: str) -> tuple[str, int]:
        self._check_budgets(dt.nbytes)
        handle = new_handle()
        record = {"tenant": tenant, "bounds": dt.bounds, "block_nnz": dt.block_nnz, "nbytes": dt.nbytes,
                  "meta": dt.meta, "blocks": dt.blocks}
        with _dask_errors("publishing a partitioned tensor"):
            self.client.publish_dataset(record, name=handle)
        self._blocks[handle] = len(dt.blocks)
        try:
            self.store.put(_Stub(dt.nbytes), tenant, handle=handle)
        except SparseServeError:
            self._blocks.pop(handle, None)
            self._unpublish_now(handle)
            raise
        return handle, dt.nbytes

    def stats(self) -> tuple[int, int, int]:
        """(handles, bytes, blocks) of the partitioned tensors made here and held now."""
        handles, nbytes = self.store.stats()
        return handles, nbytes, sum(self._blocks.copy().values())  # a copy: a drop may come meanwhile

    def _check_budgets(self, nbytes: int) -> None:
        """A partitioned tensor bigger than the whole budget (STORE_BUDGET) or than one tenant's
        (TENANT_QUOTA, HTTP 429 as for the local store) is refused, naming this store's flags;
        smaller ones make room (``HandleStore.put``)."""
        if nbytes > self.store.budget_bytes:
            raise ResourceExhaustedError(f"the tensor takes {nbytes} bytes, over the partitioned tensors' budget "
                                         f"(--dask-store-bytes) of {self.store.budget_bytes} bytes",
                                         reason=STORE_REASON)
        quota = self.store.tenant_budget_bytes
        if quota and nbytes > quota:
            err = ResourceExhaustedError(f"the tensor takes {nbytes} bytes, over the budget of one tenant's "
                                         f"partitioned tensors, {quota} bytes (--tenant-dask-store-bytes)",
                                         reason=Reason.TENANT_QUOTA)
            err.http_status = 429  # a quota, not a size limit
            raise err

    def lookup(self, handle: str, tenant: str) -> DistributedTensor:
        """The partitioned tensor ``handle`` names, made through any replica."""
        with _dask_errors("looking up a partitioned tensor"):
            try:
                record = self.client.get_dataset(handle)
            except KeyError:
                raise NotFoundError(f"no tensor with handle {handle!r}: never made, deleted, expired "
                                    "or evicted", reason=Reason.UNKNOWN_HANDLE) from None
        if record["tenant"] != tenant:
            raise PermissionDeniedError(f"handle {handle!r} belongs to another tenant", reason=Reason.OTHER_TENANT)
        with contextlib.suppress(SparseServeError):
            self.store.get(handle, tenant)  # a use: renews its TTL where it was made
        return DistributedTensor(record["blocks"], record["bounds"], record["meta"], record["block_nnz"],
                                 record["nbytes"])

    def delete(self, handle: str, tenant: str) -> None:
        self.lookup(handle, tenant)  # NOT_FOUND and another tenant's handle, as for any handle
        self._unpublish_now(handle)
        with contextlib.suppress(SparseServeError):
            self.store.delete(handle, tenant)  # made here: its on_drop finds it unpublished already

    def get(self, handle: str, tenant: str, limit: int) -> Any:
        return self.gather(self.lookup(handle, tenant), limit, f"tensor {handle!r}")

    def gather(self, dt: DistributedTensor, limit: int, what: str = "a partitioned argument") -> Any:
        if dt.nbytes > limit:
            raise part.too_big_to_gather(what, dt.nbytes, limit)
        return part.join_rows(self._results(dt.blocks), dt.bounds)

    def _dropped(self, handle: str) -> None:
        self._blocks.pop(handle, None)
        self._unpublish.put(handle)  # called under the store's lock: no network there

    def _unpublisher(self) -> None:
        while True:
            self._unpublish_now(self._unpublish.get())

    def _unpublish_now(self, handle: str) -> None:
        try:
            self.client.unpublish_dataset(handle)
        except KeyError:
            pass  # deleted through another replica, or here just before
        except Exception:  # the cluster is gone: nothing left to free
            log.warning("could not unpublish %s", handle, exc_info=True)

    # ----------------------------------------------------------------- ops
    def execute(self, op, args: dict[str, Any], keep: bool, tenant: str) -> list[tuple[str, Any]] | Gathered:
        """Run ``op`` where its partitioned arguments' blocks are, when its plan covers the call;
        otherwise gather them (``Gathered``)."""
        plan = op.kernels.get("dask")
        like = {name: self._like(value) for name, value in args.items()}
        bound = op.bind(like)  # argument types, layouts and defaults, before anything runs
        runner = getattr(self, f"_{plan.kind}", None) if plan is not None else None
        with _dask_errors(f"running {op.name}"):
            result = runner(op, plan, args, bound) if runner is not None else None
            if result is None:
                return Gathered(self.gathered(args))
            if isinstance(result, _Outputs):  # host values, kept (if asked) as any op's are
                return [(out.name, value) for out, value in zip(op.outputs, result.values)]
            if isinstance(result, _Blocks):
                if keep:
                    handle, _ = self.keep(self._distributed(result.futures, result.bounds), tenant)
                    return [(op.outputs[0].name, HandleRef(handle))]
                result = self._joined(result, f"the {op.outputs[0].name} of {op.name}")
        return [(op.outputs[0].name, result)]

    @staticmethod
    def holds(value: Any) -> bool:
        """Whether an argument value is (or lists) a partitioned tensor."""
        return _distributed_in(value)

    def gathered(self, args: dict[str, Any]) -> dict[str, Any]:
        """``args`` with every partitioned tensor gathered (within --max-result-bytes)."""
        with _dask_errors("gathering partitioned arguments"):
            return {name: self._gathered(value) for name, value in args.items()}

    def _like(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self._like(v) for v in value]
        return value.like if isinstance(value, DistributedTensor) else value

    def _gathered(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self._gathered(v) for v in value]
        if isinstance(value, DistributedTensor):
            return mark_validated(self.gather(value, self.config.max_result_bytes))
        return value

    @staticmethod
    def _checked(op, bound: dict[str, Any], entries: tuple[str, ...] = ()) -> Plan:
        """The op's check on the partitioned tensors' descriptions (entry-less stand-ins of the
        whole shape; arrays with a row per entry cut to match), before any block works: the
        single node's refusals and messages, and the normalised arguments the plan reads."""
        return op.plan({k: (v[:0] if k in entries else v) for k, v in bound.items()})

    # Each runner returns the answer (_Blocks being computed, or a host value), or None to gather.
    def _rowwise(self, op, plan: part.Rowwise, args, bound):
        dt = args.get(plan.tensor)
        others = [k for k, v in args.items() if k != plan.tensor and _distributed_in(v)]
        if not isinstance(dt, DistributedTensor) or others or (plan.applies and not plan.applies(**bound)):
            return None
        nnz = dt.nnz
        for name in plan.entries:
            got = np.shape(bound[name])[0] if np.ndim(bound[name]) else 0
            if got != nnz:
                raise part.entry_count_error(name, got, nnz)
        self._checked(op, bound, plan.entries)
        sliced = {k for k in plan.rows if plan.slice_rows is not None and plan.slice_rows(bound[k], dt.like)}
        whole = {k: self._shared(v) for k, v in bound.items()
                 if k != plan.tensor and k not in sliced and k not in plan.entries}
        entry_bounds = dt.entry_bounds
        futures = []
        for i, block in enumerate(dt.blocks):
            r0, r1 = dt.bounds[i], dt.bounds[i + 1]
            e0, e1 = entry_bounds[i], entry_bounds[i + 1]
            block_args = {**whole, plan.tensor: block,
                          **{k: bound[k][r0:r1] for k in sliced},
                          **{k: bound[k][e0:e1] for k in plan.entries}}
            futures.append(self.client.submit(blockwork.run_block, op.name, block_args,
                                              self.config.max_result_bytes, pure=False))
        return _Blocks(futures, dt.bounds)

    def _reduction(self, op, plan: part.Reduction, args, bound):
        dt = args.get(plan.tensor)
        if not isinstance(dt, DistributedTensor) or not isinstance(dt.like, SparseTensor):
            return None
        checked = self._checked(op, bound)
        axes = checked.args[plan.axes]
        if 0 not in axes:
            return self._rowwise(op, part.Rowwise(plan.tensor), args, bound)
        limit = self.config.max_result_bytes
        dense = plan.additive and not bound["output_is_sparse"]  # sums of dense partials are the sum
        level = [self.client.submit(blockwork.reduce_partial, op.name, b, axes, limit, dense, pure=False)
                 for b in dt.blocks]
        while len(level) > 2:  # pairs, up a tree: log2(blocks) rounds
            pairs = [level[i:i + 2] for i in range(0, len(level), 2)]
            level = [(self.client.submit(np.add, *p, pure=False) if dense else
                      self.client.submit(blockwork.reduce_combine, op.name, p, axes, True, True, limit, pure=False))
                     if len(p) == 2 else p[0] for p in pairs]
        if dense:
            final = self.client.submit(blockwork.dense_total, level, axes, bound["keepdims"], pure=False)
        else:
            final = self.client.submit(blockwork.reduce_combine, op.name, level, axes, bound["keepdims"],
                                       bound["output_is_sparse"], limit, pure=False)
        return self._results([final])[0]

    def _shuffle(self, op, plan: part.Shuffle, args, bound):
        dt = args.get(plan.tensor)
        if not isinstance(dt, DistributedTensor) or getattr(dt.like, "layout", None) != "coo":
            return None
        checked = self._checked(op, bound)
        perm = checked.args[plan.perm]
        if perm[0] == 0:
            return self._rowwise(op, part.Rowwise(plan.tensor), args, bound)
        shape = tuple(dt.like.dense_shape)
        out_rows = shape[perm[0]]
        parts_n = len(dt.blocks)
        new_bounds = sorted(set(out_rows * k // parts_n for k in range(parts_n + 1)))
        limit = self.config.max_result_bytes
        pieces = [self.client.submit(blockwork.transpose_pieces, b, dt.bounds[i], shape, perm, new_bounds, limit,
                                     pure=False) for i, b in enumerate(dt.blocks)]
        futures = []
        for j in range(len(new_bounds) - 1):
            column = [self.client.submit(operator.getitem, p, j, pure=False) for p in pieces]
            futures.append(self.client.submit(blockwork.merge_pieces, column, pure=False))
        return _Blocks(futures, new_bounds)

    def _stack(self, op, plan: part.Stack, args, bound):
        inputs = args.get(plan.tensors)
        if not isinstance(inputs, list) or not _distributed_in(inputs) or bound.get("expand_nonconcat_dims"):
            return None
        if any(getattr(self._like(t), "layout", None) != "coo" for t in inputs):
            return None
        checked = self._checked(op, bound)
        if checked.args[plan.axis] != 0:
            return None
        futures, bounds = [], [0]
        for t in inputs:
            if isinstance(t, DistributedTensor):
                blocks, rows = t.blocks, t.bounds
            else:
                blocks, rows = self.client.scatter([t], hash=False), [0, part.rows_of(t)]
            for i, block in enumerate(blocks):
                futures.append(self.client.submit(blockwork.run_block, op.name, {"axis": 0, plan.tensors: [block]},
                                                  self.config.max_result_bytes, pure=False))
                bounds.append(bounds[-1] + rows[i + 1] - rows[i])
        return _Blocks(futures, bounds)

    def _krylov(self, op, plan: part.Krylov, args, bound):
        dt = args.get(plan.tensor)
        others = [k for k, v in args.items() if k != plan.tensor and _distributed_in(v)]
        if not isinstance(dt, DistributedTensor) or others:  # a partitioned b or x0: gathered
            return None
        made: list[BlockOperator] = []

        def make_operator(dtype) -> BlockOperator:
            made.append(BlockOperator(self, dt, dtype))
            return made[-1]
        try:
            return _Outputs(plan.solve(make_operator, **self._checked(op, bound).args))
        finally:  # answered, failed or past its deadline: the actors go now
            for operator in made:
                operator.close()

    # ------------------------------------------------------------- plumbing
    def _shared(self, value: Any) -> Any:
        """A whole argument as every block's task receives it: big arrays sent once."""
        if isinstance(value, np.ndarray) and value.nbytes >= _SCATTER_BYTES:
            return self.client.scatter(value, broadcast=False, hash=False)
        return value

    def _distributed(self, futures: list[Any], bounds: list[int]) -> DistributedTensor:
        """The tensor whose blocks the tasks ``futures`` compute, once they have (their errors
        raised here, before anything is kept)."""
        metas = self._results([self.client.submit(block_meta, f, pure=False) for f in futures])
        meta = dict(metas[0])
        if meta["layout"] != "dense":
            meta["coalesced"] = all(m["coalesced"] for m in metas)
        return DistributedTensor(futures, list(bounds), meta, [m["nnz"] for m in metas],
                                 sum(m["nbytes"] for m in metas))

    def _joined(self, blocks: "_Blocks", what: str) -> Any:
        """An answer's blocks gathered into one tensor here, if it fits --max-result-bytes: the
        size is the scheduler's count of the finished blocks' bytes, read before fetching them."""
        self._finished(blocks.futures)
        sizes = self.client.nbytes(keys=[f.key for f in blocks.futures], summary=False)
        total = sum(sizes.values())
        if total > self.config.max_result_bytes:
            raise part.too_big_to_gather(what, total, self.config.max_result_bytes)
        return part.join_rows(self.client.gather(blocks.futures), blocks.bounds)

    def _finished(self, futures: list[Any]) -> None:
        """Wait for ``futures`` until the caller's deadline; the first failure raised here."""
        left = seconds_left()
        try:
            with self.client.as_current():  # wait() looks for a default client, and we set none
                wait(futures, timeout=None if left is None else max(left, 0.0))
        except TimeoutError:
            self.client.cancel(futures)
            raise deadline_exceeded("while the Dask workers ran") from None
        for future in futures:
            if future.status != "finished":
                future.result()  # raises the task's error, or CancelledError for a lost one

    def _results(self, futures: list[Any]) -> list[Any]:
        self._finished(futures)
        return self.client.gather(futures)


class BlockOperator:
    """A partitioned square matrix as the solvers' loops use one (``server/ops/solvers.py``'s
    ``Operator``: ``n``, ``dtype``, ``matvec``, ``spmv_dot(s)``, ``jacobi``), its products computed
    by the workers that hold the blocks. Each block gets a Dask actor on its worker for the
    solve (``blockwork.SolverRows``: the block made ready once); a product sends each actor the
    span of the vector its columns reach, and writes the rows it answers into the result here.
    Actors rather than submitted tasks: a call goes to the actor's worker without the scheduler
    placing a task each time (about 7 ms a product on 2 local workers against 25 ms for tasks:
    docs/solvers.md). The dot products taken here are summed as the single node's kernels sum
    them, so the loop computes the same numbers."""

    def __init__(self, cluster: Cluster, dt: DistributedTensor, dtype: np.dtype):
        self.n = dt.bounds[-1]
        self.dtype = np.dtype(dtype)
        self._bounds = dt.bounds
        self._jacobi: np.ndarray | None = None
        self._client = client = cluster.client
        holders = client.who_has(dt.blocks)
        with client.as_current():  # an actor finds its client as the current one, and we set none
            self._made = [client.submit(blockwork.SolverRows, block, dt.bounds[i], self.dtype.str, actor=True,
                                        workers=list(holders.get(block.key, ())) or None, pure=False)
                          for i, block in enumerate(dt.blocks)]
            try:
                self._rows = cluster._results(self._made)
                self._spans = self._answers([rows.columns() for rows in self._rows])
            except BaseException:  # never handed out, so never closed by the caller
                self.close()
                raise

    def close(self) -> None:
        """The actors deleted from their workers now. Not left to garbage collection: each call
        on an actor leaves a reference cycle in Dask (a closure that refers to itself) holding
        the actor, and with it a reference to its key, until a collection runs; until then each
        dataset lookup would tell the scheduler the key is wanted (a warning there once it is
        cancelled). So the keys are cancelled and the actors' own references released."""
        with contextlib.suppress(Exception):  # the cluster gone: nothing left to free
            self._client.cancel(self._made)
        for rows in getattr(self, "_rows", ()):
            future = getattr(rows, "_future", None)  # Dask's Actor keeps its key's future there
            if future is not None:
                future.release()

    def matvec(self, x: np.ndarray) -> np.ndarray:
        y = np.empty(self.n, self.dtype)
        self._product(np.ascontiguousarray(x, self.dtype), y)
        return y

    def spmv_dot(self, x: np.ndarray, y: np.ndarray) -> float:
        self._product(x, y)
        return sk.blocked_dot(x, y)

    def spmv_dots(self, x: np.ndarray, y: np.ndarray, u: np.ndarray) -> tuple[float, float]:
        self._product(x, y)
        return sk.blocked_dots(u, y)

    def jacobi(self) -> np.ndarray:
        if self._jacobi is None:
            self._jacobi = inverse_diagonal(np.concatenate(self._answers([rows.diagonal() for rows in self._rows])))
        return self._jacobi

    def _product(self, x: np.ndarray, y: np.ndarray) -> None:
        """y = A @ x, every block's rows at once."""
        calls = [rows.product(x[lo:hi]) for rows, (lo, hi) in zip(self._rows, self._spans)]
        for answer, r0, r1 in zip(self._answers(calls), self._bounds, self._bounds[1:]):
            y[r0:r1] = answer

    @staticmethod
    def _answers(calls: list[Any]) -> list[Any]:
        """The actors' answers, waited for until the caller's deadline."""
        answers = []
        for call in calls:
            left = seconds_left()
            try:
                answers.append(call.result(timeout=None if left is None else max(left, 0.0)))
            except TimeoutError:
                raise deadline_exceeded("while the Dask workers computed a product") from None
        return answers


@dataclass
class _Outputs:
    """A multi-output op's answer computed here (a solver's), in the op's output order."""

    values: tuple[Any, ...]


@dataclass
class _Blocks:
    """An answer's blocks, still being computed: futures and the row bounds they cover."""

    futures: list[Any]
    bounds: list[int]


@dataclass
class _Stub:
    """What the making replica's store holds for a partitioned handle: its size."""

    nbytes: int


def _checked_block(block: Any) -> Any:
    from .validated import validated

    return validated(block, "block")


@contextlib.contextmanager
def _dask_errors(doing: str):
    """Cluster failures as the service's errors: a lost worker or scheduler is UNAVAILABLE with
    what was being done; our own errors pass through; anything else is a bug (INTERNAL)."""
    try:
        yield
    except SparseServeError:
        raise
    except (concurrent.futures.CancelledError, distributed.scheduler.KilledWorker) as exc:
        # Dask cancels what depended on blocks lost with a worker (FutureCancelledError, and
        # FuturesCancelledError for several): a block sent by put has no recipe to recompute it.
        raise UnavailableError(f"a Dask worker holding part of the data was lost while {doing}; a tensor "
                               f"stored with put must be stored again ({type(exc).__name__}: {exc})",
                               reason=Reason.WORKER_LOST) from None
    except (OSError, TimeoutError, distributed.comm.CommClosedError) as exc:
        raise UnavailableError(f"the Dask cluster did not answer while {doing} ({type(exc).__name__}: {exc})",
                               reason=Reason.CLUSTER_UNAVAILABLE) from None
    except Exception as exc:
        log.exception("partitioned work failed while %s", doing)
        raise InternalError(f"{doing} failed: {type(exc).__name__}: {exc}") from exc
