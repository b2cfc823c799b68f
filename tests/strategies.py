"""Inputs for every test: random values and sparse tensors, in every layout.

Two levels, one implementation:

* builders that take a ``numpy.random.Generator`` (``random_values``, ``random_coo``,
  ``random_compressed``), for parametrised tests and for anything built from a fixed seed;
* hypothesis strategies that draw the builders' arguments and a seed (``coo_tensors``,
  ``layout_specs``, ``compressed_tensors``, ``sparse_tensors``), for property tests. A failing
  example shrinks through the drawn arguments; the seed only fills in the numbers.

What the tensors hold, unless asked otherwise: every dtype of docs/contract.md ("Tensors"), ranks 1 to 5 with
dimensions up to 4 (empty ones included), hybrid values (dense trailing dimensions), batches
for the compressed layouts, repeated and unsorted indices, small exact values (integers, halves
for floats: sums are exact even in float16). Each knob narrows that where an op or a library
takes less (``hybrid=False`` for TensorFlow, ``canonical=True`` where an op needs it, ...).

Imported as ``from strategies import ...`` from every folder of ``tests/`` alike (pytest puts
``tests/`` on the path for ``conftest.py``).
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from sparseserve import SparseTensor
from sparseserve.core.dtypes import DTYPE_NAMES

__all__ = ["DTYPES", "LAYOUTS", "COMPRESSED", "random_values", "random_coo", "random_compressed",
           "coo_tensors", "layout_specs", "compressed_tensors", "sparse_tensors"]

DTYPES: tuple[str, ...] = tuple(DTYPE_NAMES)
LAYOUTS = ("coo", "csr", "csc", "bsr", "bsc")
COMPRESSED = ("csr", "csc", "bsr", "bsc")


# ------------------------------------------------------------------ builders
def random_values(rng: np.random.Generator, shape, dtype, *, low: int = -5, high: int = 5,
                  halves: bool = True, normal: bool = False) -> np.ndarray:
    """Small exact values of ``dtype``: integers in ``[low, high]`` (unsigned ones from
    ``max(low, 0)``), halved for real floats (so sums stay exact in float16 too), complex with an
    imaginary part drawn alike; bools at random, or all True where ``low > 0`` (no value is zero
    then, so a dense comparison sees every stored entry).

    ``normal``: standard-normal floats and complex values instead, whose sums round: any change
    of summation order shows."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.ones(shape, bool) if low > 0 else rng.integers(0, 2, size=shape).astype(bool)
    if normal and dtype.kind in "fc":
        out = rng.standard_normal(shape)
        if dtype.kind == "c":
            out = out + 1j * rng.standard_normal(shape)
        return np.asarray(out.astype(dtype))
    raw = rng.integers(max(low, 0) if dtype.kind == "u" else low, high + 1, size=shape)
    if dtype.kind == "c":
        return np.asarray((raw + 1j * rng.integers(low, high + 1, size=shape)).astype(dtype))
    if dtype.kind == "f" and halves:
        return np.asarray((raw / 2).astype(dtype))
    return np.asarray(raw.astype(dtype))


def _row_major(idx: np.ndarray) -> np.ndarray:
    """Rows of ``idx`` in row-major order, stably (repeats keep their order)."""
    return idx[np.lexsort(idx.T[::-1])] if idx.shape[0] and idx.shape[1] else idx


def random_coo(rng: np.random.Generator, shape, nnz: int, dtype="float64", sparse_ndim: int | None = None, *,
               duplicates: bool = True, repeat: bool | None = None, sort: bool = False, span: int | None = None,
               coalesced: bool = False, values: dict | None = None) -> SparseTensor:
    """A COO tensor of ``shape`` with ``nnz`` entries over its first ``sparse_ndim`` dimensions
    (all of them by default; 0 gives ``nnz`` entries at the one position ``()``), and none where
    one of those dimensions is 0.

    duplicates: positions drawn independently, so they may repeat, and with ``repeat`` (default:
        when ``nnz > 2``) the last one a copy of the first; False: distinct positions (as many as
        there are, at most).
    span: positions drawn below ``span`` in each dimension (small spans repeat often).
    sort: in row-major order (stable: repeats stay); else in the order drawn.
    coalesced: distinct and sorted, and flagged so.
    values: keyword arguments of ``random_values`` (the value range, ``normal``).
    """
    shape = tuple(int(d) for d in shape)
    s = len(shape) if sparse_ndim is None else sparse_ndim
    lead = shape[:s]
    cells = math.prod(lead)
    if coalesced:
        duplicates, sort = False, True
    if cells == 0:
        nnz = 0
    if not s:
        idx = np.zeros((nnz, 0), np.int64)
    elif not nnz:
        idx = np.zeros((0, s), np.int64)
    elif duplicates:
        idx = np.stack([rng.integers(0, min(d, span or d), nnz) for d in lead], axis=1).astype(np.int64)
        if (nnz > 2 if repeat is None else repeat and nnz > 1):
            idx[-1] = idx[0]
    else:
        flat = rng.choice(cells, size=min(nnz, cells), replace=False)
        idx = np.stack(np.unravel_index(flat, lead), axis=1).astype(np.int64)
    if sort:
        idx = _row_major(idx)
    vals = random_values(rng, (idx.shape[0], *shape[s:]), dtype, **(values or {}))
    return SparseTensor(indices=idx, values=vals, dense_shape=shape, coalesced=coalesced)


def random_compressed(rng: np.random.Generator, layout: str, shape, nse: int | None = None, dtype="float64", *,
                      batch_ndim: int = 0, blocksize=None, index_dtype="int64", canonical: bool = False,
                      repeat: bool = False, values: dict | None = None) -> SparseTensor:
    """A CSR, CSC, BSR or BSC tensor of ``shape`` = ``(*batch, rows, cols, *dense)`` (the first
    ``batch_ndim`` dimensions batches, those after the two sparse ones dense) with ``nse``
    stored elements (blocks of ``blocksize`` for BSR/BSC, which must divide rows and cols) in
    every batch, at most one per position; drawn at random where None.

    canonical: each segment's plain indices strictly increase. Otherwise they come in any order
    and may repeat within a segment (docs/contract.md, "Tensors", allows that), and ``repeat`` makes the first
    two plain indices equal where they share a segment.
    values: keyword arguments of ``random_values``."""
    shape = tuple(int(d) for d in shape)
    batch_shape, (rows, cols), dense_dims = shape[:batch_ndim], shape[batch_ndim:batch_ndim + 2], \
        shape[batch_ndim + 2:]
    blocked = layout in ("bsr", "bsc")
    br, bc = tuple(blocksize) if blocked else (1, 1)
    row_major = layout in ("csr", "bsr")
    n_comp, n_plain = (rows // br, cols // bc) if row_major else (cols // bc, rows // br)
    cells = n_comp * n_plain
    n_batch = math.prod(batch_shape)
    if nse is None:
        nse = int(rng.integers(0, cells + 1))
    nse = min(nse, cells)
    ci = np.zeros((n_batch, n_comp + 1), np.int64)
    pi = np.zeros((n_batch, nse), np.int64)
    for b in range(n_batch):
        pos = np.sort(rng.choice(cells, size=nse, replace=False)) if nse else np.zeros(0, np.int64)
        comp = pos // max(n_plain, 1)
        if canonical:
            plain = pos % max(n_plain, 1)
        else:
            plain = rng.integers(0, n_plain, nse) if nse else np.zeros(0, np.int64)
            if repeat and nse > 1 and comp[1] == comp[0]:
                plain[1] = plain[0]
        ci[b, 1:] = np.cumsum(np.bincount(comp, minlength=n_comp))
        pi[b] = plain
    blocks = (br, bc) if blocked else ()
    vals = random_values(rng, (*batch_shape, nse, *blocks, *dense_dims), dtype, **(values or {}))
    return SparseTensor(layout=layout, compressed_indices=ci.reshape(*batch_shape, n_comp + 1).astype(index_dtype),
                        plain_indices=pi.reshape(*batch_shape, nse).astype(index_dtype), values=vals,
                        dense_shape=shape, blocksize=(br, bc) if blocked else None)


# ------------------------------------------------------------------ strategies
@st.composite
def coo_tensors(draw, dtypes=DTYPES, *, min_rank: int = 1, max_rank: int = 5, shape=None,
                sparse_ndim: int | None = None, hybrid: bool = True, duplicates: bool = True,
                unsorted: bool = True, coalesced: bool | None = False, max_nnz: int = 12, min_dim: int = 0,
                max_dim: int | None = None, values: dict | None = None) -> SparseTensor:
    """COO tensors of rank ``min_rank``..``max_rank`` (dimensions up to ``max_dim``, by default 4
    and 3 at rank 5; empty ones unless ``min_dim``) or of ``shape``, with any of ``dtypes`` and up
    to ``max_nnz`` entries; hybrid (dense trailing dimensions) unless ``hybrid=False`` or
    ``sparse_ndim`` is given; repeated indices when ``duplicates`` (sometimes a forced repeat),
    unsorted when ``unsorted`` (each sometimes); ``coalesced``: True draws coalesced tensors
    (distinct, sorted, flagged), None either kind. ``values``: keyword arguments of
    ``random_values``."""
    if shape is None:
        rank = draw(st.integers(min_rank, max_rank))
        top = max_dim if max_dim is not None else 4 if rank < 5 else 3
        shape = tuple(draw(st.lists(st.integers(min_dim, top), min_size=rank, max_size=rank)))
    rank = len(shape)
    if sparse_ndim is None:
        sparse_ndim = draw(st.integers(1, rank)) if hybrid else rank
    dtype = draw(st.sampled_from(dtypes))
    if coalesced is None:
        coalesced = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    nnz = 0 if math.prod(shape[:sparse_ndim]) == 0 else draw(st.integers(0, max_nnz))
    if coalesced:
        repeat = sort = False
    else:
        repeat = duplicates and nnz > 2 and draw(st.booleans())
        sort = not unsorted or draw(st.booleans())
    return random_coo(np.random.default_rng(seed), shape, nnz, dtype, sparse_ndim, duplicates=duplicates,
                      repeat=repeat, sort=sort, coalesced=coalesced, values=values)


@st.composite
def layout_specs(draw, layouts=COMPRESSED, *, batch: bool = True, dense: bool = True) -> dict:
    """The shape of a compressed tensor, as ``random_compressed``'s keyword arguments: a layout,
    0-2 batch dimensions of 1-3 (when ``batch``), rows and cols of 0-3 blocks (1x1 for CSR/CSC,
    up to 2x3 for BSR/BSC), 0-1 dense dimensions of 0-3 (when ``dense``), int32 or int64 indices."""
    layout = draw(st.sampled_from(layouts))
    block = (draw(st.integers(1, 2)), draw(st.integers(1, 3))) if layout in ("bsr", "bsc") else (1, 1)
    rows, cols = block[0] * draw(st.integers(0, 3)), block[1] * draw(st.integers(0, 3))
    batch_shape = tuple(draw(st.lists(st.integers(1, 3), max_size=2))) if batch and draw(st.booleans()) else ()
    dense_dims = tuple(draw(st.lists(st.integers(0, 3), max_size=1))) if dense else ()
    index_dtype = draw(st.sampled_from(["int32", "int64"]))
    return {"layout": layout, "shape": (*batch_shape, rows, cols, *dense_dims), "batch_ndim": len(batch_shape),
            "blocksize": block if layout in ("bsr", "bsc") else None, "index_dtype": index_dtype}


@st.composite
def compressed_tensors(draw, spec: dict | None = None, dtypes=DTYPES, *, layouts=COMPRESSED, batch: bool = True,
                       dense: bool = True, canonical: bool | None = None, max_nse: int = 6,
                       values: dict | None = None) -> SparseTensor:
    """Compressed tensors of ``spec`` (from ``layout_specs``; drawn from ``layouts``, ``batch``
    and ``dense`` when None) with up to ``max_nse`` stored elements in each batch, any of
    ``dtypes``; canonical (each segment's plain indices strictly increasing: True), with repeats
    and disorder within segments (False), or either (None)."""
    spec = spec or draw(layout_specs(layouts, batch=batch, dense=dense))
    if canonical is None:
        canonical = draw(st.booleans())
    batch_ndim = spec["batch_ndim"]
    rows, cols = spec["shape"][batch_ndim:batch_ndim + 2]
    br, bc = spec["blocksize"] or (1, 1)
    cells = (rows // br) * (cols // bc)
    nse = 0 if cells == 0 else draw(st.integers(0, min(max_nse, cells)))
    repeat = not canonical and nse > 1 and draw(st.booleans())
    dtype = draw(st.sampled_from(dtypes))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return random_compressed(rng, nse=nse, dtype=dtype, canonical=canonical, repeat=repeat, values=values, **spec)


@st.composite
def sparse_tensors(draw, layouts=LAYOUTS, dtypes=DTYPES, *, batch: bool = True, dense: bool = True,
                   canonical: bool | None = None, values: dict | None = None) -> SparseTensor:
    """Sparse tensors in any of ``layouts``: COO as ``coo_tensors`` (hybrid when ``dense``;
    coalesced when ``canonical``, either when it is None), the others as
    ``compressed_tensors``."""
    layout = draw(st.sampled_from(layouts))
    if layout == "coo":
        return draw(coo_tensors(dtypes, hybrid=dense, coalesced=canonical, values=values))
    return draw(compressed_tensors(dtypes=dtypes, layouts=(layout,), batch=batch, dense=dense,
                                   canonical=canonical, values=values))
