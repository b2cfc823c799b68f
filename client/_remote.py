"""``RemoteTensor``: the handle of a tensor a server keeps, bound to the client that made it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .core.tensor import HandleRef

__all__ = ["RemoteTensor"]


@dataclass(frozen=True, eq=False)
class RemoteTensor(HandleRef):
    """A tensor kept on the server; pass it to any op in place of the tensor itself."""

    nbytes: int = 0
    client: Any = field(default=None, repr=False)

    def get(self):
        """Fetch the tensor (``await`` it with an ``AsyncClient``)."""
        return self.client.get(self)

    def delete(self):
        return self.client.delete(self)
