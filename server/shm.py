"""Same-host transfers through POSIX shared memory: the server's side of ``RegisterSegment``,
``PutShared`` and ``GetShared`` (segment layout and naming: ``sparseserve.core.shm``). Only a
server started with ``--allow-shared-memory`` serves them (``Service.shared`` refuses them
otherwise, UNIMPLEMENTED with reason ``SHARED_MEMORY_OFF``).

Who may hand a segment over
---------------------------
A segment used to be accepted by its name alone. Tenant B's client made and wrote
``sparseserve-<32 hex>``; tenant A on the same host listed /dev/shm (anyone may), handed that
name to ``PutShared`` with its own token, and the server, which could open B's segment, stored
B's tensor as A's and unlinked it, so that B's own transfer failed: a confused deputy.

A name must be bound to the one tenant that may hand it over. grpcio cannot tell the server
who its peer is: over a ``unix:`` listener ``context.peer()`` is just ``"unix:"``, and
``auth_context()`` holds only the transport's security type (``local`` credentials
included); SO_PEERCRED is not exposed. A Unix user is not a tenant either: tenants are bearer
tokens, and several may run under one user. So the binding goes through the token:

1. ``RegisterSegment(nbytes)``, authenticated as every call is: the server draws a fresh name
   (128 random bits), creates the segment itself, ``nbytes`` long, with O_CREAT|O_EXCL and mode
   0600, records the caller's tenant, the time and the object's identity (st_dev, st_ino), and
   returns the name to that caller alone.
2. The client opens that existing segment read-write (it never creates one), writes the
   tensor, and calls ``PutShared(name, header)``.
3. The server takes the registration out, only for the same tenant and within ``--shm-ttl``,
   once; checks that the object under the name is still the one it made; copies the tensor
   out; and unlinks the segment whatever happened.
4. A registration not handed over within the TTL is unlinked by the server (by a background
   thread): a client that dies between 1 and 3 leaks nothing.

The races, and how each is closed:

- *Seeing the name.* Once the segment exists, every local user can read its name in
  /dev/shm. PutShared of it with another token is refused (PERMISSION_DENIED,
  ``SEGMENT_NOT_REGISTERED``) and leaves the owner's registration in place, so B's transfer
  still succeeds. The refusal is the same for a name never registered, registered to another
  tenant, handed over already or expired, so it tells A nothing about B.
- *Pre-creating a name.* Nobody knows a name before RegisterSegment returns it, and the server
  creates with O_EXCL: a segment someone made first under a guessed name makes the create fail,
  and the server draws another name. It never adopts an object it did not make, and the client
  opens the name without O_CREAT, so it cannot be led to make one either.
- *Replacing the object.* Whoever may unlink the segment (only its owner's user: /dev/shm is
  sticky) and put another object under the name is caught by the identity check at PutShared.
- *An exported name.* The segments written for GetShared are recorded apart and never
  registered (their names are drawn fresh, with O_EXCL, too), so PutShared of one is refused as
  any unregistered name is, whoever sends it.
- *Two PutShared of one name.* The registration is taken out under a lock: one call has it,
  the other is refused.
- *The TTL against a slow client.* PutShared and the reaper take registrations out under the
  same lock: a segment is either handed over or reaped, never both. Since the server made the
  segment at registration, the name it unlinks at the TTL names that object; had the client
  created it, a client stalled past the TTL could create it after its reap and die, and that
  segment would stay until reboot.
- *A failed or cancelled put.* The SDK unlinks the segment itself once its PutShared fails or
  is cancelled; what it never learnt of (a RegisterSegment reply lost on its way, a client
  killed) the TTL removes.

What it does not do: segments are mode 0600, owned by the server's user, so shared memory
needs its clients under that user (or root), and processes under one user can open each other's
segments in /dev/shm directly, without the server. Within one user the server only guarantees
that it never acts for one tenant on another's segment; tenants that must not see each other's
bytes in flight need users of their own and the streamed transfers, and shared memory is off
unless the server is started with ``--allow-shared-memory``. Writing segments fills memory,
which a local process can do without the server; the server bounds its own bookkeeping
(``MAX_LEASES`` registrations per tenant, a few hundred bytes each).

Exported segments and hostile bytes
-----------------------------------
Segments written for ``GetShared`` are created the same way (fresh name, O_EXCL, 0600) and
named only in the reply to the caller; the client unlinks one once copied, and those no client
claims within the TTL are unlinked here, at each export and by the background thread, and all
that remain at ``close``.

The bytes a client wrote are untrusted: the header is checked by ``_codec`` and against the
store budget before the segment is opened, and the bytes are read with ``preadv`` into the
server's own buffers rather than through a mapping (a client shrinking its segment mid-copy
makes a short read, not a SIGBUS, and changing it mid-copy changes only the copy, which is
validated after).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from sparseserve.core.codec import tensor_to_pb
from sparseserve.core.errors import (InternalError, InvalidArgumentError, PermissionDeniedError,
                                     ResourceExhaustedError, UnavailableError)
from sparseserve.core.shm import (SEGMENT_NAME, create_segment, header_slots, new_segment_name, open_segment,
                                  read_tensor, segment_bytes, tensor_arrays, unlink_segment, write_tensor)
from sparseserve.core.reasons import Reason
from sparseserve.v1 import sparseserve_pb2 as pb

from .store import STORE_LIMIT, STORE_REASON

__all__ = ["SharedSegments", "MAX_LEASES"]

log = logging.getLogger("sparseserve.shm")

# Registrations one tenant may hold at once (each is a segment until handed over or reaped).
MAX_LEASES = 1024


@dataclass(frozen=True)
class _Lease:
    """A segment RegisterSegment made: whose it is, when, and which object (st_dev, st_ino)."""

    tenant: str
    made: float
    identity: tuple[int, int]


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


class SharedSegments:
    """The segments of same-host transfers: registered ones waiting for PutShared, exported
    ones waiting for their client, and the TTL of both."""

    def __init__(self, ttl_seconds: float, clock: Callable[[], float] = time.monotonic,
                 max_leases: int = MAX_LEASES):
        self.ttl_seconds = float(ttl_seconds)
        self.max_leases = max_leases
        self._clock = clock
        self._exported: dict[str, float] = {}  # segments written for GetShared -> when
        self._leases: dict[str, _Lease] = {}  # segments made by RegisterSegment
        self._held: Counter[str] = Counter()  # tenant -> its registrations
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        self._closed = False
        self.reaped = 0

    # ------------------------------------------------------- RegisterSegment
    def register(self, tenant: str, nbytes: int, max_bytes: int | None = None) -> pb.RegisterSegmentResponse:
        """A new empty segment of ``nbytes`` for ``tenant`` to write and hand over with PutShared."""
        if nbytes < 0:
            raise InvalidArgumentError(f"nbytes = {nbytes}: a segment's size cannot be negative",
                                       reason=Reason.BAD_SEGMENT_SIZE)
        if max_bytes is not None and nbytes > max_bytes:
            raise ResourceExhaustedError(f"a {nbytes}-byte segment would hold a tensor over {STORE_LIMIT} of "
                                         f"{max_bytes} bytes", reason=STORE_REASON)
        self._check_open()
        name, fd = self._create(nbytes)
        try:
            identity = _identity(fd)
        finally:
            os.close(fd)
        refusal: Exception | None = None
        with self._lock:
            if self._closed:
                refusal = UnavailableError("the server is shutting down", reason=Reason.SHUTTING_DOWN)
            elif self._held[tenant] >= self.max_leases:
                refusal = ResourceExhaustedError(
                    f"this tenant holds {self._held[tenant]} registered segments, the most it may (each is "
                    f"handed over with PutShared or unlinked after --shm-ttl {self.ttl_seconds:g} s)",
                    reason=Reason.TOO_MANY_SEGMENTS)
            else:
                self._leases[name] = _Lease(tenant, self._clock(), identity)
                self._held[tenant] += 1
        if refusal is not None:
            unlink_segment(name)
            raise refusal
        self._start_reaper()
        return pb.RegisterSegmentResponse(segment=name, ttl_seconds=self.ttl_seconds)

    # ------------------------------------------------------------- PutShared
    def read(self, request: pb.SharedTensor, tenant: str, max_bytes: int | None = None) -> Any:
        """The tensor in a segment RegisterSegment made for ``tenant``, copied out; the segment is
        then unlinked."""
        name = request.segment
        if not SEGMENT_NAME.match(name):
            raise InvalidArgumentError(
                f"segment = {name[:80]!r} is not a sparseserve segment name ('sparseserve-' and 32 "
                "lowercase hex digits, as RegisterSegment makes them)", reason=Reason.BAD_SEGMENT_NAME)
        lease = self._claim(name, tenant)
        try:
            slots = header_slots(request.header, "tensor")
            total = sum(slot.nbytes for slot in slots)
            if max_bytes is not None and total > max_bytes:
                raise ResourceExhaustedError(f"tensor would take {total} bytes, over {STORE_LIMIT} of "
                                             f"{max_bytes} bytes", reason=STORE_REASON)
            fd = open_segment(name, "something unlinked it after RegisterSegment made it")
            try:
                if _identity(fd) != lease.identity:
                    raise InvalidArgumentError(f"segment {name} is not the object RegisterSegment made: "
                                               "another was put under its name", reason=Reason.BAD_SEGMENT)
                return read_tensor(fd, request.header, name, slots)
            finally:
                os.close(fd)
        finally:
            # Handed over: the server made it, and removes it whatever happened.
            unlink_segment(name)

    def _claim(self, name: str, tenant: str) -> _Lease:
        """Take out ``tenant``'s registration of ``name``, once; anything else is one refusal."""
        now = self._clock()
        with self._lock:
            lease = self._leases.get(name)
            mine = lease is not None and lease.tenant == tenant
            if mine:
                self._drop_lease(name)
        if lease is not None and mine:
            if now - lease.made < self.ttl_seconds:
                return lease
            unlink_segment(name)  # expired, not reaped yet: it goes now
        elif lease is not None:
            log.warning("PutShared refused: tenant %r named a segment registered to another tenant", tenant)
        raise PermissionDeniedError(
            f"segment {name} is not one RegisterSegment made for this tenant, or it was handed over "
            f"already, or its --shm-ttl of {self.ttl_seconds:g} s ran out: PutShared takes a segment from "
            "RegisterSegment, once, with the token that registered it", reason=Reason.SEGMENT_NOT_REGISTERED)

    # ------------------------------------------------------------- GetShared
    def export(self, tensor: Any) -> pb.SharedTensor:
        """A new segment holding ``tensor``, for the client to copy and unlink."""
        self._check_open()
        self.reap()
        header = tensor_to_pb(tensor, with_data=False)
        slots = header_slots(header)
        name, fd = self._create(segment_bytes(slots))
        try:
            with self._lock:  # counted from before it is written, so none escapes ``close``
                closed = self._closed
                if not closed:
                    self._exported[name] = self._clock()
            if closed:
                unlink_segment(name)
                raise UnavailableError("the server is shutting down", reason=Reason.SHUTTING_DOWN)
            try:
                write_tensor(fd, slots, tensor_arrays(tensor))
            except BaseException:
                self._forget(name)
                unlink_segment(name)
                raise
        finally:
            os.close(fd)
        self._start_reaper()
        return pb.SharedTensor(segment=name, header=header)

    def pending(self) -> list[str]:
        """Names of the segments written for clients and not yet reaped (claimed ones included:
        the server cannot see a client's unlink)."""
        with self._lock:
            return list(self._exported)

    # ------------------------------------------------------------- the TTL
    def reap(self) -> int:
        """Unlink the segments older than the TTL; returns how many were still there."""
        now = self._clock()
        with self._lock:
            exported = [name for name, made in self._exported.items() if now - made >= self.ttl_seconds]
            for name in exported:
                del self._exported[name]
            leased = [name for name, lease in self._leases.items() if now - lease.made >= self.ttl_seconds]
            for name in leased:
                self._drop_lease(name)
        unclaimed = [name for name in exported if unlink_segment(name)]
        unused = [name for name in leased if unlink_segment(name)]
        for name in unclaimed:
            log.warning("unlinked shared-memory segment %s: not claimed within %g s", name, self.ttl_seconds)
        for name in unused:
            log.warning("unlinked registered shared-memory segment %s: not handed over within %g s", name,
                        self.ttl_seconds)
        with self._lock:
            self.reaped += len(unclaimed) + len(unused)
        return len(unclaimed) + len(unused)

    def close(self) -> None:
        """Stop the reaper and unlink every segment still pending or registered."""
        self._stop.set()
        with self._lock:
            self._closed = True
            names = [*self._exported, *self._leases]
            self._exported, self._leases, self._held = {}, {}, Counter()
        for name in names:
            unlink_segment(name)

    # ------------------------------------------------------------- internals
    def _check_open(self) -> None:
        if self._closed:
            raise UnavailableError("the server is shutting down", reason=Reason.SHUTTING_DOWN)

    def _create(self, size: int) -> tuple[str, int]:
        """A new segment under a fresh name, and its descriptor; a name that exists already (made
        by someone else) is left alone and another drawn."""
        for _ in range(8):
            name = new_segment_name()
            try:
                return name, create_segment(name, size)
            except FileExistsError:
                log.warning("a fresh shared-memory segment name existed already: %s; drawing another", name)
            except OSError as exc:
                raise ResourceExhaustedError(f"cannot make a {size}-byte shared-memory segment: "
                                             f"{exc.strerror}", reason=Reason.SHARED_MEMORY_FULL) from None
        raise InternalError("eight fresh 128-bit segment names all existed already")

    def _drop_lease(self, name: str) -> None:
        """Forget a registration (the lock held)."""
        tenant = self._leases.pop(name).tenant
        self._held[tenant] -= 1
        if not self._held[tenant]:
            del self._held[tenant]

    def _forget(self, name: str) -> None:
        with self._lock:
            self._exported.pop(name, None)

    def _start_reaper(self) -> None:
        """A daemon thread reaping even when no further call comes (started on first use)."""
        with self._lock:
            if self._reaper is not None or self._closed:
                return
            self._reaper = threading.Thread(target=self._reap_loop, name="sparseserve-shm-reaper",
                                            daemon=True)
        self._reaper.start()

    def _reap_loop(self) -> None:
        interval = min(max(self.ttl_seconds / 4, 0.05), 5.0)
        while not self._stop.wait(interval):
            try:
                self.reap()
            except Exception:  # keep reaping; a failure here must not end the thread
                log.exception("reaping shared-memory segments failed")
