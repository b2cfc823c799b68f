"""Same-host transfers through POSIX shared memory (``Client.put/get(shared_memory=True)``).

A ``SharedTensor`` names a segment and carries the tensor's header (``Tensor`` with empty
Array data). The segment holds the arrays' bytes in TensorChunk order (COO: indices,
values; compressed: compressed_indices, plain_indices, values; dense: data), each array
starting at a multiple of ``ALIGN`` bytes from the segment start, zero padding between.

The server makes every segment (``server/shm.py`` says why): one it writes for
``GetShared``, and an empty one of the size a client announces through ``RegisterSegment``,
which that client writes and hands back with ``PutShared``. Each side copies the bytes
once: the writer into the segment, the reader out of it into its own buffers; the reader
then unlinks the segment. The layout is computed here from the header alone, so the SDK
and the server cannot disagree on it.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import threading
from dataclasses import dataclass

import numpy as np

from .codec import array_spec, sparse_fields, sparse_from_arrays, array_view, wire_array
from .tensor import SparseTensor
from .errors import InvalidArgumentError, NotFoundError, ResourceExhaustedError
from ..v1 import sparseserve_pb2 as pb
from .reasons import Reason

__all__ = ["ALIGN", "SEGMENT_NAME", "Slot", "header_slots", "segment_bytes", "new_segment_name",
           "create_segment", "unlink_segment", "open_segment", "write_tensor", "read_slot", "read_tensor",
           "tensor_arrays", "tensor_from_slots"]

# Cache-line alignment: every dtype's alignment divides it, and copies run on whole lines.
ALIGN = 64
# The names the SDK and the server make; the server opens nothing else (no "/", no "..").
SEGMENT_NAME = re.compile(r"sparseserve-[0-9a-f]{32}\Z")


@dataclass(frozen=True)
class Slot:
    """Where one array lives in a segment."""

    field: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


def header_slots(header: pb.Tensor, name: str = "tensor") -> list[Slot]:
    """The arrays a ``SharedTensor`` header announces and their places, after ``_codec``'s
    checks of each Array header (dtype, shape, exact byte length)."""
    kind = header.WhichOneof("kind")
    if kind == "sparse":
        msgs = [(field, getattr(header.sparse, field)) for field in sparse_fields(header.sparse)]
    elif kind == "dense":
        msgs = [("data", header.dense)]
    else:
        raise InvalidArgumentError(f"{name}: the header of a shared tensor must be a sparse or dense "
                                   "tensor", reason=Reason.BAD_HEADER)
    slots, offset = [], 0
    for field, msg in msgs:
        if msg.data:
            raise InvalidArgumentError(f"{name}.{field}: a shared tensor's header carries no data "
                                       "(the bytes are in the segment)", reason=Reason.BAD_HEADER)
        dtype, shape, nbytes = array_spec(msg, f"{name}.{field}")
        offset = _aligned(offset)
        slots.append(Slot(field, dtype, shape, offset, nbytes))
        offset += nbytes
    return slots


def segment_bytes(slots: list[Slot]) -> int:
    """Bytes a segment needs for ``slots``: the end of the last array."""
    return slots[-1].offset + slots[-1].nbytes if slots else 0


def tensor_arrays(t: SparseTensor | np.ndarray) -> list[np.ndarray]:
    """The arrays of ``t`` in segment order, as they go on the wire (little-endian, C order)."""
    return [wire_array(a) for a in (t.arrays() if isinstance(t, SparseTensor) else (t,))]


def tensor_from_slots(header: pb.Tensor, slots: list[Slot], buffers: list[np.ndarray],
                      name: str = "tensor") -> SparseTensor | np.ndarray:
    """The tensor whose arrays are ``buffers`` (raw bytes, one per slot)."""
    arrays = {slot.field: array_view(buf, slot.dtype, slot.shape) for slot, buf in zip(slots, buffers)}
    if header.WhichOneof("kind") == "dense":
        return arrays["data"]
    return sparse_from_arrays(header.sparse, arrays, name)


# ------------------------------------------------------------------ segments
# Bytes move through the segment's file descriptor (pwritev/preadv), not through a mapping:
# measured on this project's 2-core host with 300 MB, a mapping cost a page fault per 4 KiB
# (writes 1.4 GB/s, against 2.8 through pwritev; reads 2.6 against 3.3), and a mapping is
# unsafe to read from someone else's segment: if they shrink it, touching a page past the
# new end kills the reader with SIGBUS, where preadv just comes back short. Writes through
# the descriptor also report a full /dev/shm as ENOSPC rather than SIGBUS.

# Linux moves at most 2 GiB less a page per call.
_IO_BYTES = 1 << 30


def new_segment_name() -> str:
    """A fresh name: 128 random bits, so nobody can guess one the server has not told them."""
    return "sparseserve-" + secrets.token_hex(16)


def create_segment(name: str, size: int) -> int:
    """A new segment ``name`` of ``size`` bytes, mode 0600, made with O_CREAT|O_EXCL (a name that
    exists already is ``FileExistsError``, never opened); returns its read-write descriptor."""
    from _posixshmem import shm_open

    fd = shm_open("/" + name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        unlink_segment(name)
        raise
    return fd


def unlink_segment(name: str) -> bool:
    """Remove a segment's name; False when it was already gone."""
    from _posixshmem import shm_unlink

    try:
        shm_unlink("/" + name)
    except FileNotFoundError:
        return False
    return True


def open_segment(name: str, missing: str, writable: bool = False) -> int:
    """A descriptor of the existing segment ``name``, read-only unless ``writable`` (never created;
    glibc's shm_open adds O_NOFOLLOW); ``missing`` says why it might not exist."""
    from _posixshmem import shm_open

    try:
        fd = shm_open("/" + name, os.O_RDWR if writable else os.O_RDONLY, 0)
    except FileNotFoundError:
        raise NotFoundError(f"segment {name} does not exist ({missing})", reason=Reason.SEGMENT_NOT_FOUND) from None
    except OSError as exc:
        raise InvalidArgumentError(f"segment {name} cannot be opened: {exc.strerror} (shared memory needs "
                                   "the client and the server under one user, or root)",
                                   reason=Reason.BAD_SEGMENT) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InvalidArgumentError(f"segment {name} is not a shared-memory object", reason=Reason.BAD_SEGMENT)
    return fd


def write_tensor(fd: int, slots: list[Slot], arrays: list[np.ndarray]) -> None:
    """Copy ``arrays`` to their slots of the segment open as ``fd`` (one copy each)."""
    for slot, a in zip(slots, arrays):
        view = a.reshape(-1).view(np.uint8).data
        done = 0
        while done < slot.nbytes:
            try:
                done += os.pwritev(fd, [view[done:done + _IO_BYTES]], slot.offset + done)
            except OSError as exc:
                raise ResourceExhaustedError(f"no room for a {segment_bytes(slots)}-byte shared-memory "
                                             f"segment: {exc.strerror}", reason=Reason.SHARED_MEMORY_FULL) from None


def _read_range(fd: int, view: memoryview, offset: int, name: str, field: str) -> None:
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:done + _IO_BYTES]], offset + done)
        if got == 0:
            raise InvalidArgumentError(f"segment {name} shrank while being read: {field} is short of "
                                       f"{len(view) - done} bytes", reason=Reason.BUFFER_LENGTH)
        done += got


_POOL = None
_POOL_LOCK = threading.Lock()
# Big arrays are read in pieces by several threads (preadv drops the GIL): the copy faults in
# fresh pages, and faulting on several cores is faster (1 GB on 2 cores: 2.8 GB/s with one
# thread, 5.8 with two, median of 6). Writes gain nothing: they serialize on the file's lock.
_READ_THREADS = min(4, os.cpu_count() or 1)
_PARALLEL_BYTES = 64 << 20


def _copy_pool():
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            from concurrent.futures import ThreadPoolExecutor

            _POOL = ThreadPoolExecutor(_READ_THREADS, thread_name_prefix="sparseserve-shm")
        return _POOL


def read_slot(fd: int, slot: Slot, name: str) -> np.ndarray:
    """One array's bytes, copied from a segment into a buffer of its own."""
    buf = np.empty(slot.nbytes, np.uint8)
    view = buf.data
    if slot.nbytes < _PARALLEL_BYTES or _READ_THREADS == 1:
        _read_range(fd, view, slot.offset, name, slot.field)
        return buf
    step = -(-slot.nbytes // _READ_THREADS // 4096) * 4096
    pieces = [(start, min(start + step, slot.nbytes)) for start in range(0, slot.nbytes, step)]
    futures = [_copy_pool().submit(_read_range, fd, view[a:b], slot.offset + a, name, slot.field)
               for a, b in pieces]
    for future in futures:
        future.result()
    return buf


def read_tensor(fd: int, header: pb.Tensor, segment: str, slots: list[Slot] | None = None,
                name: str = "tensor") -> SparseTensor | np.ndarray:
    """The tensor an open segment holds, copied out; its size checked against the header."""
    slots = header_slots(header, name) if slots is None else slots
    size = os.fstat(fd).st_size
    if segment_bytes(slots) > size:
        raise InvalidArgumentError(
            f"{name}: the header announces {segment_bytes(slots)} bytes (arrays at {ALIGN}-byte "
            f"aligned offsets) but segment {segment} has {size}", reason=Reason.BUFFER_LENGTH)
    return tensor_from_slots(header, slots, [read_slot(fd, slot, segment) for slot in slots], name)
