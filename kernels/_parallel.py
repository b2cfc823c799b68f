"""The numba threading layer, chosen deliberately.

The server calls kernels from a thread pool, so parallel kernels need a
thread-safe layer: OpenMP (GNU libgomp) or TBB. Numba's fallback, workqueue,
is not thread-safe; where it is all there is, parallel kernels run one at a
time under ``PARALLEL_LOCK`` instead of crashing.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading

import numba


def _threadsafe_layer_available() -> bool:
    for pool in ("numba.np.ufunc.omppool", "numba.np.ufunc.tbbpool"):
        try:
            importlib.import_module(pool)
            return True
        except ImportError:
            continue
    return False


THREADSAFE = _threadsafe_layer_available()
if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER = "threadsafe" if THREADSAFE else "workqueue"

PARALLEL_LOCK = contextlib.nullcontext() if THREADSAFE else threading.Lock()

# Chunks a parallel pass splits its input into: a few per thread evens out the load.
N_CHUNKS = max(1, numba.config.NUMBA_NUM_THREADS) * 4
