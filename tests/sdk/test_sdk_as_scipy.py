"""The SDK answers as scipy does (issue 37, part 3), over every wire and in process.

- Errors are also the Python exceptions numpy and scipy raise: ``InvalidArgumentError`` a
  ``ValueError``, with a type reason an ``InvalidArgumentTypeError`` (a ``TypeError`` too),
  ``UnimplementedError`` a ``NotImplementedError``; the same class raised in process, rebuilt
  from gRPC, from REST, and unpickled.
- ``sparseserve.linalg`` takes scipy's arguments as scipy reads them: ``b`` [n, 1], ``x0='Mb'``,
  ``rtol``/``atol`` inf, ``atol=None``, a matrix as ``M``, ``minres(shift=, check=)``; ``spsolve``
  shapes, dtypes, sparse b and a singular A; each answer held to scipy's on the same arrays.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from sparseserve import linalg
from sparseserve.core.convert import scipy_to_sparse
from sparseserve.core.reasons import Reason
from sparseserve.errors import (TYPE_REASONS, InvalidArgumentError, InvalidArgumentTypeError, UnimplementedError,
                                error_for_code, error_for_grpc_status)

from conftest import WIRES, make_client, op_raises


def poisson(k: int) -> sp.csr_array:
    t = sp.diags_array([-np.ones(k - 1), 2 * np.ones(k), -np.ones(k - 1)], offsets=[-1, 0, 1])
    return sp.csr_array(sp.kron(t, sp.eye_array(k)) + sp.kron(sp.eye_array(k), t))


@pytest.fixture(scope="module", params=WIRES)
def c(request, server):
    with make_client(server, request.param) as client:
        yield client


# ------------------------------------------------------------------ errors
def is_value_error_only(err: BaseException) -> bool:
    return isinstance(err, InvalidArgumentError) and isinstance(err, ValueError) and not isinstance(err, TypeError)


def is_type_error(err: BaseException) -> bool:
    return isinstance(err, InvalidArgumentTypeError) and isinstance(err, TypeError) and isinstance(err, ValueError)


def test_the_class_follows_the_reason_wherever_the_error_is_made():
    for reason in Reason:
        for made in (InvalidArgumentError("m", reason=reason), error_for_code("INVALID_ARGUMENT", "m", reason),
                     error_for_grpc_status(InvalidArgumentError.grpc_status, "m", reason)):
            again = pickle.loads(pickle.dumps(made))  # Dask workers raise them
            for err in (made, again):
                assert err.reason == reason
                assert is_type_error(err) if reason in TYPE_REASONS else is_value_error_only(err), (reason, err)
    assert isinstance(error_for_code("UNIMPLEMENTED", "m"), NotImplementedError)
    assert not isinstance(error_for_code("NOT_FOUND", "m"), (ValueError, TypeError, NotImplementedError))


def test_in_process_ops_raise_the_same_classes():
    a = poisson(3)
    err = op_raises(InvalidArgumentError, "BAD_TOLERANCE", "cg", a=scipy_to_sparse(a), b=np.ones(9), rtol=-1.0)
    assert is_value_error_only(err)
    err = op_raises(InvalidArgumentError, "BAD_ARGUMENT_TYPE", "cg", a=scipy_to_sparse(a), b=np.ones(9), rtol="x")
    assert is_type_error(err)


def test_errors_are_scipys_exceptions_on_every_wire(c):
    A = c.put(poisson(3))
    b = np.ones(9)
    with pytest.raises(ValueError) as value:
        c.cg(A, b, rtol=-1.0)
    assert is_value_error_only(value.value) and value.value.reason == "BAD_TOLERANCE"
    for call, reason in [(lambda: c.call("cg", a=A, b=b, maxiter="many"), "BAD_ARGUMENT_TYPE"),
                         (lambda: c.call("cg", a=A, b=b, tolerance=1.0), "UNKNOWN_ARGUMENT"),
                         (lambda: c.call("cg", a=A), "MISSING_ARGUMENT")]:
        with pytest.raises(TypeError) as typed:
            call()
        assert is_type_error(typed.value) and typed.value.reason == reason
    with pytest.raises(NotImplementedError) as unimplemented:
        c.index_select(sp.csc_array(poisson(3)), 0, np.array([0]))
    assert isinstance(unimplemented.value, UnimplementedError) and unimplemented.value.reason == "UNSUPPORTED_LAYOUT"
    A.delete()


# ------------------------------------------------------------------ sparseserve.linalg's solvers
@pytest.mark.parametrize("op", ["cg", "bicgstab", "gmres", "minres"])
def test_a_column_b_x0_mb_and_infinite_tolerances_as_scipy(c, op):
    S = poisson(6)
    A = c.put(S)
    b = np.random.default_rng(1).standard_normal((36, 1))
    x, info = getattr(linalg, op)(A, b, x0=np.zeros((36, 1)))
    want, want_info = getattr(spla, op)(S, b, x0=np.zeros((36, 1)))
    assert x.shape == want.shape == (36,) and type(info) is int and info == want_info == 0
    np.testing.assert_allclose(x, want, rtol=1e-6)
    dinv = sp.diags_array(1 / S.diagonal())
    x, info = getattr(linalg, op)(A, b, x0="Mb", preconditioner="jacobi", rtol=1e-8)
    want, want_info = getattr(spla, op)(S, b, x0="Mb", M=dinv, rtol=1e-8)
    assert info == want_info == 0
    np.testing.assert_allclose(x, want, rtol=1e-6)
    if op != "minres":  # minres runs one iteration even at rtol inf, as scipy's
        x0 = np.random.default_rng(2).standard_normal(36)
        for tolerance in ({"rtol": np.inf}, {"atol": np.inf}):
            x, info = getattr(linalg, op)(A, b[:, 0], x0=x0, **tolerance)  # inf crosses the JSON wire too
            assert info == 0
            np.testing.assert_array_equal(x, x0)
        for atol in (None, "legacy", -1.0):  # scipy's test_invalid_atol
            with pytest.raises(ValueError):
                getattr(linalg, op)(A, b, atol=atol)
    with pytest.raises(ValueError) as typed:
        getattr(linalg, op)(A, b, x0="b")
    assert isinstance(typed.value, TypeError)
    A.delete()


def test_a_matrix_as_m_held_sent_or_dense(c):
    S = poisson(6)
    A = c.put(S)
    b = np.random.default_rng(3).standard_normal(36)
    M = sp.csr_array(sp.diags_array(1 / S.diagonal()) + 0.01 * sp.eye_array(36))
    held = c.put(M)
    for op in ("cg", "bicgstab", "gmres", "minres"):
        want, want_info = getattr(spla, op)(S, b, M=M, rtol=1e-8)
        for given in (M, M.toarray(), held):
            x, info = getattr(linalg, op)(A, b, M=given, rtol=1e-8)
            assert info == want_info == 0
            np.testing.assert_allclose(x, want, rtol=1e-7, atol=1e-9)
    with pytest.raises(ValueError) as both:
        linalg.cg(A, b, M=M, preconditioner="jacobi")
    assert both.value.reason == "EXCLUSIVE_ARGUMENTS"
    with pytest.raises(TypeError, match="preconditioner='jacobi'"):
        linalg.gmres(A, b, M=spla.aslinearoperator(M))
    with pytest.raises(TypeError, match="progress=fn"):
        linalg.cg(A, b, callback=print)
    held.delete()
    A.delete()


def test_minres_shift_and_check_as_scipy(c):
    rng = np.random.default_rng(4)
    dense = rng.random((10, 10))
    dense += dense.T
    b = rng.random(10)
    A = c.put(sp.csr_array(dense))
    x, info = linalg.minres(A, b, shift=0.5)
    want, want_info = spla.minres(dense, b, shift=0.5)
    assert info == want_info == 0
    np.testing.assert_allclose(x, want, rtol=1e-5)  # as scipy's test_shift: an indefinite A spreads rounding
    dense[1, 2] = 1
    dense[2, 1] = 2
    with pytest.raises(ValueError):  # scipy's test_asymmetric_fail
        linalg.minres(c.put(sp.csr_array(dense)), b, check=True)
    A.delete()


# ------------------------------------------------------------------ spsolve and factorized
def test_spsolve_shapes_dtypes_and_a_singular_matrix_as_scipy(c):
    S = sp.csc_array(np.array([[0.0, 1, 1], [1, 0, 1], [0, 0, 1]]))
    A = c.put(S)
    b = np.array([[1.0], [2.0], [3.0]])
    x = linalg.spsolve(A, b)
    assert x.shape == (3,)
    np.testing.assert_allclose(x, spla.spsolve(S, b))
    np.testing.assert_allclose(linalg.spsolve(A, np.array([1, 2, 3])), spla.spsolve(S, np.array([1, 2, 3])))
    B = sp.csc_array(np.array([[0.0, 1], [1, 0], [0, 0]]))
    x = linalg.spsolve(A, B)
    assert sp.issparse(x) and x.shape == (3, 2)
    np.testing.assert_allclose(x.toarray(), spla.spsolve(S, B).toarray())
    integers = c.put(sp.csr_array(np.array([[2, 1], [0, 1]])))  # solved in float64, as scipy's
    x = linalg.spsolve(integers, np.array([3, 1]))
    assert x.dtype == np.float64
    np.testing.assert_allclose(x, [1.0, 1.0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = linalg.spsolve(c.put(sp.csc_array((4, 4))), np.ones(4))
    assert np.isnan(x).all() and any(issubclass(w.category, spla.MatrixRankWarning) for w in caught)
    solve = linalg.factorized(integers)
    np.testing.assert_allclose(solve(np.array([3, 1])), [1.0, 1.0])
    with pytest.raises(TypeError, match="Cannot cast array data"):  # scipy's SuperLU says the same
        solve(np.array([1, 1], np.complex128))
    solve.delete()
    for tensor in (A, integers):
        tensor.delete()

