"""The SDK as a sparse array (issue 27, part 2): ``RemoteTensor``'s description and operators,
and ``sparseserve.linalg``, each held to scipy on the same arrays, against the session's server
over every wire."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from sparseserve import AsyncClient, RemoteTensor, linalg
from sparseserve.errors import NotFoundError

from conftest import WIRES, make_client

RNG = np.random.default_rng(27)


def random_csr(m: int, n: int, density: float = 0.3, dtype=np.float64, seed: int = 0) -> sp.csr_array:
    """Entries of both signs (so that max has something to decide), sorted indices."""
    rng = np.random.default_rng(seed)
    a = sp.random_array((m, n), density=density, format="csr", rng=rng, dtype=np.float64)
    a.data = (a.data - 0.5) * 8
    return a.astype(dtype)


def dense_of(value) -> np.ndarray:
    """A RemoteTensor fetched and densified, or scipy's answer densified."""
    if isinstance(value, RemoteTensor):
        return value.toarray()
    return value.toarray() if sp.issparse(value) else np.asarray(value)


def same(got, want, dtype=True) -> None:
    """Equal values (to rounding in their dtype: sums may add in another order) and scipy's dtype."""
    got_dense, want_dense = dense_of(got), dense_of(want)
    assert got_dense.shape == want_dense.shape
    tol = 1e-5 if want_dense.dtype in (np.float32, np.complex64) else 1e-12
    np.testing.assert_allclose(got_dense, want_dense, rtol=tol, atol=tol)
    if dtype:
        assert got_dense.dtype == want_dense.dtype, (got_dense.dtype, want_dense.dtype)


def poisson(n: int) -> sp.csr_array:
    t = sp.diags_array([-np.ones(n - 1), 2 * np.ones(n), -np.ones(n - 1)], offsets=[-1, 0, 1])
    eye = sp.eye_array(n)
    return (sp.kron(eye, t) + sp.kron(t, eye)).tocsr()


@pytest.fixture(scope="module", params=WIRES)
def c(request, server):
    with make_client(server, request.param) as client:
        yield client


# ------------------------------------------------------------------ what a handle says it holds
def test_put_and_kept_outputs_describe_what_they_hold(c):
    S = random_csr(6, 5)
    A = c.put(S)
    assert (A.shape, A.dtype, A.nnz, A.layout, A.format, A.ndim) == ((6, 5), np.float64, S.nnz, "csr", "csr", 2)
    assert A.nbytes == S.data.nbytes + S.indices.nbytes + S.indptr.nbytes
    for kept in (A.T, A.tocoo(), A * 2.0, c.call("matmul", a=A, b=np.ones((5, 3)), keep=True)):
        fetched = kept.get()
        layout = "dense" if isinstance(fetched, np.ndarray) else fetched.layout
        shape = fetched.shape if isinstance(fetched, np.ndarray) else fetched.dense_shape
        nnz = fetched.size if isinstance(fetched, np.ndarray) else fetched.nnz
        assert (kept.layout, kept.shape, kept.dtype, kept.nnz) == (layout, tuple(shape), fetched.dtype, nnz)
        assert kept.nbytes == fetched.nbytes


def test_a_handle_the_server_did_not_describe_says_so(c):
    bare = RemoteTensor(c.put(np.ones(3)).handle, client=c)
    with pytest.raises(AttributeError, match="did not describe"):
        _ = bare.shape
    np.testing.assert_array_equal(bare.get(), np.ones(3))


# ------------------------------------------------------------------ operators against scipy
def test_products_match_scipy(c):
    S, B = random_csr(7, 5, seed=1), random_csr(5, 4, seed=2)
    A, RB = c.put(S), c.put(B)
    x, X, y = RNG.standard_normal(5), RNG.standard_normal((5, 3)), RNG.standard_normal(7)
    same(A @ x, S @ x)
    same(A @ X, S @ X)
    same(y @ A, y @ S)
    same(A.dot(x), S.dot(x))
    product = A @ RB  # sparse @ sparse stays on the server
    assert isinstance(product, RemoteTensor) and product.shape == (7, 4)
    same(product, S @ B)
    same(A @ B, S @ B)  # a local scipy operand is sent, the sparse result kept
    gram = A.T @ A  # A.T is never downloaded: it is a handle, and so is the product
    assert isinstance(A.T, RemoteTensor) and isinstance(gram, RemoteTensor)
    same(gram, S.T @ S)


def test_elementwise_and_sums_match_scipy(c):
    S, S2 = random_csr(6, 5, seed=3), random_csr(6, 5, seed=4)
    A, A2 = c.put(S), c.put(S2)
    row = RNG.standard_normal(5)
    same(A * 2.5, S * 2.5)
    same(3 * A, 3 * S)
    same(A / 4.0, S / 4.0)
    same(A * row, S * row)  # a dense row broadcast over the stored entries: sparse, kept
    assert isinstance(A * row, RemoteTensor)
    same(A * A2, S * S2)
    same(A.multiply(A2), S.multiply(S2))
    same(A + A2, S + S2)
    same(A + c.put(S2.tocoo()), S + S2.tocoo())  # another layout: converted on the server first
    same(A - A2, S - S2)
    same(A - c.put(S2.tocoo()), S - S2.tocoo())
    same(-A, -S)
    dense = RNG.standard_normal((6, 5))
    same(A + dense, S + dense)
    same(A - dense, S - dense)
    same(dense - A, dense - S)
    assert A + 0 is A
    with pytest.raises(NotImplementedError, match="nonzero scalar"):
        A + 1
    with pytest.raises(ZeroDivisionError):
        A / 0
    with np.errstate(divide="ignore", invalid="ignore"):
        same(A / dense, S / dense)


def test_shape_and_indexing_match_scipy(c):
    S = random_csr(6, 5, seed=5)
    A = c.put(S)
    assert A.T.layout == S.T.format == "csc"
    same(A.T, S.T)
    same(A.transpose(), S.transpose())
    Z = (random_csr(4, 3, seed=6) + 1j * random_csr(4, 3, seed=7)).astype(np.complex128)
    Hz = c.put(Z).H
    assert isinstance(Hz, RemoteTensor)
    same(Hz, Z.conj().T)
    same(c.put(Z).conj(), Z.conj())
    assert A.conj() is A
    for fmt in ("coo", "csr", "csc"):
        converted = A.asformat(fmt)
        assert converted.layout == fmt
        same(converted, S.asformat(fmt))
    same(A.toarray(), S.toarray())
    same(A.todense(), S.todense())
    for key in (1, (2, 3), (-1, -2), slice(1, 4), (slice(None), slice(1, 4)), (slice(0, 5, 2), 3)):
        got, want = A[key], S[key]
        if np.isscalar(want) or np.ndim(want) == 0:
            assert not isinstance(got, RemoteTensor) and got == want
        else:
            assert isinstance(got, RemoteTensor)
            same(got, want)
    with pytest.raises(IndexError, match="ints and slices"):
        A[[1, 2]]


def check_reductions(client, dtype) -> None:
    S = random_csr(5, 6, density=0.5, seed=8, dtype=dtype).tolil()
    # A full row (of negatives where the dtype has them): its max is not 0.
    S[0, :] = np.arange(1, 7) * (1 if np.dtype(dtype).kind == "u" else -1)
    S = S.tocsr()
    A = client.put(S)
    for axis in (None, 0, 1, -1):
        same(A.sum(axis=axis), S.sum(axis=axis))
        want_max = S.max(axis=axis)
        same(A.max(axis=axis), want_max.toarray() if sp.issparse(want_max) else want_max)
    same(A * 2, S * 2)
    same(A * 2.5, S * 2.5)
    same(A / 2, S / 2)


def test_reductions_match_scipy(c):
    check_reductions(c, np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.int32, np.int64, np.uint16])
def test_result_dtypes_follow_scipy(server, dtype):
    """Sums widen small integers, division goes to float64, scalars are weak: as in scipy."""
    with make_client(server, "grpc") as client:
        check_reductions(client, dtype)


def test_duplicates_are_summed_as_scipy_sums_them(c):
    coo = sp.coo_array((np.array([-3.0, 1.0, -2.0]), (np.array([0, 0, 1]), np.array([1, 1, 0]))), shape=(2, 2))
    A = c.put(coo)
    same(A.toarray(), coo.toarray())
    same(A.max(axis=1), coo.max(axis=1).toarray())
    same(A.sum(axis=0), coo.sum(axis=0))


def test_async_client_operators_are_awaitable(server):
    async def main():
        async with AsyncClient(server.grpc_target) as ac:
            S = random_csr(5, 4, seed=9)
            A = await ac.put(S)
            x = RNG.standard_normal(4)
            same(await (A @ x), S @ x)
            AT = await A.T
            assert isinstance(AT, RemoteTensor) and AT.shape == (4, 5)
            same(await AT.toarray(), S.T.toarray())
            same(await A.max(axis=0), S.max(axis=0).toarray())
            same(await A.sum(), S.sum())
            with pytest.raises(TypeError, match="calls block"):
                linalg.cg(A, np.ones(5))

    asyncio.run(main())


# ------------------------------------------------------------------ sparseserve.linalg
def test_solvers_answer_as_scipy(c):
    S = poisson(12)
    A = c.put(S)
    b = RNG.standard_normal(S.shape[0])
    for ours, theirs, kwargs in ((linalg.cg, spla.cg, {}), (linalg.bicgstab, spla.bicgstab, {}),
                                 (linalg.gmres, spla.gmres, {"restart": 10}), (linalg.minres, spla.minres, {})):
        x, info = ours(A, b, rtol=1e-8, **kwargs)
        want, want_info = theirs(S, b, rtol=1e-8, **kwargs)
        assert isinstance(info, int) and info == want_info == 0, ours.__name__
        np.testing.assert_allclose(x, want, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(S @ x, b, atol=1e-6 * np.linalg.norm(b))
    x, info = linalg.cg(A, b, maxiter=3)
    assert info == 3  # not converged: scipy's iteration count, no exception
    x, info = linalg.cg(A, b, rtol=1e-10, preconditioner="jacobi")
    assert info == 0 and np.linalg.norm(S @ x - b) <= 1e-9 * np.linalg.norm(b)


def test_direct_and_eigen_answer_as_scipy(c):
    S = poisson(10)
    A = c.put(S)
    b = RNG.standard_normal(S.shape[0])
    np.testing.assert_allclose(linalg.spsolve(A, b), spla.spsolve(S.tocsc(), b), rtol=1e-10)
    solve = linalg.factorized(A)
    np.testing.assert_allclose(solve(b), spla.factorized(S.tocsc())(b), rtol=1e-10)
    solve.delete()
    with pytest.raises(NotFoundError):
        solve(b)
    w, v = linalg.eigsh(A, k=4)
    np.testing.assert_allclose(w, spla.eigsh(S, k=4, return_eigenvectors=False), rtol=1e-9)
    np.testing.assert_allclose(S @ v, v * w, atol=1e-8)
    np.testing.assert_allclose(linalg.eigsh(A, k=3, sigma=0, return_eigenvectors=False),
                               spla.eigsh(S, k=3, sigma=0, return_eigenvectors=False), rtol=1e-9)
    N = random_csr(12, 9, density=0.4, seed=10)
    u, s, vt = linalg.svds(c.put(N), k=3)
    np.testing.assert_allclose(s, spla.svds(N, k=3, return_singular_vectors=False), rtol=1e-9)
    np.testing.assert_allclose(N @ vt.T, u * s, atol=1e-8)


def test_scipy_solvers_run_on_the_remote_operator(c):
    S = random_csr(8, 6, seed=11)
    L = linalg.aslinearoperator(c.put(S))
    assert (L.shape, L.dtype) == ((8, 6), np.float64)
    x, X, y = RNG.standard_normal(6), RNG.standard_normal((6, 2)), RNG.standard_normal(8)
    np.testing.assert_allclose(L.matvec(x), S @ x, rtol=1e-12)
    np.testing.assert_allclose(L.rmatvec(y), S.T @ y, rtol=1e-12)
    np.testing.assert_allclose(L.matmat(X), S @ X, rtol=1e-12)
    np.testing.assert_allclose(L.H.matmat(np.eye(8)), S.T.toarray(), rtol=1e-12)
    np.testing.assert_allclose(spla.lsqr(L, y)[0], spla.lsqr(S, y)[0], rtol=1e-8)
    P = poisson(8)
    b = RNG.standard_normal(P.shape[0])
    steps: dict[str, int] = {"remote": 0, "local": 0}
    remote, info = spla.cg(linalg.aslinearoperator(c.put(P)), b, rtol=1e-10,
                           callback=lambda _: steps.__setitem__("remote", steps["remote"] + 1))
    local, _ = spla.cg(P, b, rtol=1e-10, callback=lambda _: steps.__setitem__("local", steps["local"] + 1))
    assert info == 0 and steps["remote"] == steps["local"]
    np.testing.assert_allclose(remote, local, rtol=1e-10)


def test_linalg_refuses_what_it_cannot_do(c):
    A = c.put(poisson(4))
    b = np.ones(16)
    with pytest.raises(TypeError, match="preconditioner='jacobi'"):
        linalg.cg(A, b, M=spla.LinearOperator((16, 16), matvec=lambda v: v))
    with pytest.raises(TypeError, match="progress=fn"):
        linalg.gmres(A, b, callback=print)
    with pytest.raises(TypeError, match="client.put"):
        linalg.cg(poisson(4), b)
    with pytest.raises(TypeError, match="show"):  # scipy's log would print on the server
        linalg.minres(A, b, show=True)
    with pytest.raises(TypeError, match="OPinv"):  # the server factors A - sigma I itself
        linalg.eigsh(A, k=2, sigma=1.0, OPinv=spla.LinearOperator((16, 16), matvec=lambda v: v))
