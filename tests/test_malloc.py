"""The SDK keeps memory that a transfer frees (``sparseserve._malloc``): measured in fresh
processes by the page faults of a thread that allocates and frees blocks as grpcio's
receive path does, with and without a ``Client`` made first."""

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
_CHURN = """
import ctypes, json, resource, sys, threading
if sys.argv[1] == "client":
    from sparseserve import Client
    Client("127.0.0.1:1")  # no call: making one is enough
from sparseserve import _malloc
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


def test_a_client_keeps_freed_blocks_instead_of_faulting_them_in_again():
    without = churn("bare")
    with_client = churn("client")
    assert without["kept"] is None and with_client["kept"] is True
    # glibc's own thresholds hand each round's 8 MiB back: every later round faults it in.
    assert without["faults"] > 29 * PAGES_PER_ROUND / 2, without
    # Kept, the blocks are reused: the rounds after the first cost next to nothing.
    assert with_client["faults"] < PAGES_PER_ROUND, with_client


def test_the_users_own_malloc_settings_are_left_alone():
    # glibc reads these at start-up: trimming everything, the churn faults every round, and
    # the SDK, seeing the user's choice, does not override it.
    chosen = churn("client", MALLOC_TRIM_THRESHOLD_="0")
    assert chosen["kept"] is False
    assert chosen["faults"] > 29 * PAGES_PER_ROUND / 2, chosen
