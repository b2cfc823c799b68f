"""Eigenvalues, SVD and direct solves: eigsh, svds, spsolve, factorize and solve.

Each compared with scipy on the same inputs in the same test (eigenvalues, singular values,
``a @ x`` against ``b``), shift-invert, a factor kept on the server and reused, deleted, guarded
from another tenant and counted in the store's gauges, the refusals of bad arguments, and a
deadline abandoning a long eigsh; over every wire for a sample."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla

from sparseserve import (DeadlineExceededError, InvalidArgumentError, NotFoundError, PermissionDeniedError,
                         SparseTensor)
from sparseserve.core.convert import scipy_to_sparse
from sparseserve.kernels import solvers as sk
from conftest import WIRES, ServerProcess, make_client, op_raises, run_op

ALICE, BOB = "alice-eigen-token", "bob-eigen-token"


# ------------------------------------------------------------------ inputs
def symmetric(n: int, seed: int, density: float = 0.05, dtype=np.float64) -> sp.csr_array:
    rng = np.random.default_rng(seed)
    m = sp.random_array((n, n), density=density, rng=rng, dtype=dtype)
    if np.dtype(dtype).kind == "c":
        m = m + 1j * sp.random_array((n, n), density=density, rng=rng)
    return (m + m.conj().T + sp.eye_array(n)).astype(dtype).tocsr()


def nonsymmetric(n: int, seed: int) -> sp.csr_array:
    rng = np.random.default_rng(seed)
    return (sp.random_array((n, n), density=0.05, rng=rng) + 4 * sp.eye_array(n)).tocsr()


def poisson(grid: int) -> sp.csr_array:
    line = sp.diags_array([-np.ones(grid - 1), 4 * np.ones(grid), -np.ones(grid - 1)], offsets=[-1, 0, 1])
    ones = sp.diags_array([-np.ones(grid - 1), -np.ones(grid - 1)], offsets=[-1, 1])
    return (sp.kron(sp.eye_array(grid), line) + sp.kron(ones, sp.eye_array(grid))).tocsr()


def tensor(m, layout: str = "csr") -> SparseTensor:
    return scipy_to_sparse(m.tocsc() if layout == "csc" else m.tocoo() if layout == "coo" else m.tocsr())


def assert_eigenpairs(a, w, v, w_scipy, rtol) -> None:
    np.testing.assert_allclose(w, w_scipy, rtol=rtol, atol=rtol)
    residual = np.abs(a @ v - v * w).max()
    assert residual < rtol * max(1.0, np.abs(w).max()) * 10, residual


# ------------------------------------------------------------------ eigsh
@pytest.mark.parametrize("which", ["LM", "SA", "LA", "BE"])
@pytest.mark.parametrize("layout", ["csr", "coo", "csc"])
def test_eigsh_equals_scipy(which, layout):
    a = symmetric(120, seed=1)
    w, v = run_op("eigsh", a=tensor(a, layout), k=5, which=which)
    w_scipy, v_scipy = sla.eigsh(a, k=5, which=which)
    assert_eigenpairs(a, w, v, w_scipy, 1e-8)
    # Eigenvectors up to sign (the eigenvalues of a random matrix are distinct).
    np.testing.assert_allclose(np.abs(v.T @ v_scipy), np.eye(5), atol=1e-6)


def test_eigsh_shift_invert_equals_scipy():
    a = poisson(20)
    w, v = run_op("eigsh", a=tensor(a), k=4, sigma=0.5)
    w_scipy, _ = sla.eigsh(a, k=4, sigma=0.5)
    assert_eigenpairs(a, w, v, w_scipy, 1e-8)


@pytest.mark.parametrize("dtype", [np.float32, np.complex128])
def test_eigsh_other_dtypes(dtype):
    a = symmetric(80, seed=2, dtype=dtype)
    w, v = run_op("eigsh", a=tensor(a), k=3)
    w_scipy = np.sort(sla.eigsh(a, k=3, return_eigenvectors=False))  # scipy's eigs (complex) does not sort
    assert w.dtype.kind == "f" and v.dtype == dtype
    assert_eigenpairs(a, w, v, w_scipy, 1e-3 if dtype == np.float32 else 1e-8)


# ------------------------------------------------------------------ svds
@pytest.mark.parametrize("shape", [(90, 60), (50, 120)])
@pytest.mark.parametrize("which", ["LM", "SM"])
def test_svds_equals_scipy(shape, which):
    b = sp.random_array(shape, density=0.1, rng=np.random.default_rng(3)).tocsr()
    u, s, vt = run_op("svds", a=tensor(b), k=4, which=which)
    _, s_scipy, _ = sla.svds(b, k=4, which=which, solver="arpack", random_state=0)
    np.testing.assert_allclose(s, s_scipy, rtol=1e-7)
    assert u.shape == (shape[0], 4) and vt.shape == (4, shape[1])
    np.testing.assert_allclose(b @ vt.T, u * s, atol=1e-7)  # a v_i = s_i u_i


# ------------------------------------------------------------------ direct solves
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
def test_spsolve_vector_and_block(dtype):
    a = nonsymmetric(150, seed=4).astype(dtype)
    rng = np.random.default_rng(5)
    for b in (rng.random(150).astype(dtype), rng.random((150, 3)).astype(dtype)):
        x = run_op("spsolve", a=tensor(a, "coo"), b=b)
        tol = 1e-4 if dtype == np.float32 else 1e-10
        np.testing.assert_allclose(a @ x, b, atol=tol)
        np.testing.assert_allclose(x, sla.spsolve(a.tocsc(), b), rtol=tol * 10, atol=tol)


def test_factorize_then_solve_equals_splu():
    a = nonsymmetric(200, seed=6)
    lower, upper, perm_r, perm_c = run_op("factorize", a=tensor(a))
    lu = sla.splu(a.tocsc())
    np.testing.assert_array_equal(perm_r, lu.perm_r)
    assert lower.to_scipy().nnz == lu.L.nnz and upper.to_scipy().nnz == lu.U.nnz
    rng = np.random.default_rng(7)
    for b in (rng.random(200), rng.random((200, 4))):
        x = run_op("solve", factor=[lower, upper, perm_r, perm_c], b=b)
        np.testing.assert_allclose(x, lu.solve(b), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128, np.complex64])
def test_the_triangular_solves_are_scipys(dtype):
    """solve's kernels against the spsolve_triangular they replace (kernels/solvers.py)."""
    rng = np.random.default_rng(8)
    m = sp.random_array((120, 120), density=0.1, rng=rng) + sp.eye_array(120) * 2
    m = (m + 1j * sp.random_array((120, 120), density=0.1, rng=rng)).astype(dtype) if np.iscomplexobj(
        np.empty(0, dtype)) else m.astype(dtype)
    tol = 1e-4 if dtype in (np.float32, np.complex64) else 1e-12
    for lower in (True, False):
        t = sp.csr_array(sp.tril(m) if lower else sp.triu(m))
        ptr, idx = t.indptr.astype(np.int64), t.indices.astype(np.int64)
        b = rng.standard_normal(120).astype(dtype)
        got = b.copy()
        if lower:
            sk.unit_lower_solve(ptr, idx, t.data, got)
        else:
            assert sk.upper_solve(ptr, idx, t.data, got) == -1
        want = sla.spsolve_triangular(t, b, lower=lower, unit_diagonal=lower)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
        assert sk.misplaced_row(ptr, idx, lower) == -1 and sk.misplaced_row(ptr, idx, not lower) >= 0


# ------------------------------------------------------------------ refusals
def test_bad_arguments_name_the_argument_and_rule():
    a = tensor(symmetric(30, seed=8))
    rect = tensor(sp.random_array((30, 20), density=0.2, rng=np.random.default_rng(0)).tocsr())
    for k in (0, 30):
        assert "k" in op_raises(InvalidArgumentError, "K_OUT_OF_RANGE", "eigsh", a=a, k=k).message
    assert "min(m, n)" in op_raises(InvalidArgumentError, "K_OUT_OF_RANGE", "svds", a=rect, k=20).message
    assert "which" in op_raises(InvalidArgumentError, "BAD_WHICH", "eigsh", a=a, which="XX").message
    op_raises(InvalidArgumentError, "BAD_WHICH", "svds", a=rect, which="LA")
    op_raises(InvalidArgumentError, "NOT_SQUARE", "eigsh", a=rect)
    op_raises(InvalidArgumentError, "NOT_SQUARE", "spsolve", a=rect, b=np.ones(30))
    op_raises(InvalidArgumentError, "NOT_HERMITIAN", "eigsh", a=tensor(nonsymmetric(30, seed=9)))
    op_raises(InvalidArgumentError, "NOT_FINITE", "eigsh", a=a, sigma=float("nan"))
    op_raises(InvalidArgumentError, "BAD_TOL", "eigsh", a=a, tol=-1.0)
    ints = SparseTensor(indices=[[0, 0], [1, 1]], values=np.array([1, 2]), dense_shape=[2, 2])
    assert "float32" in op_raises(InvalidArgumentError, "UNSUPPORTED_DTYPE", "spsolve", a=ints,
                                  b=np.ones(2, np.int64)).message
    assert "b" in op_raises(InvalidArgumentError, "SHAPE_MISMATCH", "spsolve", a=a, b=np.ones(29)).message
    op_raises(InvalidArgumentError, "DTYPE_MISMATCH", "spsolve", a=a, b=np.ones(30, np.float32))
    op_raises(InvalidArgumentError, "NOT_FINITE", "spsolve", a=a, b=np.full(30, np.inf))
    singular = tensor(sp.csr_array(np.array([[1.0, 2.0], [2.0, 4.0]])))
    op_raises(InvalidArgumentError, "SINGULAR", "spsolve", a=singular, b=np.ones(2))
    op_raises(InvalidArgumentError, "SINGULAR", "factorize", a=singular)
    lower, upper, perm_r, perm_c = run_op("factorize", a=a)
    op_raises(InvalidArgumentError, "BAD_FACTOR", "solve", factor=[lower, upper, perm_r], b=np.ones(30))
    op_raises(InvalidArgumentError, "BAD_FACTOR", "solve", factor=[upper, lower, perm_r, perm_c], b=np.ones(30))
    op_raises(InvalidArgumentError, "BAD_FACTOR", "solve", factor=[lower, upper, perm_r, perm_c[:-1]],
              b=np.ones(30))


# ------------------------------------------------------------------ through a server
@pytest.fixture(scope="module")
def token_server(tmp_path_factory):
    tokens = tmp_path_factory.mktemp("eigen") / "tokens"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\n")
    srv = ServerProcess("--token-file", str(tokens))
    yield srv
    assert srv.stop() == 0, srv.log()


def gauge(srv: ServerProcess, name: str) -> float:
    body = httpx.get(f"{srv.http_url}/metrics").text
    return float(next(line.split()[-1] for line in body.splitlines() if line.startswith(f"{name} ")))


def store_bytes(srv: ServerProcess) -> float:
    return gauge(srv, "sparseserve_store_bytes")


@pytest.mark.parametrize("wire", WIRES)
def test_ops_over_every_wire(token_server, wire):
    a = symmetric(60, seed=10)
    rng = np.random.default_rng(11)
    with make_client(token_server, wire, token=ALICE) as c:
        handle = c.put(tensor(a))
        w, v = c.call("eigsh", handle, k=3)
        np.testing.assert_allclose(w, sla.eigsh(a, k=3)[0], rtol=1e-8)
        u, s, vt = c.call("svds", handle, k=3)
        np.testing.assert_allclose(s, sla.svds(a, k=3, solver="arpack", random_state=0)[1], rtol=1e-7)
        b = rng.random(60)
        np.testing.assert_allclose(a @ c.call("spsolve", handle, b), b, atol=1e-10)
        c.delete(handle)


def test_kept_factor_reused_counted_guarded_and_deleted(token_server):
    a = nonsymmetric(300, seed=12)
    rng = np.random.default_rng(13)
    with make_client(token_server, "grpc", token=ALICE) as alice, \
            make_client(token_server, "rest-protobuf", token=BOB) as bob:
        before = store_bytes(token_server)
        factor = alice.call("factorize", tensor(a), keep=True)
        assert len(factor) == 4
        lu = sla.splu(a.tocsc())
        held = store_bytes(token_server) - before
        factor_bytes = (lu.L.nnz + lu.U.nnz) * (8 + 8) + 2 * (300 + 1) * 8 + 2 * 300 * 8
        assert held == factor_bytes, (held, factor_bytes)
        for b in (rng.random(300), rng.random(300), rng.random((300, 2))):
            np.testing.assert_allclose(a @ alice.call("solve", factor, b), b, atol=1e-10)
        with pytest.raises(PermissionDeniedError) as info:
            bob.call("solve", factor, rng.random(300))
        assert info.value.reason == "OTHER_TENANT"
        for h in factor:
            alice.delete(h)
        assert store_bytes(token_server) == before
        with pytest.raises(NotFoundError):
            alice.call("solve", factor, rng.random(300))


def test_deadline_abandons_a_long_eigsh(token_server):
    # The smallest eigenvalues by ARPACK's SM without a shift: thousands of products, over 10 s to the
    # end (scipy takes about 4 s on poisson(150)), so a server that ran it out would stay busy long after.
    a = poisson(200)
    with make_client(token_server, "grpc", token=ALICE) as c:
        handle = c.put(tensor(a))
    with make_client(token_server, "grpc", token=ALICE, timeout=0.5) as c:
        with pytest.raises(DeadlineExceededError):
            c.call("eigsh", handle, k=6, which="SM", solver="arpack")
    abandoned = time.monotonic()
    while gauge(token_server, "sparseserve_in_flight_requests") > 0:  # the kernel thread let go of it
        assert time.monotonic() - abandoned < 3, "eigsh ran on past its deadline"
        time.sleep(0.02)
    with make_client(token_server, "grpc", token=ALICE) as c:
        c.delete(handle)


def test_duplicates_are_summed_and_a_held_csr_is_left_as_it_was():
    # A CSR with a repeated column in a row and unsorted columns: read as the sum, the input untouched.
    ptr, idx = np.array([0, 3, 4, 5]), np.array([2, 0, 0, 1, 2])
    vals = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    a = SparseTensor(layout="csr", compressed_indices=ptr, plain_indices=idx, values=vals, dense_shape=[3, 3])
    dense = np.array([[5.0, 0, 1], [0, 4, 0], [0, 0, 5]])
    b = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(run_op("spsolve", a=a, b=b), np.linalg.solve(dense, b))
    np.testing.assert_array_equal(a.plain_indices, [2, 0, 0, 1, 2])
    np.testing.assert_array_equal(a.values, [1.0, 2.0, 3.0, 4.0, 5.0])


def test_without_scipy_the_server_loads_and_the_ops_say_what_is_missing():
    import subprocess
    import sys

    code = ("import sys; sys.modules['scipy'] = None\n"
            "from sparseserve import SparseTensor\n"
            "from sparseserve.server.ops import REGISTRY\n"
            "a = SparseTensor(indices=[[0, 0], [1, 1]], values=[1.0, 2.0], dense_shape=[2, 2])\n"
            "try:\n"
            "    REGISTRY.get('eigsh').run('cpu', REGISTRY.get('eigsh').bind({'a': a, 'k': 1}))\n"
            "except Exception as exc:\n"
            "    print(type(exc).__name__, exc.reason)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "UnimplementedError MISSING_DEPENDENCY", out.stderr[-2000:]
