"""Keep the memory that gRPC frees for a large transfer, instead of handing it back to the
kernel and faulting it in again a moment later.

glibc adjusts two thresholds as a process runs: blocks above ``M_MMAP_THRESHOLD`` get a
mapping of their own, and free memory above ``M_TRIM_THRESHOLD`` at the top of an arena goes
back to the kernel. grpcio's receive buffers are allocated and freed by its event-engine
threads, in arenas of their own, and the defaults trimmed them after nearly every message: a
1 GB get faulted in 100-170 thousand fresh pages, most of them in grpcio's ``recvmsg``, and
spent more time in the kernel than in moving the bytes. Fixed thresholds (4 MiB and 32 MiB)
keep those buffers: ~2 thousand faults, and half the system time, per get.

The setting is the whole process's, not the SDK's to make: nothing in the SDK calls this.
A program that moves large tensors opts in with ``sparseserve.keep_transfer_buffers()``
(docs/sdk.md), which changes it once, on Linux with glibc only, and leaves it alone where the
user has chosen either threshold through glibc's own environment variables
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from typing import Callable

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD_BYTES = 4 << 20   # above a 1 MiB frame and grpcio's buffers for it
TRIM_THRESHOLD_BYTES = 32 << 20  # room for the 16 MiB a stream's window lets gRPC buffer
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")

_lock = threading.Lock()
_outcome: bool | None = None  # None: not tried yet


def _glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, or None on another C library or platform."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    # Only glibc has gnu_get_libc_version, and only glibc's mallopt takes these parameters.
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


def keep_transfer_buffers() -> bool:
    """Have glibc keep the memory a large transfer frees for the next one, instead of handing
    it back to the kernel: fixes its mmap threshold at 4 MiB and its trim threshold at 32 MiB
    for the whole process (a 1 GB gRPC get: ~2 thousand page faults instead of 100-170
    thousand, half the system time). Once per process (idempotent, thread-safe); returns
    whether the thresholds are these now: False on another C library, or where the user set
    ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_``, which are left as chosen."""
    global _outcome
    with _lock:
        if _outcome is None:
            mallopt = None if any(v in os.environ for v in USER_SETTINGS) else _glibc_mallopt()
            _outcome = (mallopt is not None
                        and mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
                        and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1)
        return _outcome
