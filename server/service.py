"""The transport-neutral data plane shared by the gRPC and REST wires.

Both wires decode their request into Python values (tensors already in the
shared representation, handles as ``HandleRef``), call ``Service``, and encode
what comes back. Errors are ``SparseServeError`` subclasses; each wire maps
them to its status codes in one place.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable


from sparseserve.core.tensor import HandleRef, TensorInfo
from sparseserve.core.errors import (InternalError, InvalidArgumentError, NotFoundError, ResourceExhaustedError,
                                SparseServeError, UnauthenticatedError, UnavailableError, UnimplementedError)
from sparseserve.core.reasons import Reason

from . import tracing
from .validated import validated
from .buffers import BufferPool
from .config import ServerConfig
from .device import ArrayBackend, resolve_backend
from .limits import (check_argument_limits, check_deadline, check_result_bytes, check_tensor_limits,
                     deadline_exceeded, seconds_left)
from .metrics import Metrics, current, name_op
from .pipeline import plan_pipeline, run_steps
from .registry import Plan, Registry
from .shm import SharedSegments
from .sizes import INLINE_BYTES, arguments_nbytes, tensor_nbytes
from .spill import SpillDir, SpillDirError, Staging, file_bytes
from .store import HandleStore, new_handle

if TYPE_CHECKING:  # Dask is an optional extra: imported only with --dask-scheduler
    from .cluster import Cluster

__all__ = ["Service", "check_partitions", "partitions_from_text", "MAX_PARTITIONS"]

log = logging.getLogger("sparseserve.server")

# Blocks one put may ask for: more would be scheduler load, not parallelism.
MAX_PARTITIONS = 4096


def check_partitions(partitions: Any) -> int:
    """``partitions`` of a put: 0 (not partitioned) up to MAX_PARTITIONS."""
    if isinstance(partitions, bool) or not isinstance(partitions, int) or not 0 <= partitions <= MAX_PARTITIONS:
        raise InvalidArgumentError(f"partitions must be an integer from 0 (not partitioned) to {MAX_PARTITIONS}, "
                                   f"not {partitions!r}", reason=Reason.BAD_PARTITIONS)
    return partitions


def partitions_from_text(value: str | None, source: str) -> int:
    """The partitions a wire carries as text (absent: 0); ``put`` checks the range."""
    if value is None:
        return 0
    try:
        return int(value)
    except ValueError:
        raise InvalidArgumentError(f"{source} must be an integer, not {value[:40]!r}",
                                   reason=Reason.BAD_PARTITIONS) from None


class Service:
    def __init__(self, config: ServerConfig, registry: Registry, backend: ArrayBackend | None | str = "resolve"):
        self.config = config
        self.registry = registry
        # None: CPU kernels only. The tests pass ArrayBackend.numpy_stand_in() to run the GPU paths.
        self.backend: ArrayBackend | None = (resolve_backend(config.device) if isinstance(backend, str)
                                             else backend)
        self.device = self.backend.name if self.backend is not None else "cpu"
        spill = None
        if config.spill_dir:
            try:
                spill = SpillDir(config.spill_dir, config.spill_bytes, config.durable, to_host=self._on_host)
            except SpillDirError as exc:
                raise SystemExit(str(exc)) from None
        self.store = HandleStore(config.store_bytes, config.store_ttl,
                                 tenant_budget_bytes=config.tenant_store_bytes, spill=spill,
                                 check=self._checked_from_disk)
        self.buffers = BufferPool(config.buffer_pool_bytes)
        self.tokens = config.tokens()
        self.executor = ThreadPoolExecutor(max_workers=config.workers or os.cpu_count() or 1,
                                           thread_name_prefix="sparseserve-kernel")
        self.ready = False
        # Admission (see ``run``): slots for pool work, and how many calls wait for one.
        self.concurrency = config.max_concurrency or self.executor._max_workers
        self._slots = asyncio.Semaphore(self.concurrency)
        self.running = 0
        self.queued = 0
        self.batcher = None
        if config.batch_window_ms > 0:
            from .batching import Batcher

            self.batcher = Batcher(self, config.batch_window_ms / 1000, config.max_batch)
        self._shared: SharedSegments | None = None
        self.metrics = Metrics(self)
        tracing.configure(config)  # with --otlp-endpoint: OpenTelemetry loaded, a span per request
        if self.backend is not None:
            self.backend.on_fallback = self.metrics.count_fallback
        self.cluster: Cluster | None = None  # partitioned tensors on Dask, with --dask-scheduler
        if config.dask_scheduler:
            from .cluster import Cluster

            self.cluster = Cluster(config, config.store_ttl)

    @property
    def shared(self) -> SharedSegments:
        """The shared-memory segments of same-host transfers (made on first use); refused unless
        the server was started with --allow-shared-memory."""
        if not self.config.allow_shared_memory:
            raise UnimplementedError("shared memory is off on this server: start it with --allow-shared-memory "
                                     "(SPARSESERVE_ALLOW_SHARED_MEMORY=1) for same-host transfers, or put and "
                                     "get without shared_memory=True", reason=Reason.SHARED_MEMORY_OFF)
        if self._shared is None:
            self._shared = SharedSegments(self.config.shm_ttl)
        return self._shared

    # ------------------------------------------------------------- plumbing
    def tenant_for(self, authorization: str | None) -> str:
        """The tenant a bearer token names; '' when the server runs without tokens."""
        if not self.tokens:
            return ""
        scheme, _, token = (authorization or "").partition(" ")
        tenant = self.tokens.get(token) if scheme.lower() == "bearer" else None
        if tenant is None:
            raise UnauthenticatedError("a valid bearer token is required (Authorization: Bearer ...)",
                                       reason=Reason.BAD_TOKEN if authorization else Reason.MISSING_TOKEN)
        info = current.get()
        if info is not None:
            info.tenant = tenant
        return tenant

    async def run(self, fn: Callable[..., Any], *args: Any, nbytes: int | None = None) -> Any:
        """Run ``fn`` in the kernel pool, off the event loop, unless it works on ``nbytes`` below
        ``INLINE_BYTES`` — then on the loop, since handing it to a worker thread and back costs
        more than the work (a 100-entry reorder over gRPC: p50 2.0 ms through the pool, 0.85 ms
        inline).

        Pool work takes one of --max-concurrency slots; with none free it waits in a queue of at
        most --max-queue calls, and past that it is refused at once (UNAVAILABLE), so a burst
        never becomes a backlog. The caller's deadline bounds the wait and the work: at the
        deadline the caller gets DEADLINE_EXCEEDED and the result is dropped when the thread
        finishes (a numba kernel cannot be interrupted; its slot stays taken until then, so the
        slots always count the threads really busy)."""
        check_deadline("before the work started")
        if nbytes is not None and nbytes < INLINE_BYTES:
            return fn(*args)
        await self._admit()
        # run_in_executor drops context variables; the request's id and deadline must reach the thread.
        try:
            work = self.executor.submit(contextvars.copy_context().run, fn, *args)
        except RuntimeError:  # the pool has shut down (the server is stopping)
            self._free_slot()
            raise UnavailableError("the server is shutting down", reason=Reason.SHUTTING_DOWN) from None
        future = asyncio.wrap_future(work)
        future.add_done_callback(self._release)
        expiry = asyncio.timeout(seconds_left())
        try:
            async with expiry:
                return await asyncio.shield(future)  # the timeout must not cancel a running thread's future
        except TimeoutError:
            if not expiry.expired():
                raise
            work.cancel()  # drops it if no thread has started it
            raise deadline_exceeded("while the work ran") from None
        except asyncio.CancelledError:  # the caller went away (or gRPC's deadline cancelled the call)
            work.cancel()
            raise

    async def _admit(self) -> None:
        """Take a --max-concurrency slot, queueing for one up to --max-queue deep."""
        if self._slots.locked():
            if self.queued >= self.config.max_queue:
                raise UnavailableError(
                    f"the server is running {self.running} calls, its limit (--max-concurrency "
                    f"{self.concurrency}), and {self.queued} more wait, its queue limit (--max-queue "
                    f"{self.config.max_queue}); retry later", reason=Reason.OVERLOADED)
            self.queued += 1
            try:
                with tracing.span("queue wait", {"sparseserve.queue.position": self.queued}):
                    async with asyncio.timeout(seconds_left()):
                        await self._slots.acquire()
            except TimeoutError:
                raise deadline_exceeded("while the call waited for a worker") from None
            finally:
                self.queued -= 1
        else:
            await self._slots.acquire()  # free: returns at once
        self.running += 1

    def _free_slot(self) -> None:
        self.running -= 1
        self._slots.release()

    def _release(self, future: asyncio.Future) -> None:
        self._free_slot()
        if not future.cancelled():
            future.exception()  # read, so an abandoned call's error is not logged as never retrieved

    def warm_up(self) -> None:
        """Compile (or load from numba's disk cache) every kernel, and on a GPU worker the GPU
        kernels' CuPy code too, then report ready (at once with --no-warm-up)."""
        from sparseserve import kernels

        if self.config.warm_up:
            kernels.warm_up()  # a GPU worker falls back to them
            if self.backend is not None:
                self.backend.warm_up(self.registry)
        self.ready = True

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.store.close()
        if self._shared is not None:
            self._shared.close()
        if self.cluster is not None:
            self.cluster.close()
        tracing.shutdown()  # the spans still held are sent

    # ------------------------------------------------------------------ ops
    async def execute(self, op_name: str, args: dict[str, Any], keep: bool, tenant: str) -> list[tuple[str, Any]]:
        name_op(op_name, self.registry.ops)
        op = self.registry.get(op_name)
        resolved = {}  # a loop, not a comprehension: one with an await is a coroutine of its own to run
        for name, value in args.items():
            resolved[name] = await self._resolve(value, tenant) if isinstance(value, (HandleRef, list)) else value
        check_argument_limits(op, resolved, self.config)
        if self._partitioned(resolved.values()):
            answer = await self.run(self._dask().execute, op, resolved, keep, tenant)
            if not isinstance(answer, list):  # no plan for this call: its arguments were gathered
                return await self._kept(await self.run(self._execute_sync, op, answer.args, not keep), keep, tenant)
            return await self._kept(answer, keep, tenant)
        if self.batcher is not None and op.batchable:
            return await self._kept(await self.batcher.submit(op, resolved), keep, tenant)
        size = arguments_nbytes(resolved.values())
        if size >= INLINE_BYTES or op.iterative:  # an iterative op's cost is not its input's size
            return await self._kept(await self.run(self._execute_sync, op, resolved, not keep), keep, tenant)
        # Small inputs: checked on the loop, and the kernel run there too unless the op says its
        # result is big (as ``run`` would, without its awaits: a small call's time is overheads).
        check_deadline("before the work started")
        plan = self._plan(op, resolved)
        result = self.result_bytes(op, plan, size)
        if result >= INLINE_BYTES:
            outputs = await self.run(self._compute, op, plan, not keep)
        else:
            outputs = self._compute(op, plan, not keep)
        return await self._kept(outputs, keep, tenant) if keep else outputs  # not kept: on the host already

    async def execute_pipeline(self, raw_steps: list[tuple[str, str, dict[str, Any]]], outputs: list[str],
                               keep: bool, tenant: str) -> list[tuple[str, Any]]:
        """Run (name, op, args) steps as one request (``server/pipeline.py``): every step is
        checked before the first runs; the chosen outputs come back."""
        resolved = []
        for name, op_name, args in raw_steps:
            args = {k: await self._resolve(v, tenant) for k, v in args.items()}
            if self._partitioned(args.values()):  # a pipeline runs in this process
                args = await self.run(self._dask().gathered, args)
            if op_name in self.registry.ops:  # an unknown op is the planner's to report
                check_argument_limits(self.registry.get(op_name), args, self.config)
            resolved.append((name, op_name, args))
        steps, chosen = await self.run(tracing.traced("validation", plan_pipeline), self.registry, resolved, outputs)
        return await self._kept(await self.run(run_steps, self, steps, chosen, not keep), keep, tenant)

    def _execute_sync(self, op, args: dict[str, Any], to_host: bool = False) -> list[tuple[str, Any]]:
        return self._compute(op, self._plan(op, args), to_host)

    def _plan(self, op, args: dict[str, Any]) -> Plan:
        """Check, before any kernel: the arguments bound, the op's ``check`` run once (its
        refusals, the same on every device), and the declared result size held to the limit."""
        with tracing.span("validation"):
            plan = op.plan(op.bind(args))
            if op.result_bytes is not None:
                check_result_bytes(op, self.result_bytes(op, plan), self.config.max_result_bytes)
        return plan

    def result_bytes(self, op, plan: Plan, otherwise: int = 0) -> int:
        """The op's declared result size (``otherwise`` when it declares none). Some estimates
        count entries with numpy; CuPy refuses to hand numpy a device array (TypeError), and
        then the estimate reads a host copy of the arguments: a copy, never a skipped check."""
        if op.result_bytes is None:
            return otherwise
        try:
            return op.result_bytes(**plan.args)
        except TypeError:
            if self.backend is None:
                raise
            return op.result_bytes(**{name: self.backend.to_host(value) for name, value in plan.args.items()})

    def _compute(self, op, plan: Plan, to_host: bool = False) -> list[tuple[str, Any]]:
        """(output name, value) pairs of one checked op call; with ``to_host``,
        a GPU worker's outputs copied to the host here, in the worker thread, rather than on the
        event loop (``_kept`` copies only what is still on the device)."""
        try:
            with tracing.span("kernel", {"sparseserve.op": op.name, "sparseserve.device": self.device}):
                results = op.run_plan("cpu", plan) if self.backend is None else self.backend.run(op, plan)
        except SparseServeError:
            raise
        except MemoryError:
            raise ResourceExhaustedError(f"{op.name} ran out of memory", reason=Reason.OUT_OF_MEMORY) from None
        except Exception as exc:  # a bug: report it as one, keep serving
            log.exception("op %s failed", op.name)
            raise InternalError(f"{op.name} failed: {type(exc).__name__}: {exc}") from exc
        outputs = [(out.name, list(value) if out.is_list else value) for out, value in zip(op.outputs, results)]
        for name, value in outputs:
            if isinstance(value, list):  # a list output: each of its tensors
                for i, item in enumerate(value):
                    check_tensor_limits(item, f"the {name}[{i}] output of {op.name}", self.config)
            else:
                check_tensor_limits(value, f"the {name} output of {op.name}", self.config)
        if to_host:
            outputs = [(name, self._on_host(value)) for name, value in outputs]
        return outputs

    async def _kept(self, outputs: list[tuple[str, Any]], keep: bool, tenant: str) -> list[tuple[str, Any]]:
        """With ``keep``, the outputs stored and replaced by their handles (those kept on the Dask
        cluster already are handles). Called on the event loop once the work has come back, so
        a call abandoned at its deadline stores nothing."""
        if keep:
            return [(name, [await self._kept_one(v, tenant) for v in value] if isinstance(value, list)
                     else await self._kept_one(value, tenant)) for name, value in outputs]
        return [(name, self._on_host(value)) for name, value in outputs]

    async def _kept_one(self, value: Any, tenant: str) -> HandleRef:
        """One output tensor stored (a list output's are stored one by one), as its handle and
        what it holds (the SDK's RemoteTensor knows its shape, dtype, nnz and layout from it)."""
        if isinstance(value, HandleRef):  # kept in blocks on the Dask cluster already
            held = await self.run(self._dask().lookup, value.handle, tenant)
            return HandleRef(value.handle, replace(TensorInfo.of(held.like, held.nbytes), nnz=held.nnz))
        handle, nbytes = await self._store(value, tenant)
        return HandleRef(handle, TensorInfo.of(value, nbytes))

    async def _store(self, value: Any, tenant: str, partitions: int = 0) -> tuple[str, int]:
        """Keep a checked tensor: partitioned on the Dask cluster when asked or above
        --distribute-above-bytes, else in this process (a GPU worker's device memory)."""
        if partitions and self.cluster is None:
            raise UnimplementedError("partitions needs a server started with --dask-scheduler",
                                     reason=Reason.NO_CLUSTER)
        big = self.cluster is not None and 0 < self.config.distribute_above_bytes < tensor_nbytes(value)
        if partitions or big:
            from .partition import not_partitionable, partitionable

            why = partitionable(value)
            if why is None:
                parts = partitions or await self.run(self._dask().default_partitions)
                return await self.run(self._dask().put, self._on_host(value), tenant, parts)
            if partitions:
                raise not_partitionable(why)
        return await self._keep(value, tenant)

    async def _keep(self, value: Any, tenant: str) -> tuple[str, int]:
        """Keep a tensor in this process's store. With --durable its file is written first, in the
        kernel pool: the put is answered once the file is on disk, and one abandoned on the way (its
        deadline, a refusal) leaves no file. With a disk tier, the evictions a put causes are on
        disk before it is answered, so that clients cannot outrun the disk."""
        store = self.store
        if store.spill is None:
            return store.put(self._on_device(value), tenant)
        handle, written, staging = new_handle(), 0, Staging()
        try:
            if store.spill.durable:
                store.admit(tensor_nbytes(value), tenant, file_bytes(handle, tenant, value))
                written = await self.run(store.spill.write, handle, tenant, value, True, staging)
            kept = store.put(self._on_device(value), tenant, handle=handle, written=written)
        except BaseException:
            staging.abandon()
            raise
        if store.pending:
            await asyncio.wrap_future(store.flush())
        return kept

    def _checked_from_disk(self, tensor: Any) -> Any:
        """A tensor mapped back from the disk tier, validated as a put validates it."""
        check_tensor_limits(tensor, "tensor", self.config)
        return validated(tensor, "tensor")

    async def _held(self, handle: str, tenant: str) -> Any:
        """A tensor of this process's store; one on disk is mapped back and checked in the kernel pool."""
        tensor = self.store.get(handle, tenant, load=False)
        return tensor if tensor is not None else await self.run(self.store.get, handle, tenant)

    def _dask(self) -> Cluster:
        """The Dask cluster, where a call has found partitioned tensors (so there is one)."""
        if self.cluster is None:
            raise InternalError("a partitioned tensor on a server without --dask-scheduler")
        return self.cluster

    def _partitioned(self, values) -> bool:
        return self.cluster is not None and any(self.cluster.holds(v) for v in values)

    def _on_device(self, value: Any) -> Any:
        """Where the store keeps a tensor: device memory on a GPU worker, until it is fetched."""
        return value if self.backend is None else self.backend.to_device(value)

    def _on_host(self, value: Any) -> Any:
        """A tensor as the wires send it."""
        return value if self.backend is None else self.backend.to_host(value)

    async def _resolve(self, value: Any, tenant: str) -> Any:
        if isinstance(value, HandleRef):
            try:
                return await self._held(value.handle, tenant)
            except NotFoundError as exc:
                if self.cluster is None or exc.reason != Reason.UNKNOWN_HANDLE:  # EVICTED, say: one of ours
                    raise
                return await self.run(self.cluster.lookup, value.handle, tenant)
        if isinstance(value, list):
            return [await self._resolve(v, tenant) for v in value]
        return value

    # -------------------------------------------------------------- tensors
    async def put(self, tensor: Any, tenant: str, partitions: int = 0) -> tuple[str, int]:
        """Validate and keep a tensor; returns (handle, bytes). Stored on the loop after the
        check, so an upload abandoned at its deadline leaves nothing behind. ``partitions``:
        cut into that many row blocks on the Dask cluster (``_store``)."""
        check_partitions(partitions)
        check_tensor_limits(tensor, "tensor", self.config)
        value = await self.run(tracing.traced("validation", validated), tensor, "tensor")
        return await self._store(value, tenant, partitions)

    def upload_budget(self) -> int:
        """The most bytes one upload may bring: the store's budget, or the cluster's when bigger."""
        return max(self.store.budget_bytes, self.cluster.store.budget_bytes if self.cluster else 0)

    async def get(self, handle: str, tenant: str) -> Any:
        try:
            return self._on_host(await self._held(handle, tenant))
        except NotFoundError as exc:
            if self.cluster is None or exc.reason != Reason.UNKNOWN_HANDLE:
                raise
        return await self.run(self.cluster.get, handle, tenant, self.config.max_result_bytes)

    async def delete(self, handle: str, tenant: str) -> None:
        try:
            self.store.delete(handle, tenant)
        except NotFoundError as exc:
            if self.cluster is None or exc.reason != Reason.UNKNOWN_HANDLE:
                raise
            await self.run(self.cluster.delete, handle, tenant)

    def catalogue(self) -> list[dict[str, Any]]:
        return [op.describe() for op in self.registry]

    def check_result_size(self, tensors: list[Any], limit: int, what: str) -> int:
        """The bytes of ``tensors`` (handles count none; a list output counts its tensors),
        refused over ``limit``."""
        flat = [t for v in tensors for t in (v if isinstance(v, list) else (v,))]
        size = sum(tensor_nbytes(t) for t in flat if not isinstance(t, HandleRef))
        if size > limit:
            raise ResourceExhaustedError(
                f"the {what} takes {size} bytes, over the {limit}-byte message limit; call with "
                "keep=true and fetch the result with get (it streams in chunks)",
                reason=Reason.MESSAGE_TOO_LARGE)
        return size
