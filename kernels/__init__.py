"""Numba CPU kernels of sparseserve. Every function assumes validated input
(``sparseserve.core.validate`` runs first) and never raises."""

from __future__ import annotations

from ._parallel import PARALLEL_MIN
from ._sort import argsort_stable, frozen, gather_rows, linearize
from .coo import DTYPES, coalesce, first_disorder, from_dense, indices_in_range, reorder, to_dense

# The server's seam into the kernels: these, and the family modules (kernels.linalg, ...).
__all__ = ["DTYPES", "PARALLEL_MIN", "linearize", "argsort_stable", "frozen", "gather_rows", "reorder", "coalesce",
           "first_disorder", "to_dense", "from_dense", "indices_in_range", "warm_up"]


def warm_up() -> None:
    """Call every kernel module's ``warm_up()`` so numba compiles, or loads from its disk
    cache, before the server reports ready. A new kernel module only defines its own."""
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "warm_up"):
            module.warm_up()
