"""The one in-memory tensor representation shared by the SDK and the server.

A ``SparseTensor`` holds numpy arrays in one of the layouts of SPEC section 2.
Dense tensors are plain ``numpy.ndarray``. A ``HandleRef`` names a tensor kept
in a server's store. Construction converts what it is given to arrays (without
a copy where the buffers allow) but does not validate: ``validate()`` runs the
SPEC invariants, which the server runs on every tensor it receives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

__all__ = ["SparseTensor", "HandleRef", "OutputRef", "LAYOUTS", "COMPRESSED_LAYOUTS", "BLOCK_LAYOUTS"]

LAYOUTS = ("coo", "csr", "csc", "bsr", "bsc")
COMPRESSED_LAYOUTS = ("csr", "csc", "bsr", "bsc")
BLOCK_LAYOUTS = ("bsr", "bsc")


@dataclass(frozen=True)
class HandleRef:
    """A reference to a tensor kept in the server's handle store."""

    handle: str


@dataclass(frozen=True)
class OutputRef:
    """In a pipeline step's arguments: the output ``"<step>.<output>"`` of an earlier step."""

    ref: str

    @property
    def step(self) -> str:
        return self.ref.partition(".")[0]


_INT64_RANGE = range(-(1 << 63), 1 << 63)


def _as_int64_vector(shape: Any) -> tuple[int, ...]:
    # Shapes are mostly tuples of Python ints already (every decoded tensor's is): kept as
    # they are, without a trip through numpy (a few microseconds on every small call).
    if type(shape) is tuple and all(type(d) is int and d in _INT64_RANGE for d in shape):
        return shape
    return tuple(int(d) for d in np.asarray(shape, dtype=np.int64).reshape(-1))


class SparseTensor:
    """A sparse tensor: COO (TensorFlow's convention) or CSR/CSC/BSR/BSC (PyTorch's).

    COO::

        SparseTensor(indices=[[0, 0], [1, 2]], values=[1.0, 2.0], dense_shape=[3, 4])

    ``indices`` is int64 ``[nnz, sparse_ndim]``, ``values`` is
    ``[nnz, *dense_shape[sparse_ndim:]]`` (a hybrid tensor when
    ``sparse_ndim < ndim``).

    Compressed::

        SparseTensor(layout="csr", compressed_indices=[0, 1, 2], plain_indices=[1, 0],
                     values=[5.0, 6.0], dense_shape=[2, 2])
    """

    __slots__ = ("layout", "dense_shape", "indices", "values", "compressed_indices",
                 "plain_indices", "blocksize", "coalesced", "__weakref__")

    def __init__(
        self,
        indices: Any = None,
        values: Any = None,
        dense_shape: Sequence[int] | None = None,
        *,
        layout: str = "coo",
        compressed_indices: Any = None,
        plain_indices: Any = None,
        blocksize: Sequence[int] | None = None,
        dtype: Any = None,
        coalesced: bool = False,
    ):
        layout = str(layout).lower()
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
        if dense_shape is None:
            raise ValueError("dense_shape is required")
        self.layout = layout
        self.dense_shape = _as_int64_vector(dense_shape)
        self.values = np.asarray([] if values is None else values, dtype=dtype)
        self.blocksize = None if blocksize is None else _as_int64_vector(blocksize)
        self.coalesced = bool(coalesced)
        if layout == "coo":
            idx = np.asarray([] if indices is None else indices)
            if idx.size == 0:
                # [] means "no entries": give it the [0, sparse_ndim] shape it implies.
                sparse_ndim = idx.shape[1] if idx.ndim == 2 else len(self.dense_shape)
                idx = idx.reshape(0, sparse_ndim)
            self.indices = idx.astype(np.int64) if idx.dtype != np.int64 and idx.dtype.kind in "iub" else idx
            if self.values.size == 0 and self.values.ndim == 1 and idx.ndim == 2:
                self.values = self.values.reshape((0, *self.dense_shape[idx.shape[1]:]))
            self.compressed_indices = self.plain_indices = None
        else:
            if compressed_indices is None or plain_indices is None:
                raise ValueError(f"layout {layout!r} needs compressed_indices and plain_indices")
            self.indices = None
            self.compressed_indices = np.asarray(compressed_indices)
            self.plain_indices = np.asarray(plain_indices)
            if self.compressed_indices.dtype == np.float64 and self.compressed_indices.size == 0:
                self.compressed_indices = self.compressed_indices.astype(np.int64)
            if self.plain_indices.dtype == np.float64 and self.plain_indices.size == 0:
                self.plain_indices = self.plain_indices.astype(self.compressed_indices.dtype)

    # ----------------------------------------------------------------- shape
    @property
    def shape(self) -> tuple[int, ...]:
        return self.dense_shape

    @property
    def ndim(self) -> int:
        return len(self.dense_shape)

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    @property
    def nnz(self) -> int:
        """Stored entries: rows of ``indices`` (COO) or plain indices per batch (compressed)."""
        if self.layout == "coo":
            return int(self.indices.shape[0]) if self.indices.ndim == 2 else 0
        return int(self.plain_indices.shape[-1]) if self.plain_indices.ndim else 0

    @property
    def sparse_ndim(self) -> int:
        if self.layout == "coo":
            return int(self.indices.shape[1]) if self.indices.ndim == 2 else 0
        return 2

    @property
    def batch_ndim(self) -> int:
        """Leading batch dimensions of a compressed tensor (0 for COO)."""
        if self.layout == "coo":
            return 0
        return max(self.compressed_indices.ndim - 1, 0)

    @property
    def dense_ndim(self) -> int:
        """Trailing dense dimensions (PyTorch's dense_dim)."""
        return self.ndim - self.batch_ndim - self.sparse_ndim

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The arrays in wire order (the order chunked transfers use)."""
        if self.layout == "coo":
            return (self.indices, self.values)
        return (self.compressed_indices, self.plain_indices, self.values)

    @property
    def nbytes(self) -> int:
        # Spelled out rather than summed over arrays(): read several times on every call.
        if self.layout == "coo":
            return int(self.indices.nbytes) + int(self.values.nbytes)
        return int(self.compressed_indices.nbytes) + int(self.plain_indices.nbytes) + int(self.values.nbytes)

    def __sizeof__(self) -> int:
        # With its arrays: Dask's memory accounting (spilling, the size check before a partitioned
        # answer is gathered) reads sys.getsizeof, which would otherwise count the object alone.
        return object.__sizeof__(self) + self.nbytes

    # ------------------------------------------------------------ conversion
    def validate(self, name: str = "tensor") -> "SparseTensor":
        """Check every SPEC section 2 invariant; raise ``InvalidArgumentError`` naming ``name``."""
        from ._validate import check_sparse

        check_sparse(self, name)
        return self

    def to_coo(self) -> "SparseTensor":
        """This tensor in COO layout (itself when it already is)."""
        from ._convert import compressed_to_coo

        return self if self.layout == "coo" else compressed_to_coo(self)

    def to_dense(self) -> np.ndarray:
        """The dense ``numpy.ndarray``, computed locally; repeated indices are summed."""
        from ._convert import sparse_to_numpy

        return sparse_to_numpy(self)

    def to_scipy(self):
        """A ``scipy.sparse`` array (coo_array, csr_array, csc_array or bsr_array) of a 2-D tensor."""
        from ._convert import sparse_to_scipy

        return sparse_to_scipy(self)

    def to_torch(self):
        """The ``torch`` sparse tensor in the same layout."""
        from ._convert import sparse_to_torch

        return sparse_to_torch(self)

    @classmethod
    def from_dense(cls, array: Any, sparse_dim: int | None = None) -> "SparseTensor":
        """The coalesced COO form of a dense array, computed locally (numpy)."""
        from ._convert import numpy_to_sparse

        return numpy_to_sparse(np.asarray(array), sparse_dim)

    def __repr__(self) -> str:
        parts = [f"layout={self.layout!r}", f"dense_shape={list(self.dense_shape)}",
                 f"dtype={self.dtype}", f"nnz={self.nnz}"]
        if self.blocksize is not None:
            parts.append(f"blocksize={list(self.blocksize)}")
        if self.layout == "coo" and self.nnz <= 8:
            parts.append(f"indices={self.indices.tolist()}")
            parts.append(f"values={self.values.tolist()}")
        return f"SparseTensor({', '.join(parts)})"


def coo_tensor(indices: Any, values: Any, dense_shape: tuple[int, ...], *, coalesced: bool = False,
               blocksize: tuple[int, ...] | None = None) -> SparseTensor:
    """``SparseTensor(indices=..., values=..., dense_shape=...)`` for a shape already held as a
    tuple of ints (a tensor's own, or ``check_shape``'s), built without ``__init__`` when its
    conversions would change nothing: ndarrays, int64 indices of rank 2, values not an empty
    vector. The decoders and the ops build every tensor of a call, and those conversions were a
    tenth of a small call's decoding."""
    if (type(indices) is np.ndarray and type(values) is np.ndarray and indices.ndim == 2
            and indices.dtype == np.int64 and (values.ndim != 1 or values.size > 0)):
        t = object.__new__(SparseTensor)
        t.layout, t.dense_shape, t.indices, t.values = "coo", dense_shape, indices, values
        t.blocksize, t.coalesced = blocksize, bool(coalesced)
        t.compressed_indices = t.plain_indices = None
        return t
    return SparseTensor(indices=indices, values=values, dense_shape=dense_shape, coalesced=coalesced,
                        blocksize=blocksize)
