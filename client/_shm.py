"""``put/get(shared_memory=True)``: the SDK's side of same-host transfers through POSIX shared
memory: writing a segment the server made for this client (``RegisterSegment``) for the server
to take (``PutShared``), and claiming one it wrote (``GetShared``). The gRPC transports
(``_transport_grpc``) make the calls; the segment layout both sides share is
``sparseserve.core.shm``, and why the server makes every segment, ``server/shm.py``."""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Iterator

import numpy as np

from .core.codec import tensor_to_pb
from .core.errors import InvalidArgumentError
from .core.shm import (SEGMENT_NAME, Slot, header_slots, open_segment, read_tensor, segment_bytes, tensor_arrays,
                       unlink_segment, write_tensor)
from .core.tensor import SparseTensor
from .v1 import sparseserve_pb2 as pb
from .core.reasons import Reason

__all__ = ["Outgoing", "segment_of", "segment_of_async", "registered_async", "claim"]


@dataclass(frozen=True)
class Outgoing:
    """A tensor on its way to a segment: its header and the places of its arrays."""

    tensor: SparseTensor | np.ndarray
    header: pb.Tensor
    slots: list[Slot]

    @classmethod
    def of(cls, tensor: SparseTensor | np.ndarray) -> "Outgoing":
        header = tensor_to_pb(tensor, with_data=False)
        return cls(tensor, header, header_slots(header))

    def registration(self) -> pb.RegisterSegmentRequest:
        """The RegisterSegment request for a segment that holds it."""
        return pb.RegisterSegmentRequest(nbytes=segment_bytes(self.slots))


@contextlib.contextmanager
def segment_of(outgoing: Outgoing, lease: pb.RegisterSegmentResponse) -> Iterator[pb.SharedTensor]:
    """The segment ``lease`` names, written with ``outgoing``, as the PutShared request that hands
    it over. Unlinked on leaving: the server unlinks a segment it has taken, so this covers a call
    that failed before (and the server's TTL, a client that died)."""
    try:
        _fill(outgoing, lease)
        yield pb.SharedTensor(segment=lease.segment, header=outgoing.header)
    finally:
        _release(lease.segment)


def claim(reply: pb.SharedTensor) -> SparseTensor | np.ndarray:
    """The tensor of a GetShared reply, copied out of its segment, which is then unlinked."""
    _check_name(reply.segment)
    try:
        fd = open_segment(reply.segment, "the server unlinks segments not claimed within --shm-ttl "
                                          "seconds, and shared memory needs the server on this host")
        try:
            return read_tensor(fd, reply.header, reply.segment)
        finally:
            os.close(fd)
    finally:
        unlink_segment(reply.segment)


def _check_name(segment: str) -> None:
    if not SEGMENT_NAME.match(segment):
        raise InvalidArgumentError(f"the server named segment {segment!r}, not one of sparseserve's",
                                   reason=Reason.BAD_SEGMENT_NAME)


def _fill(outgoing: Outgoing, lease: pb.RegisterSegmentResponse) -> None:
    """Write the tensor into the segment the server made: opened by its name, never created (a
    name that is not there is the server's TTL having run out, or no server on this host)."""
    _check_name(lease.segment)
    fd = open_segment(lease.segment, f"the server made it for this put and unlinks it after --shm-ttl "
                                     f"{lease.ttl_seconds:g} s; shared memory needs the server on this host",
                      writable=True)
    try:
        size, nbytes = os.fstat(fd).st_size, segment_bytes(outgoing.slots)
        if size != nbytes:
            raise InvalidArgumentError(f"segment {lease.segment} has {size} bytes, not the {nbytes} asked "
                                       "for", reason=Reason.BUFFER_LENGTH)
        write_tensor(fd, outgoing.slots, tensor_arrays(outgoing.tensor))
    finally:
        os.close(fd)


def _release(segment: str) -> None:
    """Unlink a segment this client was lent, if it is still there and this user may."""
    with contextlib.suppress(OSError):
        unlink_segment(segment)


# The AsyncClient's half: the copy (a gigabyte takes a good fraction of a second) runs in a
# worker thread, so the event loop keeps serving the program's other calls meanwhile.
async def registered_async(call: Awaitable[pb.RegisterSegmentResponse]) -> pb.RegisterSegmentResponse:
    """The reply of a RegisterSegment call. A caller cancelled while it is in flight leaves the
    segment to be unlinked when the reply comes (the server's TTL covers one that never does)."""
    future = asyncio.ensure_future(call)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(_release_lent)
        raise


def _release_lent(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is None:
        _release(future.result().segment)


@contextlib.asynccontextmanager
async def segment_of_async(outgoing: Outgoing, lease: pb.RegisterSegmentResponse) -> AsyncIterator[pb.SharedTensor]:
    """``segment_of``, the copy made in a worker thread. A caller cancelled mid-copy unlinks the
    name at once; the thread, which cannot be stopped, finishes into the unlinked segment, whose
    memory goes when it closes it."""
    try:
        await asyncio.to_thread(_fill, outgoing, lease)
        yield pb.SharedTensor(segment=lease.segment, header=outgoing.header)
    finally:
        _release(lease.segment)
