"""Which tensors are validated: those checked against docs/contract.md ("Tensors") on their way
in (``validated``), and those the server made itself from validated data (``mark_validated``).
Binding such a tensor again costs nothing.

Validated tensors are read-only (their arrays are read-only views: ``read_only_tensor``), so
validation stays true for as long as the object lives; the set holds them weakly.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from sparseserve.core.tensor import SparseTensor
from sparseserve.core.validate import check_dense, check_sparse
from sparseserve.kernels import indices_in_range
from sparseserve.kernels import frozen

__all__ = ["validated", "mark_validated", "is_validated", "read_only_tensor", "has_read_only_arrays"]

# Sparse tensors validated and made read-only on their way into the handle store. They are used by
# every op that names their handle; checking them again on each use was a quarter of a
# 20M-entry SpMV through the service. Nothing writes a stored tensor (its arrays are
# read-only views), so validation stays true for as long as the object lives.
_VALIDATED: weakref.WeakSet = weakref.WeakSet()


def validated(value: Any, name: str) -> Any:
    """``value`` validated, as the read-only tensor ops receive; sparse ones are remembered
    as validated, so binding them again costs nothing."""
    if isinstance(value, SparseTensor):
        if value in _VALIDATED:
            return value
        check_sparse(value, name, indices_in_range)
        value = read_only_tensor(value)
        _VALIDATED.add(value)
        return value
    value = np.asarray(value)
    check_dense(value, name)
    return read_only_tensor(value)


def mark_validated(value: Any) -> Any:
    """A tensor the server made itself from validated data (a result, a copy between host and
    device) marked as validated, so binding it skips validation; host arrays made read-only."""
    if isinstance(value, np.ndarray):
        return frozen(value)
    if type(value) is SparseTensor:
        value = read_only_tensor(value)
    _VALIDATED.add(value)
    return value


def is_validated(value: Any) -> bool:
    """Whether ``value`` passed ``validated`` or ``mark_validated``."""
    return value in _VALIDATED


def read_only_tensor(value: Any) -> Any:
    """Read-only views of a tensor's arrays. Kernels never write their inputs, and numba
    compiles read-only and writable arrays as different signatures: one kind from every
    wire (protobuf bytes are read-only, JSON lists are not) keeps the warmed-up ones in use."""
    if isinstance(value, np.ndarray):
        return frozen(value)
    if value.layout == "coo":
        return SparseTensor(indices=frozen(value.indices), values=frozen(value.values),
                            dense_shape=value.dense_shape, coalesced=value.coalesced)
    return SparseTensor(layout=value.layout, compressed_indices=frozen(value.compressed_indices),
                        plain_indices=frozen(value.plain_indices), values=frozen(value.values),
                        dense_shape=value.dense_shape, blocksize=value.blocksize,
                        coalesced=value.coalesced)


def has_read_only_arrays(t: SparseTensor) -> bool:
    """Whether every array of ``t`` is read-only already (as those decoded from bytes are)."""
    return not any(a.flags.writeable for a in t.arrays())
