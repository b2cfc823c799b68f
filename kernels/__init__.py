"""Numba CPU kernels of sparseserve. Every function assumes validated input
(``sparseserve.core.validate`` runs first) and never raises."""

from __future__ import annotations

from ._sort import argsort_stable, linearize
from .coo import DTYPES, coalesce, first_disorder, from_dense, indices_in_range, reorder, to_dense

__all__ = ["DTYPES", "linearize", "argsort_stable", "reorder", "coalesce", "first_disorder", "to_dense",
           "from_dense", "indices_in_range", "warm_up"]


def warm_up() -> None:
    """Call every kernel module's ``warm_up()`` so numba compiles, or loads from its disk
    cache, before the server reports ready. A new kernel module only defines its own."""
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "warm_up"):
            module.warm_up()
