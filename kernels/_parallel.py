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


# Idle OpenMP threads sleep instead of spinning: in a server other requests need the cores
# (with spinning, a 100-entry call took tens of milliseconds on a busy 2-core machine).
# libgomp reads this when it loads, which is below.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


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

# Below this many entries a parallel region costs more than it saves: wrappers take
# their sequential path (also the latency path for small calls).
PARALLEL_MIN = 1 << 16
