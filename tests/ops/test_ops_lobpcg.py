"""eigsh at the bottom of the spectrum and with scipy's other arguments (issue 37): LOBPCG with the
multigrid preconditioner against scipy's eigsh on Poisson, pyamg's gallery (anisotropic diffusion,
linear elasticity, its finite-element examples), graph Laplacians, random SPD and indefinite
matrices (eigenvalues, residuals, subspace angles); the part of the spectrum each method takes;
shift-invert on a factorization kept with the held matrix (made once per matrix and shift,
charged to its handle, gone with it); the generalised problem in every mode of scipy's; seed and
v0, ncv and maxiter; svds with each of scipy's solvers; the refusals; a deadline in LOBPCG; and
through the SDK (``sparseserve.linalg``: M, rng, solver) over a real server."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla
from scipy.linalg import subspace_angles

from sparseserve import DeadlineExceededError, InternalError, InvalidArgumentError, SparseTensor, linalg
from sparseserve.core.convert import scipy_to_sparse
from sparseserve.server.ops import eigen, multigrid
from conftest import WIRES, make_client, op_raises, run_op

pyamg = pytest.importorskip("pyamg")
RNG = np.random.default_rng(37)


# ------------------------------------------------------------------ matrices
def poisson(grid: int) -> sp.csr_array:
    return sp.csr_array(pyamg.gallery.poisson((grid, grid), format="csr"))


def anisotropic(grid: int) -> sp.csr_array:
    """Rotated anisotropic diffusion, finite elements: SPD with positive off-diagonals, so its
    Gershgorin discs cross zero."""
    stencil = pyamg.gallery.diffusion_stencil_2d(epsilon=0.01, theta=np.pi / 6, type="FE")
    return sp.csr_array(pyamg.gallery.stencil_grid(stencil, (grid, grid), format="csr"))


def elasticity(grid: int) -> sp.csr_array:
    return sp.csr_array(pyamg.gallery.linear_elasticity((grid, grid))[0].tocsr())


def example(name: str) -> sp.csr_array:
    return sp.csr_array(pyamg.gallery.load_example(name)["A"]).tocsr()


def graph_laplacian(n: int, seed: int) -> sp.csr_array:
    r = sp.random_array((n, n), density=0.004, rng=np.random.default_rng(seed))
    w = r + r.T
    return sp.csr_array(sp.diags_array(np.asarray(abs(w).sum(axis=1)).ravel()) - w + 1e-2 * sp.eye_array(n))


def random_spd(n: int, seed: int) -> sp.csr_array:
    rng = np.random.default_rng(seed)
    r = sp.random_array((n, n), density=0.004, rng=rng)
    return sp.csr_array(r @ r.T + sp.diags_array(rng.random(n)) + 1e-3 * sp.eye_array(n))


def indefinite(n: int, seed: int) -> sp.csr_array:
    r = sp.random_array((n, n), density=0.002, rng=np.random.default_rng(seed))
    return sp.csr_array(r + r.T)


def stiffness_and_mass(grid: int) -> tuple[sp.csr_array, sp.csr_array]:
    """K and M of bilinear-ish finite elements on a grid: K v = w M v with M SPD."""
    t = sp.diags_array([-np.ones(grid - 1), 2 * np.ones(grid), -np.ones(grid - 1)], offsets=[-1, 0, 1])
    m = sp.diags_array([np.ones(grid - 1), 4 * np.ones(grid), np.ones(grid - 1)], offsets=[-1, 0, 1]) / 6
    return sp.csr_array(sp.kron(t, m) + sp.kron(m, t)), sp.csr_array(sp.kron(m, m))


MATRICES = {
    "poisson": lambda: poisson(60),
    "anisotropic": lambda: anisotropic(50),
    "elasticity": lambda: elasticity(25),
    "airfoil": lambda: example("airfoil"),
    "knot": lambda: example("knot"),
    "bar": lambda: example("bar"),
    "graph_laplacian": lambda: graph_laplacian(2000, seed=1),
    "random_spd": lambda: random_spd(2000, seed=2),
    "indefinite": lambda: indefinite(2000, seed=3),
}


def held(m) -> SparseTensor:
    """A tensor as a handle's: read-only arrays, so what eigsh derives is kept with it."""
    t = scipy_to_sparse(sp.csr_array(m))
    for array in t.arrays():
        array.flags.writeable = False
    return t


@pytest.fixture
def lobpcg_runs(monkeypatch):
    """How many LOBPCG runs eigsh made, and how many gave converged pairs."""
    runs = {"ran": 0, "converged": 0}
    original = eigen.bottom_pairs

    def spy(*args, **kwargs):
        found = original(*args, **kwargs)
        runs["ran"] += 1
        runs["converged"] += found is not None
        return found
    monkeypatch.setattr(eigen, "bottom_pairs", spy)
    return runs


def assert_same_pairs(a, w, v, w_scipy, v_scipy, *, m=None, gap_ok=True) -> None:
    """Eigenvalues to 1e-9 of the spectrum's scale, residuals within LOBPCG's rule, and the same
    invariant subspace as scipy's (where the k-th eigenvalue is apart from the next)."""
    scale = np.abs(a).sum(axis=1).max()
    np.testing.assert_allclose(w, w_scipy, rtol=0, atol=1e-9 * scale)
    mv = v if m is None else m @ v
    residuals = np.linalg.norm(a @ v - mv * w, axis=0) / np.linalg.norm(v, axis=0)
    m_scale = 1.0 if m is None else np.abs(m).sum(axis=1).max()
    assert np.all(residuals <= 4e-11 * (scale + np.abs(w) * m_scale) * 1.01), residuals
    if gap_ok:
        assert subspace_angles(v, v_scipy).max() < 1e-6


# ------------------------------------------------------------------ the bottom by LOBPCG
@pytest.mark.parametrize("name", sorted(MATRICES))
def test_smallest_by_lobpcg_equal_scipys(name, lobpcg_runs):
    a = MATRICES[name]()
    k = 6
    w, v = run_op("eigsh", a=scipy_to_sparse(a), k=k, which="SA")
    # scipy's k + 1 smallest, by shift-invert below the spectrum (its SA alone takes minutes on some)
    w_next, v_next = sla.eigsh(a, k=k + 1, sigma=float(w[0]) - 1e-3 * max(1.0, abs(w[0])))
    assert lobpcg_runs["converged"] == 1
    gap = (w_next[k] - w_next[k - 1]) > 1e-6 * np.abs(w_next).max()
    assert_same_pairs(a, w, v, w_next[:k], v_next[:, :k], gap_ok=gap)
    assert w.dtype == np.float64 and v.shape == (a.shape[0], k)


def test_sigma_at_the_bottom_and_sm_of_a_positive_matrix_are_lobpcgs(lobpcg_runs):
    a = poisson(50)  # k = 4: the 5th and 6th eigenvalues are one double one
    w_scipy, v_scipy = sla.eigsh(a, k=4, sigma=0)
    for args in ({"sigma": 0.0}, {"sigma": -1.0, "which": "LA"}, {"which": "SM"}):
        w, v = run_op("eigsh", a=scipy_to_sparse(a), k=4, **args)
        assert_same_pairs(a, w, v, w_scipy, v_scipy)
    assert lobpcg_runs["converged"] == 3


@pytest.mark.parametrize("args", [{"which": "LM"}, {"which": "LA"}, {"which": "BE"}, {"sigma": 1.0},
                                  {"sigma": 0.0, "which": "SA"}, {"which": "SA", "solver": "arpack"}])
def test_the_rest_of_the_spectrum_is_arpacks(args, lobpcg_runs):
    a = poisson(20)
    w, v = run_op("eigsh", a=scipy_to_sparse(a), k=4, **args)
    w_scipy, _ = sla.eigsh(a, k=4, **{key: value for key, value in args.items() if key != "solver"})
    np.testing.assert_allclose(w, w_scipy, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(a @ v, v * w, atol=1e-9)
    assert lobpcg_runs["ran"] == 0


def test_an_indefinite_matrix_with_a_positive_diagonal_falls_to_the_shifted_hierarchy(lobpcg_runs):
    # Poisson less 0.02 I: positive diagonal, so the hierarchy of a itself is tried first; it is no
    # SPD preconditioner and may stall (it did on 80 x 80 with pyamg's cycle); that of a - lower I
    # then converges. Either way the pairs pass the residual check or are not returned.
    a = sp.csr_array(poisson(50) - 0.02 * sp.eye_array(2500))
    w, v = run_op("eigsh", a=scipy_to_sparse(a), k=4, which="SA")
    w_scipy, v_scipy = sla.eigsh(a, k=4, sigma=-1.0)
    assert_same_pairs(a, w, v, w_scipy, v_scipy, gap_ok=False)
    assert lobpcg_runs["converged"] == 1 and lobpcg_runs["ran"] <= 2


def test_a_small_matrix_is_solved_dense():
    a = poisson(4)  # 16 < 5 blocks of 6
    w, v = run_op("eigsh", a=scipy_to_sparse(a), k=6, which="SA")
    w_dense = np.linalg.eigvalsh(a.toarray())[:6]
    np.testing.assert_allclose(w, w_dense, rtol=1e-12)
    np.testing.assert_allclose(a @ v, v * w, atol=1e-12)


def test_float32_runs_in_float64_and_answers_in_float32():
    a = poisson(40).astype(np.float32)
    w, v = run_op("eigsh", a=scipy_to_sparse(a), k=4, which="SA")
    assert w.dtype == np.float32 and v.dtype == np.float32
    w_scipy = sla.eigsh(a.astype(np.float64), k=4, sigma=0, return_eigenvectors=False)
    np.testing.assert_allclose(w, w_scipy, rtol=1e-5)


def test_complex_hermitian_smallest_is_arpacks(lobpcg_runs):
    rng = np.random.default_rng(5)
    m = sp.random_array((120, 120), density=0.05, rng=rng) + 1j * sp.random_array((120, 120), density=0.05, rng=rng)
    a = sp.csr_array(m + m.conj().T + 4 * sp.eye_array(120))
    w, v = run_op("eigsh", a=scipy_to_sparse(a), k=3, which="SA")
    np.testing.assert_allclose(w, np.sort(sla.eigsh(a, k=3, which="SA", return_eigenvectors=False)), rtol=1e-9)
    np.testing.assert_allclose(a @ v, v * w, atol=1e-8)
    assert lobpcg_runs["ran"] == 0


def test_the_hierarchy_is_built_once_per_held_matrix():
    a = held(poisson(40))
    before = multigrid.builds[0]
    first, _ = run_op("eigsh", a=a, k=4, which="SA")
    assert multigrid.builds[0] == before + 1
    again, _ = run_op("eigsh", a=a, k=4, which="SA")
    assert multigrid.builds[0] == before + 1
    np.testing.assert_array_equal(first, again)  # the same start, the same steps: the same bits


# ------------------------------------------------------------------ shift-invert on a kept factorization
def test_shift_invert_factors_once_per_held_matrix_and_shift():
    a_scipy = poisson(30)
    a = held(a_scipy)
    count = eigen.FACTORIZATIONS
    before = count["eigsh"]
    for sigma, made in ((0.5, 1), (0.5, 1), (0.7, 2), (0.5, 2)):
        w, v = run_op("eigsh", a=a, k=4, sigma=sigma)
        np.testing.assert_allclose(w, sla.eigsh(a_scipy, k=4, sigma=sigma, return_eigenvectors=False), rtol=1e-10)
        assert count["eigsh"] == before + made, (sigma, count["eigsh"] - before)
    run_op("eigsh", a=held(a_scipy), k=4, sigma=0.5)  # another matrix (the same values): its own
    assert count["eigsh"] == before + 3
    k_scipy, m_scipy = stiffness_and_mass(20)
    k_held, m_held = held(k_scipy), held(m_scipy)
    for _ in range(2):  # a v = w m v with a shift: a - sigma m, once per (a, m, sigma)
        w, _ = run_op("eigsh", a=k_held, m=m_held, k=3, sigma=0.1)
        np.testing.assert_allclose(w, sla.eigsh(k_scipy, k=3, M=m_scipy, sigma=0.1, return_eigenvectors=False),
                                   rtol=1e-10)
    assert count["eigsh"] == before + 4


def test_a_kept_factorization_is_charged_to_the_handle_and_goes_with_it(server):
    a = poisson(40)
    with make_client(server, "grpc") as c:
        handle = c.put(a)
        before = _store_bytes(server)
        for _ in range(2):
            w = c.call("eigsh", handle, k=4, sigma=0.3)[0]
            np.testing.assert_allclose(w, sla.eigsh(a, k=4, sigma=0.3, return_eigenvectors=False), rtol=1e-10)
            kept = _store_bytes(server) - before
        lu = sla.splu(sp.csc_array(a - 0.3 * sp.eye_array(1600)), permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.1,
                      options={"SymmetricMode": True})
        factor = sum(f.data.nbytes + f.indices.nbytes + f.indptr.nbytes for f in (lu.L, lu.U)) \
            + lu.perm_r.nbytes + lu.perm_c.nbytes
        assert kept >= factor, (kept, factor)  # the factorization (and nothing made twice)
        c.delete(handle)
        assert _store_bytes(server) == before - _held_bytes(a)


def _store_bytes(srv) -> float:
    body = httpx.get(f"{srv.http_url}/metrics").text
    return float(next(line.split()[-1] for line in body.splitlines() if line.startswith("sparseserve_store_bytes ")))


def _held_bytes(a: sp.csr_array) -> int:
    t = scipy_to_sparse(a)
    return sum(arr.nbytes for arr in t.arrays())


# ------------------------------------------------------------------ the generalised problem, every mode
GENERALISED = [{"which": "SA"}, {"which": "LM"}, {"which": "LA"}, {"which": "SM"}, {"sigma": 0.0},
               {"sigma": 0.05}, {"sigma": 0.05, "which": "LA"}, {"sigma": 0.05, "mode": "buckling"},
               {"sigma": 0.05, "mode": "cayley"}, {"sigma": -0.1, "mode": "cayley"}]


@pytest.mark.parametrize("args", GENERALISED, ids=lambda args: "-".join(f"{k}={v}" for k, v in args.items()))
def test_generalised_problem_equals_scipys(args):
    k_scipy, m_scipy = stiffness_and_mass(30)
    w, v = run_op("eigsh", a=scipy_to_sparse(k_scipy), m=scipy_to_sparse(m_scipy), k=4, **args)
    w_scipy = sla.eigsh(k_scipy, k=4, M=m_scipy, return_eigenvectors=False, **args)
    np.testing.assert_allclose(w, np.sort(w_scipy), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(k_scipy @ v, (m_scipy @ v) * w, atol=1e-8)
    if args.get("mode") != "buckling":  # scipy's buckling vectors are normalised otherwise
        np.testing.assert_allclose(v.T @ m_scipy @ v, np.eye(4), atol=1e-8)


def test_generalised_smallest_by_lobpcg(lobpcg_runs):
    k_scipy, m_scipy = stiffness_and_mass(60)
    w, v = run_op("eigsh", a=scipy_to_sparse(k_scipy), m=scipy_to_sparse(m_scipy), k=5, which="SA")
    w_scipy, v_scipy = sla.eigsh(k_scipy, k=5, M=m_scipy, sigma=-1.0)
    assert_same_pairs(k_scipy, w, v, w_scipy, v_scipy, m=m_scipy, gap_ok=False)
    assert lobpcg_runs["converged"] == 1


# ------------------------------------------------------------------ seed, v0, ncv, maxiter
def test_seed_starts_where_scipys_rng_starts():
    a = poisson(20)
    w, v = run_op("eigsh", a=scipy_to_sparse(a), k=4, which="LA", seed=5)
    w_scipy, v_scipy = sla.eigsh(a, k=4, which="LA", rng=5)
    np.testing.assert_allclose(w, w_scipy, rtol=1e-12)
    assert subspace_angles(v, v_scipy).max() < 1e-9
    again, _ = run_op("eigsh", a=scipy_to_sparse(a), k=4, which="LA", seed=5)
    np.testing.assert_array_equal(w, again)
    v0 = RNG.standard_normal(400)
    w, _ = run_op("eigsh", a=scipy_to_sparse(a), k=4, which="LA", v0=v0, ncv=12)
    np.testing.assert_allclose(w, sla.eigsh(a, k=4, which="LA", v0=v0, ncv=12, return_eigenvectors=False),
                               rtol=1e-12)


def test_arpack_out_of_iterations_is_not_converged():
    a = poisson(30)
    error = op_raises(InternalError, "NOT_CONVERGED", "eigsh", a=scipy_to_sparse(a), k=4, which="SM",
                      solver="arpack", maxiter=2)
    assert "maxiter" in error.message
    op_raises(InternalError, "NOT_CONVERGED", "eigsh", a=scipy_to_sparse(a), k=4, which="SA", solver="lobpcg",
              maxiter=1)


# ------------------------------------------------------------------ svds with scipy's solvers
# scipy's PROPACK with SM answers zeros for this matrix (its vectors then are no singular vectors),
# ours the same: not a case to hold either to.
@pytest.mark.parametrize("solver, which", [("arpack", "LM"), ("arpack", "SM"), ("lobpcg", "LM"), ("lobpcg", "SM"),
                                           ("propack", "LM")])
def test_svds_solvers_equal_scipys(solver, which):
    b = sp.random_array((80, 50), density=0.2, rng=np.random.default_rng(6)).tocsr()
    extra = {"maxiter": 200} if solver == "lobpcg" else {}  # scipy's 20 LOBPCG iterations do not reach 1e-7
    u, s, vt = run_op("svds", a=scipy_to_sparse(b), k=4, which=which, solver=solver, seed=3, **extra)
    s_scipy = sla.svds(b, k=4, which=which, solver=solver, rng=np.random.default_rng(3), return_singular_vectors=False,
                       **extra)
    np.testing.assert_allclose(s, s_scipy, rtol=1e-7)
    np.testing.assert_allclose(b @ vt.T, u * s, atol=1e-7)
    np.testing.assert_allclose(u.T @ u, np.eye(4), atol=1e-7)


def test_svds_propack_takes_k_up_to_min_and_v0_of_m():
    b = sp.random_array((30, 20), density=0.3, rng=np.random.default_rng(7)).tocsr()
    _, s, _ = run_op("svds", a=scipy_to_sparse(b), k=20, solver="propack")
    np.testing.assert_allclose(s, np.linalg.svd(b.toarray(), compute_uv=False)[::-1], rtol=1e-9, atol=1e-12)
    op_raises(InvalidArgumentError, "K_OUT_OF_RANGE", "svds", a=scipy_to_sparse(b), k=20)
    v0 = RNG.standard_normal(30)
    _, s, _ = run_op("svds", a=scipy_to_sparse(b), k=3, solver="propack", v0=v0)
    np.testing.assert_allclose(s, sla.svds(b, k=3, solver="propack", v0=v0, return_singular_vectors=False),
                               rtol=1e-9)
    op_raises(InvalidArgumentError, "SHAPE_MISMATCH", "svds", a=scipy_to_sparse(b), k=3, v0=v0)  # [20] for arpack


# ------------------------------------------------------------------ refusals
def test_refusals_name_the_argument_and_rule():
    a = scipy_to_sparse(poisson(10))
    hermitian = sp.csr_array(sp.eye_array(10, dtype=np.complex128) * 2)
    c = scipy_to_sparse(hermitian)
    assert "mode" in op_raises(InvalidArgumentError, "BAD_MODE", "eigsh", a=c, k=2, sigma=1.0,
                               mode="buckling").message
    op_raises(InvalidArgumentError, "BAD_MODE", "eigsh", a=a, mode="shift")
    op_raises(InvalidArgumentError, "BAD_WHICH", "eigsh", a=c, k=2, which="BE")
    op_raises(InvalidArgumentError, "K_OUT_OF_RANGE", "eigsh", a=c, k=9)  # n - 1 for eigs
    assert "arpack" in op_raises(InvalidArgumentError, "BAD_SOLVER", "eigsh", a=a, which="LA",
                                 solver="lobpcg").message
    op_raises(InvalidArgumentError, "BAD_SOLVER", "eigsh", a=c, k=2, which="SA", solver="lobpcg")
    op_raises(InvalidArgumentError, "BAD_SOLVER", "eigsh", a=a, solver="magic")
    # the entries decide: sigma 1 is inside Poisson's spectrum, so the nearest need not be the smallest
    assert "Gershgorin" in op_raises(InvalidArgumentError, "BAD_SOLVER", "eigsh", a=a, sigma=1.0,
                                     solver="lobpcg").message
    op_raises(InvalidArgumentError, "SHAPE_MISMATCH", "eigsh", a=a, m=scipy_to_sparse(poisson(9)))
    op_raises(InvalidArgumentError, "DTYPE_MISMATCH", "eigsh", a=a, m=scipy_to_sparse(sp.eye_array(100) * 1j))
    op_raises(InvalidArgumentError, "NOT_HERMITIAN", "eigsh", a=a,
              m=scipy_to_sparse(sp.csr_array(sp.eye_array(100) + sp.eye_array(100, k=1))))
    op_raises(InvalidArgumentError, "SHAPE_MISMATCH", "eigsh", a=a, v0=np.ones(99))
    op_raises(InvalidArgumentError, "DTYPE_MISMATCH", "eigsh", a=a, v0=np.ones(100, np.complex128))
    op_raises(InvalidArgumentError, "NOT_FINITE", "eigsh", a=a, v0=np.full(100, np.nan))
    assert "ncv" in op_raises(InvalidArgumentError, "VALUE_OUT_OF_RANGE", "eigsh", a=a, k=6, ncv=6).message
    op_raises(InvalidArgumentError, "VALUE_OUT_OF_RANGE", "eigsh", a=a, seed=-1)
    op_raises(InvalidArgumentError, "BAD_MAXITER", "eigsh", a=a, maxiter=0)
    op_raises(InvalidArgumentError, "BAD_SOLVER", "svds", a=a, solver="magic")
    op_raises(InvalidArgumentError, "BAD_TOL", "svds", a=a, tol=-1.0)
    op_raises(InvalidArgumentError, "SINGULAR", "eigsh", a=scipy_to_sparse(sp.eye_array(10)), k=2, sigma=1.0,
              solver="arpack")


# ------------------------------------------------------------------ a deadline inside LOBPCG
def test_a_deadline_abandons_lobpcg(server):
    a = poisson(250)
    with make_client(server, "grpc") as c:
        handle = c.put(a)
        c.call("eigsh", handle, k=2, which="SA", tol=1e-3)  # the hierarchy built and kept
    with make_client(server, "grpc", timeout=0.3) as c:
        with pytest.raises(DeadlineExceededError):
            c.call("eigsh", handle, k=12, which="SA")
    abandoned = time.monotonic()
    body = ""
    while "sparseserve_in_flight_requests 0.0" not in body:
        assert time.monotonic() - abandoned < 3, "eigsh ran on past its deadline"
        time.sleep(0.02)
        body = httpx.get(f"{server.http_url}/metrics").text
    with make_client(server, "grpc") as c:
        c.delete(handle)


# ------------------------------------------------------------------ through the SDK
@pytest.mark.parametrize("wire", WIRES)
def test_sdk_eigsh_takes_scipys_arguments(server, wire):
    k_scipy, m_scipy = stiffness_and_mass(20)
    with make_client(server, wire) as c:
        A = c.put(k_scipy)
        for M in (m_scipy, m_scipy.toarray(), c.put(m_scipy)):
            w, v = linalg.eigsh(A, k=3, M=M, sigma=0.1, mode="cayley")
            np.testing.assert_allclose(w, sla.eigsh(k_scipy, k=3, M=m_scipy, sigma=0.1, mode="cayley",
                                                    return_eigenvectors=False), rtol=1e-10)
        w = linalg.eigsh(A, k=3, which="LA", rng=4, return_eigenvectors=False)
        np.testing.assert_allclose(w, sla.eigsh(k_scipy, k=3, which="LA", rng=4, return_eigenvectors=False),
                                   rtol=1e-12)
        gen = np.random.default_rng(1)
        w_gen = linalg.eigsh(A, k=3, which="LA", rng=gen, return_eigenvectors=False)
        np.testing.assert_allclose(w_gen, w, rtol=1e-12)
        w, v = linalg.eigsh(A, k=3, which="SA", solver="lobpcg")
        np.testing.assert_allclose(w, sla.eigsh(k_scipy, k=3, sigma=-1.0, return_eigenvectors=False), rtol=1e-9)
        A.delete()


def test_sdk_refuses_operators_it_cannot_send(server):
    with make_client(server, "grpc") as c:
        A = c.put(poisson(10))
        identity = sla.LinearOperator((100, 100), matvec=lambda x: x)
        with pytest.raises(TypeError, match="M as an operator"):
            linalg.eigsh(A, k=2, M=identity)
        with pytest.raises(TypeError, match="OPinv"):
            linalg.eigsh(A, k=2, sigma=1.0, OPinv=identity)
        with pytest.raises(TypeError, match="Minv"):
            linalg.eigsh(A, k=2, M=sp.eye_array(100), Minv=identity)
        with pytest.raises(TypeError, match="rng"):
            linalg.eigsh(A, k=2, rng="seed")
        with pytest.raises(ValueError, match="mode"):  # InvalidArgumentError is a ValueError, as scipy's
            linalg.eigsh(A, k=2, sigma=1.0, mode="shift")
        with pytest.raises(TypeError, match="options"):
            linalg.svds(A, k=2, options={"x": 1})
        A.delete()


def test_sdk_svds_solvers_rng_and_what_it_returns(server):
    b = sp.random_array((60, 40), density=0.2, rng=np.random.default_rng(8)).tocsr()
    with make_client(server, "grpc") as c:
        B = c.put(b)
        for solver in ("arpack", "lobpcg", "propack"):
            s = linalg.svds(B, k=3, solver=solver, rng=2, maxiter=200 if solver == "lobpcg" else None,
                            return_singular_vectors=False)
            np.testing.assert_allclose(s, sla.svds(b, k=3, solver=solver, return_singular_vectors=False,
                                                   maxiter=200 if solver == "lobpcg" else None), rtol=1e-7)
        u, s, vt = linalg.svds(B, k=3, return_singular_vectors="u")
        assert vt is None and u.shape == (60, 3)
        u, s, vt = linalg.svds(B, k=3, return_singular_vectors="vh")
        assert u is None and vt.shape == (3, 40)
        B.delete()
