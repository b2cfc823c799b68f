"""``Client.put/get(shared_memory=True)``: the SDK's side of same-host transfers through POSIX
shared memory; the segment layout both sides share is ``sparseserve.core.shm``."""

from __future__ import annotations

import asyncio
import os
import threading
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from .core.codec import tensor_to_pb
from .core.errors import InvalidArgumentError, UnimplementedError
from .core.shm import (SEGMENT_NAME, close_segment, create_segment, header_slots, open_segment, read_tensor,
                       segment_bytes, tensor_arrays, unlink_segment, write_tensor)
from ._remote import RemoteTensor
from .core.tensor import SparseTensor
from .v1 import sparseserve_pb2 as pb

__all__ = ["put", "get", "put_async", "get_async"]


def _require_grpc(client: Any) -> None:
    if client.wire != "grpc":
        raise UnimplementedError(
            f"shared_memory=True needs the gRPC wire (a host:port target); {client.target} speaks REST",
            reason="SHARED_MEMORY_NEEDS_GRPC")


def _written_segment(tensor: SparseTensor | np.ndarray) -> tuple[shared_memory.SharedMemory, pb.SharedTensor]:
    """A new segment holding ``tensor``, and the PutShared request that names it."""
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
    # The server unlinks a segment once copied; this covers a call that failed first.
    close_segment(shm)
    unlink_segment(shm.name)


def _claim(reply: pb.SharedTensor) -> SparseTensor | np.ndarray:
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


def put(client: Any, tensor: SparseTensor | np.ndarray):
    """``Client.put(tensor, shared_memory=True)``: write a segment, have the server take it."""
    _require_grpc(client)
    shm, request = _written_segment(tensor)
    try:
        reply = client._grpc(client._stub.PutShared, request)
    finally:
        _drop_segment(shm)
    return RemoteTensor(reply.handle, nbytes=reply.nbytes, client=client)


def get(client: Any, handle: str) -> SparseTensor | np.ndarray:
    """``Client.get(handle, shared_memory=True)``: the server writes a segment, this copies it out."""
    _require_grpc(client)
    return _claim(client._grpc(client._stub.GetShared, pb.Handle(handle=handle)))


# The AsyncClient's halves: the copies (a gigabyte takes a good fraction of a second) run in a
# worker thread, so the event loop keeps serving the program's other calls meanwhile.
class _Handover:
    """A segment passing from the thread that writes it to the caller waiting on the loop.
    Whichever side comes second drops it when the caller has gone: not a done callback on the
    loop, which may be shut down (``asyncio.run`` ending) before the thread finishes."""

    def __init__(self):
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


async def put_async(client: Any, tensor: SparseTensor | np.ndarray):
    """``await AsyncClient.put(tensor, shared_memory=True)``."""
    _require_grpc(client)
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
        reply = await client._grpc(client._stub.PutShared, request)
    finally:
        _drop_segment(shm)
    return RemoteTensor(reply.handle, nbytes=reply.nbytes, client=client)


def _retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


async def get_async(client: Any, handle: str) -> SparseTensor | np.ndarray:
    """``await AsyncClient.get(handle, shared_memory=True)``."""
    _require_grpc(client)
    reply = await client._grpc(client._stub.GetShared, pb.Handle(handle=handle))
    return await asyncio.to_thread(_claim, reply)
