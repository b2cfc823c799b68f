"""The real libraries as oracles: TensorFlow and PyTorch run on the same inputs as our kernels.

Every differential test in this folder imports the libraries from here (each imported once per
test run; TensorFlow's import costs seconds) and the conversions between our ``SparseTensor`` and
theirs. Inputs come from ``tests/strategies.py`` and the comparison is ``tests/helpers.py``'s
``assert_eq`` (which takes the libraries' results as they are), as for every other test.

TensorFlow's ``SparseTensor`` holds 1-D values only: draw ``coo_tensors(hybrid=False)`` for it;
PyTorch takes hybrid tensors (dense trailing dimensions) and the compressed layouts.

Comparison rule (issue 30): integers, bools and every piece of structure (indices, their order,
shapes, dtypes) equal exactly; floating and complex values ``allclose``.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from helpers import as_ours
from sparseserve import SparseTensor

__all__ = ["tf", "torch", "run", "raises", "to_tf", "from_tf", "to_torch", "from_torch", "in_layout",
           "TF_DTYPES", "TORCH_DTYPES"]

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
