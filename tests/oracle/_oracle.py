"""The real libraries as oracles: TensorFlow and PyTorch run on the same inputs as our kernels.

Every differential test in this folder imports what it needs from here: the libraries (each
imported once per test run; TensorFlow's import costs seconds), conversions between our
``SparseTensor`` and theirs, hypothesis strategies for inputs, and the one comparison.

TensorFlow's ``SparseTensor`` holds 1-D values only: draw ``coo_tensors(hybrid=False)`` for it;
PyTorch takes hybrid tensors (dense trailing dimensions) and the compressed layouts.

Comparison rule (issue 30): integers, bools and every piece of structure (indices, their order,
shapes, dtypes) equal exactly; floating and complex values ``allclose``.
"""

from __future__ import annotations

import functools
import os

import numpy as np
from hypothesis import strategies as st

from sparseserve import SparseTensor

__all__ = ["tf", "torch", "run", "raises", "to_tf", "from_tf", "to_torch", "from_torch",
           "assert_same", "assert_same_dense", "coo_tensors", "in_layout", "TF_DTYPES",
           "TORCH_DTYPES", "random_values"]

# Every dtype of SPEC section 2 that each library's sparse kernels take, as numpy names.
TF_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
             "float16", "float32", "float64", "complex64", "complex128")
TORCH_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32",
                "float64", "complex64", "complex128")


@functools.cache
def tf():
    """TensorFlow, imported once per test run, quiet and on this process's two cores."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow

    try:
        tensorflow.config.threading.set_inter_op_parallelism_threads(2)
        tensorflow.config.threading.set_intra_op_parallelism_threads(2)
    except RuntimeError:  # already initialised by an earlier import: keep its settings
        pass
    return tensorflow


@functools.cache
def torch():
    import torch as _torch

    return _torch


# ------------------------------------------------------------------ our side
def run(name: str, **kwargs):
    """Bind and run one of our ops in-process, as the server does (one output, or a tuple)."""
    from sparseserve.server.ops import REGISTRY

    op = REGISTRY.get(name)
    out = op.run("cpu", op.bind(kwargs))
    return out if len(out) > 1 else out[0]


def raises(name: str, **kwargs):
    """The error our op raises for these arguments (the test asserts on it)."""
    from sparseserve.errors import SparseServeError

    try:
        run(name, **kwargs)
    except SparseServeError as exc:
        return exc
    raise AssertionError(f"{name} accepted {kwargs!r}")


def in_layout(t: SparseTensor, layout: str, blocksize=None) -> SparseTensor:
    """``t`` converted by our own ``convert`` op (COO returned as given, duplicates and order kept)."""
    if layout == "coo":
        return t
    return run("convert", sp_input=t, layout=layout, blocksize=blocksize)


# ------------------------------------------------------------------ TensorFlow
def to_tf(t: SparseTensor):
    """A ``tf.SparseTensor`` with our COO tensor's indices, values and shape, as they are (order
    and repeats kept: TensorFlow's kernels see exactly what ours see)."""
    t = t.to_coo()
    return tf().SparseTensor(indices=np.asarray(t.indices, np.int64).reshape(t.nnz, t.sparse_ndim),
                             values=tf().constant(np.asarray(t.values)),
                             dense_shape=np.asarray(t.dense_shape, np.int64))


def from_tf(st_) -> SparseTensor:
    return SparseTensor(indices=st_.indices.numpy(), values=st_.values.numpy(),
                        dense_shape=st_.dense_shape.numpy())


# ------------------------------------------------------------------ PyTorch
def to_torch(t):
    """A torch tensor (sparse in our layout, or dense) with the same contents."""
    if isinstance(t, SparseTensor):
        out = t.to_torch()
        return out
    return torch().from_numpy(np.array(t))


def from_torch(t):
    """Our tensor (``SparseTensor`` in torch's layout, or a numpy array) from a torch one."""
    from sparseserve.core.convert import torch_to_tensor

    return torch_to_tensor(t)


# ------------------------------------------------------------------ comparison
def _values_equal(got: np.ndarray, want: np.ndarray, what: str, rtol: float, atol: float) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if got.dtype.kind in "fc":
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def assert_same_dense(got, want, *, rtol: float = 1e-6, atol: float = 1e-6, what: str = "output") -> None:
    _values_equal(got, want, what, rtol, atol)


def assert_same(got: SparseTensor, want: SparseTensor, *, rtol: float = 1e-6, atol: float = 1e-6,
                what: str = "output") -> None:
    """Layout, shape, every index array (order included) and dtype exactly; values allclose
    for floating kinds, exact otherwise."""
    assert isinstance(got, SparseTensor), f"{what}: {type(got).__name__} is not a SparseTensor"
    assert got.layout == want.layout, f"{what}: layout {got.layout} != {want.layout}"
    assert tuple(got.dense_shape) == tuple(want.dense_shape), \
        f"{what}: dense_shape {list(got.dense_shape)} != {list(want.dense_shape)}"
    if got.layout == "coo":
        np.testing.assert_array_equal(np.asarray(got.indices).reshape(got.nnz, got.sparse_ndim),
                                      np.asarray(want.indices).reshape(want.nnz, want.sparse_ndim),
                                      err_msg=f"{what}.indices")
    else:
        for name in ("compressed_indices", "plain_indices"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=f"{what}.{name}")
        assert (None if got.blocksize is None else tuple(got.blocksize)) == \
            (None if want.blocksize is None else tuple(want.blocksize)), f"{what}: blocksize"
    _values_equal(got.values, want.values, f"{what}.values", rtol, atol)


# ------------------------------------------------------------------ inputs
def random_values(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Small exact values of ``dtype`` (halves for floats, so sums are exact in float16 too)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    raw = rng.integers(0 if dtype.kind == "u" else -5, 6, size=shape)
    if dtype.kind == "c":
        return (raw + 1j * rng.integers(-5, 6, size=shape)).astype(dtype)
    if dtype.kind == "f":
        return (raw / 2).astype(dtype)
    return raw.astype(dtype)


@st.composite
def coo_tensors(draw, dtypes=TF_DTYPES, *, min_rank: int = 1, max_rank: int = 5, shape=None,
                sparse_ndim: int | None = None, hybrid: bool = True, duplicates: bool = True,
                unsorted: bool = True, max_nnz: int = 12, min_dim: int = 0) -> SparseTensor:
    """COO tensors of rank ``min_rank``..``max_rank`` (dimensions up to 4, empty ones included
    unless ``min_dim``), any of ``dtypes``; hybrid (dense trailing dimensions) when allowed,
    repeated and unsorted indices when allowed, else coalesced."""
    if shape is None:
        rank = draw(st.integers(min_rank, max_rank))
        shape = tuple(draw(st.lists(st.integers(min_dim, 4 if rank < 5 else 3), min_size=rank, max_size=rank)))
    rank = len(shape)
    if sparse_ndim is None:
        sparse_ndim = draw(st.integers(1, rank)) if hybrid else rank
    dtype = draw(st.sampled_from(dtypes))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    cells = int(np.prod(shape[:sparse_ndim], dtype=np.int64))
    nnz = 0 if cells == 0 else draw(st.integers(0, max_nnz))
    if nnz:
        if duplicates:
            idx = np.stack([rng.integers(0, d, nnz) for d in shape[:sparse_ndim]], axis=1)
        else:
            flat = rng.choice(cells, size=min(nnz, cells), replace=False)
            idx = np.stack(np.unravel_index(flat, shape[:sparse_ndim]), axis=1).astype(np.int64)
        nnz = idx.shape[0]
        if duplicates and nnz > 2 and draw(st.booleans()):
            idx[-1] = idx[0]
        if not unsorted or draw(st.booleans()):
            idx = idx[np.lexsort(idx.T[::-1])]
    else:
        idx = np.zeros((0, sparse_ndim), np.int64)
    values = random_values(rng, (nnz, *shape[sparse_ndim:]), dtype)
    return SparseTensor(indices=idx, values=values, dense_shape=shape)
