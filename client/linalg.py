"""``sparseserve.linalg``: scipy.sparse.linalg's calls on a matrix the server holds.

Two ways to solve with a ``RemoteTensor`` ``A`` (from ``client.put``, or an op with keep):

- ``cg(A, b)``, ``bicgstab``, ``gmres``, ``minres``, ``eigsh``, ``svds``, ``spsolve`` and
  ``factorized`` take scipy's arguments and answer as scipy does (``x, info``), while the whole
  iteration runs on the server: only ``b`` and ``x`` cross the network.
- ``aslinearoperator(A)`` is a ``scipy.sparse.linalg.LinearOperator`` whose products run on the
  server, so any scipy routine works on the remote matrix unchanged, at one round trip per
  product (bench/solvers.py measures the difference).

Preconditioners run on the server too: ``preconditioner="jacobi"``, ``"ilu0"`` or ``"amg"`` (pyamg's
smoothed aggregation, ``amg_options`` as pyamg names them; ``amg_solve`` is its ``ml.solve``), or scipy's ``M``
given as a matrix (sparse or dense, held or sent), which the server applies as ``M @ r``; an
``M`` that is an operator (Python code) would cost a round trip per application and is refused
(``TypeError``), as is ``callback`` (``progress=`` reports each iteration instead). Argument
errors are scipy's exceptions: ``InvalidArgumentError`` is a ``ValueError``. scipy is needed only
for ``aslinearoperator``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from ._client import AsyncClient
from ._remote import RemoteTensor
from .core.convert import is_tensor_like
from .core.reasons import Reason
from .core.tensor import SparseTensor
from .errors import InvalidArgumentError

__all__ = ["aslinearoperator", "cg", "bicgstab", "gmres", "minres", "amg_solve", "eigsh", "svds", "spsolve",
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
                                "iterates use scipy's solver on aslinearoperator(A)",
                    "show": "scipy's log would print on the server; pass progress=fn to see each iteration's "
                            "residual (gRPC)"}.get(name, "leave it out")
            raise TypeError(f"{function}: {name} is not supported here: {hint}")


def _solved(x: Any, info: Any) -> tuple[np.ndarray, Any]:
    """scipy's (x, info): info an int for one right-hand side, an array for a block."""
    info = np.asarray(info)
    return x, int(info) if info.ndim == 0 else info


def _column_as_vector(v: Any) -> np.ndarray:
    """b or x0 as scipy reads them: [n, 1] is the vector [n] (scipy's make_system ravels it)."""
    v = np.asarray(v)
    return v[:, 0] if v.ndim == 2 and v.shape[1] == 1 else v


def _preconditioner_matrix(function: str, M: Any) -> Any:
    """scipy's ``M`` as the ops' ``m``: a matrix (a RemoteTensor, scipy.sparse, a SparseTensor, a
    dense array) goes to the server, which applies M @ r; an operator is Python code the server
    cannot call each iteration."""
    if M is None or isinstance(M, RemoteTensor) or is_tensor_like(M):
        return M
    if not (hasattr(M, "matvec") or callable(M)):
        as_array = np.asarray(M)
        if as_array.dtype != object:
            return as_array
    raise TypeError(f"{function}: M as an operator ({type(M).__name__}) is Python code the server cannot run at "
                    "each iteration: give M as a matrix (sparse or dense, applied on the server as M @ r), or "
                    "preconditioner='jacobi', 'ilu0' or 'amg'; for an operator of your own use scipy's solver on "
                    "aslinearoperator(A)")


def _krylov(op: str, A: Any, b: Any, x0: Any, M: Any, progress: Any, **args: Any) -> Any:
    A = _remote(A)
    if "atol" in args and (args["atol"] is None or isinstance(args["atol"], str)):
        # scipy's rule (ValueError): atol=None and 'legacy' were its old defaults, gone since 1.14.
        raise InvalidArgumentError(f"{op}: atol must be a real number >= 0, not {args['atol']!r}",
                                   reason=Reason.BAD_TOLERANCE)
    b = _column_as_vector(b)
    extra: dict[str, Any] = {"progress": progress} if progress is not None else {}
    if isinstance(x0, str):
        if x0 != "Mb":
            raise InvalidArgumentError(f"{op}: x0 must be an array or 'Mb' (start from M @ b), not {x0!r}",
                                       reason=Reason.BAD_ARGUMENT_TYPE)
        x0, extra["x0_mb"] = None, True
    elif x0 is not None:
        x0 = _column_as_vector(x0)
    m = _preconditioner_matrix(op, M)
    if m is not None:
        extra["m"] = m
    x, info, _, _ = A.client.call(op, a=A, b=b, x0=x0, **args, **extra)
    return _solved(x, info)


def _amg(options: Any) -> dict[str, Any]:
    """``amg_options`` as an argument, sent only when given (a server from before it lacks it)."""
    return {} if options is None else {"amg_options": options}


def cg(A, b, x0=None, *, rtol=1e-05, atol=0.0, maxiter=None, M=None, callback=None,
       preconditioner="none", progress=None, amg_options=None):
    """scipy.sparse.linalg.cg on the server: ``(x, info)``. ``preconditioner="amg"`` is one cycle of
    pyamg's smoothed aggregation, ``amg_options`` as pyamg names them (docs/solvers.md)."""
    _unsupported("cg", callback=callback)
    return _krylov("cg", A, b, x0, M, progress, rtol=rtol, atol=atol, maxiter=maxiter,
                   preconditioner=preconditioner, **_amg(amg_options))


def bicgstab(A, b, x0=None, *, rtol=1e-05, atol=0.0, maxiter=None, M=None, callback=None,
             preconditioner="none", progress=None, amg_options=None):
    """scipy.sparse.linalg.bicgstab on the server: ``(x, info)``."""
    _unsupported("bicgstab", callback=callback)
    return _krylov("bicgstab", A, b, x0, M, progress, rtol=rtol, atol=atol, maxiter=maxiter,
                   preconditioner=preconditioner, **_amg(amg_options))


def gmres(A, b, x0=None, *, rtol=1e-05, atol=0.0, restart=None, maxiter=None, M=None, callback=None,
          callback_type=None, preconditioner="none", progress=None, amg_options=None):
    """scipy.sparse.linalg.gmres on the server (restart 20 by default, as scipy's): ``(x, info)``.
    ``callback_type`` only names what a callback would get: without a callback it changes nothing."""
    _unsupported("gmres", callback=callback)
    if callback_type not in (None, "x", "pr_norm", "legacy"):
        raise InvalidArgumentError(f"gmres: callback_type must be 'x', 'pr_norm' or 'legacy', not {callback_type!r}",
                                   reason=Reason.VALUE_OUT_OF_RANGE)
    return _krylov("gmres", A, b, x0, M, progress, rtol=rtol, atol=atol, maxiter=maxiter,
                   restart=20 if restart is None else restart, preconditioner=preconditioner, **_amg(amg_options))


def minres(A, b, x0=None, *, rtol=1e-05, shift=0.0, maxiter=None, M=None, callback=None, show=False,
           check=False, preconditioner="none", progress=None, amg_options=None):
    """scipy.sparse.linalg.minres on the server: ``(x, info)``; ``shift`` solves (A - shift I) x = b
    and ``check`` tests A and M for symmetry first, as scipy's."""
    _unsupported("minres", callback=callback, show=show)
    return _krylov("minres", A, b, x0, M, progress, rtol=rtol, maxiter=maxiter, preconditioner=preconditioner,
                   shift=float(shift), check=bool(check), **_amg(amg_options))


def amg_solve(A, b, x0=None, tol=1e-05, maxiter=None, accel=None, return_info=False, *, atol=0.0,
              amg_options=None, progress=None):
    """pyamg's ``smoothed_aggregation_solver(A, **amg_options).solve(b, x0, tol, maxiter, accel=accel,
    return_info=return_info)`` on the server: ``x``, or ``(x, info)`` with ``return_info``. The
    hierarchy is built once per held matrix and options, and kept with it; ``accel`` is None
    (multigrid cycles alone) or 'cg', 'bicgstab', 'gmres', 'minres' (that solver of the server's,
    one cycle its preconditioner); ``maxiter`` None is pyamg's 100."""
    A = _remote(A)
    extra: dict[str, Any] = {"progress": progress} if progress is not None else {}
    x0 = None if x0 is None else _column_as_vector(x0)
    x, info, _, _ = A.client.call("amg_solve", a=A, b=_column_as_vector(b), x0=x0, rtol=tol, atol=atol,
                                  maxiter=maxiter, accel=accel, **_amg(amg_options), **extra)
    x, info = _solved(x, info)
    return (x, info) if return_info else x


def _eigen_matrix(M: Any) -> Any:
    """eigsh's ``M`` as the op's ``m``: a RemoteTensor or a sparse matrix as it is, a dense one as
    its nonzeros (COO); an operator is Python code the server cannot call."""
    if isinstance(M, RemoteTensor) or (is_tensor_like(M) and not isinstance(M, np.ndarray)):
        return M
    if hasattr(M, "matvec") or callable(M):
        raise TypeError(f"eigsh: M as an operator ({type(M).__name__}) is Python code the server cannot run: give M "
                        "as a matrix (sparse or dense), sent with A or held (client.put(M)); for an operator of "
                        "your own use scipy's eigsh on aslinearoperator(A)")
    dense = np.asarray(M)
    if dense.ndim != 2:
        raise ValueError(f"eigsh: M must be a matrix [n, n]; it has shape {dense.shape}")
    rows, cols = np.nonzero(dense)
    return SparseTensor(indices=np.stack([rows, cols], axis=1).astype(np.int64), values=dense[rows, cols],
                        dense_shape=dense.shape)


def _seed(function: str, rng: Any) -> int | None:
    """scipy's ``rng`` as the ops' ``seed``: an integer is the seed itself (so eigsh starts where
    scipy's eigsh with that rng starts); a Generator, a RandomState, a SeedSequence or a
    BitGenerator draws one."""
    if rng is None:
        return None
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return int(rng)
    if isinstance(rng, np.random.RandomState):
        return int(rng.randint(2**31 - 1))
    if isinstance(rng, (np.random.Generator, np.random.SeedSequence, np.random.BitGenerator)):
        return int(np.random.default_rng(rng).integers(2**63 - 1))
    raise TypeError(f"{function}: rng must be None, an integer seed or a numpy Generator, not {type(rng).__name__}")


def _given(**args: Any) -> dict[str, Any]:
    """The arguments not at their defaults (None): sent only then, so that a server from before
    them still answers a call that leaves them out."""
    return {name: value for name, value in args.items() if value is not None}


def eigsh(A, k=6, M=None, sigma=None, which="LM", v0=None, ncv=None, maxiter=None, tol=0,
          return_eigenvectors=True, Minv=None, OPinv=None, mode="normal", rng=None, *, solver="auto"):
    """scipy.sparse.linalg.eigsh on the server: ``w, v`` (``w`` alone without eigenvectors),
    eigenvalues ascending. The smallest (which='SA', or sigma below the spectrum) come from
    LOBPCG with an algebraic-multigrid preconditioner, the rest from ARPACK (``solver='arpack'``
    or ``'lobpcg'`` to choose). ``M`` (the generalised problem A v = w M v) is a matrix, sparse or
    dense, held or sent with A; with ``sigma`` the server factors A - sigma M once per held A and
    shift and keeps it, so ``Minv`` and ``OPinv`` (operators) are refused. ``rng`` seeds the start
    (an integer: scipy's own start for that seed)."""
    for name, value in (("Minv", Minv), ("OPinv", OPinv)):
        if value is not None:
            raise TypeError(f"eigsh: {name} is not supported here: the server factors "
                            f"{'M' if name == 'Minv' else 'A - sigma M'} itself and keeps the factorization with the "
                            "held A; leave it out (for an operator of your own use scipy's eigsh on "
                            "aslinearoperator(A))")
    A = _remote(A)
    args = _given(m=None if M is None else _eigen_matrix(M), v0=None if v0 is None else np.asarray(v0),
                  ncv=ncv, maxiter=maxiter, seed=_seed("eigsh", rng),
                  mode=None if mode == "normal" else mode, solver=None if solver == "auto" else solver)
    w, v = A.client.call("eigsh", a=A, k=k, which=which, sigma=sigma, tol=float(tol), **args)
    return (w, v) if return_eigenvectors else w


def svds(A, k=6, ncv=None, tol=0, which="LM", v0=None, maxiter=None, return_singular_vectors=True,
         solver="arpack", rng=None, options=None):
    """scipy.sparse.linalg.svds on the server, any of its solvers ('arpack', 'lobpcg', 'propack'):
    ``u, s, vt`` (``s`` alone with return_singular_vectors=False; u or vt None with 'vh' or
    'u'), singular values ascending as scipy's. ``rng`` seeds the start."""
    if options:
        raise TypeError("svds: options is reserved by scipy (none of its solvers takes any); leave it out")
    if return_singular_vectors not in (True, False, "u", "vh"):
        raise ValueError("svds: return_singular_vectors must be True, False, 'u' or 'vh'")
    A = _remote(A)
    solver = str(solver).lower()
    args = _given(tol=float(tol) if tol else None, v0=None if v0 is None else np.asarray(v0), ncv=ncv,
                  maxiter=maxiter, seed=_seed("svds", rng), solver=None if solver == "arpack" else solver)
    if solver == "lobpcg" and isinstance(k, (int, np.integer)) and 0 < k and min(A.shape) < 5 * k:
        import warnings  # what scipy's lobpcg says here: the server does the same (dense LAPACK)

        warnings.warn(f"The problem size {min(A.shape)} minus the constraints size 0 is too small relative to the "
                      f"block size {k}. Using a dense eigensolver instead of LOBPCG iterations. No output of the "
                      "history of the iterations.", UserWarning, stacklevel=2)
    with _in_dtype(A, _floating(A.dtype)) as a:  # an integer matrix in float64, as scipy's svds takes it
        u, s, vt = A.client.call("svds", a=a, k=k, which=which, **args)
    if return_singular_vectors is False:
        return s
    return (u if return_singular_vectors in (True, "u") else None, s,
            vt if return_singular_vectors in (True, "vh") else None)


def _floating(dtype: Any) -> np.dtype:
    """scipy's _asfptype: integers and bools are solved in float64."""
    dtype = np.dtype(dtype)
    return dtype if dtype.kind in "fc" else np.dtype(np.float64)


@contextlib.contextmanager
def _in_dtype(A: RemoteTensor, dtype: np.dtype):
    """A in ``dtype`` on the server: A itself, or a cast (A times one) deleted afterwards."""
    if A.dtype == dtype:
        yield A
        return
    cast = A * dtype.type(1)
    try:
        yield cast
    finally:
        cast.delete()


def spsolve(A, b, permc_spec=None, use_umfpack=True):
    """scipy.sparse.linalg.spsolve on the server (SuperLU), shaped as scipy's: ``x`` [n] for b [n]
    or [n, 1], [n, k] for [n, k]; a scipy.sparse b of several columns gives a sparse x (CSR for a
    CSR A, else CSC); A and b are solved in their promoted dtype (integers as float64); a singular
    A warns (MatrixRankWarning) and gives nan, as scipy's."""
    _unsupported("spsolve", permc_spec=permc_spec)
    del use_umfpack  # a hint in scipy too; the server always uses SuperLU
    A = _remote(A)
    sparse_b = not isinstance(b, np.ndarray) and hasattr(b, "toarray") and hasattr(b, "format")
    rhs = _column_as_vector(b.toarray() if sparse_b else b)
    dtype = np.promote_types(_floating(A.dtype), _floating(rhs.dtype))
    rhs = rhs.astype(dtype, copy=False)
    try:
        with _in_dtype(A, dtype) as a:
            x = A.client.call("spsolve", a=a, b=rhs)
    except InvalidArgumentError as exc:
        if exc.reason != Reason.SINGULAR:
            raise
        import warnings
        try:
            from scipy.sparse.linalg import MatrixRankWarning as warning
        except ImportError:  # the SDK runs without scipy
            warning = UserWarning  # scipy's is a UserWarning
        warnings.warn(f"Matrix is exactly singular ({exc.message})", warning, stacklevel=2)
        x = np.full(rhs.shape, np.nan, dtype)
    if sparse_b and x.ndim == 2:
        from scipy import sparse

        return sparse.csr_array(x) if A.layout == "csr" else sparse.csc_array(x)
    return x


class RemoteFactor:
    """A factorization the server keeps (``factorized``): call it with ``b`` for ``x``; ``delete()``
    frees its tensors on the server (they count against the store's budget until then)."""

    def __init__(self, client: Any, factor: list[RemoteTensor]):
        self.client = client
        self.factor = factor

    def __call__(self, b: Any) -> np.ndarray:
        b, dtype = np.asarray(b), self.factor[0].dtype
        if not np.can_cast(b.dtype, dtype, "safe"):  # numpy's words, as SuperLU's solve says them
            raise TypeError(f"Cannot cast array data from {b.dtype!r} to {dtype!r} according to the rule 'safe' "
                            f"(the factors are {dtype}: factorize A in {b.dtype} to solve with this b)")
        return self.client.call("solve", factor=self.factor, b=b.astype(dtype, copy=False))

    def delete(self) -> None:
        for tensor in self.factor:
            tensor.delete()


def factorized(A) -> RemoteFactor:
    """scipy.sparse.linalg.factorized: a function solving A x = b, the LU factors of A kept on the
    server (SuperLU through scipy there); an integer A is factorized in float64, as scipy's."""
    A = _remote(A)
    with _in_dtype(A, _floating(A.dtype)) as a:
        return RemoteFactor(A.client, A.client.call("factorize", a=a, keep=True))


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
