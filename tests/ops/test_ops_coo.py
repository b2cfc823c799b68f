"""COO basics: reorder, coalesce, to_dense, from_dense.

On CSR, CSC, BSR and BSC: the answer on the tensor's COO view, converted back to the input's layout
(``_compressed.py``), and the ops on CSR over the three wires. The kernels are held to plain numpy
references in tests/kernels/test_kernels_coo.py, the ops to TensorFlow and PyTorch in
tests/oracle/test_oracle_coo.py, their GPU kernels in tests/gpu/test_gpu_coo.py, and the ops end to
end in tests/server/test_server_e2e.py.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sparseserve import InvalidArgumentError, SparseTensor
from conftest import op_raises, run_op
from helpers import assert_eq
from strategies import compressed_tensors
from _compressed import DTYPES, assert_same_or_error, back, canonical, coo_view, op_raises_any

run, raises = run_op, op_raises
SETTINGS = settings(max_examples=30, deadline=None)


# ======================================================= CSR, CSC, BSR and BSC
@SETTINGS
@given(t=compressed_tensors(dtypes=DTYPES), default=st.integers(0, 1))
def test_to_dense(t, default):
    want = run("to_dense", sp_input=coo_view(t), default_value=default, validate_indices=False)
    assert_eq(run("to_dense", sp_input=t, default_value=default, validate_indices=False), want, exact=True)
    if default == 0:  # the SDK's own numpy expansion (it has no default value)
        np.testing.assert_array_equal(want, t.to_dense())
    if canonical(t):
        assert_eq(run("to_dense", sp_input=t, default_value=default), want, exact=True)
    else:
        err = op_raises_any(InvalidArgumentError, "to_dense", sp_input=t)
        assert err.reason in ("INDICES_REPEATED", "INDICES_UNSORTED") and "plain_indices" in err.message


@SETTINGS
@given(t=compressed_tensors(dtypes=DTYPES))
def test_reorder_and_coalesce(t):
    out = run("reorder", sp_input=t)
    if canonical(t):
        assert_eq(out, t, exact=True)  # returned as it is
        assert_eq(run("coalesce", sp_input=t), t, exact=True)
        return
    # reorder: each segment sorted, stably, repeats kept
    assert_structure_kept_shape(out, t)
    np.testing.assert_array_equal(out.compressed_indices, t.compressed_indices)
    assert out.compressed_indices.dtype == t.compressed_indices.dtype
    ci = t.compressed_indices.reshape(-1, t.compressed_indices.shape[-1])
    pi = t.plain_indices.reshape(ci.shape[0], t.plain_indices.shape[-1])
    vals = t.values.reshape(ci.shape[0], pi.shape[1], *t.values.shape[t.batch_ndim + 1:])
    got_pi = out.plain_indices.reshape(pi.shape)
    got_vals = out.values.reshape(vals.shape)
    for b in range(ci.shape[0]):
        for k in range(ci.shape[1] - 1):
            lo, hi = ci[b, k], ci[b, k + 1]
            order = np.argsort(pi[b, lo:hi], kind="stable")
            np.testing.assert_array_equal(got_pi[b, lo:hi], pi[b, lo:hi][order])
            np.testing.assert_array_equal(got_vals[b, lo:hi], vals[b, lo:hi][order])
    # coalesce: the COO answer converted back (or its batch-count error)
    assert_same_or_error(lambda: run("coalesce", sp_input=t),
                         lambda: back(run("coalesce", sp_input=coo_view(t)), t))


def assert_structure_kept_shape(got, t):
    assert got.layout == t.layout and tuple(got.dense_shape) == tuple(t.dense_shape) and got.blocksize == t.blocksize


# ============================================================== over the wires
def test_ops_over_the_wire_with_csr(client):
    d = np.array([[1.0, 0, 2], [0, 0, 3]])
    csr = SparseTensor(layout="csr", compressed_indices=np.array([0, 2, 3], np.int32),
                       plain_indices=np.array([0, 2, 2], np.int32), values=np.array([1.0, 2.0, 3.0]),
                       dense_shape=[2, 3])
    np.testing.assert_array_equal(client.to_dense(csr), d)
    out = client.mul(csr, np.array([10.0, 20.0, 30.0]))
    assert out.layout == "csr" and out.values.tolist() == [10.0, 60.0, 90.0]
    assert out.compressed_indices.dtype == np.int32
    out = client.add(csr, csr, threshold=0.0)
    assert out.layout == "csr" and out.values.tolist() == [2.0, 4.0, 6.0]
    np.testing.assert_array_equal(client.add(csr, np.ones((2, 3))), d + 1)
    out = client.map_values(csr, "neg")
    assert out.layout == "csr" and out.values.tolist() == [-1.0, -2.0, -3.0]
    out = client.select(csr, [1])
    assert out.layout == "coo" and out.indices.tolist() == [[2]] and out.values.tolist() == [3.0]
    out = client.concat(0, [csr, csr])
    assert out.layout == "csr" and out.to_dense().tolist() == np.concatenate([d, d]).tolist()
    out = client.coalesce(csr)
    assert out.layout == "csr" and out.plain_indices.tolist() == [0, 2, 2]
    out, empty = client.fill_empty_rows(csr, 0.0)
    assert out.layout == "csr" and empty.tolist() == [False, False]
