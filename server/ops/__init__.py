"""The op declarations. Importing this package fills ``REGISTRY``; each module
declares a family of ops and nothing else needs to change to add one."""

from ..registry import REGISTRY
from . import coo  # noqa: F401  (registers its ops)

__all__ = ["REGISTRY"]
