"""The one in-memory tensor representation shared by the SDK and the server.

A ``SparseTensor`` holds numpy arrays in one of the layouts of docs/contract.md ("Tensors").
Dense tensors are plain ``numpy.ndarray``. A ``HandleRef`` names a tensor kept
in a server's store. Construction converts what it is given to arrays (without
a copy where the buffers allow) but does not validate: ``validate()`` runs the
contract invariants (docs/contract.md, "Tensors"), which the server runs on every tensor it receives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .layouts import BLOCK_LAYOUTS, COMPRESSED_LAYOUTS, LAYOUTS
from .validate import check_sparse

__all__ = ["SparseTensor", "HandleRef", "TensorInfo", "OutputRef", "LAYOUTS", "COMPRESSED_LAYOUTS", "BLOCK_LAYOUTS"]



@dataclass(frozen=True)
class TensorInfo:
    """What a kept tensor is, without its data: a sparse ``layout`` (coo, csr, csc, bsr, bsc) or
    ``"dense"``, its dtype, shape, ``nnz`` (a sparse tensor's stored entries, as
    ``SparseTensor.nnz`` counts them; a dense array's element count) and ``nbytes`` (what it
    takes in the server's store)."""

    layout: str
    dtype: np.dtype
    shape: tuple[int, ...]
    nnz: int
    nbytes: int

    @classmethod
    def of(cls, t: Any, nbytes: int) -> "TensorInfo":
        """The description of a ``SparseTensor`` or an array (numpy's, or a device array)."""
        shape = tuple(int(d) for d in (t.dense_shape if isinstance(t, SparseTensor) else t.shape))
        if isinstance(t, SparseTensor):
            return cls(t.layout, np.dtype(t.dtype), shape, t.nnz, nbytes)
        return cls("dense", np.dtype(t.dtype), shape, math.prod(shape), nbytes)


@dataclass(frozen=True)
class HandleRef:
    """A reference to a tensor kept in the server's handle store; ``info`` describes it where
    the server said (a kept output) or the client knows (its own put)."""

    handle: str
    info: TensorInfo | None = field(default=None, compare=False)


@dataclass(frozen=True)
class OutputRef:
    """In a pipeline step's arguments: the output ``"<step>.<output>"`` of an earlier step."""

    ref: str

    @property
    def step(self) -> str:
        return self.ref.partition(".")[0]


_INT64_RANGE = range(-(1 << 63), 1 << 63)
# The arrays a layout does not have: None, typed to stand where an array is declared.
ABSENT: Any = None


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
    layout: str
    dense_shape: tuple[int, ...]
    values: np.ndarray
    # A layout's own arrays: ``indices`` (COO), or ``compressed_indices`` and ``plain_indices``;
    # the other layout's are None (``ABSENT``). Typed as arrays: code reads them by layout.
    indices: np.ndarray
    compressed_indices: np.ndarray
    plain_indices: np.ndarray
    blocksize: tuple[int, ...] | None
    coalesced: bool

    def __init__(
        self,
        indices: Any = None,
        values: Any = None,
        dense_shape: Sequence[int] | np.ndarray | None = None,
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
            self.compressed_indices = self.plain_indices = ABSENT
        else:
            if compressed_indices is None or plain_indices is None:
                raise ValueError(f"layout {layout!r} needs compressed_indices and plain_indices")
            self.indices = ABSENT
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
        """Check every docs/contract.md ("Tensors") invariant; raise ``InvalidArgumentError`` naming ``name``."""
        check_sparse(self, name)
        return self

    def to_coo(self) -> "SparseTensor":
        """This tensor in COO layout (itself when it already is)."""
        return self if self.layout == "coo" else compressed_to_coo(self)

    def to_dense(self) -> np.ndarray:
        """The dense ``numpy.ndarray``, computed locally; repeated indices are summed."""
        return sparse_to_numpy(self)

    def to_scipy(self):
        """A ``scipy.sparse`` array (coo_array, csr_array, csc_array or bsr_array) of a 2-D tensor."""
        return sparse_to_scipy(self)

    def to_torch(self):
        """The ``torch`` sparse tensor in the same layout."""
        return sparse_to_torch(self)

    @classmethod
    def from_dense(cls, array: Any, sparse_dim: int | None = None) -> "SparseTensor":
        """The coalesced COO form of a dense array, computed locally (numpy)."""
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
        t.compressed_indices = t.plain_indices = ABSENT
        return t
    return SparseTensor(indices=indices, values=values, dense_shape=dense_shape, coalesced=coalesced,
                        blocksize=blocksize)


# ------------------------------------------------------------------ conversions of the to_*/from_* methods
def numpy_to_sparse(array: np.ndarray, sparse_dim: int | None = None) -> SparseTensor:
    """Coalesced COO of a dense array; only all-zero sub-arrays are dropped (torch's to_sparse)."""
    sparse_dim = array.ndim if sparse_dim is None else int(sparse_dim)
    lead = array.shape[:sparse_dim]
    rows = array.reshape(int(np.prod(lead, dtype=np.int64)), -1)
    keep = np.flatnonzero(np.any(rows != 0, axis=1))
    indices = np.stack(np.unravel_index(keep, lead), axis=1) if keep.size else np.zeros((0, sparse_dim))
    return SparseTensor(indices=indices.astype(np.int64), values=rows[keep].reshape(-1, *array.shape[sparse_dim:]),
                        dense_shape=array.shape, coalesced=True)


def compressed_to_coo(t: SparseTensor) -> SparseTensor:
    """CSR/CSC/BSR/BSC (batched, hybrid) -> COO with indices over batch and both sparse dims."""
    nb = t.batch_ndim
    batch = t.dense_shape[:nb]
    n_batch = int(np.prod(batch, dtype=np.int64))
    # Explicit lengths: a batch dimension of 0 leaves nothing for -1 to infer from.
    ci = t.compressed_indices.reshape(n_batch, t.compressed_indices.shape[-1]).astype(np.int64)
    pi = t.plain_indices.reshape(n_batch, t.plain_indices.shape[-1]).astype(np.int64)
    nse = pi.shape[1]
    block = tuple(t.blocksize) if t.layout in BLOCK_LAYOUTS and t.blocksize else (1, 1)
    dense_dims = t.dense_shape[nb + 2:]
    values = t.values.reshape(n_batch, nse, *block, *dense_dims)
    counts = np.diff(ci, axis=1)
    # The compressed coordinate of every stored entry, per batch.
    comp = np.concatenate([np.repeat(np.arange(counts.shape[1]), counts[b]) for b in range(n_batch)]) \
        if n_batch else np.zeros(0, np.int64)
    plain = pi.reshape(-1)
    batch_id = np.repeat(np.arange(n_batch), nse)
    block_row, block_col = (comp, plain) if t.layout in ("csr", "bsr") else (plain, comp)
    # Expand each block into its block[0] * block[1] elements.
    r_in, c_in = np.meshgrid(np.arange(block[0]), np.arange(block[1]), indexing="ij")
    rows = (block_row[:, None] * block[0] + r_in.reshape(1, -1)).reshape(-1)
    cols = (block_col[:, None] * block[1] + c_in.reshape(1, -1)).reshape(-1)
    batch_ids = np.repeat(batch_id, block[0] * block[1])
    batch_coords = np.unravel_index(batch_ids, batch) if nb else ()
    indices = np.stack([*batch_coords, rows, cols], axis=1).astype(np.int64)
    n = n_batch * nse * block[0] * block[1]
    return SparseTensor(indices=indices.reshape(n, nb + 2),
                        values=values.reshape(n, *dense_dims), dense_shape=t.dense_shape)


def sparse_to_numpy(t: SparseTensor) -> np.ndarray:
    coo = t.to_coo()
    out = np.zeros(coo.dense_shape, dtype=coo.values.dtype)
    if coo.nnz:
        key = tuple(coo.indices.T)
        if coo.values.dtype == np.bool_:
            np.logical_or.at(out, key, coo.values)
        else:
            np.add.at(out, key, coo.values)
    return out


def sparse_to_scipy(t: SparseTensor):
    import scipy.sparse as sp

    if t.layout == "bsc":
        raise ValueError("scipy.sparse has no BSC format; convert the tensor to bsr or csc first")
    if t.batch_ndim:
        raise ValueError(f"scipy.sparse holds single 2-D matrices; this {t.layout} tensor has "
                         f"{t.batch_ndim} batch dimensions (dense_shape {list(t.dense_shape)}): "
                         "convert each batch, or use to_torch()")
    if t.ndim != 2 or t.dense_ndim != 0:
        raise ValueError(f"scipy.sparse holds 2-D tensors without dense dimensions; this one has "
                         f"dense_shape {list(t.dense_shape)} with {t.dense_ndim} dense dimensions")
    if t.layout == "coo":
        return sp.coo_array((t.values, (t.indices[:, 0], t.indices[:, 1])), shape=t.dense_shape)
    if t.layout == "csr":
        return sp.csr_array((t.values, t.plain_indices, t.compressed_indices), shape=t.dense_shape)
    if t.layout == "csc":
        return sp.csc_array((t.values, t.plain_indices, t.compressed_indices), shape=t.dense_shape)
    if t.layout == "bsr":
        return sp.bsr_array((t.values, t.plain_indices, t.compressed_indices), shape=t.dense_shape,
                            blocksize=tuple(t.blocksize or ()))
    raise ValueError(f"unknown layout {t.layout!r}")


def _to_torch_array(a: np.ndarray):
    import torch

    # Arrays decoded from the wire are read-only views of the message; torch
    # tensors are always writable, so those are copied.
    a = np.ascontiguousarray(a)
    return torch.from_numpy(a if a.flags.writeable else a.copy())


def sparse_to_torch(t: SparseTensor):
    import torch

    # torch's invariant checks are on: a SparseTensor built by hand may not have been validated.
    if t.layout == "coo":
        return torch.sparse_coo_tensor(_to_torch_array(t.indices.T), _to_torch_array(t.values),
                                       size=t.dense_shape, is_coalesced=t.coalesced or None,
                                       check_invariants=True)
    ctor = {"csr": torch.sparse_csr_tensor, "csc": torch.sparse_csc_tensor,
            "bsr": torch.sparse_bsr_tensor, "bsc": torch.sparse_bsc_tensor}[t.layout]
    return ctor(_to_torch_array(t.compressed_indices), _to_torch_array(t.plain_indices),
                _to_torch_array(t.values), size=t.dense_shape, check_invariants=True)
