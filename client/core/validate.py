"""The docs/contract.md ("Tensors") invariants, checked on every tensor that enters the server.

Kernels (numba does no bounds checks) may assume whatever is checked here, so
these checks are complete, not sampled, and use plain numpy: no kernel runs on
a tensor that has not passed them. The one exception is the server's compiled
range check of COO indices (``InRange``), which reads nothing but the arrays
it is given, within their own shapes. Each failure names the argument and the
broken rule and carries a stable ``reason`` word.
"""

from __future__ import annotations

import math
from typing import Callable, Protocol, TypeVar

import numpy as np

from .dtypes import INDEX_DTYPES, check_supported
from .layouts import BLOCK_LAYOUTS, LAYOUTS
from .errors import InvalidArgumentError
from .reasons import Reason

__all__ = ["check_shape", "check_sparse", "check_dense", "INT64_MAX"]

INT64_MAX = np.iinfo(np.int64).max


class Sparse(Protocol):
    """What validation reads of a sparse tensor (``sparseserve.core.tensor.SparseTensor``)."""

    @property
    def layout(self) -> str: ...
    @property
    def dense_shape(self) -> tuple[int, ...]: ...
    @property
    def values(self) -> np.ndarray: ...
    @property
    def indices(self) -> np.ndarray: ...  # COO
    @property
    def compressed_indices(self) -> np.ndarray: ...  # the compressed layouts
    @property
    def plain_indices(self) -> np.ndarray: ...
    @property
    def blocksize(self) -> tuple[int, ...] | None: ...


T = TypeVar("T", bound=Sparse)


def _fail(message: str, reason: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, reason=reason)


# The most elements whose bytes int64 can count at the widest dtype (complex128: 16 bytes).
EMPTY_SHAPE_MAX = INT64_MAX // 16


def check_shape(shape, name: str) -> tuple[int, ...]:
    """No negative dimension, and the element count fits in int64."""
    shape = tuple(map(int, shape))
    if shape and min(shape) < 0:
        axis = next(i for i, dim in enumerate(shape) if dim < 0)
        raise _fail(f"{name}[{axis}] = {shape[axis]} is negative", Reason.NEGATIVE_DIMENSION)
    total = math.prod(shape)  # Python ints: exact
    if total > INT64_MAX:
        raise _fail(f"{name} = {list(shape)} has {total} elements, more than int64 can count",
                    Reason.SHAPE_OVERFLOW)
    # numpy sizes an array by its nonzero dimensions even when one is zero, and refuses shapes
    # whose bytes could not be counted: such an empty shape would fail inside an op instead.
    if total == 0 and math.prod(d for d in shape if d) > EMPTY_SHAPE_MAX:
        raise _fail(f"{name} = {list(shape)} is empty, but its other dimensions multiply to more than "
                    f"{EMPTY_SHAPE_MAX} (2**59), past what an array can describe", Reason.SHAPE_OVERFLOW)
    return shape


# numpy's limit on an array's dimensions (NPY_MAXDIMS). A sparse tensor's dense_shape may
# have more (its indices stay 2-D); an array decoded from a wire may not.
ARRAY_MAX_RANK = 64


def check_array_shape(shape, name: str) -> tuple[int, ...]:
    """``check_shape`` for the shape an array is to be made with: also no more dimensions
    than numpy allows."""
    if len(shape) > ARRAY_MAX_RANK:
        raise _fail(f"{name} has {len(shape)} dimensions, more than the {ARRAY_MAX_RANK} an array can have",
                    Reason.TOO_MANY_DIMENSIONS)
    return check_shape(shape, name)


def check_dense(array: np.ndarray, name: str) -> np.ndarray:
    check_supported(array.dtype, name)
    check_shape(array.shape, f"{name}.shape")
    return array


def _first_bad(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(mask)), mask.shape))


# Up to this many index elements, a range check's temporaries are cheaper than its calls.
_SMALL_CHECK = 1 << 14


# ``in_range(indices, limits) -> bool``: a compiled answer to "is every int64 indices[i, j] in
# [0, limits[j])?" for [nnz, k] indices and k limits. The server passes one (numba's, a seventh
# of numpy's time on a small call); the SDK, which has no compiler, checks with numpy.
InRange = Callable[[np.ndarray, np.ndarray], bool]


def _check_index_range(indices: np.ndarray, limits: np.ndarray, name: str, limits_name: str,
                       in_range: InRange | None = None):
    """Every int64 ``indices[..., j]`` in ``[0, limits[j])`` (non-negative int64 limits); the
    message names the first offender and the limit (``limits_name[j]``) it breaks."""
    if indices.size == 0:
        return
    if in_range is not None:
        if in_range(indices, limits):
            return
    elif indices.size <= _SMALL_CHECK:  # one whole-array pass: fewer calls than per column
        # Read as uint64, a negative int64 index is 2**63 or more, above every limit: one
        # comparison checks both ends.
        if (indices.view(np.uint64) < limits.view(np.uint64)).all():
            return
    else:
        # One min/max pass per column, no nnz-sized temporaries unless something is wrong.
        # (Per column: numpy's axis-0 reduction over [nnz, k] is ten times slower.)
        flat = indices.reshape(-1, indices.shape[-1])
        if all(int(flat[:, j].min()) >= 0 and int(flat[:, j].max()) < int(limits[j])
               for j in range(flat.shape[1])):
            return
    pos = _first_bad((indices < 0) | (indices >= limits))
    column = pos[-1]
    raise _fail(
        f"{name}[{', '.join(map(str, pos))}] = {int(indices[pos])} is out of range for "
        f"{limits_name}[{column}] = {int(limits[column])}",
        Reason.INDEX_OUT_OF_RANGE,
    )


def _check_values_shape(values: np.ndarray, expected: tuple[int, ...], name: str, why: str):
    if tuple(values.shape) != expected:
        raise _fail(f"{name}.values has shape {list(values.shape)} but {why} imply {list(expected)}",
                    Reason.VALUES_SHAPE_MISMATCH)


def check_sparse(t: T, name: str, in_range: InRange | None = None) -> T:
    """All docs/contract.md ("Tensors") invariants of a sparse tensor; raises ``InvalidArgumentError``.
    ``in_range``: a compiled check of COO index ranges (see ``InRange``)."""
    if t.layout not in LAYOUTS:
        raise _fail(f"{name}.layout = {t.layout!r} is not one of {', '.join(LAYOUTS)}", Reason.BAD_LAYOUT)
    shape = check_shape(t.dense_shape, f"{name}.dense_shape")
    check_supported(t.values.dtype, f"{name}.values")
    if t.layout == "coo":
        _check_coo(t, shape, name, in_range)
    else:
        _check_compressed(t, shape, name)
    return t


def _check_coo(t: Sparse, shape: tuple[int, ...], name: str, in_range: InRange | None):
    idx = t.indices
    if idx.dtype != np.int64:
        raise _fail(f"{name}.indices has dtype {idx.dtype}; COO indices are int64", Reason.INDEX_DTYPE)
    if idx.ndim != 2:
        raise _fail(f"{name}.indices has rank {idx.ndim}; COO indices are [nnz, sparse_ndim]",
                    Reason.INDICES_RANK)
    nnz, sparse_ndim = idx.shape
    if not 1 <= sparse_ndim <= len(shape):
        raise _fail(
            f"{name}.indices has {sparse_ndim} columns but dense_shape has rank {len(shape)}; "
            f"sparse_ndim must be between 1 and the rank", Reason.RANK_MISMATCH)
    # Keys over the sparse dimensions are int64 even when a dense dimension of 0 makes the
    # whole tensor empty (otherwise they are: their product divides the whole's).
    if sparse_ndim < len(shape) and not math.prod(shape):
        check_shape(shape[:sparse_ndim], f"{name}.dense_shape[:{sparse_ndim}]")
    _check_values_shape(t.values, (nnz, *shape[sparse_ndim:]), name,
                        f"nnz = {nnz} and dense_shape[{sparse_ndim}:]")
    _check_index_range(idx, np.asarray(shape[:sparse_ndim], dtype=np.int64), f"{name}.indices",
                       f"{name}.dense_shape", in_range)


def _check_compressed(t: Sparse, shape: tuple[int, ...], name: str):
    ci, pi = t.compressed_indices, t.plain_indices
    for arr, field in ((ci, "compressed_indices"), (pi, "plain_indices")):
        if arr.dtype not in INDEX_DTYPES:
            raise _fail(f"{name}.{field} has dtype {arr.dtype}; index dtype must be int32 or int64",
                        Reason.INDEX_DTYPE)
    if ci.dtype != pi.dtype:
        raise _fail(f"{name}.compressed_indices ({ci.dtype}) and plain_indices ({pi.dtype}) "
                    "must share one index dtype", Reason.INDEX_DTYPE)
    if ci.ndim < 1 or pi.ndim != ci.ndim:
        raise _fail(f"{name}.compressed_indices has rank {ci.ndim} and plain_indices rank {pi.ndim}; "
                    "both are [*batch, n] with the same batch dimensions", Reason.INDICES_RANK)
    batch = tuple(ci.shape[:-1])
    if tuple(pi.shape[:-1]) != batch:
        raise _fail(f"{name}.plain_indices batch shape {list(pi.shape[:-1])} differs from "
                    f"compressed_indices batch shape {list(batch)}", Reason.BATCH_MISMATCH)
    nb = len(batch)
    if len(shape) < nb + 2:
        raise _fail(f"{name}.dense_shape has rank {len(shape)}; a {t.layout} tensor with {nb} batch "
                    f"dimensions needs at least {nb + 2}", Reason.RANK_MISMATCH)
    if tuple(shape[:nb]) != batch:
        raise _fail(f"{name}.dense_shape[:{nb}] = {list(shape[:nb])} differs from the index batch "
                    f"shape {list(batch)}", Reason.BATCH_MISMATCH)
    rows, cols = shape[nb], shape[nb + 1]
    block: tuple[int, ...] = (1, 1)
    if t.layout in BLOCK_LAYOUTS:
        bs = t.blocksize
        if bs is None or len(bs) != 2 or min(bs) < 1:
            raise _fail(f"{name}.blocksize = {None if bs is None else list(bs)} must be two positive "
                        f"integers for layout {t.layout}", Reason.BLOCKSIZE)
        if rows % bs[0] or cols % bs[1]:
            raise _fail(f"{name}.blocksize = {list(bs)} does not divide the sparse dimensions "
                        f"{[rows, cols]}", Reason.BLOCKSIZE)
        block = tuple(bs)
    elif t.blocksize is not None:
        raise _fail(f"{name}.blocksize is only allowed for bsr and bsc, not {t.layout}", Reason.BLOCKSIZE)
    row_major = t.layout in ("csr", "bsr")
    n_compressed = (rows // block[0]) if row_major else (cols // block[1])
    n_plain = (cols // block[1]) if row_major else (rows // block[0])
    if ci.shape[-1] != n_compressed + 1:
        raise _fail(f"{name}.compressed_indices has {ci.shape[-1]} entries per batch; "
                    f"{t.layout} of dense_shape {list(shape)} needs {n_compressed + 1}",
                    Reason.COMPRESSED_LENGTH)
    nse = pi.shape[-1]
    dense_dims = tuple(shape[nb + 2:])
    value_block = block if t.layout in BLOCK_LAYOUTS else ()
    _check_values_shape(t.values, (*batch, nse, *value_block, *dense_dims), name,
                        "the batch shape, nse, blocksize and dense dimensions")
    if ci.size:
        # Python ints from here on: no overflow whatever the index dtype.
        ci64 = ci.astype(np.int64, copy=False)
        first = ci64[..., 0]
        if np.any(first != 0):
            pos = _first_bad(first != 0)
            raise _fail(f"{name}.compressed_indices[{', '.join(map(str, pos + (0,)))}] = "
                        f"{int(first[pos])}; compressed indices start at 0", Reason.COMPRESSED_START)
        steps = np.diff(ci64, axis=-1)
        if steps.size and np.any(steps < 0):
            pos = _first_bad(steps < 0)
            raise _fail(f"{name}.compressed_indices decreases at position "
                        f"[{', '.join(map(str, pos[:-1] + (pos[-1] + 1,)))}]; compressed indices "
                        "never decrease", Reason.COMPRESSED_DECREASING)
        if steps.size and np.any(steps > n_plain):
            pos = _first_bad(steps > n_plain)
            raise _fail(f"{name}.compressed_indices steps by {int(steps[pos])} at position "
                        f"[{', '.join(map(str, pos))}], more than the plain dimension {n_plain}",
                        Reason.COMPRESSED_STEP)
        last = ci64[..., -1]
        if np.any(last != nse):
            pos = _first_bad(last != nse)
            raise _fail(f"{name}.compressed_indices ends at {int(last[pos])} but nse = {nse}; "
                        "compressed indices end at nse", Reason.COMPRESSED_END)
    if pi.size and (int(pi.min()) < 0 or int(pi.max()) >= n_plain):
        pos = _first_bad((pi < 0) | (pi >= n_plain))
        raise _fail(f"{name}.plain_indices[{', '.join(map(str, pos))}] = {int(pi[pos])} is out of "
                    f"range for the plain dimension {n_plain}", Reason.INDEX_OUT_OF_RANGE)
