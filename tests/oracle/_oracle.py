"""The real libraries as oracles: TensorFlow and PyTorch run on the same inputs as our kernels.

Every differential test in this folder imports the libraries from here (each imported once per
test run; TensorFlow's import costs seconds) and the conversions between our ``SparseTensor`` and
theirs. Inputs come from ``tests/strategies.py`` and the comparison is ``tests/helpers.py``'s
``assert_eq`` (which takes the libraries' results as they are), as for every other test.

TensorFlow's ``SparseTensor`` holds 1-D values only: draw ``coo_tensors(hybrid=False)`` for it;
PyTorch takes hybrid tensors (dense trailing dimensions) and the compressed layouts.

Comparison rule (issue 30): integers, bools and every piece of structure (indices, their order,
shapes, dtypes) equal exactly; floating and complex values ``allclose``.

Below the conversions, what several test_oracle_<module>.py files share: the TensorFlow
comparisons' settings, dtype groups and ``check`` (TensorFlow's answer, or both refusing); the
PyTorch comparisons' settings and conversions (``torch_convert``); and ``torch_sparse``, the CSR,
CSC, BSR and BSC tensors PyTorch makes.
"""

from __future__ import annotations

import functools
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from helpers import as_ours
from strategies import random_values
from sparseserve import SparseTensor
from sparseserve.errors import InvalidArgumentError

__all__ = ["tf", "torch", "run", "raises", "to_tf", "from_tf", "to_torch", "from_torch", "in_layout",
           "TF_DTYPES", "TORCH_DTYPES",
           "TF_SETTINGS", "INTS", "FLOATS", "COMPLEX", "REAL", "NUMBER", "tol", "tf_call", "ours_refuse", "check",
           "scalars", "shapes", "tf_scalar",
           "TORCH_SETTINGS", "COMPRESSED", "declared_layouts", "nonzero_values", "torch_convert",
           "COMPRESSED_SETTINGS", "LAYOUTS", "NUMBERS", "torch_sparse"]

# Every dtype of docs/contract.md ("Tensors") that each library's sparse kernels take, as numpy names.
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
    return as_ours(st_)


# ------------------------------------------------------------------ PyTorch
def to_torch(t):
    """A torch tensor (sparse in our layout, or dense) with the same contents."""
    if isinstance(t, SparseTensor):
        out = t.to_torch()
        return out
    return torch().from_numpy(np.array(t))


def from_torch(t):
    """Our tensor (``SparseTensor`` in torch's layout, or a numpy array) from a torch one."""
    return as_ours(t)


# ------------------------------------------------------------------ what the TensorFlow comparisons share
TF_SETTINGS = settings(max_examples=30, deadline=None,
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
FLOATS = ("float16", "float32", "float64")
COMPLEX = ("complex64", "complex128")
REAL = INTS + FLOATS  # TensorFlow's REAL_NUMBER_TYPES: mul, div, reduce_max, maximum, minimum
NUMBER = REAL + COMPLEX  # reduce_sum


def tol(dtype) -> dict:
    return {"rtol": 2e-3, "atol": 2e-3} if np.dtype(dtype) in (np.float16, np.complex64) else \
        {"rtol": 1e-5, "atol": 1e-6}


def tf_call(fn):
    """TensorFlow's answer, or the error it refuses the input with (None, error)."""
    try:
        return fn(), None
    except (tf().errors.InvalidArgumentError, ValueError) as exc:
        return None, exc


def ours_refuse(name: str, **kwargs) -> InvalidArgumentError:
    with pytest.raises(InvalidArgumentError) as info:
        run(name, **kwargs)
    return info.value


def check(name: str, kwargs: dict, theirs, compare) -> None:
    """TensorFlow's result compared with ours, or both refusing the input."""
    want, err = tf_call(theirs)
    if err is not None:
        ours_refuse(name, **kwargs)
        return
    compare(run(name, **kwargs), want)


@st.composite
def scalars(draw, dtype):
    """A small scalar of ``dtype`` (what default_value arguments take)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return random_values(rng, (), dtype)[()]


@st.composite
def shapes(draw, min_rank=1, max_rank=5, min_dim=0, max_dim=4):
    rank = draw(st.integers(min_rank, max_rank))
    return tuple(draw(st.lists(st.integers(min_dim, max_dim if rank < 5 else 3), min_size=rank, max_size=rank)))


def tf_scalar(value, dtype):
    return tf().constant(np.asarray(value, dtype=dtype))


# ------------------------------------------------------------------ what the PyTorch comparisons share
TORCH_SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
COMPRESSED = ("csr", "csc", "bsr", "bsc")


warnings.filterwarnings("ignore", message=".*[Ss]parse.*")  # torch's beta-layout warnings


def declared_layouts(op: str, arg: str) -> tuple[str, ...]:
    from sparseserve.server.ops import REGISTRY

    return tuple(REGISTRY.get(op).args_by_name[arg].layouts)


def nonzero_values(rng, shape, dtype):
    v = random_values(rng, shape, dtype)
    if np.dtype(dtype) == np.bool_:
        return np.ones(shape, bool)
    return np.where(v == 0, np.ones((), dtype), v).astype(dtype)


def torch_convert(x, layout, blocksize, dense_dim):
    if layout == "coo":
        return x.to_sparse() if x.layout != torch().strided else x.to_sparse(x.ndim - (dense_dim or 0))
    if layout == "csr":
        return x.to_sparse_csr(dense_dim)
    if layout == "csc":
        return x.to_sparse_csc(dense_dim)
    if layout == "bsr":
        return x.to_sparse_bsr(blocksize, dense_dim)
    return x.to_sparse_bsc(blocksize, dense_dim)


def _index_dtype_like(want: SparseTensor, got: SparseTensor) -> SparseTensor:
    """torch's dense -> compressed gives int64 indices; ours keeps a compressed input's int32."""
    assert np.dtype(want.compressed_indices.dtype) == np.int64
    if got.compressed_indices.dtype == want.compressed_indices.dtype:
        return want
    return SparseTensor(layout=want.layout,
                        compressed_indices=want.compressed_indices.astype(got.compressed_indices.dtype),
                        plain_indices=want.plain_indices.astype(got.plain_indices.dtype), values=want.values,
                        dense_shape=want.dense_shape, blocksize=want.blocksize)


# ------------------------------------------------------------------ CSR, CSC, BSR and BSC made by PyTorch
COMPRESSED_SETTINGS = settings(max_examples=25, deadline=None,
                               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
LAYOUTS = ("csr", "csc", "bsr", "bsc")
NUMBERS = ("int32", "int64", "float32", "float64", "complex64")


@st.composite
def torch_sparse(draw, layouts=LAYOUTS, dtypes=NUMBERS, batch=True, dense=True, shape=None, blocksize=None):
    """(torch tensor, ours): a random dense tensor (about half zeros) made sparse by torch."""
    layout = draw(st.sampled_from(layouts))
    if shape is None:
        block = (draw(st.integers(1, 2)), draw(st.integers(1, 2))) if layout in ("bsr", "bsc") else (1, 1)
        rows, cols = block[0] * draw(st.integers(0, 3)), block[1] * draw(st.integers(0, 3))
        batch_shape = (draw(st.integers(1, 2)),) if batch and draw(st.booleans()) else ()
        dense_dims = (draw(st.integers(1, 2)),) if dense and draw(st.booleans()) else ()
        shape = (*batch_shape, rows, cols, *dense_dims)
        n_batch, n_dense = len(batch_shape), len(dense_dims)
    else:
        shape, n_batch, n_dense, block = shape
    dtype = draw(st.sampled_from(dtypes))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    base = random_values(rng, shape, dtype)
    if n_batch:  # every batch one sparsity pattern (torch needs equal nse), values differ
        pattern = rng.integers(0, 2, size=shape[n_batch:]).astype(bool)
        base = base * pattern
        base = np.where(base == 0, np.ones((), base.dtype), base) * pattern
    else:
        base = base * rng.integers(0, 2, size=shape).astype(base.dtype)
    dense_t = torch().from_numpy(np.ascontiguousarray(base))
    b = blocksize or block
    t = {"csr": lambda: dense_t.to_sparse_csr(dense_dim=n_dense),
         "csc": lambda: dense_t.to_sparse_csc(dense_dim=n_dense),
         "bsr": lambda: dense_t.to_sparse_bsr(b, dense_dim=n_dense),
         "bsc": lambda: dense_t.to_sparse_bsc(b, dense_dim=n_dense)}[layout]()
    return t, from_torch(t), (shape, n_batch, n_dense, b)
