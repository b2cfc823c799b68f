"""Same-host transfers through POSIX shared memory: the server's side of ``PutShared`` and
``GetShared`` (segment layout and naming: ``sparseserve.core.shm``).

The segment a client hands over is untrusted: its name must be one the SDK makes, the
header is checked by ``_codec`` and against the store budget before the segment is
opened, and the bytes are read with ``preadv`` rather than through a mapping (a client
shrinking its segment mid-copy makes a short read, not a SIGBUS: see ``_shm``).

Segments written for ``GetShared`` are unlinked by the client once copied; the ones no
client claims within the TTL (the client died) are unlinked here, at each export and by
a background thread, and all that remain at ``close``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable

from sparseserve.core.codec import tensor_to_pb
from sparseserve.core.shm import (SEGMENT_NAME, close_segment, create_segment, header_slots, open_segment,
                              read_tensor, segment_bytes, tensor_arrays, unlink_segment, write_tensor)
from sparseserve.core.errors import InvalidArgumentError, ResourceExhaustedError, UnavailableError
from sparseserve.v1 import sparseserve_pb2 as pb

from .store import STORE_LIMIT, STORE_REASON

__all__ = ["SharedSegments"]

log = logging.getLogger("sparseserve.shm")


class SharedSegments:
    """The segments of same-host transfers, with the TTL of the unclaimed ones."""

    def __init__(self, ttl_seconds: float, clock: Callable[[], float] = time.monotonic):
        self.ttl_seconds = float(ttl_seconds)
        self._clock = clock
        self._pending: dict[str, float] = {}  # segments written for GetShared -> when
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        self._closed = False
        self.reaped = 0

    # ------------------------------------------------------------- PutShared
    def read(self, request: pb.SharedTensor, max_bytes: int | None = None) -> Any:
        """The tensor in the client's segment, copied out; the segment is then unlinked."""
        name = request.segment
        if not SEGMENT_NAME.match(name):
            raise InvalidArgumentError(
                f"segment = {name[:80]!r} is not a sparseserve segment name ('sparseserve-' and 32 "
                "lowercase hex digits, as the SDK makes them)", reason="BAD_SEGMENT_NAME")
        slots = header_slots(request.header, "tensor")
        total = sum(slot.nbytes for slot in slots)
        if max_bytes is not None and total > max_bytes:
            raise ResourceExhaustedError(f"tensor would take {total} bytes, over {STORE_LIMIT} of "
                                         f"{max_bytes} bytes", reason=STORE_REASON)
        fd = open_segment(name, "shared memory needs the client on the server's host")
        try:
            return read_tensor(fd, request.header, name, slots)
        finally:
            os.close(fd)
            # Handed over: the client's copy of the name is no longer needed, whatever happened.
            unlink_segment(name)

    # ------------------------------------------------------------- GetShared
    def export(self, tensor: Any) -> pb.SharedTensor:
        """A new segment holding ``tensor``, for the client to copy and unlink."""
        if self._closed:
            raise UnavailableError("the server is shutting down", reason="SHUTTING_DOWN")
        self.reap()
        header = tensor_to_pb(tensor, with_data=False)
        slots = header_slots(header)
        shm = self._new_segment(segment_bytes(slots))
        try:
            write_tensor(shm, slots, tensor_arrays(tensor))
        except BaseException:
            self._forget(shm.name)
            unlink_segment(shm.name)
            raise
        finally:
            close_segment(shm)
        self._start_reaper()
        return pb.SharedTensor(segment=shm.name, header=header)

    def pending(self) -> list[str]:
        """Names of the segments written for clients and not yet reaped (claimed ones included:
        the server cannot see a client's unlink)."""
        with self._lock:
            return list(self._pending)

    def reap(self) -> int:
        """Unlink the segments older than the TTL; returns how many were still there."""
        now = self._clock()
        with self._lock:
            expired = [name for name, made in self._pending.items() if now - made >= self.ttl_seconds]
            for name in expired:
                del self._pending[name]
        unclaimed = [name for name in expired if unlink_segment(name)]
        for name in unclaimed:
            log.warning("unlinked shared-memory segment %s: not claimed within %g s", name, self.ttl_seconds)
        with self._lock:
            self.reaped += len(unclaimed)
        return len(unclaimed)

    def close(self) -> None:
        """Stop the reaper and unlink every segment still pending."""
        self._stop.set()
        with self._lock:
            self._closed = True
            names, self._pending = list(self._pending), {}
        for name in names:
            unlink_segment(name)

    # ------------------------------------------------------------- internals
    def _new_segment(self, size: int):
        """A segment counted as pending from before it is written, so none escapes ``close``."""
        try:
            shm = create_segment(size)
        except OSError as exc:
            raise ResourceExhaustedError(f"cannot make a {size}-byte shared-memory segment: "
                                         f"{exc.strerror}", reason="SHARED_MEMORY_FULL") from None
        with self._lock:
            closed = self._closed
            if not closed:
                self._pending[shm.name] = self._clock()
        if closed:
            close_segment(shm)
            unlink_segment(shm.name)
            raise UnavailableError("the server is shutting down", reason="SHUTTING_DOWN")
        return shm

    def _forget(self, name: str) -> None:
        with self._lock:
            self._pending.pop(name, None)

    def _start_reaper(self) -> None:
        """A daemon thread reaping even when no further call comes (started on first export)."""
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

