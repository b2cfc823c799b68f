"""``put/get(shared_memory=True)``: the SDK's side of same-host transfers through POSIX shared
memory: writing a segment for the server to take, and claiming one it wrote. The gRPC
transports (``_transport_grpc``) make the calls; the segment layout both sides share is
``sparseserve.core.shm``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from multiprocessing import shared_memory
from typing import AsyncIterator, Iterator

import numpy as np

from .core.codec import tensor_to_pb
from .core.errors import InvalidArgumentError
from .core.shm import (SEGMENT_NAME, close_segment, create_segment, header_slots, open_segment, read_tensor,
                       segment_bytes, tensor_arrays, unlink_segment, write_tensor)
from .core.tensor import SparseTensor
from .v1 import sparseserve_pb2 as pb

__all__ = ["segment_of", "segment_of_async", "claim"]


@contextlib.contextmanager
def segment_of(tensor: SparseTensor | np.ndarray) -> Iterator[pb.SharedTensor]:
    """A new segment holding ``tensor``, as the PutShared request that names it; unlinked on
    leaving (the server unlinks a segment once copied: this covers a call that failed first)."""
    shm, request = _written_segment(tensor)
    try:
        yield request
    finally:
        _drop_segment(shm)


def claim(reply: pb.SharedTensor) -> SparseTensor | np.ndarray:
    """The tensor of a GetShared reply, copied out of its segment, which is then unlinked."""
    if not SEGMENT_NAME.match(reply.segment):
        raise InvalidArgumentError(f"the server named segment {reply.segment!r}, not one of "
                                   "sparseserve's", reason="BAD_SEGMENT_NAME")
    try:
        fd = open_segment(reply.segment, "the server unlinks segments not claimed within --shm-ttl "
                                          "seconds, and shared memory needs the server on this host")
        try:
            return read_tensor(fd, reply.header, reply.segment)
        finally:
            os.close(fd)
    finally:
        unlink_segment(reply.segment)


def _written_segment(tensor: SparseTensor | np.ndarray) -> tuple[shared_memory.SharedMemory, pb.SharedTensor]:
    header = tensor_to_pb(tensor, with_data=False)
    slots = header_slots(header)
    shm = create_segment(segment_bytes(slots))
    try:
        write_tensor(shm, slots, tensor_arrays(tensor))
    except BaseException:
        _drop_segment(shm)
        raise
    return shm, pb.SharedTensor(segment=shm.name, header=header)


def _drop_segment(shm: shared_memory.SharedMemory) -> None:
    close_segment(shm)
    unlink_segment(shm.name)


# The AsyncClient's half: the copy (a gigabyte takes a good fraction of a second) runs in a
# worker thread, so the event loop keeps serving the program's other calls meanwhile.
class _Handover:
    """A segment passing from the thread that writes it to the caller waiting on the loop.
    Whichever side comes second drops it when the caller has gone: not a done callback on the
    loop, which may be shut down (``asyncio.run`` ending) before the thread finishes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.abandoned = False
        self.shm: shared_memory.SharedMemory | None = None

    def write(self, tensor: SparseTensor | np.ndarray) -> tuple[shared_memory.SharedMemory, pb.SharedTensor]:
        """In the thread: write the segment, and drop it at once if the caller has gone."""
        shm, request = _written_segment(tensor)
        with self.lock:
            if not self.abandoned:
                self.shm = shm
                return shm, request
        _drop_segment(shm)
        raise asyncio.CancelledError

    def abandon(self) -> None:
        """On the loop, for a cancelled caller: drop the segment if the thread has written it."""
        with self.lock:
            self.abandoned, shm = True, self.shm
        if shm is not None:
            _drop_segment(shm)


@contextlib.asynccontextmanager
async def segment_of_async(tensor: SparseTensor | np.ndarray) -> AsyncIterator[pb.SharedTensor]:
    """``segment_of``, the copy made in a worker thread."""
    handover = _Handover()
    # Shielded: a cancelled caller must not leave the thread's segment to nobody.
    writing = asyncio.ensure_future(asyncio.to_thread(handover.write, tensor))
    try:
        shm, request = await asyncio.shield(writing)
    except asyncio.CancelledError:
        handover.abandon()
        writing.add_done_callback(_retrieved)  # its error, if any, has no one left to tell
        raise
    try:
        yield request
    finally:
        _drop_segment(shm)


def _retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()
