"""A pool of the big buffers that uploads are received into, kept for the next upload instead
of handed back to the kernel.

A fresh buffer costs the kernel a zeroed page for every page the upload writes: half the
server's samples in ``perf`` during 1 GB puts here, and on a virtual machine that hands idle memory back to
its host (virtio-balloon free page reporting), several times the whole transfer when the pages
must first be fetched back. Servers that move big tensors keep such memory (PyTorch's caching
allocator, Triton's memory pools); so does this one, for the three places a request is received
into one buffer: an ``Upload`` stream, an ``ExecuteStream`` request and a REST body.

``take(n)`` returns an ``n``-byte uint8 array; its memory goes back to the pool when the last
view of it is gone, whoever holds it (the handle store, a ``Download`` streaming it, an op's
output that is a view of an input), so a block is never handed out twice while anything can
still read it. A block is pooled again only while the free blocks stay within the pool's budget,
and a block left unused for ``idle_seconds`` is let go, so a quiet server gives its memory back.
Nothing is promised about a taken buffer's contents; every caller overwrites what it exposes.

A request that stops arriving would hold its buffer as long as its connection stays open: each
of those three reads its parts through ``arriving``, which fails the call when a part takes
longer than ``--body-timeout`` (and the buffer goes back as the call unwinds).
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from typing import AsyncIterable, AsyncIterator, TypeVar

import numpy as np

from sparseserve.core.codec import new_buffer
from sparseserve.core.errors import DeadlineExceededError
from sparseserve.core.reasons import Reason

__all__ = ["BufferPool", "arriving"]

T = TypeVar("T")

MIN_POOLED_BYTES = 4 << 20  # smaller ones come from malloc's own free lists, already reused
IDLE_SECONDS = 30.0
_SLACK = 8  # a free block serves a request of at least 1/(1 + 1/_SLACK) of its size


class _Lease:
    """A taken block, seen by numpy through ``__array_interface__``: the array made from it has
    it as its base, and numpy's base collapsing stops at an object that is not an array, so
    every view of that array, and every memoryview of those, keeps the lease alive. When the
    lease goes, nothing can read the block."""

    def __init__(self, block: np.ndarray, nbytes: int):
        self.block = block  # the interface is only an address: this keeps the memory
        self.__array_interface__ = dict(block.__array_interface__, shape=(nbytes,))


class BufferPool:
    def __init__(self, budget_bytes: int, *, idle_seconds: float = IDLE_SECONDS,
                 min_bytes: int = MIN_POOLED_BYTES, clock=time.monotonic):
        self.budget_bytes = budget_bytes
        self.idle_seconds = idle_seconds
        self.min_bytes = min_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._free: list[tuple[float, np.ndarray]] = []  # (when it came back, block), oldest first
        self.free_bytes = 0
        self.reused = 0     # takes served by a pooled block
        self.allocated = 0  # takes that needed a fresh one

    def take(self, nbytes: int) -> np.ndarray:
        """An ``nbytes``-long uint8 buffer: a free block at least as big and at most 1/8 bigger,
        else a fresh one, which comes back to the pool once nothing views it."""
        if nbytes < self.min_bytes or self.budget_bytes <= 0:
            return new_buffer(nbytes)
        block = self._reuse(nbytes)
        if block is None:
            block = new_buffer(nbytes)
        lease = _Lease(block, nbytes)
        finalizer = weakref.finalize(lease, self._give_back, block)
        finalizer.atexit = False  # at exit the memory goes anyway
        return np.asarray(lease)

    def _reuse(self, nbytes: int) -> np.ndarray | None:
        with self._lock:
            self._let_idle_go()
            fits = [i for i, (_, b) in enumerate(self._free) if nbytes <= b.size <= nbytes + nbytes // _SLACK]
            if not fits:
                self.allocated += 1
                return None
            best = min(fits, key=lambda i: self._free[i][1].size)
            _, block = self._free.pop(best)
            self.free_bytes -= block.size
            self.reused += 1
            return block

    def _give_back(self, block: np.ndarray) -> None:
        # Runs on whichever thread dropped the last view.
        with self._lock:
            self._let_idle_go()
            if block.size > self.budget_bytes:
                return
            while self.free_bytes + block.size > self.budget_bytes:  # the oldest make room
                _, old = self._free.pop(0)
                self.free_bytes -= old.size
            self._free.append((self._clock(), block))
            self.free_bytes += block.size

    def trim(self) -> None:
        """Let go of the blocks unused for ``idle_seconds`` (taking and giving back do it too)."""
        with self._lock:
            self._let_idle_go()

    def _let_idle_go(self) -> None:
        cutoff = self._clock() - self.idle_seconds
        while self._free and self._free[0][0] <= cutoff:
            _, old = self._free.pop(0)
            self.free_bytes -= old.size


async def arriving(parts: AsyncIterable[T], seconds: float, what: str) -> AsyncIterator[T]:
    """``parts`` (a request's body or stream) as they come, each within ``seconds`` of the one
    before (``--body-timeout``): a client that stops sending, alive or not, gets
    DEADLINE_EXCEEDED with reason BODY_TIMEOUT rather than holding what its request took."""
    iterator = aiter(parts)
    while True:
        try:
            async with asyncio.timeout(seconds):
                part = await anext(iterator)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise DeadlineExceededError(f"no bytes of {what} arrived for {seconds:g} s (--body-timeout); the "
                                        "call was dropped", reason=Reason.BODY_TIMEOUT) from None
        yield part
