"""Array kernels of the GPU backend: the work of the ``cuda`` op kernels, as array code over a
namespace pair.

Every function takes ``xp`` (numpy's API: CuPy on a GPU host, numpy in the tests) and, where
it builds sparse matrices, ``sparse`` (scipy.sparse's API: ``cupyx.scipy.sparse``, whose
products run in cuSPARSE, or scipy.sparse). The same code runs on both, so each GPU code path
is checked on a machine without a GPU. Only APIs that numpy and CuPy share are used: no
``ufunc.reduceat``/``ufunc.at`` (repeated-index sums go through the ``scatter_add`` the caller
passes: ``cupyx.scatter_add`` or ``numpy.add.at``), no ``repeat`` with array counts (CuPy takes
only host counts; rows of compressed entries come from ``searchsorted`` instead), no Python
loops over entries, and ``numpy`` itself only for dtype metadata. A few scalars come back to
the host (output sizes, whether an order check passed); nothing else leaves the device.

Results equal the CPU kernels' (``kernels/coo.py``, ``compressed.py``, ``linalg.py``): the same
entry order (stable sorts where the CPU kernels are stable), index dtypes and explicit zeros.
Sums of repeated entries run in other orders (atomics), so floats agree up to rounding; a run
of one entry is copied, never added to zero, so -0.0 stays -0.0 as on the CPU.
Inputs are validated tensors (docs/contract.md ("Tensors")) and the op layer has checked the arguments.
"""

from __future__ import annotations

import numpy as np

__all__ = ["linearize", "argsort_stable", "is_strictly_increasing", "runs", "segment_sum", "scatter_sum",
           "reorder", "coalesce", "fill_dense", "group_max", "expand_pointers", "compress", "transpose_compressed",
           "segments_strictly_increase", "matrix", "spmm", "spgemm"]

INT32_MAX = int(np.iinfo(np.int32).max)


# ------------------------------------------------------------------ keys and sorting
def linearize(xp, indices, shape):
    """Row-major int64 keys of ``indices`` [n, s] over ``shape`` (s dimensions whose product
    fits int64, as validated tensors' do)."""
    n, s = indices.shape
    if s == 0:
        return xp.zeros(n, xp.int64)
    keys = indices[:, 0].astype(xp.int64)
    for j in range(1, s):
        keys = keys * int(shape[j]) + indices[:, j]
    return keys


def argsort_stable(xp, keys):
    """The stable sorting permutation (CuPy's sorts are always stable; numpy's on request)."""
    return xp.argsort(keys, kind="stable")


def is_strictly_increasing(xp, keys) -> bool:
    """Sorted and unique (one scalar to the host)."""
    return keys.shape[0] < 2 or bool(xp.all(keys[1:] > keys[:-1]))


def _is_sorted(xp, keys) -> bool:
    return keys.shape[0] < 2 or bool(xp.all(keys[1:] >= keys[:-1]))


def runs(xp, sorted_keys):
    """(first, group, n_groups) of the runs of equal keys in ``sorted_keys``: ``first`` marks
    each run's first entry, ``group`` numbers every entry's run (int64)."""
    n = sorted_keys.shape[0]
    first = xp.empty(n, dtype=xp.bool_)
    first[:1] = True
    if n > 1:
        first[1:] = sorted_keys[1:] != sorted_keys[:-1]
    group = xp.cumsum(first, dtype=xp.int64) - 1
    n_groups = int(group[-1]) + 1 if n else 0
    return first, group, n_groups


# ------------------------------------------------------------------ sums of repeated entries
# Each dtype is summed in a "work" form that cupyx.scatter_add takes (CUDA atomicAdd: int32,
# uint32, uint64, float32, float64): int64 as its uint64 bits (two's complement addition is
# the same), narrow integers widened to 64 bits (the sum wraps to the same value once cast
# back), float16 in float32 (as the CPU kernels sum it), complex as pairs of its real parts,
# bool as a count (logical or).
def _to_work(xp, values2d):
    values2d = xp.ascontiguousarray(values2d)
    dtype = np.dtype(values2d.dtype)
    if dtype == np.bool_:
        return values2d.astype(xp.uint32)
    if dtype == np.float16:
        return values2d.astype(xp.float32)
    if dtype.name in ("float32", "float64", "int32", "uint32", "uint64"):
        return values2d
    if dtype == np.int64:
        return values2d.view(xp.uint64)
    if dtype.kind == "i":
        return values2d.astype(xp.int64).view(xp.uint64)
    if dtype.kind == "u":
        return values2d.astype(xp.uint64)
    if dtype.kind == "c":
        part = xp.float32 if dtype == np.complex64 else xp.float64
        return values2d.view(part)  # [n, 2 * inner]: real and imaginary parts side by side
    raise TypeError(f"no sum for {dtype}")


def _from_work(xp, work2d, dtype: np.dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return work2d > 0
    if dtype == np.float16 or (dtype.kind == "u" and dtype.itemsize < 4):
        return work2d.astype(dtype)
    if dtype.kind == "i" and dtype.itemsize < 4:
        return work2d.view(xp.int64).astype(dtype)
    if dtype.kind == "c" or dtype == np.int64:
        return xp.ascontiguousarray(work2d).view(dtype)
    return work2d


def segment_sum(xp, values2d, first, group, n_groups: int, scatter_add):
    """``[n_groups, inner]``: the rows of ``values2d`` [n, inner] summed per ``group`` (the
    output of ``runs``), in the values' dtype with the CPU kernels' arithmetic (wrapping
    integers, float16 via float32, bool as or). Each run's first row is copied and the others
    added to it, so a run of one entry keeps its value bit for bit."""
    dtype = values2d.dtype
    work = _to_work(xp, values2d)
    out = work[first]
    if n_groups < work.shape[0]:
        rest = ~first
        scatter_add(out, group[rest], work[rest])
    return _from_work(xp, out, dtype)


def scatter_sum(xp, out2d, keys, values2d, scatter_add) -> None:
    """``out2d[keys[i]] += values2d[i]`` for every i, repeated keys summed, in place; both in one
    dtype (the work form is a view of ``out2d``, so the sums land in it)."""
    if keys.shape[0] == 0 or out2d.size == 0:
        return
    dtype = np.dtype(out2d.dtype)
    if dtype == np.bool_ or dtype == np.float16 or (dtype.kind in "iu" and dtype.itemsize < 4):
        raise TypeError(f"scatter_sum sums {dtype} through a copy; use segment_sum")
    scatter_add(_to_work(xp, out2d), keys, _to_work(xp, values2d))


def _rows(values, n: int):
    inner = 1
    for d in values.shape[1:]:
        inner *= int(d)
    return values.reshape(n, inner)


# ------------------------------------------------------------------ COO
def reorder(xp, indices, values, shape):
    """(indices, values) in row-major order, repeated indices kept in input order (stable)."""
    keys = linearize(xp, indices, shape)
    if _is_sorted(xp, keys):
        return indices, values
    perm = argsort_stable(xp, keys)
    return indices[perm], values[perm]


def coalesce(xp, indices, values, shape, scatter_add):
    """(indices, values): sorted row-major, repeated indices summed (``segment_sum``)."""
    n = indices.shape[0]
    keys = linearize(xp, indices, shape)
    if is_strictly_increasing(xp, keys):
        return indices, values
    perm = argsort_stable(xp, keys)
    first, group, n_groups = runs(xp, keys[perm])
    sorted_indices = indices[perm]
    summed = segment_sum(xp, _rows(values, n)[perm], first, group, n_groups, scatter_add)
    return sorted_indices[first], summed.reshape((n_groups, *values.shape[1:]))


def fill_dense(xp, keys, rows, n_rows: int, fill, dtype, shape):
    """A dense array of ``shape``: ``n_rows`` rows of ``fill``, row ``keys[i]`` set to
    ``rows[i]`` (keys unique)."""
    inner = 1
    for d in rows.shape[1:]:
        inner *= int(d)
    out = xp.empty((n_rows, inner), dtype=dtype)
    out[...] = fill
    if keys.shape[0] and inner:
        out[keys] = rows.reshape(keys.shape[0], inner)
    return out.reshape(shape)


def group_max(xp, keys, values2d, n_rows: int):
    """``[n_rows, inner]``: per key, the largest of the rows' values column by column (NaN when
    one is NaN, as numpy's maximum); 0 where no row has the key. Sorting by (key, value) puts
    each group's maximum last, so no atomic max is needed (cupyx.scatter_max takes neither
    int64 nor a NaN rule) and every real dtype works."""
    n, inner = values2d.shape
    out = xp.zeros((n_rows, inner), dtype=values2d.dtype)
    if n == 0 or inner == 0:
        return out
    flat_keys = (keys[:, None] * inner + xp.arange(inner, dtype=xp.int64)[None, :]).reshape(-1)
    flat_values = xp.ascontiguousarray(values2d).reshape(-1)
    by_value = argsort_stable(xp, flat_values)
    order = by_value[argsort_stable(xp, flat_keys[by_value])]
    sorted_keys = flat_keys[order]
    last = xp.empty(sorted_keys.shape[0], dtype=xp.bool_)
    last[-1:] = True
    last[:-1] = sorted_keys[1:] != sorted_keys[:-1]
    out_flat = out.reshape(-1)
    out_flat[sorted_keys[last]] = flat_values[order[last]]
    if np.dtype(values2d.dtype).kind == "f":
        # A radix sort (CuPy's for floats) puts a NaN with its sign bit set first, not last:
        # NaN is written over its groups whatever the sort made of it.
        nan = xp.isnan(flat_values)
        out_flat[flat_keys[nan]] = flat_values[nan]
    return out


# ------------------------------------------------------------------ compressed
def expand_pointers(xp, ptr, nse: int):
    """The compressed index (row of a CSR) of each of the ``nse`` entries, int64."""
    ptr = ptr.astype(xp.int64)
    return xp.searchsorted(ptr, xp.arange(nse, dtype=xp.int64), side="right") - 1


def compress(xp, sorted_major, n_major: int):
    """Pointers [n_major + 1] (int64) of entries whose compressed indices ``sorted_major`` are
    non-decreasing."""
    return xp.searchsorted(sorted_major.astype(xp.int64), xp.arange(n_major + 1, dtype=xp.int64),
                           side="left")


def transpose_compressed(xp, ptr, plain, n_plain: int):
    """(ptr_t, plain_t, perm): the compressed structure of the transpose (CSR <-> CSC), index
    dtypes kept. A stable sort by plain index, so each new segment lists its entries in storage
    order (old compressed indices ascending), as the CPU's counting sort does; output entry p is
    input entry perm[p]."""
    nse = plain.shape[0]
    perm = argsort_stable(xp, plain)
    major = expand_pointers(xp, ptr, nse)
    plain_t = major[perm].astype(plain.dtype)
    ptr_t = compress(xp, plain[perm], n_plain).astype(ptr.dtype)
    return ptr_t, plain_t, perm


def segments_strictly_increase(xp, major, minor) -> bool:
    """Whether the minor indices strictly increase within each run of equal major indices
    (entries in compressed order): the COO form is then coalesced. One scalar to the host."""
    if major.shape[0] < 2:
        return True
    ok = (major[1:] != major[:-1]) | (minor[1:] > minor[:-1])
    return bool(xp.all(ok))


# ------------------------------------------------------------------ sparse matrices (cuSPARSE)
def matrix(xp, sparse, layout: str, shape, values, *, indices=None, ptr=None, plain=None):
    """A 2-D sparse matrix of the ``sparse`` namespace over fresh int32 index arrays and a fresh
    copy of ``values``: the library may sort or sum a matrix's arrays in place, and these must
    never be a kept tensor's arrays."""
    values = xp.array(values, copy=True)
    shape = (int(shape[0]), int(shape[1]))
    if layout == "coo":
        row = xp.array(indices[:, 0], dtype=xp.int32, copy=True)
        col = xp.array(indices[:, 1], dtype=xp.int32, copy=True)
        return sparse.coo_matrix((values, (row, col)), shape=shape)
    cls = sparse.csr_matrix if layout == "csr" else sparse.csc_matrix
    return cls((values, xp.array(plain, dtype=xp.int32, copy=True), xp.array(ptr, dtype=xp.int32, copy=True)),
               shape=shape)


def spmm(xp, mat, x):
    """``mat @ x`` for a dense vector or matrix ``x`` (SpMV or SpMM), C-contiguous."""
    if x.ndim == 1 and mat.format == "csr":
        # cupyx sorts and sums a CSR matrix whose columns are not canonical before a product,
        # in place: 14 ms of a 10M-entry SpMV's 14.4 (H100, 2026-11-27), on a copy made for this
        # one call. cuSPARSE's CSR SpMV needs neither (each row's entries are summed, in any
        # order, repeats too): measured equal to the CPU kernel, repeats included; 0.36 ms.
        mat.has_canonical_format = True
    return xp.ascontiguousarray(mat @ x)


def _canonical_csr(xp, sparse, rows, cols, values, shape, scatter_add):
    """A CSR matrix (int32 indices) of entries (rows, cols, values): sorted, repeats summed, every
    distinct position kept (zeros too); and its all-ones pattern over the same arrays."""
    n_rows, n_cols = shape
    idx = xp.stack([rows, cols], axis=1)
    idx, vals = coalesce(xp, idx, values, shape, scatter_add)
    ptr = compress(xp, idx[:, 0], n_rows).astype(xp.int32)
    col = idx[:, 1].astype(xp.int32)
    numeric = sparse.csr_matrix((xp.array(vals, copy=True), col, ptr), shape=(n_rows, n_cols))
    pattern = sparse.csr_matrix((xp.ones(col.shape[0], dtype=xp.float32), col.copy(), ptr.copy()),
                                shape=(n_rows, n_cols))
    numeric.has_canonical_format = pattern.has_canonical_format = True  # no check pass in the library
    return numeric, pattern


def _sorted_keys_of(xp, mat, n_cols: int):
    """(row-major int64 keys, values) of a CSR matrix's entries, sorted, repeats summed (the
    library's own canonical form)."""
    mat.sum_duplicates()
    rows = expand_pointers(xp, mat.indptr, mat.indices.shape[0])
    return rows * n_cols + mat.indices.astype(xp.int64), mat.data


def spgemm(xp, sparse, a_entries, b_entries, p: int, q: int, r: int, dtype, scatter_add):
    """(ptr int64, cols int64, values) of op(a) @ op(b) as a canonical CSR [p, r]: every position
    some product a[i, k] * b[k, j] of stored entries reaches is stored, zeros from cancellation
    (and from stored zeros) included, columns ascending in each row.

    ``a_entries``/``b_entries`` are (rows, cols, values) of op(a) [p, q] and op(b) [q, r]. The
    structure is the product of the two patterns with all-ones values (its sums are counts,
    never 0, so no library drops an entry); the values are the library's numeric product
    (scipy drops exact zeros, cuSPARSE keeps them) placed into that structure by key."""
    a_num, a_pat = _canonical_csr(xp, sparse, *a_entries, (p, q), scatter_add)
    b_num, b_pat = _canonical_csr(xp, sparse, *b_entries, (q, r), scatter_add)
    structure = a_pat @ b_pat
    keys, _ = _sorted_keys_of(xp, structure, r)
    product = a_num @ b_num
    product_keys, product_values = _sorted_keys_of(xp, product, r)
    values = xp.zeros(keys.shape[0], dtype=dtype)
    if product_keys.shape[0]:
        values[xp.searchsorted(keys, product_keys)] = product_values.astype(dtype)
    rows = keys // r if r else keys
    ptr = compress(xp, rows, p)
    return ptr, keys - rows * r, values
