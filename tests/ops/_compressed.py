"""What the ops' tests on CSR, CSC, BSR and BSC share: a compressed tensor's COO view and back.

Every op answers on a compressed tensor (batch and dense dimensions too) what it answers on the
tensor's COO view, in the layout a torch user expects: value-only ops (with_values, retain, mul,
div, map_values) keep the structure and work in storage order (torch's ``values()``), checked
against the op on a COO tensor listing the stored elements in that order; the others equal the
COO answer converted back to the input's layout, blocksize and index dtype (structure exact).
Inputs are canonical (each segment's plain indices strictly increasing) or not (repeats and
disorder within segments, which docs/contract.md, "Tensors", allows).

Imported as ``from _compressed import ...`` by test_ops_coo.py, test_ops_elementwise.py and
test_ops_structure.py in this folder. TensorFlow and PyTorch on these layouts: tests/oracle/
(test_oracle_coo.py, test_oracle_elementwise.py, test_oracle_structure.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from sparseserve import InvalidArgumentError, SparseTensor
from conftest import run_op as run
from helpers import assert_eq

FLOATS = ("float32", "float64")
DTYPES = ("bool", "int8", "int32", "int64", "uint8", "float16", "float32", "float64", "complex64")


def canonical(t: SparseTensor) -> bool:
    """Each segment's plain indices strictly increase (written out here, not ours)."""
    ci = t.compressed_indices.reshape(-1, t.compressed_indices.shape[-1])
    pi = t.plain_indices.reshape(ci.shape[0], t.plain_indices.shape[-1])
    return all(np.all(np.diff(pi[b, ci[b, k]:ci[b, k + 1]]) > 0)
               for b in range(ci.shape[0]) for k in range(ci.shape[1] - 1))


def coo_view(t: SparseTensor) -> SparseTensor:
    return run("convert", sp_input=t, layout="coo")


def back(coo: SparseTensor, t: SparseTensor) -> SparseTensor:
    """The COO answer in ``t``'s layout, blocksize and index dtype (where int32 holds it)."""
    out = run("convert", sp_input=coo, layout=t.layout, blocksize=None if t.blocksize is None else list(t.blocksize))
    dtype = t.compressed_indices.dtype
    if dtype == np.int32 and max(out.nnz, *out.dense_shape) > np.iinfo(np.int32).max:
        dtype = np.int64
    return SparseTensor(layout=out.layout, compressed_indices=out.compressed_indices.astype(dtype),
                        plain_indices=out.plain_indices.astype(dtype), values=out.values,
                        dense_shape=out.dense_shape, blocksize=out.blocksize)


def expect(fn):
    """fn()'s result, or the InvalidArgumentError it raises (reason compared by the caller)."""
    try:
        return fn()
    except InvalidArgumentError as exc:
        return exc


def assert_same_or_error(got_fn, want_fn, what="output"):
    want = expect(want_fn)
    if isinstance(want, InvalidArgumentError):
        with pytest.raises(InvalidArgumentError) as info:
            got_fn()
        assert info.value.reason == want.reason, (info.value, want)
        return None
    got = got_fn()
    assert_eq(got, want, what=what, exact=True)
    return got


def op_raises_any(cls, name, **kwargs):
    with pytest.raises(cls) as info:
        run(name, **kwargs)
    return info.value
