"""``sparseserve.linalg``: scipy.sparse.linalg's calls on a matrix the server holds.

Two ways to solve with a ``RemoteTensor`` ``A`` (from ``client.put``, or an op with keep):

- ``cg(A, b)``, ``bicgstab``, ``gmres``, ``minres``, ``eigsh``, ``svds``, ``spsolve`` and
  ``factorized`` take scipy's arguments and answer as scipy does (``x, info``), while the whole
  iteration runs on the server: only ``b`` and ``x`` cross the network.
- ``aslinearoperator(A)`` is a ``scipy.sparse.linalg.LinearOperator`` whose products run on the
  server, so any scipy routine works on the remote matrix unchanged, at one round trip per
  product (bench/solvers.py measures the difference).

Preconditioners run on the server too: ``preconditioner="jacobi"`` or ``"ilu0"`` where scipy takes
an operator ``M`` (an ``M`` made here would cost a round trip per application). scipy is needed
only for ``aslinearoperator``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._client import AsyncClient
from ._remote import RemoteTensor

__all__ = ["aslinearoperator", "cg", "bicgstab", "gmres", "minres", "eigsh", "svds", "spsolve",
           "factorized", "RemoteFactor"]


def _remote(A: Any) -> RemoteTensor:
    if not isinstance(A, RemoteTensor):
        raise TypeError(f"A must be a RemoteTensor (keep it on the server first: A = client.put(A)), "
                        f"not {type(A).__name__}")
    if isinstance(A.client, AsyncClient):
        raise TypeError("sparseserve.linalg calls block, as scipy's do: use a Client (with an AsyncClient, "
                        "await the ops themselves: await client.cg(A, b))")
    return A


def _unsupported(function: str, **given: Any) -> None:
    """scipy arguments with no server-side meaning must be left at their defaults."""
    for name, value in given.items():
        if value is not None and value is not False:
            hint = {"M": "pass preconditioner='jacobi' or 'ilu0' (it runs on the server); for an operator "
                         "of your own use scipy's solver on aslinearoperator(A)",
                    "callback": "pass progress=fn to see each iteration's residual (gRPC); for the "
                                "iterates use scipy's solver on aslinearoperator(A)"}.get(name, "leave it out")
            raise TypeError(f"{function}: {name} is not supported here: {hint}")


def _solved(x: Any, info: Any) -> tuple[np.ndarray, Any]:
    """scipy's (x, info): info an int for one right-hand side, an array for a block."""
    info = np.asarray(info)
    return x, int(info) if info.ndim == 0 else info


def _krylov(op: str, A: Any, b: Any, x0: Any, progress: Any, **args: Any) -> Any:
    A = _remote(A)
    extra = {"progress": progress} if progress is not None else {}
    x, info, _, _ = A.client.call(op, a=A, b=np.asarray(b), x0=None if x0 is None else np.asarray(x0),
                                  **args, **extra)
    return _solved(x, info)


def cg(A, b, x0=None, *, rtol=1e-05, atol=0.0, maxiter=None, M=None, callback=None,
       preconditioner="none", progress=None):
    """scipy.sparse.linalg.cg on the server: ``(x, info)``."""
    _unsupported("cg", M=M, callback=callback)
    return _krylov("cg", A, b, x0, progress, rtol=rtol, atol=atol, maxiter=maxiter,
                   preconditioner=preconditioner)


def bicgstab(A, b, x0=None, *, rtol=1e-05, atol=0.0, maxiter=None, M=None, callback=None,
             preconditioner="none", progress=None):
    """scipy.sparse.linalg.bicgstab on the server: ``(x, info)``."""
    _unsupported("bicgstab", M=M, callback=callback)
    return _krylov("bicgstab", A, b, x0, progress, rtol=rtol, atol=atol, maxiter=maxiter,
                   preconditioner=preconditioner)


def gmres(A, b, x0=None, *, rtol=1e-05, atol=0.0, restart=None, maxiter=None, M=None, callback=None,
          callback_type=None, preconditioner="none", progress=None):
    """scipy.sparse.linalg.gmres on the server (restart 20 by default, as scipy's): ``(x, info)``."""
    _unsupported("gmres", M=M, callback=callback, callback_type=callback_type)
    return _krylov("gmres", A, b, x0, progress, rtol=rtol, atol=atol, maxiter=maxiter,
                   restart=20 if restart is None else restart, preconditioner=preconditioner)


def minres(A, b, x0=None, *, rtol=1e-05, shift=0.0, maxiter=None, M=None, callback=None, show=False,
           check=False, preconditioner="none", progress=None):
    """scipy.sparse.linalg.minres on the server: ``(x, info)`` (no ``shift``: solve with A - shift I)."""
    _unsupported("minres", M=M, callback=callback, show=show, check=check, shift=shift or None)
    return _krylov("minres", A, b, x0, progress, rtol=rtol, maxiter=maxiter, preconditioner=preconditioner)


def eigsh(A, k=6, M=None, sigma=None, which="LM", v0=None, ncv=None, maxiter=None, tol=0,
          return_eigenvectors=True, Minv=None, OPinv=None, mode="normal"):
    """scipy.sparse.linalg.eigsh on the server (ARPACK over the server's products): ``w, v``
    (``w`` alone without eigenvectors), eigenvalues ascending."""
    _unsupported("eigsh", M=M, v0=v0, ncv=ncv, maxiter=maxiter, Minv=Minv, OPinv=OPinv,
                 mode=None if mode == "normal" else mode)
    A = _remote(A)
    w, v = A.client.call("eigsh", a=A, k=k, which=which, sigma=sigma, tol=float(tol))
    return (w, v) if return_eigenvectors else w


def svds(A, k=6, ncv=None, tol=0, which="LM", v0=None, maxiter=None, return_singular_vectors=True,
         solver="arpack", rng=None, options=None):
    """scipy.sparse.linalg.svds on the server: ``u, s, vt`` (``s`` alone without vectors),
    singular values ascending as scipy's."""
    _unsupported("svds", ncv=ncv, tol=tol or None, v0=v0, maxiter=maxiter, rng=rng, options=options,
                 solver=None if solver == "arpack" else solver,
                 return_singular_vectors=None if return_singular_vectors is True else return_singular_vectors)
    A = _remote(A)
    u, s, vt = A.client.call("svds", a=A, k=k, which=which)
    return u, s, vt


def spsolve(A, b, permc_spec=None, use_umfpack=True):
    """scipy.sparse.linalg.spsolve on the server (SuperLU): ``x`` (b dense: [n] or [n, k])."""
    _unsupported("spsolve", permc_spec=permc_spec)
    del use_umfpack  # a hint in scipy too; the server always uses SuperLU
    A = _remote(A)
    return A.client.call("spsolve", a=A, b=np.asarray(b))


class RemoteFactor:
    """A factorization the server keeps (``factorized``): call it with ``b`` for ``x``; ``delete()``
    frees its tensors on the server (they count against the store's budget until then)."""

    def __init__(self, client: Any, factor: list[RemoteTensor]):
        self.client = client
        self.factor = factor

    def __call__(self, b: Any) -> np.ndarray:
        return self.client.call("solve", factor=self.factor, b=np.asarray(b))

    def delete(self) -> None:
        for tensor in self.factor:
            tensor.delete()


def factorized(A) -> RemoteFactor:
    """scipy.sparse.linalg.factorized: a function solving A x = b, the LU factors of A kept on the
    server (SuperLU through scipy there)."""
    A = _remote(A)
    return RemoteFactor(A.client, A.client.call("factorize", a=A, keep=True))


def aslinearoperator(A):
    """A ``scipy.sparse.linalg.LinearOperator`` of ``A`` whose matvec, rmatvec, matmat and rmatmat
    run on the server (one request each): scipy's solvers, eigsh and friends work on it unchanged."""
    from scipy.sparse.linalg import LinearOperator

    A = _remote(A)
    if A.ndim != 2:
        raise ValueError(f"A must be a matrix; it has shape {A.shape}")

    def product(x: np.ndarray, adjoint: bool) -> np.ndarray:
        return A.client.call("matmul", a=A, b=np.ascontiguousarray(x, dtype=A.dtype), adjoint_a=adjoint)

    class _Remote(LinearOperator):
        def _matvec(self, x):
            return product(x.reshape(-1), False)

        def _rmatvec(self, x):
            return product(x.reshape(-1), True)

        def _matmat(self, X):
            return product(X, False)

        def _rmatmat(self, X):
            return product(X, True)

    return _Remote(dtype=A.dtype, shape=A.shape)
