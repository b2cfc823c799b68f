"""The op declarations. Importing this package imports every module in it, and
each module's declarations fill ``REGISTRY``: adding an op family is adding a
module here, and nothing else changes."""

import importlib
import pkgutil

from ..registry import REGISTRY

for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["REGISTRY"]
