"""The handle store's disk tier (``--spill-dir``): a kept tensor written to a file, and mapped
back read-only (a numpy memmap) when it is next used.

Layout. Everything lives in ``DIR/v1/`` (v1: the file format), a directory the server makes
with mode 0700, owns, and locks while it runs (a second server on the same directory stops
at start). One file per handle, ``h-<32 hex digits>.tensor``, mode 0600. A file is written
as ``.tmp-<handle>-<random>``, fsynced when durable, and renamed: a file under a handle's name
is whole. Temporary files found at start are writes a process died in, and are removed.

A file: 16 bytes (magic, the header's length, its CRC-32), the header (JSON: the handle, the
tenant that owns it, the tensor's layout, shape and flags, and per array its dtype, shape,
offset, length and CRC-32), then the arrays, each at a 64-byte aligned offset. Loading
checks the magic, the header's CRC, the file's length, each array's length and CRC-32; the
store then validates the tensor as a put does (``HandleStore``).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import secrets
import stat
import struct
import threading
import zlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from sparseserve.core.errors import ResourceExhaustedError, SparseServeError, UnavailableError
from sparseserve.core.tensor import SparseTensor
from sparseserve.core.reasons import Reason

__all__ = ["SpillDir", "SpillDirError", "Damaged", "Abandoned", "Staging", "Restored", "file_bytes"]

log = logging.getLogger("sparseserve.store")

FORMAT = "v1"
MAGIC = b"SPSPILL1"
_PREFIX = struct.Struct("<8sII")  # magic, header length, CRC-32 of the header
ALIGN = 64
_CHUNK = 64 << 20  # bytes written (and CRC'd) at a time
_MAX_HEADER = 1 << 20
_NAME = re.compile(r"(h-[0-9a-f]{32})\.tensor")
_TEMP = re.compile(r"\.tmp-h-[0-9a-f]{32}-[0-9a-f]+")
_SPARSE_ARRAYS = {"coo": ("indices", "values")}
_COMPRESSED_ARRAYS = ("compressed_indices", "plain_indices", "values")


class SpillDirError(RuntimeError):
    """The directory cannot be used (not ours, not writable, or another server holds it)."""


class Damaged(Exception):
    """A file that fails its check; the message says which part."""


class Abandoned(Exception):
    """The put a file was being written for was abandoned: the file is gone."""


@dataclass(frozen=True)
class Restored:
    """A handle's file found at start (``--durable``)."""

    handle: str
    tenant: str
    nbytes: int  # the tensor's bytes
    file_bytes: int
    mtime: float


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _arrays(tensor: Any) -> tuple[dict[str, Any], tuple[str, ...], tuple[Any, ...]]:
    """(metadata, array names, arrays) of a tensor: a SparseTensor (a GPU worker's device
    tensors too: only their metadata is read here) or a dense array."""
    if isinstance(tensor, SparseTensor):
        meta = {"kind": "sparse", "layout": tensor.layout, "dense_shape": [int(d) for d in tensor.dense_shape],
                "blocksize": None if tensor.blocksize is None else [int(b) for b in tensor.blocksize],
                "coalesced": bool(tensor.coalesced)}
        return meta, _SPARSE_ARRAYS.get(tensor.layout, _COMPRESSED_ARRAYS), tensor.arrays()
    return {"kind": "dense"}, ("data",), (tensor,)


class _Plan:
    """What a tensor's file holds: its header (array CRCs still zero, the same length as the
    final ones) and where each array goes, so its size is known before a byte is written."""

    def __init__(self, handle: str, tenant: str, tensor: Any, durable: bool = False):
        meta, names, arrays = _arrays(tensor)
        entries, end = [], 0
        for name, a in zip(names, arrays, strict=True):
            offset = _align(end)
            entries.append({"name": name, "dtype": np.dtype(a.dtype).str, "shape": [int(d) for d in a.shape],
                            "offset": offset, "nbytes": int(a.nbytes), "crc32": "00000000"})
            end = offset + int(a.nbytes)
        self.header = {"format": FORMAT, "handle": handle, "tenant": tenant, "durable": int(durable),
                       "nbytes": sum(e["nbytes"] for e in entries), **meta, "arrays": entries}
        self.header_length = len(self.encoded())  # the same with the real CRCs: 8 hex digits each
        self.data_start = _align(_PREFIX.size + self.header_length)
        self.file_bytes = self.data_start + end

    def encoded(self) -> bytes:
        return json.dumps(self.header, separators=(",", ":")).encode()


def file_bytes(handle: str, tenant: str, tensor: Any) -> int:
    """The size of the file ``tensor`` would be written as (its metadata only is read)."""
    return _Plan(handle, tenant, tensor).file_bytes


def _write_all(fd: int, data: Any, offset: int | None = None) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[n:]
        if offset is not None:
            offset += n


def _sync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _disk_error(exc: OSError, doing: str) -> SparseServeError:
    """An OSError of the disk tier as the error model has it; the message names the errno's text
    and the flag, not the path (a tenant is told what happened, not where the files are)."""
    what = f"{doing} in --spill-dir failed: {exc.strerror or exc}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        err: SparseServeError = ResourceExhaustedError(
            f"{what}; the disk is full. Delete handles, or give --spill-dir more room", reason=Reason.DISK_FULL)
        err.http_status = 507  # Insufficient Storage: the server's disk, not the request, is too small
        return err
    return UnavailableError(f"{what}; retry later", reason=Reason.DISK_ERROR)


class Staging:
    """The file of a durable put while it is written (in the kernel pool), so that a put
    abandoned at any point (its deadline, a refusal) leaves no file: the writer calls ``begin``
    and ``commit``, the put's own code ``abandon`` when it gives up; a lock orders them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._path: str | None = None
        self._abandoned = False

    def begin(self, path: str) -> None:
        with self._lock:
            if self._abandoned:
                raise Abandoned("the put was abandoned before its file was made")
            self._path = path

    def commit(self, temporary: str, final: str) -> None:
        with self._lock:
            if self._abandoned:  # abandon() removed the temporary file already
                raise Abandoned("the put was abandoned while its file was written")
            os.rename(temporary, final)
            self._path = final

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            if self._path is not None:
                _remove(self._path)


class SpillDir:
    """``DIR/v1/``: made, checked and locked when opened. With ``durable``, the durable files
    found there are this server's handles from before (``restored``); temporary files and
    those of a server that was not durable are left-overs whose handles are gone, and go."""

    def __init__(self, root: str, budget_bytes: int, durable: bool,
                 to_host: Callable[[Any], Any] = lambda t: t):
        self.root = os.path.abspath(root)
        self.path = os.path.join(self.root, FORMAT)
        self.budget_bytes = int(budget_bytes)
        self.durable = durable
        self._to_host = to_host  # a GPU worker's device tensors are copied to the host to be written
        self._fds: tuple[int, ...] = ()
        try:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            try:
                os.mkdir(self.path, 0o700)
                _sync_directory(self.root)  # a durable file's directory survives a crash too
            except FileExistsError:
                pass
            info = os.lstat(self.path)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                raise SpillDirError(f"--spill-dir {root}: {self.path} must be a directory owned by this "
                                    f"server's user (uid {os.geteuid()})")
            os.chmod(self.path, 0o700)
            self._dir_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._fds = (self._dir_fd,)
            lock = os.open(os.path.join(self.path, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._fds = (lock, self._dir_fd)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise SpillDirError(f"--spill-dir {root}: another sparseserve server uses it (it holds "
                                    f"{self.path}/lock); give each server its own directory") from None
            self.restored = self._scan()
        except BaseException as exc:
            self.close()
            if isinstance(exc, OSError):
                raise SpillDirError(f"--spill-dir {root}: cannot use {exc.filename or self.path} "
                                    f"({exc.strerror})") from None
            raise

    # ------------------------------------------------------------------ files
    def file(self, handle: str) -> str:
        return os.path.join(self.path, handle + ".tensor")

    def write(self, handle: str, tenant: str, tensor: Any, durable: bool = False,
              staging: Staging | None = None) -> int:
        """Write ``tensor`` as ``handle``'s file (fsynced, and its directory entry too, when
        ``durable``); returns the file's size. ``staging``: a durable put's, which may abandon it.
        A write that fails leaves no file, and says why in the error model: a full disk is
        RESOURCE_EXHAUSTED (``DISK_FULL``), any other failure UNAVAILABLE (``DISK_ERROR``)."""
        try:
            return self._write(handle, tenant, tensor, durable, staging)
        except OSError as exc:
            raise _disk_error(exc, f"writing {handle}'s file") from None

    def _write(self, handle: str, tenant: str, tensor: Any, durable: bool, staging: Staging | None) -> int:
        plan = _Plan(handle, tenant, tensor, durable)
        host = self._to_host(tensor)
        arrays = _arrays(host)[2]
        temporary = os.path.join(self.path, f".tmp-{handle}-{secrets.token_hex(4)}")
        if staging is not None:
            staging.begin(temporary)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            zeros = bytes(ALIGN)
            at = plan.data_start
            os.lseek(fd, at, os.SEEK_SET)  # the header goes in last, once the CRCs are known
            for entry, a in zip(plan.header["arrays"], arrays, strict=True):
                _write_all(fd, zeros[:plan.data_start + entry["offset"] - at])
                flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
                crc = 0
                for start in range(0, flat.size, _CHUNK):
                    chunk = flat[start:start + _CHUNK]
                    crc = zlib.crc32(chunk.data, crc)
                    _write_all(fd, chunk)
                entry["crc32"] = f"{crc:08x}"
                at = plan.data_start + entry["offset"] + entry["nbytes"]
            os.ftruncate(fd, plan.file_bytes)  # its length exactly, empty arrays at the end included
            header = plan.encoded()
            assert len(header) == plan.header_length
            _write_all(fd, _PREFIX.pack(MAGIC, len(header), zlib.crc32(header)) + header, 0)
            if durable:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            _remove(temporary)
            raise
        os.close(fd)
        final = self.file(handle)
        try:
            if staging is not None:
                staging.commit(temporary, final)
            else:
                os.rename(temporary, final)
        except BaseException:
            _remove(temporary)
            raise
        if durable:
            os.fsync(self._dir_fd)  # the rename itself survives a crash
        return plan.file_bytes

    def remove(self, handle: str) -> None:
        """``handle``'s file gone (a failure is logged: the handle is gone either way)."""
        try:
            _remove(self.file(handle))
        except OSError as exc:
            log.error("spill file not removed", extra={"fields": {"handle": handle, "why": exc.strerror}})

    def load(self, handle: str, tenant: str, expected_bytes: int) -> Any:
        """``handle``'s tensor, its arrays read-only views of one mapping of its file, after
        the file's own checks (``Damaged`` says what failed); not yet validated as a tensor."""
        try:
            with open(self.file(handle), "rb") as fh:
                header, data_start, size = self._header(fh, handle)
                if size != expected_bytes:
                    raise Damaged(f"the file has {size} bytes, not the {expected_bytes} written")
                whole = np.memmap(fh, dtype=np.uint8, mode="r").view(np.ndarray)
        except OSError as exc:
            raise Damaged(f"cannot read it: {exc.strerror}") from None
        if header["tenant"] != tenant:
            raise Damaged("the tenant in the file is not the handle's")
        arrays = {}
        try:
            for entry in header["arrays"]:
                dtype = np.dtype(entry["dtype"])
                shape = tuple(int(d) for d in entry["shape"])
                offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
                if dtype.hasobject or not dtype.isnative or dtype.kind not in "biufc":
                    raise Damaged(f"{entry['name']}: dtype {entry['dtype']!r} is not one a tensor has")
                if min(shape, default=0) < 0 or nbytes != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize \
                        or offset % ALIGN or data_start + offset + nbytes > size:
                    raise Damaged(f"{entry['name']}: its shape, length and offset do not agree with the file")
                raw = whole[data_start + offset:data_start + offset + nbytes]
                if f"{zlib.crc32(raw.data):08x}" != entry["crc32"]:
                    raise Damaged(f"{entry['name']}: its CRC-32 does not match its bytes")
                arrays[entry["name"]] = raw.view(dtype).reshape(shape)
            if header["kind"] == "dense":
                return arrays["data"]
            if header["layout"] == "coo":
                return SparseTensor(indices=arrays["indices"], values=arrays["values"],
                                    dense_shape=header["dense_shape"], coalesced=bool(header["coalesced"]))
            return SparseTensor(layout=header["layout"], compressed_indices=arrays["compressed_indices"],
                                plain_indices=arrays["plain_indices"], values=arrays["values"],
                                dense_shape=header["dense_shape"], blocksize=header["blocksize"],
                                coalesced=bool(header["coalesced"]))
        except Damaged:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise Damaged(f"its header does not describe a tensor ({type(exc).__name__}: {exc})") from None

    def _header(self, fh, handle: str) -> tuple[dict, int, int]:
        """(header, where the data starts, the file's size), checked against the file."""
        size = os.fstat(fh.fileno()).st_size
        prefix = fh.read(_PREFIX.size)
        if len(prefix) != _PREFIX.size:
            raise Damaged(f"the file has {size} bytes, too few for a header")
        magic, length, crc = _PREFIX.unpack(prefix)
        if magic != MAGIC:
            raise Damaged("it does not start as a spilled tensor's file does")
        if length > min(_MAX_HEADER, size - _PREFIX.size):
            raise Damaged(f"its header length ({length}) does not fit the file ({size} bytes)")
        encoded = fh.read(length)
        if zlib.crc32(encoded) != crc:
            raise Damaged("its header's CRC-32 does not match")
        try:
            header = json.loads(encoded)
            declared = _align(_PREFIX.size + length) + max(
                (int(a["offset"]) + int(a["nbytes"]) for a in header["arrays"]), default=0)
            owner, nbytes = header["tenant"], int(header["nbytes"])
        except (KeyError, TypeError, ValueError) as exc:
            raise Damaged(f"its header does not describe a tensor ({type(exc).__name__}: {exc})") from None
        if header.get("handle") != handle or header.get("format") != FORMAT or not isinstance(owner, str) \
                or nbytes < 0:
            raise Damaged("its header names another handle or format")
        if size != declared:
            raise Damaged(f"the file has {size} bytes, not the {declared} its header describes (a torn write)")
        return header, _align(_PREFIX.size + length), size

    def _scan(self) -> list[Restored]:
        """Temporary files removed, and files of a server that was not durable (their handles
        died with it); the durable ones checked (header and length) and listed, least recently
        written first. Not durable, a directory holding durable files is refused: they are
        another configuration's handles, not left-overs to clean up."""
        found, removed = [], {"temporary": 0, "stale": 0, "damaged": 0}
        for name in os.listdir(self.path):
            path = os.path.join(self.path, name)
            match = _NAME.fullmatch(name)
            if _TEMP.fullmatch(name):
                _remove(path)
                removed["temporary"] += 1
            elif match:
                handle = match.group(1)
                try:
                    with open(path, "rb") as fh:
                        header, _, size = self._header(fh, handle)
                        mtime = os.fstat(fh.fileno()).st_mtime
                except (Damaged, OSError) as exc:
                    why = exc.strerror if isinstance(exc, OSError) else str(exc)
                    log.error("spill file damaged", extra={"fields": {"handle": handle, "path": path, "why": why}})
                    _remove(path)
                    removed["damaged"] += 1
                    continue
                if header.get("durable") != 1:  # an evicted tensor of a server that was not durable
                    _remove(path)
                    removed["stale"] += 1
                    continue
                found.append(Restored(handle, header["tenant"], int(header["nbytes"]), size, mtime))
        if any(removed.values()):
            os.fsync(self._dir_fd)
        if found and not self.durable:
            raise SpillDirError(f"--spill-dir {self.root}: {self.path} holds {len(found)} handles a durable "
                                "server kept; start with --durable to serve them, or give this server "
                                "another directory")
        found.sort(key=lambda r: r.mtime)
        log.info("spill directory opened", extra={"fields": {
            "path": self.path, "durable": self.durable, "handles": len(found),
            "bytes": sum(r.file_bytes for r in found), **{f"removed_{k}": n for k, n in removed.items()}}})
        return found

    def close(self) -> None:
        """Let the directory go (its lock with it)."""
        fds, self._fds = self._fds, ()
        for fd in fds:
            os.close(fd)
