"""The handle store: tensors kept on the server between calls.

A byte budget with least-recently-used eviction and a time-to-live. Handle ids are 128 random
bits, so they cannot be guessed; each entry remembers the tenant that made it and only that
tenant can read or delete it. With a per-tenant budget, a tenant over it makes room from its
own handles first, so one tenant's uploads cannot push out another's.

With a disk tier (``spill``: ``--spill-dir``), an evicted tensor is written to a file (by one
writer thread, while its handle keeps serving it from memory) and its handle stays valid.
The next use maps the file back read-only, checks it once (the file's lengths and CRCs,
then validation as at put) and serves the tensor from the mapping: it does not re-enter the
memory budget. Its pages are the page cache's, clean and file-backed, which the kernel drops
under pressure without writing anything; copying it back in would push another handle out to
disk, and a working set bigger than the budget would go round in writes. The disk tier has
its own budget (``--spill-bytes``); past it, its least recently used handles go for good.
With a durable tier (``--durable``) every tensor is written when it is kept, so a server
restarted on the directory serves the same handles to the same tenants.

A handle let go without a delete (evicted with no room on disk, expired, or a file that
failed its check) is remembered, the last ``GONE_MAX`` of them, so that its owner's next use
is told so (NOT_FOUND with reason EVICTED, EXPIRED or DAMAGED) rather than UNKNOWN_HANDLE;
each is counted (``dropped``) and logged on ``sparseserve.store``.

What an op keeps with a held tensor for its next calls (a matrix's multigrid hierarchy, eigsh's
factorization of A - sigma M) is
charged to that tensor's handle (``charge_kept``): its bytes join the handle's in the tenant's
budget, go when the handle goes, and count when others need room. A handle's charge grows
only while its tensor is in memory: a tensor mapped back from the disk tier has nothing kept
with it (the op rebuilds it for each call), and what was kept goes with the tensor when it
spills.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterator

from sparseserve.core.errors import (NotFoundError, PermissionDeniedError, ResourceExhaustedError,
                                     SparseServeError)
from sparseserve.core.reasons import Reason

from .sizes import tensor_nbytes
from .spill import Damaged, SpillDir, file_bytes
from .validated import validated

__all__ = ["HandleStore", "new_handle", "charge_kept", "GONE_MAX", "MAPPED_MAX"]

log = logging.getLogger("sparseserve.store")

# Handles let go without a delete that are remembered for the reason their next use is told:
# about 250 bytes each, so at most a few MiB however long the server runs.
GONE_MAX = 16384
# Spilled handles kept mapped (and checked) for their next use; each holds a file descriptor.
MAPPED_MAX = 256


def new_handle() -> str:
    """A fresh handle id: 128 random bits, so that handles cannot be guessed."""
    return "h-" + secrets.token_hex(16)


@dataclass(eq=False)
class _Entry:
    tensor: Any  # in memory (and being written to disk while ``spilling``); None once on disk only
    nbytes: int
    tenant: str
    expires: float
    file_bytes: int = 0  # its file in the disk tier (reserved while it is written); 0: none
    spilling: bool = False
    mapped: Any = None  # its file mapped back and checked, kept for the next use (MAPPED_MAX)


# Every store of this process, for ``charge_kept`` (a server has one; tests make many).
_STORES: "weakref.WeakSet[HandleStore]" = weakref.WeakSet()


def charge_kept(tensor: Any, nbytes: int) -> bool:
    """``nbytes`` an op keeps with ``tensor`` while it lives, charged to the handle holding it in
    memory (``HandleStore.charge``). False when there is no room for them in its budgets, or when
    the tensor is served from the disk tier: the caller then does not keep them. True, charging
    nothing, for a read-only tensor no store holds (a pipeline's intermediate, an in-process
    call), whose life is its call's."""
    for store in list(_STORES):
        charged = store.charge(tensor, nbytes)
        if charged is not None:
            return charged
    return True


# How a tensor bigger than the whole store is refused, here and by the uploads that check first.
STORE_LIMIT, STORE_REASON = "the whole store budget (--store-bytes)", Reason.STORE_BUDGET


class HandleStore:
    def __init__(self, budget_bytes: int, ttl_seconds: float,
                 clock: Callable[[], float] = time.monotonic, tenant_budget_bytes: int = 0,
                 on_drop: Callable[[str], None] | None = None, limit: str = STORE_LIMIT,
                 spill: SpillDir | None = None, check: Callable[[Any], Any] | None = None):
        self.budget_bytes = int(budget_bytes)
        self.tenant_budget_bytes = int(tenant_budget_bytes)  # 0: tenants share the whole budget
        self._tenant_bytes: dict[str, int] = {}
        self.ttl_seconds = float(ttl_seconds)
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # every handle, oldest use first
        self._memory: OrderedDict[str, None] = OrderedDict()  # those in memory, oldest use first
        self._files: OrderedDict[str, None] = OrderedDict()  # those with a file, oldest use first
        self._mapped: OrderedDict[str, None] = OrderedDict()  # those with a mapping kept, oldest use first
        self._gone: OrderedDict[str, tuple[str, str, str]] = OrderedDict()  # handle -> (tenant, reason, why)
        self._bytes = 0
        self._file_bytes = 0
        self._lock = threading.Lock()
        self._later: list[Callable[[], None]] = []  # run once the lock is let go (logs, file removals)
        self.evictions = 0  # handles pushed out of memory, to disk or for good
        self.spilled = 0  # of those, the ones that went to the disk tier
        self.dropped = {"evicted": 0, "expired": 0, "damaged": 0}  # let go without a delete, by reason
        self.pending = 0  # evicted tensors queued for the writer thread, not yet on disk
        # Told each handle that leaves (deleted, evicted, expired), under the lock: it must not block.
        self._on_drop = on_drop
        self._limit = limit  # how a tensor bigger than the budget is told which budget
        self.spill = spill
        # Validation as at put, of a tensor mapped back from disk (the service adds its limits).
        self._check = check or partial(validated, name="tensor")
        self._writer: ThreadPoolExecutor | None = None
        self._held: dict[int, str] = {}  # id of each tensor in memory -> its handle (``charge``)
        _STORES.add(self)
        if spill is not None:
            expires = self._clock() + self.ttl_seconds  # a restart counts as a use
            with self._locked():
                for r in spill.restored:
                    self._entries[r.handle] = _Entry(None, r.nbytes, r.tenant, expires, r.file_bytes)
                    self._files[r.handle] = None
                    self._file_bytes += r.file_bytes
                self._make_disk_room(0)  # a restart with a smaller --spill-bytes

    # ------------------------------------------------------------------ public
    def admit(self, nbytes: int, tenant: str = "", file_size: int = 0) -> None:
        """Refuse a tensor that could never be kept: bigger than the budget, one tenant's
        budget, or (its file, ``file_size``) the disk tier's. ``put`` checks the same; a
        caller about to write a durable file checks first."""
        if nbytes > self.budget_bytes:
            raise ResourceExhaustedError(
                f"the tensor takes {nbytes} bytes, over {self._limit} of {self.budget_bytes} bytes",
                reason=STORE_REASON)
        quota = self.tenant_budget_bytes
        if quota and nbytes > quota:
            err = ResourceExhaustedError(f"the tensor takes {nbytes} bytes, over the budget of one tenant, "
                                         f"{quota} bytes (--tenant-store-bytes)", reason=Reason.TENANT_QUOTA)
            err.http_status = 429  # a quota, not a size limit (docs/contract.md ("Errors"))
            raise err
        if self.spill is not None and file_size > self.spill.budget_bytes:
            raise ResourceExhaustedError(
                f"the tensor's file takes {file_size} bytes, over the disk tier's budget (--spill-bytes) of "
                f"{self.spill.budget_bytes} bytes; with --durable every kept tensor is written there",
                reason=STORE_REASON)

    def put(self, tensor: Any, tenant: str = "", handle: str | None = None, written: int = 0) -> tuple[str, int]:
        """Keep ``tensor``; returns (handle, bytes). With a durable disk tier its file is written
        first, here, unless the caller wrote it already (``written``: its size, under ``handle``)."""
        nbytes = tensor_nbytes(tensor)
        handle = handle or new_handle()
        if self.spill is not None and self.spill.durable and not written:
            self.admit(nbytes, tenant, file_bytes(handle, tenant, tensor))
            written = self.spill.write(handle, tenant, tensor, durable=True)
        else:
            self.admit(nbytes, tenant, written)
        quota = self.tenant_budget_bytes
        with self._locked():
            self._expire()
            if quota:
                own = (h for h in list(self._memory) if self._entries[h].tenant == tenant)
                while self._tenant_bytes.get(tenant, 0) + nbytes > quota:
                    self._evict(next(own), f"its tenant's budget (--tenant-store-bytes {quota} bytes)")
            while self._bytes + nbytes > self.budget_bytes and self._memory:
                self._evict(next(iter(self._memory)), f"{self._limit} of {self.budget_bytes} bytes")
            entry = _Entry(tensor, nbytes, tenant, self._clock() + self.ttl_seconds)
            if written:
                self._make_disk_room(written)
                entry.file_bytes = written
                self._files[handle] = None
                self._file_bytes += written
            self._entries[handle] = entry
            self._memory[handle] = None
            self._held[id(tensor)] = handle
            self._bytes += nbytes
            self._tenant_bytes[tenant] = self._tenant_bytes.get(tenant, 0) + nbytes
        return handle, nbytes

    def get(self, handle: str, tenant: str = "", load: bool = True) -> Any:
        """The tensor; one on disk is mapped back and checked first (file I/O: the service
        asks with ``load=False`` on its event loop, and gets None where that is needed)."""
        with self._locked():
            self._expire()
            entry = self._owned(handle, tenant)
            self._touch(handle, entry)
            tensor = entry.tensor if entry.tensor is not None else entry.mapped
            if tensor is not None or not load:
                return tensor
            size = entry.file_bytes
        assert self.spill is not None  # only the disk tier holds tensors out of memory
        try:
            tensor = self._check(self.spill.load(handle, tenant, size))
        except (Damaged, SparseServeError) as exc:
            why = exc.message if isinstance(exc, SparseServeError) else str(exc)
            with self._locked():
                if self._entries.get(handle) is entry:
                    self._drop(handle, "damaged", f"its file in --spill-dir failed its check ({why}) and was "
                                                  "removed; put it again")
                self._owned(handle, tenant)  # raises: DAMAGED, or what became of it meanwhile
            raise AssertionError("unreachable") from None
        with self._locked():
            if self._entries.get(handle) is entry and entry.tensor is None:
                entry.mapped = tensor
                self._mapped[handle] = None
                while len(self._mapped) > MAPPED_MAX:
                    self._entries[self._mapped.popitem(last=False)[0]].mapped = None
        return tensor

    def charge(self, tensor: Any, nbytes: int) -> bool | None:
        """Add ``nbytes`` kept with ``tensor`` to its handle's charge, making room as a put does
        (the tenant's other handles first, then the least recently used); False when the handle
        and its keepings could not fit alone, or its tensor is out of memory; None when no handle
        of this store holds ``tensor``."""
        with self._locked():
            handle = self._held.get(id(tensor))
            entry = self._entries.get(handle) if handle is not None else None
            if entry is None or entry.tensor is not tensor:
                mapped = any(e.mapped is tensor for e in (self._entries[h] for h in self._mapped))
                return False if mapped else None
            if handle not in self._memory:
                return False
            quota = self.tenant_budget_bytes
            total = entry.nbytes + nbytes
            if total > self.budget_bytes or (quota and total > quota):
                return False
            why = f"what an op keeps with handle {handle!r} (a multigrid hierarchy, a factorization)"
            if quota:
                own = (h for h in list(self._memory) if h != handle and self._entries[h].tenant == entry.tenant)
                while self._tenant_bytes.get(entry.tenant, 0) + nbytes > quota:
                    self._evict(next(own), f"its tenant's budget (--tenant-store-bytes {quota} bytes), for {why}")
            others = (h for h in list(self._memory) if h != handle)
            while self._bytes + nbytes > self.budget_bytes:
                self._evict(next(others), f"{self._limit} of {self.budget_bytes} bytes, for {why}")
            entry.nbytes += nbytes
            self._bytes += nbytes
            self._tenant_bytes[entry.tenant] = self._tenant_bytes.get(entry.tenant, 0) + nbytes
            return True

    def delete(self, handle: str, tenant: str = "") -> None:
        with self._locked():
            self._expire()
            self._owned(handle, tenant)
            self._drop(handle)

    def stats(self) -> tuple[int, int]:
        """(handles, bytes) held in memory now."""
        with self._locked():
            self._expire()
            return len(self._memory), self._bytes

    def spill_stats(self) -> tuple[int, int]:
        """(handles, bytes) of the files in the disk tier now (being written included)."""
        with self._locked():
            self._expire()
            return len(self._files), self._file_bytes

    def flush(self) -> Future:
        """Done once every eviction queued so far is on disk (the writer takes them in order)."""
        return self._spill_writer().submit(lambda: None)

    def close(self) -> None:
        """Stop the writer; without --durable the disk tier's files go (their handles die with
        the process), with it they stay for the next start."""
        if self._writer is not None:
            self._writer.shutdown(wait=True, cancel_futures=True)
        if self.spill is not None:
            if not self.spill.durable:
                with self._locked():
                    handles = list(self._files)
                for handle in handles:
                    self.spill.remove(handle)
            self.spill.close()

    # ----------------------------------------------------------------- private
    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The lock; what the section queued in ``_later`` runs once it is let go."""
        self._lock.acquire()
        try:
            yield
        finally:
            later, self._later = self._later, []
            self._lock.release()
            for action in later:
                action()

    def _owned(self, handle: str, tenant: str) -> _Entry:
        entry = self._entries.get(handle)
        if entry is None:
            owner, reason, why = self._gone.get(handle, ("", "", ""))
            if reason and owner == tenant:  # another tenant learns nothing of it
                if reason == "evicted":
                    raise NotFoundError(f"handle {handle!r} was evicted: {why}", reason=Reason.EVICTED)
                if reason == "expired":
                    raise NotFoundError(f"handle {handle!r} expired: {why}", reason=Reason.EXPIRED)
                raise NotFoundError(f"handle {handle!r} is gone: {why}", reason=Reason.DAMAGED)
            raise NotFoundError(f"no tensor with handle {handle!r}: never made, deleted, expired "
                                "or evicted", reason=Reason.UNKNOWN_HANDLE)
        if entry.tenant != tenant:
            raise PermissionDeniedError(f"handle {handle!r} belongs to another tenant",
                                        reason=Reason.OTHER_TENANT)
        return entry

    def _touch(self, handle: str, entry: _Entry) -> None:
        """A use: last in every use order it is in, and its time to live renewed."""
        self._entries.move_to_end(handle)
        for order in (self._memory, self._files, self._mapped):
            if handle in order:
                order.move_to_end(handle)
        entry.expires = self._clock() + self.ttl_seconds

    def _leave_memory(self, handle: str, entry: _Entry) -> None:
        del self._memory[handle]
        if self._held.get(id(entry.tensor)) == handle:
            del self._held[id(entry.tensor)]
        self._bytes -= entry.nbytes
        left = self._tenant_bytes[entry.tenant] - entry.nbytes
        if left:
            self._tenant_bytes[entry.tenant] = left
        else:
            del self._tenant_bytes[entry.tenant]

    def _evict(self, handle: str, budget: str) -> None:
        """Out of memory for room under ``budget``: to the disk tier when there is one its file
        fits, else gone for good."""
        self.evictions += 1
        entry = self._entries[handle]
        if entry.file_bytes:  # durable: on disk already
            self._leave_memory(handle, entry)
            entry.tensor = None
            self._spilled(handle, entry)
            return
        if self.spill is None:
            hint = " (a server started with --spill-dir keeps evicted tensors on disk)" if self._limit is STORE_LIMIT \
                else ""
            self._drop(handle, "evicted", f"{budget} needed room and it was the least recently used. Put it again"
                                          + hint)
            return
        size = file_bytes(handle, entry.tenant, entry.tensor)
        if size > self.spill.budget_bytes:
            self._drop(handle, "evicted", f"{budget} needed room, and its file ({size} bytes) is bigger than the "
                                          f"disk tier (--spill-bytes {self.spill.budget_bytes} bytes). Put it again")
            return
        self._leave_memory(handle, entry)
        self._make_disk_room(size)
        entry.spilling = True
        entry.file_bytes = size
        self._files[handle] = None
        self._file_bytes += size
        self.pending += 1
        self._spill_writer().submit(self._write_spill, handle, entry)

    def _spill_writer(self) -> ThreadPoolExecutor:
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparseserve-spill")
        return self._writer

    def _write_spill(self, handle: str, entry: _Entry) -> None:
        """In the writer thread: ``entry``'s file written, then the entry on disk only (or, when
        it left meanwhile, the file removed again)."""
        assert self.spill is not None
        try:
            self.spill.write(handle, entry.tenant, entry.tensor)
            error = None
        except Exception as exc:  # a full or failing disk: the tensor cannot be kept
            error = exc
        with self._locked():
            self.pending -= 1
            current = self._entries.get(handle) is entry
            entry.spilling = False
            if error is None and current:
                entry.tensor = None
                self._spilled(handle, entry)
            elif error is None:
                self._later.append(partial(self.spill.remove, handle))
            elif current:
                why = error.message if isinstance(error, SparseServeError) else f"{type(error).__name__}: {error}"
                self._drop(handle, "evicted", f"it was evicted from memory and could not be kept on disk ({why}). "
                                              "Put it again")

    def _spilled(self, handle: str, entry: _Entry) -> None:
        self.spilled += 1
        self._later.append(partial(log.info, "handle spilled", extra={"fields": {
            "handle": handle, "tenant": entry.tenant, "bytes": entry.nbytes, "file_bytes": entry.file_bytes}}))

    def _make_disk_room(self, need: int) -> None:
        """Room for a file of ``need`` bytes in the disk tier: its least recently used go for good."""
        assert self.spill is not None
        budget = self.spill.budget_bytes
        while self._files and self._file_bytes + need > budget:
            self._drop(next(iter(self._files)), "evicted", f"the disk tier's budget (--spill-bytes {budget} bytes) "
                                                           "needed room and it was the least recently used there. "
                                                           "Put it again")

    def _drop(self, handle: str, reason: str | None = None, why: str = "") -> None:
        """The handle gone: deleted by its owner (no ``reason``), or let go for ``reason``
        (remembered, counted and logged)."""
        entry = self._entries.pop(handle)
        if handle in self._memory:
            self._leave_memory(handle, entry)
        if handle in self._files:
            del self._files[handle]
            self._file_bytes -= entry.file_bytes
        self._mapped.pop(handle, None)
        if entry.file_bytes and not entry.spilling and self.spill is not None:  # the writer removes its own
            self._later.append(partial(self.spill.remove, handle))
        if self._on_drop is not None:
            self._on_drop(handle)
        if reason is None:
            return
        self._gone[handle] = (entry.tenant, reason, why)
        if len(self._gone) > GONE_MAX:
            self._gone.popitem(last=False)
        self.dropped[reason] += 1
        level = logging.INFO if reason == "expired" else logging.ERROR if reason == "damaged" else logging.WARNING
        self._later.append(partial(log.log, level, f"handle {reason}", extra={"fields": {
            "handle": handle, "tenant": entry.tenant, "bytes": entry.nbytes, "why": why}}))

    def _expire(self) -> None:
        now = self._clock()
        # Entries are in last-use order and each use renews the TTL, so expired ones lead.
        while self._entries:
            handle, entry = next(iter(self._entries.items()))
            if entry.expires > now:
                break
            self._drop(handle, "expired", f"unused for longer than its time to live (--store-ttl "
                                          f"{self.ttl_seconds:g} s). Put it again")
