"""The bottom of a symmetric spectrum by LOBPCG: scipy's ``lobpcg`` driver over our products,
preconditioned by one algebraic-multigrid V-cycle (``multigrid.amg_preconditioner``).

ARPACK finds the smallest eigenvalues of an elliptic operator slowly (they are clustered
relative to the spread of the spectrum: thousands of products for a Poisson matrix) or through
a factorization of A - sigma I (shift-invert: fill that grows faster than n). LOBPCG with a
multigrid preconditioner needs a few dozen block iterations whatever n, each a block product,
a block V-cycle and dense work on n x 3k blocks (Knyazev, SIAM J. Sci. Comput. 23(2), 2001).

What decides that the k wanted are the bottom ones is the Gershgorin bound of the spectrum
(``gershgorin``): every eigenvalue of a Hermitian matrix lies in [lower, upper], so a shift at
or below ``lower`` has the smallest eigenvalues nearest it, and ``lower >= 0`` makes the smallest
magnitudes the smallest values.

The stopping rule is a residual's: ``norm(A v - w B v) <= tol (norm(A) + |w| norm(B)) norm(v)``
for each pair, the norms Gershgorin's bounds. The pairs then hold eigenvalues within
``tol (norm(A) + |w| norm(B))`` of the true ones (and far closer where the spectrum has a gap:
the error is the residual squared over the gap). It is checked here on the returned pairs, not
taken from the driver; pairs that miss it come back as None and the caller falls back to ARPACK.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import TYPE_CHECKING, Callable, ContextManager

import numpy as np

if TYPE_CHECKING:
    import scipy.sparse as sp

# Iterations of the driver before a call falls back: a multigrid-preconditioned LOBPCG needs
# 15 to 40 on the matrices of tests/ops/test_ops_lobpcg.py, whatever their size.
MAXITER = 200

Block = Callable[[np.ndarray], np.ndarray]


def gershgorin(csr: sp.csr_array) -> tuple[float, float]:
    """(lower, upper): every eigenvalue of the Hermitian ``csr`` lies between them (the union of
    its Gershgorin discs, centred on the real diagonal)."""
    n = csr.shape[0]
    diagonal = csr.diagonal().real.astype(np.float64)
    row_of = np.repeat(np.arange(n), np.diff(csr.indptr))
    radius = np.bincount(row_of, weights=np.abs(csr.data), minlength=n) - np.abs(diagonal)
    return float(np.min(diagonal - radius)), float(np.max(diagonal + radius))


def residual_tolerance(tol: float, dtype: np.dtype) -> float:
    """The relative residual LOBPCG is held to: ``tol``, or for tol = 0 eps^(2/3) of the matrix's
    dtype (4e-11 in float64, 2e-5 in float32), what its driver reaches reliably in float64."""
    return tol if tol > 0 else float(np.finfo(dtype).eps) ** (2 / 3)


def one_blas_thread() -> ContextManager[object]:
    """BLAS on one thread while it lasts (threadpoolctl, where installed). The driver's dense work
    (products of n x 3k blocks, small Cholesky and eigh) goes between our parallel kernels, whose
    OpenMP threads spin on the cores for a while after each; OpenBLAS's own threads spinning
    beside them made the driver 5 to 10 times slower on a 2-core machine (docs/solvers.md)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


def bottom_pairs(a: Block, n: int, k: int, start: np.ndarray, preconditioner: Block, *, tolerance: float,
                 a_norm: float, b: Block | None = None, b_norm: float = 1.0, maxiter: int = MAXITER,
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """The ``k`` smallest eigenpairs of A v = w B v (B = I without ``b``): (w ascending [k], v [n, k]),
    or None where the pairs miss ``tolerance`` (the relative residual) after ``maxiter``
    iterations. ``a`` and ``b`` are the products of a block [n, m]; ``start`` the first block
    [n, m], m >= k; ``preconditioner`` one V-cycle of a block."""
    from scipy.sparse.linalg import LinearOperator, lobpcg

    dtype = start.dtype
    ops = [None if f is None else LinearOperator((n, n), matvec=f, matmat=f, dtype=dtype)
           for f in (a, b, preconditioner)]
    # The driver's own tolerance is on the residuals of B-normalised vectors, whose norm is at
    # least 1 / sqrt(norm(B)): this one makes its stop imply the rule checked below.
    driver_tol = tolerance * a_norm / np.sqrt(b_norm)
    try:
        with warnings.catch_warnings(), one_blas_thread():  # a miss is judged below, not announced
            warnings.simplefilter("ignore")
            w, v = lobpcg(ops[0], start, B=ops[1], M=ops[2], tol=driver_tol, maxiter=maxiter, largest=False)
    except np.linalg.LinAlgError:  # B not positive definite, or the block lost its rank
        return None
    order = np.argsort(w)[:k]
    w, v = np.asarray(w[order], np.float64), np.ascontiguousarray(v[:, order])
    av = a(v)
    bv = v if b is None else b(v)
    residuals = np.linalg.norm(av - bv * w, axis=0)
    allowed = tolerance * (a_norm + np.abs(w) * b_norm) * np.linalg.norm(v, axis=0)
    if not (np.all(np.isfinite(residuals)) and np.all(residuals <= allowed)):
        return None
    return w, v


def dense_bottom(a: sp.csr_array, k: int, b: sp.csr_array | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` smallest eigenpairs of a matrix too small for a block method (LOBPCG's own rule:
    n below 5 block sizes), by LAPACK on the dense matrices."""
    from scipy.linalg import eigh

    w, v = eigh(a.toarray(), None if b is None else b.toarray(), subset_by_index=[0, k - 1])
    return w, v
