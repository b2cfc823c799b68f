"""Numba CPU kernels of sparseserve. Every function assumes validated input
(``sparseserve.core.validate`` runs first) and never raises."""

from __future__ import annotations

import contextlib

from ._sort import argsort_stable, linearize
from .coo import DTYPES, coalesce, first_disorder, from_dense, indices_in_range, reorder, to_dense

__all__ = ["DTYPES", "linearize", "argsort_stable", "reorder", "coalesce", "first_disorder", "to_dense",
           "from_dense", "indices_in_range", "warm_up"]



def warm_up() -> None:
    """Call every kernel module's ``warm_up()`` so numba compiles, or loads from its disk
    cache, before the server reports ready. A new kernel module only defines its own."""
    import importlib
    import pkgutil

    with _llvm_lock_events_off():
        for info in pkgutil.iter_modules(__path__):
            module = importlib.import_module(f"{__name__}.{info.name}")
            if hasattr(module, "warm_up"):
                module.warm_up()


@contextlib.contextmanager
def _llvm_lock_events_off():
    """Numba announces every call into LLVM's C API as two events (for the lock-time figure of
    its compile statistics); loading ~250 cached kernels makes ~47,000 such calls, and the
    events were a tenth of a warm start (4.6 -> 4.1 s, medians of six). Nobody reads those
    figures here: the callbacks are taken off for the warm-up and put back after. They are
    found in llvmlite's lock (no public way to list them); where that has changed, nothing is
    taken off."""
    from llvmlite.binding import ffi

    callbacks = list(getattr(getattr(getattr(ffi, "lib", None), "_lock", None), "_cblist", ()))
    for acquired, released in callbacks:
        ffi.unregister_lock_callback(acquired, released)
    try:
        yield
    finally:
        for acquired, released in callbacks:
            ffi.register_lock_callback(acquired, released)
