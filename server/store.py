"""The handle store: tensors kept on the server between calls.

A byte budget with least-recently-used eviction and a time-to-live. Handle ids
are 128 random bits, so they cannot be guessed; each entry remembers the
tenant that made it and only that tenant can read or delete it. With a
per-tenant budget, a tenant over it makes room from its own handles first, so
one tenant's uploads cannot push out another's.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from sparseserve.core.errors import NotFoundError, PermissionDeniedError, ResourceExhaustedError

from .sizes import tensor_nbytes

__all__ = ["HandleStore", "new_handle"]


def new_handle() -> str:
    """A fresh handle id: 128 random bits, so that handles cannot be guessed."""
    return "h-" + secrets.token_hex(16)


@dataclass
class _Entry:
    tensor: Any
    nbytes: int
    tenant: str
    expires: float


# How a tensor bigger than the whole store is refused, here and by the uploads that check first.
STORE_LIMIT, STORE_REASON = "the whole store budget (--store-bytes)", "STORE_BUDGET"


class HandleStore:
    def __init__(self, budget_bytes: int, ttl_seconds: float,
                 clock: Callable[[], float] = time.monotonic, tenant_budget_bytes: int = 0,
                 on_drop: Callable[[str], None] | None = None, limit: str = STORE_LIMIT):
        self.budget_bytes = int(budget_bytes)
        self.tenant_budget_bytes = int(tenant_budget_bytes)  # 0: tenants share the whole budget
        self._tenant_bytes: dict[str, int] = {}
        self.ttl_seconds = float(ttl_seconds)
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # oldest use first
        self._bytes = 0
        self._lock = threading.Lock()
        self.evictions = 0
        # Told each handle that leaves (deleted, evicted, expired), under the lock: it must not block.
        self._on_drop = on_drop
        self._limit = limit  # how a tensor bigger than the budget is told which budget

    # ------------------------------------------------------------------ public
    def put(self, tensor: Any, tenant: str = "", handle: str | None = None) -> tuple[str, int]:
        nbytes = tensor_nbytes(tensor)
        if nbytes > self.budget_bytes:
            raise ResourceExhaustedError(
                f"the tensor takes {nbytes} bytes, over {self._limit} of {self.budget_bytes} bytes",
                reason=STORE_REASON)
        quota = self.tenant_budget_bytes
        if quota and nbytes > quota:
            err = ResourceExhaustedError(f"the tensor takes {nbytes} bytes, over the budget of one tenant, "
                                         f"{quota} bytes (--tenant-store-bytes)", reason="TENANT_QUOTA")
            err.http_status = 429  # a quota, not a size limit (SPEC section 6)
            raise err
        handle = handle or new_handle()
        with self._lock:
            self._expire()
            if quota:
                own = (h for h, e in list(self._entries.items()) if e.tenant == tenant)
                while self._tenant_bytes.get(tenant, 0) + nbytes > quota:
                    self._drop(next(own))
                    self.evictions += 1
            while self._bytes + nbytes > self.budget_bytes and self._entries:
                self._drop(next(iter(self._entries)))
                self.evictions += 1
            self._entries[handle] = _Entry(tensor, nbytes, tenant, self._clock() + self.ttl_seconds)
            self._bytes += nbytes
            self._tenant_bytes[tenant] = self._tenant_bytes.get(tenant, 0) + nbytes
        return handle, nbytes

    def get(self, handle: str, tenant: str = "") -> Any:
        with self._lock:
            self._expire()
            entry = self._owned(handle, tenant)
            self._entries.move_to_end(handle)
            entry.expires = self._clock() + self.ttl_seconds
            return entry.tensor

    def delete(self, handle: str, tenant: str = "") -> None:
        with self._lock:
            self._expire()
            self._owned(handle, tenant)
            self._drop(handle)

    def stats(self) -> tuple[int, int]:
        """(handles, bytes) held now."""
        with self._lock:
            self._expire()
            return len(self._entries), self._bytes

    # ----------------------------------------------------------------- private
    def _owned(self, handle: str, tenant: str) -> _Entry:
        entry = self._entries.get(handle)
        if entry is None:
            raise NotFoundError(f"no tensor with handle {handle!r}: never made, deleted, expired "
                                "or evicted", reason="UNKNOWN_HANDLE")
        if entry.tenant != tenant:
            raise PermissionDeniedError(f"handle {handle!r} belongs to another tenant",
                                        reason="OTHER_TENANT")
        return entry

    def _drop(self, handle: str) -> None:
        entry = self._entries.pop(handle)
        self._bytes -= entry.nbytes
        left = self._tenant_bytes[entry.tenant] - entry.nbytes
        if left:
            self._tenant_bytes[entry.tenant] = left
        else:
            del self._tenant_bytes[entry.tenant]
        if self._on_drop is not None:
            self._on_drop(handle)

    def _expire(self) -> None:
        now = self._clock()
        # Entries are in last-use order and each use renews the TTL, so expired ones lead.
        while self._entries:
            handle, entry = next(iter(self._entries.items()))
            if entry.expires > now:
                break
            self._drop(handle)
