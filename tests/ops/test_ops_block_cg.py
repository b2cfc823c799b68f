"""cg with a block of right-hand sides B [n, k]: the columns' iterations run side by side, one
pass over the matrix per iteration for all of them (``spmv_dot_lockstep``), each column's
numbers those of its solve alone, bit for bit; held to scipy's cg column by column."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from sparseserve.kernels import solvers as sk
from conftest import run_op
from test_ops_solvers import poisson, scipy_solve, spd, tensor_of


def test_the_lockstep_product_is_each_vectors_spmv_dot_bit_for_bit():
    for k in (60, 300):  # the sequential and the parallel (packed alone) products
        a = poisson(k)
        a.data = a.data * 0.3
        csr = sk.Csr(a.indptr.astype(np.int32), a.indices.astype(np.int32), a.data)
        x = np.random.default_rng(k).standard_normal((4, k * k))
        y = np.zeros_like(x)
        dots = sk.spmv_dot_lockstep(csr, x, y, np.array([0, 2, 3], np.int64))
        assert dots[1] == 0 and not y[1].any()  # a vector not live is left alone
        for j in (0, 2, 3):
            one = np.empty(k * k)
            assert sk.spmv_dot(csr, x[j], one) == dots[j]
            np.testing.assert_array_equal(y[j], one)
        np.testing.assert_allclose(y[[0, 2, 3]], (a @ x[[0, 2, 3]].T).T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("preconditioner", ["none", "jacobi", "ilu0", "amg"])
def test_each_column_is_its_solve_alone_and_scipys(preconditioner):
    a = poisson(40)
    rng = np.random.default_rng(2)
    b, x0 = rng.standard_normal((1600, 3)), rng.standard_normal((1600, 3))
    t = tensor_of(a)
    x, info, iterations, residual = run_op("cg", a=t, b=b, x0=x0, rtol=1e-8, preconditioner=preconditioner)
    assert x.shape == (1600, 3) and info.tolist() == [0, 0, 0]
    for j in range(3):
        alone = run_op("cg", a=t, b=b[:, j], x0=x0[:, j], rtol=1e-8, preconditioner=preconditioner)
        np.testing.assert_array_equal(x[:, j], alone[0])
        assert (iterations[j], residual[j]) == (alone[2], alone[3])
        if preconditioner != "amg":  # scipy has no multigrid (test_ops_multigrid.py holds it to pyamg)
            want_x, _, want_iterations = scipy_solve("cg", a, b[:, j], preconditioner, rtol=1e-8, x0=x0[:, j])
            assert abs(int(iterations[j]) - want_iterations) <= 1
            np.testing.assert_allclose(x[:, j], want_x, rtol=1e-6, atol=1e-8 * np.abs(want_x).max())


def test_zero_and_finished_columns_leave_the_block():
    a = spd(120, seed=4)
    rng = np.random.default_rng(5)
    b = np.stack([rng.standard_normal(120), np.zeros(120), rng.standard_normal(120)], axis=1)
    x0 = rng.standard_normal((120, 3))
    x0[:, 2] = spla.spsolve(sp.csc_array(a), b[:, 2])  # column 2 starts at its answer
    x, info, iterations, _ = run_op("cg", a=tensor_of(a), b=b, x0=x0, rtol=1e-6)
    assert info.tolist() == [0, 0, 0] and iterations[1] == 0 and iterations[2] == 0 and iterations[0] > 5
    np.testing.assert_array_equal(x[:, 1], 0)  # scipy answers b = 0 with x = 0 whatever x0
    np.testing.assert_array_equal(x[:, 2], x0[:, 2])
    np.testing.assert_allclose(x[:, 0], spla.spsolve(sp.csc_array(a), b[:, 0]), rtol=1e-4, atol=1e-6)


def test_a_block_stopped_by_maxiter_says_which_columns_met_their_tolerance():
    a = poisson(20)
    b = np.stack([np.ones(400), a @ np.ones(400)], axis=1)
    x0 = np.stack([np.zeros(400), np.ones(400)], axis=1)  # column 1 starts at its answer
    x, info, iterations, residual = run_op("cg", a=tensor_of(a), b=b, x0=x0, maxiter=3, rtol=1e-10)
    assert info.tolist() == [3, 0] and iterations.tolist() == [3, 0]
    assert residual[0] > 1e-10 * 20 and residual[1] == 0


def test_float32_blocks_stay_float32():
    a = spd(60, seed=6)
    t = tensor_of(a)
    t.values = t.values.astype(np.float32)
    b = np.random.default_rng(7).standard_normal((60, 3)).astype(np.float32)
    x, info, _, _ = run_op("cg", a=t, b=b, rtol=1e-5)
    assert x.dtype == np.float32 and info.tolist() == [0, 0, 0]
    alone = run_op("cg", a=t, b=b[:, 1], rtol=1e-5)[0]
    np.testing.assert_array_equal(x[:, 1], alone)
