"""``sparseserve.keep_transfer_buffers()`` (``sparseserve._malloc``): glibc keeps the memory a
transfer frees, for the process that opts in, and only for it. Measured in fresh processes by the
page faults of a thread that allocates and frees blocks as grpcio's receive path does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sparseserve import _malloc

pytestmark = pytest.mark.skipif(_malloc._glibc_mallopt() is None, reason="mallopt's thresholds are glibc's")

# A thread (its own arena, as grpcio's event-engine threads have) takes eight 1 MiB blocks,
# writes them, frees them, 30 times; the faults after the first round are what reuse saves.
# Modes: "bare" (nothing of the SDK), "clients" (a Client and an AsyncClient of each wire made,
# no call), "opted-in" (keep_transfer_buffers() called).
_CHURN = """
import asyncio, ctypes, json, resource, sys, threading
import sparseserve
from sparseserve import _malloc
if sys.argv[1] == "clients":
    for target in ("127.0.0.1:1", "http://127.0.0.1:1"):
        sparseserve.Client(target).close()
        async def make(target=target):
            await sparseserve.AsyncClient(target).close()
        asyncio.run(make())
elif sys.argv[1] == "opted-in":
    returned = sparseserve.keep_transfer_buffers()
    assert sparseserve.keep_transfer_buffers() is returned  # once per process
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
faults = []
def churn():
    for round in range(30):
        if round == 1:
            faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt)
        blocks = [libc.malloc(1 << 20) for _ in range(8)]
        for b in blocks:
            ctypes.memset(b, 1, 1 << 20)
        for b in blocks:
            libc.free(b)
    faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt)
t = threading.Thread(target=churn); t.start(); t.join()
print(json.dumps({"faults": faults[1] - faults[0], "kept": _malloc._outcome}))
"""

PAGES_PER_ROUND = 8 * (1 << 20) // os.sysconf("SC_PAGE_SIZE")


def churn(mode: str, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if k not in _malloc.USER_SETTINGS}
    out = subprocess.run([sys.executable, "-c", _CHURN, mode], env={**environ, **env},
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


def test_opting_in_keeps_freed_blocks_instead_of_faulting_them_in_again():
    without = churn("bare")
    opted_in = churn("opted-in")
    assert without["kept"] is None and opted_in["kept"] is True
    # glibc's own thresholds hand each round's 8 MiB back: every later round faults it in.
    assert without["faults"] > 29 * PAGES_PER_ROUND / 2, without
    # Kept, the blocks are reused: the rounds after the first cost next to nothing.
    assert opted_in["faults"] < PAGES_PER_ROUND, opted_in


def test_clients_leave_the_allocator_alone():
    made = churn("clients")
    assert made["kept"] is None  # never tried
    assert made["faults"] > 29 * PAGES_PER_ROUND / 2, made


def test_the_users_own_malloc_settings_are_left_alone():
    # glibc reads these at start-up: trimming everything, the churn faults every round, and
    # opting in, seeing the user's choice, does not override it.
    chosen = churn("opted-in", MALLOC_TRIM_THRESHOLD_="0")
    assert chosen["kept"] is False
    assert chosen["faults"] > 29 * PAGES_PER_ROUND / 2, chosen
