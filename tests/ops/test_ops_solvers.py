"""The Krylov solver ops (cg, bicgstab, gmres, minres) against scipy.sparse.linalg on the same
systems with the same preconditioner (iteration counts within one, x allclose), ILU(0) against a
plain reference, blocks of right-hand sides, x0, singular and non-converging systems, bad input,
and through a real server: every wire, a handle (its factor kept), a deadline passing mid-solve,
other clients answered while a long solve runs, and the README's Poisson example."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from scipy.linalg import solve_triangular

from sparseserve import DeadlineExceededError, InvalidArgumentError, SparseTensor
from sparseserve.kernels import solvers as sk
from sparseserve.server.ops.solvers import operator_of
from sparseserve.server.validated import read_only_tensor
from conftest import WIRES, ServerProcess, make_client, op_raises, run_op


# ------------------------------------------------------------------ systems
def tensor_of(a, layout: str = "csr") -> SparseTensor:
    a = sp.csr_array(a)
    if layout == "coo":
        c = a.tocoo()
        return SparseTensor(indices=np.stack([c.row, c.col], axis=1).astype(np.int64), values=c.data,
                            dense_shape=list(a.shape))
    m = a if layout == "csr" else a.tocsc()
    return SparseTensor(layout=layout, compressed_indices=m.indptr.astype(np.int64),
                        plain_indices=m.indices.astype(np.int64), values=m.data, dense_shape=list(a.shape))


def spd(n: int, seed: int):
    r = sp.random_array((n, n), density=0.05, rng=seed)
    return sp.csr_array(r @ r.T + sp.eye_array(n) * 0.5)


def nonsymmetric(n: int, seed: int):
    r = sp.random_array((n, n), density=0.05, rng=seed) - sp.random_array((n, n), density=0.05, rng=seed + 1)
    return sp.csr_array(r + sp.eye_array(n) * 3)  # well conditioned: rounding does not steer the iteration


def indefinite(n: int, seed: int):
    r = sp.random_array((n, n), density=0.05, rng=seed)
    diag = np.where(np.arange(n) % 2, 3.0, -3.0)
    return sp.csr_array(r + r.T + sp.diags_array(diag))


def poisson(k: int):
    t = sp.diags_array([-np.ones(k - 1), 2 * np.ones(k), -np.ones(k - 1)], offsets=[-1, 0, 1])
    return sp.csr_array(sp.kron(t, sp.eye_array(k)) + sp.kron(sp.eye_array(k), t))


# ------------------------------------------------------------------ scipy's side, same preconditioner
def reference_ilu0(a) -> tuple[np.ndarray, np.ndarray]:
    """Dense (L, U) of ILU(0): Gaussian elimination that drops every update outside A's pattern."""
    dense = sp.csr_array(a).toarray()
    pattern = dense != 0
    n = dense.shape[0]
    lu = dense.copy()
    for i in range(1, n):
        for k in range(i):
            if not pattern[i, k]:
                continue
            lu[i, k] /= lu[k, k]
            for j in range(k + 1, n):
                if pattern[i, j]:
                    lu[i, j] -= lu[i, k] * lu[k, j]
    return np.tril(lu, -1) + np.eye(n), np.triu(lu)


def scipy_m(a, preconditioner: str):
    n = a.shape[0]
    if preconditioner == "jacobi":
        dinv = 1 / a.diagonal()
        return spla.LinearOperator((n, n), matvec=lambda r: dinv * r.ravel())
    if preconditioner == "ilu0":
        lower, upper = reference_ilu0(a)
        return spla.LinearOperator((n, n), matvec=lambda r: solve_triangular(
            upper, solve_triangular(lower, r.ravel(), lower=True, unit_diagonal=True)))
    return None


def scipy_solve(op: str, a, b, preconditioner: str, **kwargs):
    count = [0]

    def callback(_):
        count[0] += 1
    extra = {"callback_type": "pr_norm"} if op == "gmres" else {}
    x, info = getattr(spla, op)(a, b, M=scipy_m(a, preconditioner), callback=callback, **extra, **kwargs)
    return x, info, count[0]


CASES = [("cg", spd), ("bicgstab", nonsymmetric), ("gmres", nonsymmetric), ("minres", spd)]


@pytest.mark.parametrize("preconditioner", ["none", "jacobi", "ilu0"])
@pytest.mark.parametrize("op,system", CASES)
def test_each_solver_answers_as_scipy_does(op, system, preconditioner):
    a = system(120, seed=7)
    b = np.random.default_rng(1).standard_normal(120)
    x, info, iterations, residual = run_op(op, a=tensor_of(a, "coo"), b=b, rtol=1e-8, preconditioner=preconditioner)
    want_x, want_info, want_iterations = scipy_solve(op, a, b, preconditioner, rtol=1e-8)
    assert info == want_info == 0
    assert abs(int(iterations) - want_iterations) <= 1, (iterations, want_iterations)
    np.testing.assert_allclose(x, want_x, rtol=1e-6, atol=1e-8 * np.linalg.norm(want_x))
    assert residual == pytest.approx(np.linalg.norm(b - a @ x), rel=1e-9)
    if op in ("cg", "bicgstab"):  # they stop on the true residual (gmres and minres on estimates)
        assert residual <= 1.01e-8 * np.linalg.norm(b)


def test_minres_on_a_symmetric_indefinite_system():
    a = indefinite(150, seed=3)
    b = np.random.default_rng(2).standard_normal(150)
    x, info, iterations, _ = run_op("minres", a=tensor_of(a), b=b, rtol=1e-10)
    want_x, want_info, want_iterations = scipy_solve("minres", a, b, "none", rtol=1e-10)
    assert info == want_info == 0 and abs(int(iterations) - want_iterations) <= 1
    np.testing.assert_allclose(x, want_x, rtol=1e-5, atol=1e-8)
    # cg is not meant for it: it ends without converging or with a worse answer, and raises nothing
    run_op("cg", a=tensor_of(a), b=b, maxiter=50)


def test_ilu0_is_incomplete_lu_with_zero_fill():
    a = nonsymmetric(60, seed=11)
    ptr, idx, lu, _ = operator_of(tensor_of(a, "csc")).ilu0()
    lower, upper = reference_ilu0(a)
    got = sp.csr_array((lu, idx, ptr), shape=a.shape).toarray()
    np.testing.assert_allclose(got, np.tril(lower, -1) + upper, rtol=1e-12, atol=1e-12)


def test_what_a_held_matrix_keeps_is_made_once():
    held = tensor_of(spd(30, seed=4))
    for array in held.arrays():
        array.flags.writeable = False
    first = operator_of(held)
    assert operator_of(held) is first and first.ilu0() is first.ilu0() and first.jacobi() is first.jacobi()
    sent = tensor_of(spd(30, seed=4))  # writable: a tensor sent inline keeps nothing
    assert operator_of(sent) is not operator_of(sent)


@pytest.mark.parametrize("dtype, index", [(np.float64, np.int32), (np.float32, np.int64)])
def test_packed_entries_give_the_csr_kernels_numbers(dtype, index):
    """A big stencil matrix is packed (3 bytes an entry): its products are the CSR kernel's bit for
    bit, and scipy's to rounding; matrices whose entries do not fit keep CSR."""
    a = poisson(130)  # 84,000 entries: the parallel products, where packing applies
    ptr, idx, vals = a.indptr.astype(index), a.indices.astype(index), a.data.astype(dtype)
    packed, plain = sk.Csr(ptr, idx, vals), sk.Csr(ptr, idx, vals)
    plain.packed = None
    assert packed.parallel and packed.packed is not None and packed.packed[3].size == 2  # the values 4, -1
    rng = np.random.default_rng(5)
    x, u = rng.standard_normal(a.shape[0]).astype(dtype), rng.standard_normal(a.shape[0]).astype(dtype)
    y_packed, y_plain = np.empty_like(x), np.empty_like(x)
    sk.spmv_into(packed, x, y_packed)
    sk.spmv_into(plain, x, y_plain)
    np.testing.assert_array_equal(y_packed, y_plain)
    np.testing.assert_allclose(y_packed, a.astype(dtype) @ x, rtol=1e-5 if dtype == np.float32 else 1e-12)
    assert sk.spmv_dot(packed, x, y_packed) == sk.spmv_dot(plain, x, y_plain)
    assert sk.spmv_dots(packed, x, y_packed, u) == sk.spmv_dots(plain, x, y_plain, u)
    np.testing.assert_array_equal(y_packed, y_plain)
    many_values = a.astype(np.float64)
    many_values.data = rng.standard_normal(a.nnz)  # more than 256 distinct values
    assert sk.pack(many_values.indptr, many_values.indices, many_values.data) is None
    far = sp.csr_array(poisson(200) + sp.csr_array(([1.0], ([0], [39_999])), shape=(40_000, 40_000)))
    assert sk.pack(far.indptr, far.indices, far.data) is None  # an entry 39,999 columns off its row
    near = poisson(200)
    assert sk.pack(near.indptr, near.indices, near.data) is not None


def test_cg_on_a_packed_matrix_answers_as_scipy():
    a = poisson(130)
    b = np.random.default_rng(6).standard_normal(a.shape[0])
    assert operator_of(tensor_of(a)).csr.packed is not None
    x, info, iterations, _ = run_op("cg", a=tensor_of(a), b=b, rtol=1e-8, preconditioner="jacobi")
    want, want_info, want_iterations = scipy_solve("cg", a, b, "jacobi", rtol=1e-8)
    assert int(info) == want_info == 0 and abs(int(iterations) - want_iterations) <= 1
    np.testing.assert_allclose(x, want, rtol=1e-6, atol=1e-8 * np.linalg.norm(want))


@pytest.mark.parametrize("op", ["cg", "bicgstab", "gmres", "minres"])
def test_every_iteration_is_reported(op):
    """Each iteration calls between_iterations: a watching caller's sink sees them in order."""
    from sparseserve.server.limits import progress_sink

    seen: list[dict] = []
    token = progress_sink.set(seen.append)
    try:
        a = spd(60, seed=8)
        _, info, iterations, _ = run_op(op, a=tensor_of(a), b=np.ones(60), preconditioner="jacobi")
    finally:
        progress_sink.reset(token)
    assert info == 0 and [r["iteration"] for r in seen] == list(range(1, len(seen) + 1))
    assert {r["op"] for r in seen} == {op} and abs(len(seen) - int(iterations)) <= 1
    if op in ("cg", "bicgstab"):
        assert seen[-1]["residual_norm"] < 1e-5 * np.sqrt(60) <= seen[0]["residual_norm"]


def test_a_block_of_right_hand_sides_and_x0():
    """bicgstab solves a block's columns one after another (cg's block solve: test_ops_block_cg.py)."""
    a = nonsymmetric(80, seed=5)
    rng = np.random.default_rng(3)
    b, x0 = rng.standard_normal((80, 3)), rng.standard_normal((80, 3))
    x, info, iterations, residual = run_op("bicgstab", a=tensor_of(a), b=b, x0=x0, preconditioner="jacobi")
    assert x.shape == (80, 3) and info.tolist() == [0, 0, 0] and residual.shape == (3,)
    for j in range(3):
        want_x, _, want_iterations = scipy_solve("bicgstab", a, b[:, j], "jacobi", x0=x0[:, j])
        assert abs(int(iterations[j]) - want_iterations) <= 1
        np.testing.assert_allclose(x[:, j], want_x, rtol=1e-6, atol=1e-10)


def test_float32_stays_float32():
    a = spd(50, seed=2)
    t = tensor_of(a)
    t32 = SparseTensor(layout="csr", compressed_indices=t.compressed_indices, plain_indices=t.plain_indices,
                       values=t.values.astype(np.float32), dense_shape=t.dense_shape)
    x, info, _, _ = run_op("cg", a=t32, b=np.ones(50, np.float32))
    assert x.dtype == np.float32 and info == 0
    x64, *_ = run_op("cg", a=t32, b=np.ones(50))  # a float64 b: solved in float64, as scipy
    assert x64.dtype == np.float64


def test_non_converging_and_singular_systems_set_info():
    a = poisson(12)
    b = np.ones(144)
    x, info, iterations, residual = run_op("cg", a=tensor_of(a), b=b, maxiter=3)
    _, want_info, _ = scipy_solve("cg", a, b, "none", maxiter=3)
    assert info == want_info == 3 and iterations == 3 and residual > 1e-5 * 12
    for op, system in (("bicgstab", tensor_of(nonsymmetric(144, 1))), ("gmres", tensor_of(nonsymmetric(144, 1))),
                       ("minres", tensor_of(a))):
        _, info, _, _ = run_op(op, a=system, b=b, maxiter=2, rtol=1e-14)
        assert info != 0, op
    singular = sp.csr_array(sp.diags_array([1.0, 2.0, 0.0, 3.0]))  # b outside the range: no solution
    x, info, iterations, _ = run_op("cg", a=tensor_of(singular), b=np.ones(4), maxiter=20)
    _, want_info, _ = scipy_solve("cg", singular, np.ones(4), "none", maxiter=20)
    assert info == want_info == 20
    zero = tensor_of(sp.csr_array(np.zeros((4, 4))))  # p . Ap = 0 at once: inf and nan, as in scipy
    x, info, iterations, _ = run_op("cg", a=zero, b=np.ones(4))
    assert info == iterations == 40
    with np.errstate(all="ignore"):
        assert scipy_solve("cg", sp.csr_array(np.zeros((4, 4))), np.ones(4), "none")[1] == 40
    x, info, _, _ = run_op("cg", a=tensor_of(a), b=np.zeros(144))  # b = 0: x = 0 at once, as scipy
    assert info == 0 and not x.any()


@pytest.mark.parametrize("kwargs,reason", [
    ({"a": tensor_of(sp.random_array((4, 5), density=0.5, rng=0)), "b": np.ones(4)}, "NOT_SQUARE"),
    ({"b": np.ones(5)}, "SHAPE_MISMATCH"),
    ({"b": np.array([1.0, np.nan, 1, 1])}, "NOT_FINITE"),
    ({"x0": np.ones(3)}, "SHAPE_MISMATCH"),
    ({"preconditioner": "ilu"}, "BAD_PRECONDITIONER"),
    ({"rtol": -1.0}, "BAD_TOLERANCE"),
    ({"maxiter": 0}, "BAD_MAXITER"),
    ({"b": np.ones(4, np.complex128)}, "UNSUPPORTED_DTYPE"),
    ({"a": tensor_of(sp.csr_array(np.array([[0.0, 1], [1, 0]]))), "b": np.ones(2), "preconditioner": "jacobi"},
     "SINGULAR_PRECONDITIONER"),
])
def test_bad_input_is_invalid_argument_naming_it(kwargs, reason):
    args = {"a": tensor_of(spd(4, 0)), "b": np.ones(4), **kwargs}
    err = op_raises(InvalidArgumentError, reason, "cg", **args)
    name = {"NOT_SQUARE": "a", "NOT_FINITE": "b", "BAD_PRECONDITIONER": "preconditioner", "BAD_TOLERANCE": "rtol",
            "BAD_MAXITER": "maxiter", "SINGULAR_PRECONDITIONER": "jacobi"}.get(reason)
    if name:
        assert name in str(err)


# ------------------------------------------------------------------ through a server
@pytest.fixture(scope="module")
def solver_server():
    srv = ServerProcess("--workers", "2")
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.mark.parametrize("wire", WIRES)
def test_over_each_wire_with_a_handle(solver_server, wire):
    a = spd(100, seed=9)
    b = np.random.default_rng(4).standard_normal(100)
    want = run_op("cg", a=tensor_of(a), b=b, preconditioner="ilu0")
    with make_client(solver_server, wire) as c:
        h = c.put(tensor_of(a))
        for _ in range(2):  # the second reuses the factor kept with the handle
            x, info, iterations, residual = c.cg(h, b, preconditioner="ilu0")
            np.testing.assert_allclose(x, want[0], rtol=1e-12)
            assert (int(info), int(iterations)) == (0, int(want[2]))
        x, info, _, _ = c.gmres(h, b, restart=5)
        assert int(info) == 0 and np.linalg.norm(a @ x - b) < 1e-4 * np.linalg.norm(b)
        c.delete(h)


def test_a_deadline_ends_a_long_solve_while_other_calls_are_answered(solver_server):
    """A solve that would run for many seconds (rtol = atol = 0: it never converges) is abandoned
    at its caller's deadline; meanwhile another client's small calls are answered at once."""
    a = tensor_of(poisson(200))  # 40,000 unknowns
    with make_client(solver_server, "grpc", timeout=4.0) as slow, make_client(solver_server, "grpc") as quick:
        h = slow.put(a)
        outcome: list = []

        def long_solve():
            start = time.monotonic()
            try:
                slow.cg(h, np.ones(40_000), rtol=0.0, maxiter=1_000_000)
                outcome.append(("answered", time.monotonic() - start))
            except DeadlineExceededError as exc:
                outcome.append((exc.reason, time.monotonic() - start))

        thread = threading.Thread(target=long_solve)
        thread.start()
        time.sleep(0.3)  # the solve is iterating now
        small = tensor_of(spd(20, seed=1))
        for _ in range(5):
            start = time.monotonic()
            x, info, _, _ = quick.cg(small, np.ones(20))
            # At once next to a solve four seconds long (bounds loose for a loaded CI machine).
            assert int(info) == 0 and time.monotonic() - start < 1.0
        assert thread.is_alive(), "the long solve ended before the small calls ran"
        thread.join(timeout=20)
        assert outcome and outcome[0][0] != "answered", outcome
        assert outcome[0][1] < 8, outcome
        x, info, _, _ = quick.cg(small, np.ones(20))  # the server goes on answering
        assert int(info) == 0
        quick.delete(h)


# ------------------------------------------------------------------ scipy's M as a matrix, x0='Mb', inf, shift
@pytest.mark.parametrize("form", ["dense", "csr", "coo"])
@pytest.mark.parametrize("op,system", CASES)
def test_a_matrix_m_is_applied_as_scipy_applies_its_m(op, system, form):
    """scipy's M given as a matrix (M @ r): the same x and info as scipy's solver with that M (cg
    and bicgstab then run scipy's own loop, so their iterates are scipy's too)."""
    a = system(80, seed=5)
    b = np.random.default_rng(6).standard_normal(80)
    near = 0.01 * np.ones(79)  # symmetric positive definite, not diagonal: minres takes it too
    m = sp.csr_array(sp.diags_array([near, 1 / a.diagonal(), near], offsets=[-1, 0, 1]))
    given = m.toarray() if form == "dense" else tensor_of(m, form)
    x, info, iterations, residual = run_op(op, a=tensor_of(a), b=b, m=given, rtol=1e-8)
    count = [0]
    extra = {"callback_type": "pr_norm"} if op == "gmres" else {}
    want_x, want_info = getattr(spla, op)(a, b, M=m, rtol=1e-8, callback=lambda _: count.__setitem__(0, count[0] + 1),
                                          **extra)
    assert info == want_info == 0 and int(iterations) == count[0]
    np.testing.assert_allclose(x, want_x, rtol=1e-7, atol=1e-9 * np.linalg.norm(want_x))  # sums' order apart
    assert residual == pytest.approx(np.linalg.norm(b - a @ x), rel=1e-9)


def test_a_dense_m_that_is_no_diagonal_and_a_held_one():
    a = spd(60, seed=2)
    b = np.ones(60)
    m = np.linalg.inv(a.toarray() + 0.1 * np.eye(60))  # close to A^-1: a few iterations
    for op in ("cg", "gmres"):
        x, info, iterations, _ = run_op(op, a=tensor_of(a), b=b, m=m, rtol=1e-10)
        want_x, want_info = getattr(spla, op)(a, b, M=m, rtol=1e-10)
        assert info == want_info == 0 and int(iterations) < 10
        np.testing.assert_allclose(x, want_x, rtol=1e-9)
    held = read_only_tensor(tensor_of(sp.csr_array(m)))  # a handle's tensor: its CSR is kept with it
    run_op("cg", a=tensor_of(a), b=b, m=held)
    assert operator_of(held, np.float64) is operator_of(held, np.float64)


@pytest.mark.parametrize("preconditioner", ["none", "jacobi", "ilu0"])
@pytest.mark.parametrize("op,system", CASES)
def test_x0_mb_starts_from_m_b_as_scipy(op, system, preconditioner):
    a = system(100, seed=3)
    b = np.random.default_rng(7).standard_normal(100)
    x, info, iterations, _ = run_op(op, a=tensor_of(a), b=b, x0_mb=True, preconditioner=preconditioner, rtol=1e-8)
    want_x, want_info, want_iterations = scipy_solve(op, a, b, preconditioner, x0="Mb", rtol=1e-8)
    assert info == want_info == 0 and abs(int(iterations) - want_iterations) <= 1
    np.testing.assert_allclose(x, want_x, rtol=1e-6, atol=1e-8 * np.linalg.norm(want_x))
    if op != "minres":  # the start itself: rtol inf stops before the first iteration (minres runs one)
        start, _, its, _ = run_op(op, a=tensor_of(a), b=b, x0_mb=True, preconditioner=preconditioner, rtol=np.inf)
        m = scipy_m(a, preconditioner)
        np.testing.assert_allclose(start, b if m is None else m.matvec(b), rtol=1e-12)
        assert int(its) == 0


def test_a_block_starts_from_m_b_column_by_column():
    a = spd(50, seed=4)
    b = np.random.default_rng(8).standard_normal((50, 3))
    x, info, _, _ = run_op("cg", a=tensor_of(a), b=b, x0_mb=True, preconditioner="jacobi", rtol=np.inf)
    np.testing.assert_allclose(x, b / a.diagonal()[:, None], rtol=1e-15)
    assert (info == 0).all()


@pytest.mark.parametrize("op", ["cg", "bicgstab", "gmres", "minres"])
def test_an_infinite_tolerance_stops_at_once_as_scipy(op):
    a = spd(40, seed=1)
    b, x0 = np.ones(40), np.random.default_rng(3).standard_normal(40)
    tolerances = [{"rtol": np.inf}] + ([] if op == "minres" else [{"atol": np.inf}, {"rtol": np.inf, "atol": np.inf}])
    for tolerance in tolerances:
        x, info, _, _ = run_op(op, a=tensor_of(a), b=b, x0=x0, **tolerance)
        want_x, want_info = getattr(spla, op)(a, b, x0=x0, **tolerance)
        assert info == want_info == 0
        np.testing.assert_array_equal(x, want_x)
    x, info, _, _ = run_op(op, a=tensor_of(a), b=np.zeros(40), rtol=np.inf)  # b = 0: x = 0, as scipy
    assert info == 0 and not x.any()


def test_minres_with_a_shift_and_scipys_check():
    a = spd(60, seed=5)
    b = np.random.default_rng(9).standard_normal(60)
    x, info, _, residual = run_op("minres", a=tensor_of(a), b=b, shift=0.25, rtol=1e-10)
    want_x, want_info = spla.minres(a, b, shift=0.25, rtol=1e-10)
    assert info == want_info == 0
    np.testing.assert_allclose(x, want_x, rtol=1e-9)
    assert residual == pytest.approx(np.linalg.norm(b - (a @ x - 0.25 * x)), rel=1e-9)  # the shifted system's
    np.testing.assert_allclose(run_op("minres", a=tensor_of(a), b=b, check=True)[0], spla.minres(a, b, check=True)[0],
                               rtol=1e-9)
    lopsided = sp.lil_array(a)
    lopsided[1, 2] += 5.0
    with pytest.raises(ValueError, match="non-symmetric matrix"):  # scipy's own test
        spla.minres(lopsided, b, check=True)
    err = op_raises(InvalidArgumentError, "NOT_HERMITIAN", "minres", a=tensor_of(lopsided), b=b, check=True)
    assert "non-symmetric matrix" in err.message
    err = op_raises(InvalidArgumentError, "INDEFINITE_PRECONDITIONER", "minres", a=tensor_of(a), b=b,
                    m=-np.eye(60))
    assert "indefinite preconditioner" in err.message


@pytest.mark.parametrize("kwargs,reason,named", [
    ({"m": np.eye(4), "preconditioner": "jacobi"}, "EXCLUSIVE_ARGUMENTS", "preconditioner='jacobi'"),
    ({"x0": np.ones(4), "x0_mb": True}, "EXCLUSIVE_ARGUMENTS", "x0_mb"),
    ({"m": np.eye(3)}, "SHAPE_MISMATCH", "m has shape [3, 3]"),
    ({"m": np.ones(4)}, "SHAPE_MISMATCH", "m has shape [4]"),
    ({"m": tensor_of(sp.eye_array(5))}, "SHAPE_MISMATCH", "m has shape [5, 5]"),
    ({"m": np.eye(4, dtype=np.complex128)}, "UNSUPPORTED_DTYPE", "m has dtype complex128"),
    ({"rtol": np.nan}, "BAD_TOLERANCE", "rtol"),
    ({"atol": -np.inf}, "BAD_TOLERANCE", "atol"),
])
def test_refusals_of_m_x0_mb_and_tolerances(kwargs, reason, named):
    for op in ("cg", "bicgstab", "gmres", "minres"):
        if op == "minres" and "atol" in kwargs:
            continue
        err = op_raises(InvalidArgumentError, reason, op, a=tensor_of(spd(4, 0)), b=np.ones(4), **kwargs)
        assert named in err.message, err
        assert isinstance(err, ValueError)  # scipy-style code catches it


def test_a_non_finite_shift_is_refused():
    op_raises(InvalidArgumentError, "NOT_FINITE", "minres", a=tensor_of(spd(4, 0)), b=np.ones(4), shift=np.inf)
