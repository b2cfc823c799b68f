"""Algebraic multigrid: smoothed aggregation after pyamg, as a preconditioner of the Krylov
solvers (``preconditioner="amg"``) and as a solver (``amg_solve``, pyamg's ``ml.solve``).

What is pyamg's and what is ours (docs/solvers.md, "Multigrid", has the measurements):

- pyamg decides the hierarchy: its aggregation, its tentative prolongator (``fit_candidates``),
  its strength measures but the symmetric one, and any prolongation smoother other than Jacobi.
  The levels' sizes and the operator complexity are pyamg's for the same options. The products
  A T, A P and R (A P) are scipy's (measured faster here than our parallel SpGEMM).
- Ours are the steps that dominate its time on a large matrix, each computing what pyamg
  computes: the spectral radius of D^-1 A that Jacobi prolongation smoothing and Jacobi
  relaxation scale by (Lanczos over our parallel SpMV, from a fixed start, where pyamg runs
  restarted Arnoldi from a random one: the same estimate to its tolerance, the same on every
  build), the symmetric strength measure (pyamg's to the bit, in parallel), the finest level's
  candidate improvement (our sweep), and the whole cycle: Gauss-Seidel or Jacobi passes,
  residuals, restriction and prolongation over our parallel kernels (``kernels/multigrid.py``),
  and the coarse solve by a factorization kept with the hierarchy (pyamg's: 'pinv', 'lu',
  'cholesky' or 'splu'; LAPACK's, whose last bits may depend on the CPU).

Gauss-Seidel on a level of more than ``GS_BLOCK_ROWS`` rows sweeps fixed blocks in parallel
(``kernels/multigrid.py``), which is pyamg's sweep on smaller levels and within each block.

``amg_preconditioner(a, dtype, options)`` is one cycle as M^-1 (x0 = 0), for a vector [n] or a
block [n, k]. The hierarchy is built once per held (read-only) matrix, dtype and options and kept
with it, as ``solvers.operator_of`` keeps the CSR: its bytes are charged to the matrix's handle in
the tenant's store budget (``store.charge_kept``), and it goes when the matrix goes.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from sparseserve.core.errors import InvalidArgumentError, UnimplementedError
from sparseserve.core.reasons import Reason
from sparseserve.core.tensor import SparseTensor
from sparseserve.kernels import multigrid as mk
from sparseserve.kernels import solvers as sk

from ..store import charge_kept
from ._amg_options import normalize_amg_options
from .operator import operator_of

__all__ = ["normalize_amg_options", "Hierarchy", "build_hierarchy", "hierarchy_of", "amg_preconditioner",
           "builds"]


# ------------------------------------------------------------------ the hierarchy
def _pyamg():
    try:
        import pyamg
    except ImportError:
        raise UnimplementedError("multigrid builds its hierarchy with pyamg on the server; install it there "
                                 "(pip install 'sparseserve[server]', or pip install pyamg)",
                                 reason=Reason.MISSING_DEPENDENCY) from None
    return pyamg


def _index_dtype(n: int, nnz: int) -> np.dtype:
    return np.dtype(np.int32) if max(n, nnz) < np.iinfo(np.int32).max else np.dtype(np.int64)


def _matrix(m) -> mk.Matrix:
    """A scipy sparse matrix as the cycle's CSR (int32 indices where they fit: fewer bytes a pass)."""
    m = m.tocsr()
    m.sum_duplicates()
    index = _index_dtype(max(m.shape), m.nnz)
    return mk.Matrix(m.indptr.astype(index), m.indices.astype(index), np.ascontiguousarray(m.data), m.shape[1])


def _spgemm(a, b):
    """a @ b of two scipy CSR matrices by scipy's SpGEMM: on the products of a hierarchy's build
    (a few entries a row, one or a few columns of a tentative prolongator) it measured 2.5 to 6
    times faster than our parallel SpGEMM, whose per-thread accumulators span the output's width
    (docs/solvers.md, "Multigrid")."""
    return (a.tocsr() @ b.tocsr()).tocsr()


def _inverse_diagonal(a) -> np.ndarray:
    d = a.diagonal()
    out = np.zeros_like(d)
    np.divide(1, d, out=out, where=d != 0)
    return out


LANCZOS_STEPS = 15


def _spectral_radius(a, matrix: mk.Matrix, dinv: np.ndarray, symmetric: bool) -> float:
    """rho(D^-1 A) (``matrix`` is A's CSR for the cycle). Symmetric with a positive diagonal: the
    largest Ritz value of 15 Lanczos steps (pyamg's Krylov dimension) on D^-1/2 A D^-1/2 (the same
    spectrum) over our parallel SpMV, from a fixed start; else pyamg's restarted Arnoldi, from the
    same fixed start (pyamg's own is random: the hierarchy would differ from build to build)."""
    n = a.shape[0]
    start = np.random.default_rng(0).random(n)  # pyamg's start: uniform on [0, 1)
    if not (symmetric and n > 1 and bool((dinv > 0).all())):
        from pyamg.util.linalg import approximate_spectral_radius

        return float(approximate_spectral_radius(_scale_rows(a, dinv), initial_guess=start.astype(a.dtype)))
    from scipy.linalg import eigvalsh_tridiagonal

    dtype = matrix.vals.dtype
    minus_scale = -np.sqrt(dinv).astype(dtype)  # the SpMV is the residual of A u = 0: -A u
    v = start.astype(dtype)
    v /= np.sqrt(sk.blocked_dot(v, v))  # numpy's dot is BLAS's: its last bit varies by CPU
    u, v_prev, w, zero = -minus_scale * v, np.zeros(n, dtype), np.empty(n, dtype), np.zeros(n, dtype)
    alphas, betas = [], []
    beta = 0.0
    for _ in range(min(LANCZOS_STEPS, n)):
        mk.residual(matrix, u, zero, w)
        alpha, beta = mk.lanczos_step(w, minus_scale, v_prev, v, beta)
        alphas.append(alpha)
        if beta <= 1e-10 * abs(alpha):
            break
        betas.append(beta)
        mk.lanczos_next(w, v, v_prev, u, -minus_scale, alpha, beta)
    k = len(alphas)
    ritz = eigvalsh_tridiagonal(np.array(alphas), np.array(betas[:k - 1]))
    return float(np.abs(ritz).max())


def _scale_rows(a, d: np.ndarray):
    import scipy.sparse as sp

    a = a.tocsr()
    return sp.csr_array((a.data * np.repeat(d, np.diff(a.indptr)), a.indices, a.indptr), shape=a.shape)


@dataclass
class Level:
    """One level but the coarsest: its matrix, the transfers to the next, and its smoothing."""

    a: mk.Matrix
    p: mk.Matrix
    r: mk.Matrix
    blocks: np.ndarray  # Gauss-Seidel blocks (kernels/multigrid.gs_blocks)
    dinv: np.ndarray  # 1 / diag(A) (0 where it is 0)
    rho: float  # rho(D^-1 A), Jacobi relaxation's scale

    @property
    def nbytes(self) -> int:
        return self.a.nbytes + self.p.nbytes + self.r.nbytes + self.blocks.nbytes + self.dinv.nbytes


def _smoother(spec) -> tuple[str | None, dict[str, Any]]:
    name, params = spec
    return name, dict(params)


@dataclass
class Hierarchy:
    """A smoothed-aggregation hierarchy ready to cycle: ``levels`` from the finest down, and the
    coarsest level's matrix with its kept factorization."""

    options: dict[str, Any]
    dtype: np.dtype
    levels: list[Level]
    coarse_shape: tuple[int, int]
    coarse_nnz: int
    coarse_solve: Callable[[np.ndarray], np.ndarray]
    coarse_bytes: int
    _spare: list[dict[int, np.ndarray]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ---------------------------------------------------------------- what pyamg prints
    def level_sizes(self) -> list[int]:
        return [lv.a.n_rows for lv in self.levels] + [self.coarse_shape[0]]

    def level_nnz(self) -> list[int]:
        return [int(lv.a.vals.size) for lv in self.levels] + [self.coarse_nnz]

    def operator_complexity(self) -> float:
        nnz = self.level_nnz()
        return sum(nnz) / nnz[0]

    def grid_complexity(self) -> float:
        sizes = self.level_sizes()
        return sum(sizes) / sizes[0]

    @property
    def nbytes(self) -> int:
        """Every level's arrays, the coarse factor, and the one set of residual buffers kept
        between cycles (``_give``)."""
        buffers = sum(lv.a.n_rows for lv in self.levels) * np.dtype(self.dtype).itemsize
        return sum(lv.nbytes for lv in self.levels) + self.coarse_bytes + buffers

    @property
    def n(self) -> int:
        return self.coarse_shape[0] if not self.levels else self.levels[0].a.n_rows

    # ---------------------------------------------------------------- the cycle
    def cycle(self, x: np.ndarray, b: np.ndarray, cycle: str | None = None) -> None:
        """One multigrid cycle (pyamg's ``__solve``) on A x = b, x updated in place."""
        if not self.levels:
            x[:] = self.coarse_solve(b)
            return
        work = self._take()
        try:
            self._cycle(0, x, b, cycle or self.options["cycle"], work)
        finally:
            self._give(work)

    def apply(self, r: np.ndarray) -> np.ndarray:
        """M^-1 r: one cycle from x = 0."""
        z = np.zeros(self.n, self.dtype)
        self.cycle(z, np.ascontiguousarray(r, self.dtype))
        return z

    def apply_into(self, r: np.ndarray, z: np.ndarray) -> None:
        """z = M^-1 r in place (z a separate array of the hierarchy's dtype)."""
        z[:] = 0
        self.cycle(z, np.ascontiguousarray(r, self.dtype))

    def _take(self) -> dict[int, np.ndarray]:
        with self._lock:
            if self._spare:
                return self._spare.pop()
        return {}

    def _give(self, work: dict[int, np.ndarray]) -> None:
        with self._lock:
            if not self._spare:  # one set kept (counted in nbytes); a concurrent cycle's goes
                self._spare.append(work)

    def _residual_buffer(self, work: dict[int, np.ndarray], lvl: int) -> np.ndarray:
        buffer = work.get(lvl)
        if buffer is None:
            buffer = work[lvl] = np.empty(self.levels[lvl].a.n_rows, self.dtype)
        return buffer

    def _relax(self, lv: Level, x: np.ndarray, b: np.ndarray, spec) -> None:
        name, params = _smoother(spec)
        if name is None:
            return
        iterations = params.get("iterations", 1)
        if name == "jacobi":
            mk.jacobi(lv.a, lv.dinv, params.get("omega", 1.0) / lv.rho, x, b, iterations)
            return
        sweep = params.get("sweep", "forward")
        one = {"forward": (True,), "backward": (False,), "symmetric": (True, False)}[sweep]
        mk.gauss_seidel(lv.a, lv.blocks, x, b, one * iterations)

    def _cycle(self, lvl: int, x: np.ndarray, b: np.ndarray, cycle: str, work: dict[int, np.ndarray]) -> None:
        lv = self.levels[lvl]
        self._relax(lv, x, b, self.options["presmoother"])
        residual = self._residual_buffer(work, lvl)
        mk.residual(lv.a, x, b, residual)
        coarse_b = np.empty(lv.r.n_rows, self.dtype)
        mk.restrict(lv.r, residual, coarse_b)
        coarse_x = np.zeros(lv.r.n_rows, self.dtype)
        if lvl == len(self.levels) - 1:
            coarse_x[:] = self.coarse_solve(coarse_b)
        elif cycle == "V":
            self._cycle(lvl + 1, coarse_x, coarse_b, "V", work)
        elif cycle == "W":
            self._cycle(lvl + 1, coarse_x, coarse_b, cycle, work)
            self._cycle(lvl + 1, coarse_x, coarse_b, cycle, work)
        else:  # F
            self._cycle(lvl + 1, coarse_x, coarse_b, cycle, work)
            self._cycle(lvl + 1, coarse_x, coarse_b, "V", work)
        mk.prolong_add(lv.p, coarse_x, x)
        self._relax(lv, x, b, self.options["postsmoother"])


def _coarse_solver(name: str, a) -> tuple[Callable[[np.ndarray], np.ndarray], int]:
    """pyamg's coarse solvers, factored once: (solve, bytes kept)."""
    import scipy.linalg as sla

    dtype = a.dtype
    if name == "splu":
        from scipy.sparse.linalg import splu

        csc = a.tocsc()
        csc.eliminate_zeros()
        keep = np.flatnonzero(np.diff(csc.indptr) != 0)  # pyamg drops empty columns (and their rows)
        sub = csc[keep][:, keep].tocsc()
        lu = splu(sub)
        n = a.shape[0]

        def solve_lu(b: np.ndarray) -> np.ndarray:
            x = np.zeros(n, dtype)
            x[keep] = lu.solve(np.ascontiguousarray(b[keep]))
            return x
        return solve_lu, int(lu.L.data.nbytes + lu.U.data.nbytes + lu.L.indices.nbytes + lu.U.indices.nbytes)
    dense = a.toarray()
    if name == "pinv":
        inverse = sla.pinv(dense).astype(dtype, copy=False)
        return (lambda b: inverse @ b), inverse.nbytes
    if name == "lu":
        factor = sla.lu_factor(dense)
        return (lambda b: sla.lu_solve(factor, b).astype(dtype, copy=False)), factor[0].nbytes
    try:
        chol = sla.cho_factor(dense)
    except np.linalg.LinAlgError:
        raise InvalidArgumentError("amg_options.coarse_solver 'cholesky' needs a positive definite coarsest "
                                   "matrix, and this one is not; use 'pinv', 'lu' or 'splu'",
                                   reason=Reason.SINGULAR_PRECONDITIONER) from None
    return (lambda b: sla.cho_solve(chol, b).astype(dtype, copy=False)), chol[0].nbytes


def _strength(a, spec, b: np.ndarray):
    pyamg = _pyamg()
    name, params = spec
    params = dict(params)
    if name is None:
        return a.tocsr()
    if name == "symmetric":  # pyamg's measure, computed in parallel: the same entries and values
        import scipy.sparse as sp

        ptr, idx, vals = mk.symmetric_strength(a.indptr, a.indices, a.data, params.get("theta", 0.0))
        return sp.csr_array((vals, idx, ptr), shape=a.shape)
    if name == "classical":
        return pyamg.strength.classical_strength_of_connection(a.copy(), **params)  # it edits a in place
    return pyamg.strength.evolution_strength_of_connection(a.copy(), b, **params)


def _aggregate(c, spec):
    from pyamg.aggregation import naive_aggregation, standard_aggregation

    name, _ = spec
    return (standard_aggregation if name == "standard" else naive_aggregation)(c)[0]


def _improve(a: mk.Matrix, blocks: np.ndarray, b: np.ndarray) -> np.ndarray:
    """pyamg's default candidate improvement, (('block_gauss_seidel', {'sweep': 'symmetric',
    'iterations': 4}), None): 4 symmetric Gauss-Seidel iterations on A x = 0 from each candidate
    on the finest level (our sweep), none below."""
    out = np.array(b, order="F")
    zero = np.zeros(a.n_rows, b.dtype)
    for j in range(out.shape[1]):
        column = np.ascontiguousarray(out[:, j])
        mk.gauss_seidel(a, blocks, column, zero, (True, False) * 4)
        out[:, j] = column
    return np.ascontiguousarray(out)


def _smooth(a, t, c, b, dinv: np.ndarray, rho: float, spec):
    """The smoothed prolongator: Jacobi ours (pyamg's jacobi_prolongation_smoother with
    'diagonal' weighting), the others pyamg's."""
    from pyamg.aggregation import energy_prolongation_smoother, richardson_prolongation_smoother

    name, params = spec
    params = dict(params)
    if name is None:
        return t.tocsr()
    if name == "jacobi":
        omega, degree = params.get("omega", 4.0 / 3.0), params.get("degree", 1)
        scaled = _scale_rows(a, dinv * (omega / rho))
        p = t.tocsr()
        for _ in range(degree):
            p = (p - _spgemm(scaled, p)).tocsr()
        return p
    if name == "richardson":
        return richardson_prolongation_smoother(a, t, **params).tocsr()
    return energy_prolongation_smoother(a, t, c, b, None, (False, {}), **params).tocsr()


def build_hierarchy(ptr: np.ndarray, idx: np.ndarray, vals: np.ndarray, options: dict[str, Any],
                    packed: tuple[np.ndarray, ...] | None = None) -> Hierarchy:
    """The smoothed-aggregation hierarchy of the square CSR matrix (ptr, idx, vals) for normalized
    ``options``, in vals' dtype: pyamg's ``smoothed_aggregation_solver`` step for step (its
    ``_extend_hierarchy``), ours where the module's docstring says."""
    import scipy.sparse as sp

    _pyamg()
    n = ptr.size - 1
    a = sp.csr_array((vals, idx, ptr), shape=(n, n))
    # The finest level's matrix is the caller's arrays (with their packed entries, ``packed``) where
    # they are canonical (columns ascending, unrepeated): no copy.
    finest = mk.Matrix(ptr, idx, vals, n, packed, shared=True) if a.has_canonical_format else None
    if finest is None:
        a = a.copy()
        a.sum_duplicates()
    symmetry = options["symmetry"]
    symmetric = symmetry != "nonsymmetric"
    b = np.ones((n, 1), a.dtype)
    bh = b.copy()
    levels: list[Level] = []
    while len(levels) + 1 < options["max_levels"] and a.shape[0] > options["max_coarse"]:
        matrix = finest if finest is not None and not levels else _matrix(a)
        blocks = mk.gs_blocks(matrix.ptr)
        dinv = _inverse_diagonal(a)
        c = _strength(a, options["strength"], b)
        agg = _aggregate(c, options["aggregate"])
        if not levels:  # pyamg's default improve_candidates: on the finest level only
            b = _improve(matrix, blocks, b)
        from pyamg.aggregation import fit_candidates

        t, b_coarse = fit_candidates(agg, b)
        needs_rho = options["smooth"][0] == "jacobi" or "jacobi" in (options["presmoother"][0],
                                                                     options["postsmoother"][0])
        rho = _spectral_radius(a, matrix, dinv, symmetric) if needs_rho else 1.0
        p = _smooth(a, t, c, b_coarse, dinv, rho, options["smooth"])
        if symmetric:
            r = p.T.tocsr()
        else:
            ah = a.T.tocsr()
            ah_matrix = _matrix(ah)
            if not levels:
                bh = _improve(ah_matrix, mk.gs_blocks(ah_matrix.ptr), bh)
            th, bh_coarse = fit_candidates(agg, bh)
            dinv_h = _inverse_diagonal(ah)
            rho_h = _spectral_radius(ah, ah_matrix, dinv_h, False) if options["smooth"][0] == "jacobi" else 1.0
            r = _smooth(ah, th, c, bh_coarse, dinv_h, rho_h, options["smooth"]).T.tocsr()
            bh = bh_coarse
        coarse = _spgemm(r, _spgemm(a, p))
        levels.append(Level(matrix, _matrix(p), _matrix(r), blocks, dinv, rho))
        a, b = coarse, b_coarse
    solve, nbytes = _coarse_solver(options["coarse_solver"], a)
    return Hierarchy(options, a.dtype, levels, a.shape, int(a.nnz), solve, nbytes)


# ------------------------------------------------------------------ kept with a held matrix
_KEPT: "weakref.WeakKeyDictionary[SparseTensor, dict[str, Hierarchy]]" = weakref.WeakKeyDictionary()
_KEPT_LOCK = threading.Lock()
_BUILD_LOCKS: "weakref.WeakKeyDictionary[SparseTensor, threading.Lock]" = weakref.WeakKeyDictionary()
builds = [0]  # hierarchies built in this process (tests count them)


def _key(dtype: np.dtype, options: dict[str, Any]) -> str:
    return f"{dtype.name}:{sorted(options.items())!r}"


def hierarchy_of(a: SparseTensor, dtype: Any, options: Mapping[str, Any] | None = None) -> Hierarchy:
    """The hierarchy of ``a`` (a checked square 2-D sparse matrix) in ``dtype`` for ``options``
    (pyamg's names; normalized here when not already), built once and kept while a held ``a``
    lives, its bytes charged to a's handle (``store.charge_kept``: where the tenant's budget has
    no room for them, the hierarchy serves this call and is not kept)."""
    dtype = np.dtype(dtype)
    options = normalize_amg_options(options)
    key = _key(dtype, options)
    held = not any(arr.flags.writeable for arr in a.arrays())
    if not held:
        return _build(a, dtype, options)
    with _KEPT_LOCK:
        kept = _KEPT.get(a, {}).get(key)
        if kept is not None:
            return kept
        lock = _BUILD_LOCKS.setdefault(a, threading.Lock())
    with lock:  # one build per matrix at a time: a second solve waits for the first's hierarchy
        with _KEPT_LOCK:
            kept = _KEPT.get(a, {}).get(key)
        if kept is not None:
            return kept
        hierarchy = _build(a, dtype, options)
        if charge_kept(a, hierarchy.nbytes):
            with _KEPT_LOCK:
                _KEPT.setdefault(a, {})[key] = hierarchy
        return hierarchy


def _build(a: SparseTensor, dtype: np.dtype, options: dict[str, Any]) -> Hierarchy:
    csr = operator_of(a, dtype).csr  # kept with a held matrix: the finest level shares its arrays
    builds[0] += 1
    return build_hierarchy(csr.ptr, csr.idx, csr.vals, options, csr.packed)


def amg_preconditioner(a: SparseTensor, dtype: np.dtype, options: dict | None = None
                       ) -> Callable[[np.ndarray], np.ndarray]:
    """M^-1 as one cycle (``options['cycle']``, V by default) of the smoothed-aggregation
    hierarchy of ``a`` (a checked square 2-D sparse matrix) from x = 0, for a vector [n] or a
    block [n, k] (each column its own cycle); the hierarchy kept with a held ``a``."""
    hierarchy = hierarchy_of(a, dtype, options)

    def apply(r: np.ndarray) -> np.ndarray:
        if r.ndim == 1:
            return hierarchy.apply(r)
        return np.stack([hierarchy.apply(r[:, j]) for j in range(r.shape[1])], axis=1)
    return apply
