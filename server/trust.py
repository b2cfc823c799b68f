"""Which tensors the server has checked: those validated (SPEC section 2) on their way in,
and those it made itself from checked data. Binding such a tensor again costs nothing.

Checked tensors are read-only (their arrays are read-only views), so a check stays true for
as long as the object lives; the set holds them weakly.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from sparseserve.core.tensor import SparseTensor
from sparseserve.core.validate import check_dense, check_sparse
from sparseserve.kernels import indices_in_range
from sparseserve.kernels._sort import frozen

__all__ = ["checked", "trust", "is_checked", "frozen_tensor", "read_only"]

# Sparse tensors validated and frozen on their way into the handle store. They are used by
# every op that names their handle; checking them again on each use was a quarter of a
# 20M-entry SpMV through the service. Nothing writes a stored tensor (its arrays are
# read-only views), so the check stays true for as long as the object lives.
_CHECKED: weakref.WeakSet = weakref.WeakSet()


def checked(value: Any, name: str) -> Any:
    """``value`` validated, as the read-only tensor ops receive; sparse ones are remembered
    as checked, so binding them again costs nothing."""
    if isinstance(value, SparseTensor):
        if value in _CHECKED:
            return value
        check_sparse(value, name, indices_in_range)
        value = frozen_tensor(value)
        _CHECKED.add(value)
        return value
    value = np.asarray(value)
    check_dense(value, name)
    return frozen_tensor(value)


def trust(value: Any) -> Any:
    """A tensor the server made itself from checked data (a result, a copy between host and
    device) marked as checked, so binding it skips validation; host arrays made read-only."""
    if isinstance(value, np.ndarray):
        return frozen(value)
    if type(value) is SparseTensor:
        value = frozen_tensor(value)
    _CHECKED.add(value)
    return value


def is_checked(value: Any) -> bool:
    """Whether ``value`` passed ``checked`` or ``trust``."""
    return value in _CHECKED


def frozen_tensor(value: Any) -> Any:
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


def read_only(t: SparseTensor) -> bool:
    """Whether every array of ``t`` is read-only already (as those decoded from bytes are)."""
    return not any(a.flags.writeable for a in t.arrays())
