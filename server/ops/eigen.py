"""Eigenvalues, singular values and direct solves: ``eigsh``, ``svds``, ``spsolve``, ``factorize``, ``solve``.

scipy's drivers do the numerics (ARPACK and LOBPCG for ``eigsh``, ARPACK, LOBPCG and PROPACK for
``svds``, SuperLU for the direct solves); what is ours is the operator: the drivers see a
``LinearOperator`` whose products are the parallel CSR SpMV of ``kernels/linalg.py``. Each
product is also where the caller's deadline is checked (``between_iterations``): ARPACK calls it
every Lanczos step, LOBPCG every block iteration, so a call past its deadline is abandoned there.

``eigsh`` picks its method by the part of the spectrum asked. The smallest eigenvalues (which
'SA'; 'SM' or a shift where Gershgorin's bounds show those are the smallest) come from LOBPCG
preconditioned by algebraic multigrid (``_lobpcg.py``, ``multigrid.amg_preconditioner``), the
rest from ARPACK; shift-invert factors a - sigma m once per held matrix and shift and keeps
the factorization with the matrix (``factor_of``), as ``solvers.operator_of`` keeps its CSR, so
the next call with that shift only solves. What eigsh derives from a held matrix (its checked
CSR, bounds, factorizations) lives in a ``Spectral`` kept with it, its bytes charged to the
handle (``store.charge_kept``), and goes with it.

A factorization asked for by ``factorize`` is kept as four ordinary tensors, ``[L, U, perm_r,
perm_c]`` (the list output ``factor``): ``Pr @ A @ Pc = L @ U`` as scipy's ``splu`` defines them.
Plain tensors need nothing new from the store: they count against its budget, spill to disk,
stay with their tenant and go with ``delete`` like any handle. ``solve`` rebuilds the answer with
two triangular solves (``kernels/solvers.py``, held to scipy's ``spsolve_triangular``); SuperLU's
own solve object is faster per solve (measured in ``docs/solvers.md``) but is no tensor, so it
could not be spilled, downloaded or kept durable.

Each op's ``check`` makes the refusals the metadata decides (one 2-D matrix of a dtype the
drivers take, square and non-empty where the op needs it, k's range, which, mode, solver, b's,
m's and v0's shapes and dtypes, a factor's four tensors); the kernels raise only what the
entries decide (values that are not finite, a matrix that is not Hermitian, a singular one, a
factor that is not triangular or whose permutations are not, a shift LOBPCG cannot take).
"""

from __future__ import annotations

import math
import threading
import warnings
import weakref
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from sparseserve.core.errors import InternalError, InvalidArgumentError, UnimplementedError
from sparseserve.core.tensor import SparseTensor
from sparseserve.core.reasons import Reason
from sparseserve.kernels import linalg as lk
from sparseserve.kernels import solvers as sk

from ..argtypes import FLOAT, INT, OPTIONAL_INT, TENSOR, TENSORS, choice
from ..limits import between_iterations
from ..registry import REGISTRY, Arg, Output, Plan
from ..store import charge_kept
from ._layouts import SPARSE_LAYOUTS, as_coo
from ._lobpcg import MAXITER, bottom_pairs, dense_bottom, gershgorin, one_blas_thread, residual_tolerance
from ._sputils import shape_of

if TYPE_CHECKING:
    import scipy.sparse as sp
    import scipy.sparse.linalg as sla

DTYPES = ("float32", "float64", "complex64", "complex128")  # what ARPACK and SuperLU are built for
EIGSH_WHICH = choice("LM", "SM", "LA", "SA", "BE", reason=Reason.BAD_WHICH,
                     hint="eigsh takes LM/SM (magnitude), LA/SA (algebraic) or BE (both ends)")
SVDS_WHICH = choice("LM", "SM", reason=Reason.BAD_WHICH, hint="svds takes LM (largest) or SM (smallest)")
EIGSH_MODE = choice("normal", "buckling", "cayley", reason=Reason.BAD_MODE,
                    hint="scipy's shift-invert modes (with sigma)")
EIGSH_SOLVER = choice("auto", "arpack", "lobpcg", reason=Reason.BAD_SOLVER,
                      hint="auto picks LOBPCG for the bottom of the spectrum and ARPACK for the rest")
SVDS_SOLVER = choice("arpack", "lobpcg", "propack", reason=Reason.BAD_SOLVER, hint="scipy's svds solvers")


# ------------------------------------------------------------------ scipy, errors, and the checks (metadata)
def _scipy(op: str):
    """scipy.sparse and scipy.sparse.linalg: imported when called, as scipy is optional on a server."""
    try:
        import scipy.sparse
        import scipy.sparse.linalg
    except ImportError:
        raise UnimplementedError(f"{op} needs scipy on the server (pip install scipy)",
                                 reason=Reason.MISSING_DEPENDENCY) from None
    return scipy.sparse, scipy.sparse.linalg


def _bad(message: str, reason: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, reason=reason)


def _check_matrix(a: SparseTensor, name: str, op: str, square: bool = True) -> tuple[int, int]:
    """(m, n) of ``a``, one non-empty 2-D sparse matrix of a dtype ARPACK and SuperLU take (and
    square with ``square``): the check every op here makes of its matrices."""
    if a.dense_ndim or a.batch_ndim or a.ndim != 2:
        raise _bad(f"{name} has shape {shape_of(a)} ({a.layout}); {op} needs one 2-D sparse matrix "
                   "(no batch or dense dimensions)", Reason.RANK)
    if a.dtype.name not in DTYPES:
        raise _bad(f"{name} has dtype {a.dtype}; {op} takes {', '.join(DTYPES)} (cast it first)",
                   Reason.UNSUPPORTED_DTYPE)
    m, n = (int(d) for d in a.dense_shape)
    if square and m != n:
        raise _bad(f"{name} has shape [{m}, {n}]; {op} needs a square matrix", Reason.NOT_SQUARE)
    if m == 0 or n == 0:
        raise _bad(f"{name} has shape [{m}, {n}]; {op} needs a non-empty matrix", Reason.EMPTY)
    return m, n


def _check_rhs(b: np.ndarray, n: int, dtype: np.dtype, op: str) -> None:
    """``b`` a dense vector [n] or block [n, k] of ``dtype``."""
    if not isinstance(b, np.ndarray):
        raise _bad(f"b is a sparse tensor; {op} needs a dense vector [n] or block [n, k]", Reason.NOT_DENSE)
    if b.ndim not in (1, 2) or b.shape[0] != n:
        raise _bad(f"b has shape {shape_of(b)}; {op} needs [{n}] or [{n}, k] to match the matrix's {n} rows",
                   Reason.SHAPE_MISMATCH)
    if b.dtype != dtype:
        raise _bad(f"b has dtype {b.dtype} and the matrix {dtype}; {op} needs one dtype (cast b)",
                   Reason.DTYPE_MISMATCH)


def _check_k(k: int, below: int, what: str, op: str) -> None:
    if not 1 <= k < below:
        raise _bad(f"k is {k}; {op} needs 1 <= k < {what} ({below}) for ARPACK", Reason.K_OUT_OF_RANGE)


def _real(dtype: np.dtype) -> np.dtype:
    """The real dtype of ``dtype``'s values (eigenvalues and singular values are real)."""
    return np.dtype(np.finfo(dtype).dtype)


# ------------------------------------------------------------------ the kernels' matrices (entries)
def _matrix(a: SparseTensor, name: str, op: str) -> sp.csr_array:
    """A checked ``a`` (``_check_matrix``) as a scipy CSR (int64 indices, duplicates summed),
    refused where a value is not finite."""
    sp, _ = _scipy(op)
    m, n = (int(d) for d in a.dense_shape)
    if a.layout in ("csr", "csc"):  # read as they are: a COO round trip costs more than the check below
        arrays = (a.values, a.plain_indices, a.compressed_indices)
        csr = sp.csr_array(arrays, shape=(m, n)) if a.layout == "csr" else sp.csc_array(arrays, shape=(m, n)).tocsr()
    else:
        coo = as_coo(a)
        csr = sp.csr_array((coo.values, (coo.indices[:, 0], coo.indices[:, 1])), shape=(m, n))
    if not np.isfinite(csr.data).all():
        raise _bad(f"{name} holds nan or inf; {op} needs finite values", Reason.NOT_FINITE)
    if not csr.has_canonical_format:  # duplicates summed, columns sorted: on a copy, as a held tensor is shared
        csr = csr.copy()
        csr.sum_duplicates()
    return csr


def _finite_rhs(b: np.ndarray, op: str) -> np.ndarray:
    """A checked ``b`` (``_check_rhs``), refused where a value is not finite."""
    if not np.isfinite(b).all():
        raise _bad(f"b holds nan or inf; {op} needs finite values", Reason.NOT_FINITE)
    return b


def _check_hermitian(a: sp.csr_array, name: str, op: str) -> None:
    """ARPACK's symmetric driver (and LOBPCG) answers nonsense for a matrix that is not: refuse one
    whose difference from its conjugate transpose is more than rounding."""
    diff = a - a.conj().T
    scale = float(np.abs(a.data).max(initial=0.0))
    worst = float(np.abs(diff.data).max(initial=0.0))
    if worst > 64 * np.finfo(a.dtype).eps * scale:
        kind = "Hermitian" if a.dtype.kind == "c" else "symmetric"
        raise _bad(f"{name} is not {kind} (|{name} - {name}^H| reaches {worst:.3g}); {op} needs a {kind} matrix "
                   "(svds works on any matrix)", Reason.NOT_HERMITIAN)


def start_vector(n: int, dtype: np.dtype) -> np.ndarray:
    """ARPACK's starting vector: uniform in [-1, 1) as ARPACK draws its own, but from a fixed seed, so
    that the same call answers the same (and takes the same number of steps) every time."""
    rng = np.random.default_rng(0)
    v0 = rng.uniform(-1, 1, n)
    if np.dtype(dtype).kind == "c":
        v0 = v0 + 1j * rng.uniform(-1, 1, n)
    return v0.astype(dtype)


def _singular(name: str, op: str) -> InvalidArgumentError:
    return _bad(f"{name} is singular (SuperLU found an exactly zero pivot); {op} needs an invertible matrix",
                Reason.SINGULAR)


# ------------------------------------------------------------------ the operator
class SpmvOperator:
    """``a``'s products for scipy's LinearOperator (``linear_operator``), each our SpMV (and, for
    ``rmatvec``, the SpMV of ``a``'s conjugate transpose, made once). Every product checks the
    deadline: ARPACK calls one per iteration, a pass over the matrix, so the check comes every few
    ms of work."""

    def __init__(self, a: sp.csr_array, op: str, adjoint: bool = False):
        self.op_name = op
        self.shape, self.dtype = a.shape, a.dtype
        self._a = (a.indptr, a.indices, a.data)
        self._ah = None
        if adjoint:
            ah = a.conj().T.tocsr()
            self._ah = (ah.indptr, ah.indices, ah.data)
        self.products = 0

    def linear_operator(self) -> sla.LinearOperator:
        _, sla = _scipy(self.op_name)
        m, n = self.shape
        adjoint: dict[str, Any] = {}
        if self._ah is not None:
            ah = self._ah
            adjoint = {"rmatvec": lambda x: self.product(ah, n, x.reshape(-1)),
                       "rmatmat": lambda x: self.product(ah, n, x)}
        a = self._a
        return sla.LinearOperator(self.shape, dtype=self.dtype, matvec=lambda x: self.product(a, m, x.reshape(-1)),
                                  matmat=lambda x: self.product(a, m, x), **adjoint)

    def apply(self, x: np.ndarray) -> np.ndarray:
        """``a @ x`` for a vector or a block."""
        return self.product(self._a, self.shape[0], x)

    def product(self, arrays, rows: int, x: np.ndarray) -> np.ndarray:
        """``arrays``' CSR matrix times the vector or block ``x``."""
        between_iterations(self.op_name, iteration=self.products)
        self.products += 1
        ptr, idx, vals = arrays
        x = np.ascontiguousarray(x, dtype=vals.dtype)
        if x.ndim == 1:
            return lk.spmv(ptr, idx, vals, x, rows, False)
        return lk.spmm(ptr, idx, vals, x, rows, False)


def _with_deadline(solve, operator: SpmvOperator):
    """A solve or a preconditioner, counted and held to the deadline as the products are (ARPACK
    calls the shift-invert solve in place of them)."""
    def apply(x):
        between_iterations(operator.op_name, iteration=operator.products)
        operator.products += 1
        return solve(x)
    return apply


# ------------------------------------------------------------------ a matrix kept with its handle
class Spectral:
    """A checked eigsh matrix (``_matrix``: finite, canonical; Hermitian, checked once) and what
    eigsh derives from it, kept with a held tensor (``spectral``): its Gershgorin bounds, the
    factorizations of it less a shift (``factor_of``), the shifted copy the multigrid
    preconditioner is built on where it is indefinite."""

    def __init__(self, csr: sp.csr_array):
        self.csr = csr
        self.n = csr.shape[0]
        self.lower, self.upper = gershgorin(csr)
        self.norm = max(abs(self.lower), abs(self.upper), np.finfo(np.float64).tiny)  # >= norm(a, 2)
        self.lock = threading.RLock()  # float64() is asked for under it
        self.factors: dict[float, Any] = {}  # SuperLU of csr - sigma I, by sigma
        # SuperLU of csr - sigma m, by the held m, then sigma
        self.pencils: weakref.WeakKeyDictionary[SparseTensor, dict[float, Any]] = weakref.WeakKeyDictionary()
        self.positive: SparseTensor | None = None  # csr - lower I, for a preconditioner (lower < 0)
        self._float64: sp.csr_array | None = None

    def float64(self) -> sp.csr_array:
        """The matrix in float64, which LOBPCG runs in (a view of a float64 matrix)."""
        with self.lock:
            if self._float64 is None:
                self._float64 = self.csr if self.csr.dtype == np.float64 else self.csr.astype(np.float64)
            return self._float64


_SPECTRA: "weakref.WeakKeyDictionary[SparseTensor, Spectral]" = weakref.WeakKeyDictionary()
_SPECTRA_LOCK = threading.Lock()
# Factorizations made, by op (a kept one reused is not counted): the tests read it.
FACTORIZATIONS: Counter[str] = Counter()


def _held(a: SparseTensor) -> bool:
    return not any(arr.flags.writeable for arr in a.arrays())


def spectral(a: SparseTensor, name: str, op: str) -> Spectral:
    """``a`` (a checked square matrix) as a ``Spectral``, kept with a held (read-only) ``a`` while
    it lives, its bytes charged to its handle where ``_matrix`` had to copy them (a COO, a CSC, a
    CSR with repeats)."""
    held = _held(a)
    if held:
        with _SPECTRA_LOCK:
            kept = _SPECTRA.get(a)
        if kept is not None:
            return kept
    csr = _matrix(a, name, op)
    _check_hermitian(csr, name, op)
    made = Spectral(csr)
    copied = not np.shares_memory(csr.data, a.values)
    if held and (not copied or charge_kept(a, csr.data.nbytes + csr.indices.nbytes + csr.indptr.nbytes)):
        with _SPECTRA_LOCK:
            made = _SPECTRA.setdefault(a, made)
    return made


def factor_of(a: SparseTensor, first: Spectral, sigma: float, op: str, m: SparseTensor | None = None,
              second: Spectral | None = None):
    """SuperLU of ``a - sigma m`` (``a - sigma I`` without ``m``), made once per held ``a``, held ``m``
    and shift and kept with ``a`` (its bytes charged to a's handle), so that the next call with the
    same shift solves at once. A symmetric matrix's ordering: minimum degree on A + A^T with the
    diagonal preferred as pivot (SuperLU's SymmetricMode), about half COLAMD's fill on a
    Poisson matrix; a pivot below a tenth of its column's largest is still exchanged."""
    sp, sla = _scipy(op)
    with first.lock:
        table = first.factors if m is None else first.pencils.setdefault(m, {})
        lu = table.get(sigma)
        if lu is not None:
            return lu
        other = sp.eye_array(first.n, dtype=first.csr.dtype, format="csr") if second is None else second.csr
        shifted = (first.csr - sigma * other).tocsc() if sigma != 0 else first.csr.tocsc()
        try:
            with one_blas_thread():
                lu = sla.splu(shifted, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.1,
                              options={"SymmetricMode": True})
        except RuntimeError:
            less = "a" if sigma == 0 else f"a - sigma {'m' if m is not None else 'I'}"
            raise _bad(f"{less} is singular for sigma = {sigma} (SuperLU found an exactly zero pivot); choose a "
                       "shift that is not an eigenvalue", Reason.SINGULAR) from None
        FACTORIZATIONS[op] += 1
        nbytes = sum(f.data.nbytes + f.indices.nbytes + f.indptr.nbytes for f in (lu.L, lu.U)) \
            + lu.perm_r.nbytes + lu.perm_c.nbytes
        if _held(a) and charge_kept(a, nbytes):
            table[sigma] = lu
        return lu


# ------------------------------------------------------------------ eigsh: the checks
def _check_start(v0: np.ndarray | None, n: int, dtype: np.dtype, op: str) -> None:
    """v0, where given, a dense vector [n] of floats (complex only for a complex matrix)."""
    if v0 is None:
        return
    if not isinstance(v0, np.ndarray) or v0.shape != (n,):
        raise _bad(f"v0 has shape {shape_of(v0)}; {op} needs a dense vector [{n}] to start from", Reason.SHAPE_MISMATCH)
    if v0.dtype.kind not in ("fc" if dtype.kind == "c" else "f"):
        raise _bad(f"v0 has dtype {v0.dtype}; {op} takes a {'complex or real ' if dtype.kind == 'c' else ''}"
                   f"floating v0 for a {dtype} matrix", Reason.DTYPE_MISMATCH)


def _check_iterations(ncv: int | None, k: int, low: int, n: int, maxiter: int | None, seed: int | None,
                      op: str) -> None:
    """ncv (ARPACK's Lanczos vectors) in (low, n], maxiter >= 1, seed >= 0, where given."""
    if ncv is not None and not low < ncv <= n:
        raise _bad(f"ncv is {ncv}; {op} needs {low} < ncv <= {n} (ARPACK's Lanczos vectors, for k = {k})",
                   Reason.VALUE_OUT_OF_RANGE)
    if maxiter is not None and maxiter < 1:
        raise _bad(f"maxiter is {maxiter}; {op} needs at least 1 (or null for the solver's default)",
                   Reason.BAD_MAXITER)
    if seed is not None and seed < 0:
        raise _bad(f"seed is {seed}; {op} needs a seed >= 0 (numpy's default_rng), or null", Reason.VALUE_OUT_OF_RANGE)


def _bottom_by_name(which: str, sigma: float | None, mode: str) -> bool:
    """Whether which, sigma and mode can name the bottom of the spectrum (the entries then decide:
    ``_wants_bottom``)."""
    if sigma is None:
        return which in ("SA", "SM")
    return mode == "normal" and which in ("LM", "LA")


def check_eigsh(a: SparseTensor, k: int = 6, which: str = "LM", sigma: float | None = None, tol: float = 0.0,
                m: SparseTensor | None = None, mode: str = "normal", v0: np.ndarray | None = None,
                ncv: int | None = None, maxiter: int | None = None, seed: int | None = None,
                solver: str = "auto") -> Plan:
    """A square matrix, 1 <= k < n (n - 1 for a complex one: eigs), a finite sigma and tol >= 0, m of
    a's shape, scipy's rules on mode, which, v0 and ncv, and what the solver asked can do; w is [k]
    of a's real dtype."""
    n, _ = _check_matrix(a, "a", "eigsh")
    complex_ = a.dtype.kind == "c"
    if complex_:  # scipy's eigsh hands a complex matrix to eigs, whose rules these are
        _check_k(k, n - 1, "n - 1 for a complex matrix (scipy's eigs)", "eigsh")
        if which == "BE":
            raise _bad("which is 'BE'; a complex matrix goes to ARPACK's nonsymmetric driver (scipy's eigs), "
                       "which has no BE: ask LA and SA apart", Reason.BAD_WHICH)
    else:
        _check_k(k, n, "n, the matrix's order", "eigsh")
    if sigma is not None and not math.isfinite(sigma):
        raise _bad(f"sigma is {sigma}; eigsh needs a finite shift", Reason.NOT_FINITE)
    if not (math.isfinite(tol) and tol >= 0):
        raise _bad(f"tol is {tol}; eigsh needs a finite tol >= 0", Reason.BAD_TOL)
    if m is not None:
        _check_matrix(m, "m", "eigsh")
        if shape_of(m) != shape_of(a):
            raise _bad(f"m has shape {shape_of(m)} and a {shape_of(a)}; eigsh's generalised problem a v = w m v "
                       "needs them of one shape", Reason.SHAPE_MISMATCH)
        if m.dtype.kind == "c" and not complex_:
            raise _bad(f"m is {m.dtype} and a {a.dtype}; a real problem needs a real m", Reason.DTYPE_MISMATCH)
    if sigma is not None and mode != "normal" and complex_:
        raise _bad(f"mode is {mode!r}; a complex matrix takes mode 'normal' only (scipy's eigs has no "
                   "buckling or Cayley mode)", Reason.BAD_MODE)
    _check_start(v0, n, a.dtype, "eigsh")
    _check_iterations(ncv, k, k + 1 if complex_ else k, n, maxiter, seed, "eigsh")
    if solver == "lobpcg":
        if complex_:
            raise _bad(f"solver 'lobpcg' takes a real matrix here, and a is {a.dtype}; use solver 'arpack'",
                       Reason.BAD_SOLVER)
        if not _bottom_by_name(which, sigma, mode):
            raise _bad(f"solver 'lobpcg' finds the bottom of the spectrum: which 'SA' (or 'SM', or sigma below the "
                       f"spectrum with which 'LM' and mode 'normal'), not which {which!r}"
                       + (f" with sigma and mode {mode!r}" if sigma is not None else "")
                       + "; use solver 'arpack'", Reason.BAD_SOLVER)
    return Plan(dtype=_real(a.dtype), layout="dense", shape=(k,))


# ------------------------------------------------------------------ eigsh: the bottom by LOBPCG
def _wants_bottom(first: Spectral, second: Spectral | None, which: str, sigma: float | None, mode: str) -> str:
    """Why the k wanted are the k smallest (eigenvalues of the pencil (a, m)), from the Gershgorin
    bounds; '' where the bounds do not show it."""
    if not _bottom_by_name(which, sigma, mode):
        return ""
    if sigma is None:
        if which == "SA":
            return "which 'SA'"
        positive = which == "SM" and first.lower >= 0 and (second is None or second.lower > 0)
        return "which 'SM' and a >= 0" if positive else ""
    if second is None:
        return "sigma at or below the spectrum" if sigma <= first.lower else ""
    shifted, _ = gershgorin(first.csr - sigma * second.csr)
    return "sigma at or below the spectrum" if second.lower > 0 and shifted >= 0 else ""


def _shifted_positive(a: SparseTensor, first: Spectral) -> SparseTensor:
    """a - lower I as a read-only CSR tensor (positive semidefinite by Gershgorin), kept with a held
    a (its bytes charged to a's handle) so that its multigrid hierarchy is kept with it."""
    with first.lock:
        if first.positive is not None:
            return first.positive
        shifted = (first.float64() - first.lower * _scipy("eigsh")[0].eye_array(first.n, format="csr")).tocsr()
        shifted.sort_indices()
        positive = SparseTensor(layout="csr", compressed_indices=shifted.indptr.astype(np.int64),
                                plain_indices=shifted.indices.astype(np.int64), values=shifted.data,
                                dense_shape=shifted.shape)
        for array in positive.arrays():  # read-only, as a held tensor's: its hierarchy is kept with it
            array.flags.writeable = False
        if _held(a) and charge_kept(a, sum(arr.nbytes for arr in positive.arrays())):
            first.positive = positive
        return positive


def _preconditioners(a: SparseTensor, first: Spectral) -> Iterator[Callable[[np.ndarray], np.ndarray]]:
    """The V-cycles LOBPCG tries, in turn, until one gives converged pairs: the multigrid hierarchy of
    a itself where a may be positive definite (Gershgorin's lower bound >= 0, or a positive
    diagonal: a stiffness matrix whose discs cross zero), then, where a may be indefinite, that of
    a - lower I, positive semidefinite (a hierarchy of an indefinite matrix is no SPD
    preconditioner: LOBPCG stalls on it). Each hierarchy is built on first use and kept. Where
    pyamg is missing, or a hierarchy cannot be built, there are none, and ARPACK answers."""
    from .multigrid import amg_preconditioner

    float64 = np.dtype(np.float64)
    tries: list[Callable[[], SparseTensor]] = []
    if first.lower >= 0 or bool(np.all(first.csr.diagonal().real > 0)):
        tries.append(lambda: a)
    if first.lower < 0:
        tries.append(lambda: _shifted_positive(a, first))
    for matrix in tries:
        try:
            yield amg_preconditioner(matrix(), float64)
        except UnimplementedError as exc:  # no pyamg on this server
            if exc.reason != Reason.MISSING_DEPENDENCY:
                raise
            return
        except InvalidArgumentError as exc:  # a coarse level that cannot be factored
            if exc.reason != Reason.SINGULAR_PRECONDITIONER:
                raise


def _bottom(a: SparseTensor, first: Spectral, second: Spectral | None, k: int, tol: float,
            maxiter: int | None, seed: int | None, v0: np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
    """The k smallest eigenpairs by LOBPCG with a multigrid preconditioner (``_preconditioners``;
    dense LAPACK for a matrix under five blocks), or None where every try misses its tolerance
    (or a positive definite m it needs is not): the caller's ARPACK answers then."""
    n = first.n
    block = k  # measured best on Poisson and gallery matrices: a wider block costs more than it saves
    a64 = first.float64()
    b64 = None if second is None else second.float64()
    if n < 5 * block:
        try:
            return dense_bottom(a64, k, b64)
        except np.linalg.LinAlgError:  # m not positive definite
            return None
    operator = SpmvOperator(a64, "eigsh")
    metric = None if b64 is None else SpmvOperator(b64, "eigsh").apply
    for preconditioner in _preconditioners(a, first):
        start = np.random.default_rng(0 if seed is None else seed).standard_normal((n, block))
        if v0 is not None:
            start[:, 0] = v0
        found = bottom_pairs(operator.apply, n, k, start, _with_deadline(preconditioner, operator),
                             tolerance=residual_tolerance(tol, first.csr.dtype), a_norm=first.norm, b=metric,
                             b_norm=1.0 if second is None else second.norm,
                             maxiter=MAXITER if maxiter is None else maxiter)
        if found is not None:
            return found
    return None


# ------------------------------------------------------------------ eigsh: ARPACK
def _start(v0: np.ndarray | None, n: int, dtype: np.dtype, seed: int | None) -> np.ndarray:
    """ARPACK's first vector: v0, else drawn as scipy's eigsh draws it from default_rng(seed), else
    ``start_vector``."""
    if v0 is not None:
        return v0.astype(dtype)
    if seed is not None:
        return np.random.default_rng(seed).uniform(-1.0, 1.0, n).astype(dtype)
    return start_vector(n, dtype)


def _not_converged(op: str, exc: Exception, remedy: str) -> InternalError:
    return InternalError(f"{op} did not converge: {exc}; {remedy}", reason=Reason.NOT_CONVERGED)


def _arpack(a: SparseTensor, first: Spectral, m: SparseTensor | None, second: Spectral | None, k: int, which: str,
            sigma: float | None, tol: float, mode: str, start: np.ndarray, ncv: int | None,
            maxiter: int | None) -> tuple[np.ndarray, np.ndarray]:
    """scipy's eigsh over our products, every mode of its own: the inverses it needs (of m, or of
    a - sigma m) from kept factorizations (``factor_of``) rather than SuperLU made per call."""
    _, sla = _scipy("eigsh")
    operator = SpmvOperator(first.csr, "eigsh")
    extra: dict[str, Any] = {}
    if m is not None and second is not None:
        extra["M"] = SpmvOperator(second.csr, "eigsh").linear_operator()
    if sigma is None and m is not None and second is not None:  # a v = w m v: ARPACK's mode 2, m's inverse
        lu = factor_of(m, second, 0.0, "eigsh")
        extra["Minv"] = sla.LinearOperator(first.csr.shape, _with_deadline(lu.solve, operator), dtype=first.csr.dtype)
    elif sigma is not None:
        lu = factor_of(a, first, float(sigma), "eigsh", m, second)
        inverse = sla.LinearOperator(first.csr.shape, _with_deadline(lu.solve, operator), dtype=first.csr.dtype)
        extra.update(sigma=sigma, mode=mode, OPinv=inverse)
    try:
        with one_blas_thread():  # ARPACK's dense work and SuperLU's solves between our parallel products
            w, v = sla.eigsh(operator.linear_operator(), k=k, which=which, tol=tol, v0=start, ncv=ncv,
                             maxiter=maxiter, **extra)
    except sla.ArpackNoConvergence as exc:
        raise _not_converged("eigsh", exc, "raise maxiter or tol, or ask another part of the spectrum") from None
    return w, v


# ------------------------------------------------------------------ eigsh: the op
@REGISTRY.op(
    "eigsh",
    doc="""k eigenvalues and eigenvectors of a real symmetric or complex Hermitian sparse matrix, or of the
generalised problem a v = w m v (scipy.sparse.linalg.eigsh, its arguments and modes).
The smallest (which SA; SM where a >= 0; sigma at or below the spectrum with which LM or LA) come from LOBPCG
preconditioned by one algebraic-multigrid V-cycle (scipy's lobpcg driver over our parallel SpMV; the hierarchy
kept with a held matrix): a few dozen block iterations whatever n, where ARPACK needs thousands of products or a
factorization. LOBPCG stops when every pair has norm(a v - w m v) <= tol (norm(a) + |w| norm(m)) norm(v)
(Gershgorin's bounds of the norms; tol 0: eps^(2/3) of a's dtype, 4e-11 in float64); a pair that misses it,
and every other part of the spectrum, is ARPACK's (implicitly restarted Lanczos over our SpMV).
With sigma, shift-invert mode (mode normal, buckling or cayley, as scipy's): the eigenvalues nearest sigma,
through a SuperLU factorization of a - sigma m (a - sigma I without m) made once per held matrix and shift and
kept with it (its bytes charged to a's handle), so a second call solves at once. With m and no sigma, ARPACK's
mode 2 on a kept factorization of m (m must be positive definite).
a and m are float32, float64, complex64 or complex128 (one 2-D matrix each, any sparse layout); 1 <= k < n
(n - 1 for a complex a, as scipy's eigs). A matrix that is not symmetric (Hermitian) beyond rounding is refused
(NOT_HERMITIAN); a - sigma m exactly singular is SINGULAR. ARPACK, or solver 'lobpcg', that does not converge
within maxiter is INTERNAL (NOT_CONVERGED). Iterative: bounded by the caller's deadline, checked at every matrix
product, solve and V-cycle.""",
    args=[Arg("a", TENSOR, "The symmetric (Hermitian) matrix [n, n].", layouts=SPARSE_LAYOUTS),
          Arg("k", INT, "How many eigenvalues (1 <= k < n).", default=6),
          Arg("which", EIGSH_WHICH, "Which k: LM, SM, LA, SA or BE (of the shifted problem with sigma).",
              default="LM"),
          Arg("sigma", FLOAT, "Shift for shift-invert mode (finite); none: plain mode.", default=None),
          Arg("tol", FLOAT, "Relative accuracy of the eigenvalues (0: machine precision for ARPACK, "
              "eps^(2/3) of the residual for LOBPCG).", default=0.0),
          Arg("m", TENSOR, "The generalised problem's m [n, n] (symmetric, positive definite without sigma): "
              "a v = w m v; none: the standard problem.", default=None, layouts=SPARSE_LAYOUTS),
          Arg("mode", EIGSH_MODE, "With sigma: normal, buckling or cayley (scipy's shift-invert modes); "
              "without sigma it is not used, as scipy's.", default="normal"),
          Arg("v0", TENSOR, "Starting vector [n] (ARPACK's; LOBPCG's first column); none: drawn from seed.",
              default=None, layouts=("dense",)),
          Arg("ncv", OPTIONAL_INT, "ARPACK's Lanczos vectors, k < ncv <= n; none: scipy's max(2k + 1, 20).",
              default=None),
          Arg("maxiter", OPTIONAL_INT, "ARPACK's restarts (none: 10 n) or LOBPCG's iterations (none: 200).",
              default=None),
          Arg("seed", OPTIONAL_INT, "Seed of the random start (numpy default_rng, drawn as scipy's eigsh draws "
              "from its rng); none: a fixed one, so a call answers the same every time.", default=None),
          Arg("solver", EIGSH_SOLVER, "auto (LOBPCG for the bottom, else ARPACK), arpack, or lobpcg (the bottom "
              "only; refused where the bounds do not show the k asked are the smallest).", default="auto")],
    outputs=[Output("w", "dense", "The k eigenvalues [k], ascending (real)."),
             Output("v", "dense", "Their eigenvectors as columns [n, k] (unit norm, m-orthonormal with m; each "
                    "up to sign/phase).")],
    check=check_eigsh,
    iterative=True,
)
def eigsh(a: SparseTensor, k: int = 6, which: str = "LM", sigma: float | None = None, tol: float = 0.0,
          m: SparseTensor | None = None, mode: str = "normal", v0: np.ndarray | None = None, ncv: int | None = None,
          maxiter: int | None = None, seed: int | None = None, solver: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    if v0 is not None and not np.isfinite(v0).all():
        raise _bad("v0 holds nan or inf; eigsh needs a finite start", Reason.NOT_FINITE)
    first = spectral(a, "a", "eigsh")
    second = None if m is None else spectral(m, "m", "eigsh")
    dtype = first.csr.dtype
    if solver != "arpack" and dtype.kind == "f":
        why = _wants_bottom(first, second, which, sigma, mode)
        if not why and solver == "lobpcg":
            raise _bad(f"solver 'lobpcg' finds the smallest eigenvalues, and the Gershgorin bounds of a, "
                       f"[{first.lower:.6g}, {first.upper:.6g}], do not show that the k asked (which {which!r}"
                       + (f", sigma {sigma}" if sigma is not None else "") + ") are those; use solver 'arpack'",
                       Reason.BAD_SOLVER)
        found = _bottom(a, first, second, k, tol, maxiter, seed, v0) if why else None
        if found is not None:
            w, v = found
            return np.ascontiguousarray(w, _real(dtype)), np.ascontiguousarray(v, dtype)
        if solver == "lobpcg":
            raise _not_converged("eigsh", RuntimeError(f"LOBPCG missed its tolerance within {maxiter or MAXITER} "
                                                       "iterations (or m is not positive definite)"),
                                 "raise maxiter or tol, or use solver 'arpack'")
    w, v = _arpack(a, first, m, second, k, which, sigma, tol, mode, _start(v0, first.n, dtype, seed), ncv, maxiter)
    order = np.argsort(w, kind="stable")  # scipy's eigs (a complex a) returns them in its own order
    return np.ascontiguousarray(w[order]), np.ascontiguousarray(v[:, order])


# ------------------------------------------------------------------ svds
def check_svds(a: SparseTensor, k: int = 6, which: str = "LM", tol: float = 0.0, v0: np.ndarray | None = None,
               ncv: int | None = None, maxiter: int | None = None, seed: int | None = None,
               solver: str = "arpack") -> Plan:
    """A matrix [m, n], 1 <= k < min(m, n) (k <= min(m, n) for PROPACK), scipy's rules on tol, v0 and
    ncv; u is [m, k] of a's dtype."""
    rows, cols = _check_matrix(a, "a", "svds", square=False)
    if solver == "propack":
        _check_k(k, min(rows, cols) + 1, "min(m, n) + 1 for PROPACK", "svds")
    else:
        _check_k(k, min(rows, cols), "min(m, n)", "svds")
    if not (math.isfinite(tol) and tol >= 0):
        raise _bad(f"tol is {tol}; svds needs a finite tol >= 0", Reason.BAD_TOL)
    _check_start(v0, rows if solver == "propack" else min(rows, cols), a.dtype, "svds")
    _check_iterations(ncv if solver == "arpack" else None, k, k, min(rows, cols) - 1, maxiter, seed, "svds")
    return Plan(dtype=a.dtype, layout="dense", shape=(rows, k))


@REGISTRY.op(
    "svds",
    doc="""k singular values and vectors of a sparse matrix (scipy.sparse.linalg.svds over our parallel SpMV for
a @ x and a^H @ x, with scipy's three solvers: 'arpack' (Lanczos on a^H a), 'lobpcg' (on a^H a; scipy's default
of 20 iterations unless maxiter says more) and 'propack' (Lanczos bidiagonalisation of a itself, the most
accurate for small singular values). which: LM (largest) or SM (smallest). a is float32, float64, complex64 or
complex128 [m, n], any sparse layout; 1 <= k < min(m, n) (k <= min(m, n) for propack). Outputs as scipy
returns them: s ascending. ARPACK that does not converge is INTERNAL (NOT_CONVERGED).
Iterative: bounded by the caller's deadline, checked at every matrix product.""",
    args=[Arg("a", TENSOR, "The matrix [m, n].", layouts=SPARSE_LAYOUTS),
          Arg("k", INT, "How many singular values (1 <= k < min(m, n)).", default=6),
          Arg("which", SVDS_WHICH, "LM (largest) or SM (smallest).", default="LM"),
          Arg("tol", FLOAT, "Tolerance of the singular values (0: machine precision).", default=0.0),
          Arg("v0", TENSOR, "Starting vector [min(m, n)] ([m] for propack); none: drawn from seed.",
              default=None, layouts=("dense",)),
          Arg("ncv", OPTIONAL_INT, "ARPACK's Lanczos vectors (solver 'arpack'), k < ncv < min(m, n).",
              default=None),
          Arg("maxiter", OPTIONAL_INT, "The solver's iteration limit; none: its default.", default=None),
          Arg("seed", OPTIONAL_INT, "Seed of the random start (numpy default_rng, handed to scipy's svds as rng); "
              "none: a fixed one.", default=None),
          Arg("solver", SVDS_SOLVER, "arpack, lobpcg or propack (scipy's).", default="arpack")],
    outputs=[Output("u", "dense", "Left singular vectors as columns [m, k]."),
             Output("s", "dense", "The k singular values [k], ascending."),
             Output("vt", "dense", "Right singular vectors as rows [k, n].")],
    check=check_svds,
    iterative=True,
)
def svds(a: SparseTensor, k: int = 6, which: str = "LM", tol: float = 0.0, v0: np.ndarray | None = None,
         ncv: int | None = None, maxiter: int | None = None, seed: int | None = None,
         solver: str = "arpack") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if v0 is not None and not np.isfinite(v0).all():
        raise _bad("v0 holds nan or inf; svds needs a finite start", Reason.NOT_FINITE)
    matrix = _matrix(a, "a", "svds")
    _, sla = _scipy("svds")
    if v0 is None and seed is None and solver == "arpack":
        v0 = start_vector(min(matrix.shape), matrix.dtype)
    rng = np.random.default_rng(0 if seed is None else seed)
    operator = SpmvOperator(matrix, "svds", adjoint=True).linear_operator()
    try:
        with warnings.catch_warnings(), one_blas_thread():  # lobpcg's warning of a miss: scipy's svds answers anyway
            warnings.simplefilter("ignore")
            u, s, vt = sla.svds(operator, k=k, which=which, tol=tol, v0=v0, ncv=ncv, maxiter=maxiter,
                                solver=solver, rng=rng)
    except sla.ArpackNoConvergence as exc:
        raise _not_converged("svds", exc, "raise maxiter or tol, or use solver 'propack'") from None
    except np.linalg.LinAlgError as exc:  # PROPACK's word for the same
        raise _not_converged("svds", exc, "raise maxiter or tol") from None
    return np.ascontiguousarray(u), np.ascontiguousarray(s), np.ascontiguousarray(vt)


# ------------------------------------------------------------------ direct solves
def _splu(matrix: sp.csr_array, op: str):
    _, sla = _scipy(op)
    try:
        return sla.splu(matrix.tocsc())
    except RuntimeError:  # a zero pivot: the entries decide it
        raise _singular("a", op) from None


def check_spsolve(a: SparseTensor, b: np.ndarray) -> Plan:
    """A square matrix; b [n] or [n, k] of a's dtype, the shape and dtype of x."""
    n, _ = _check_matrix(a, "a", "spsolve")
    _check_rhs(b, n, a.dtype, "spsolve")
    return Plan(dtype=a.dtype, layout="dense", shape=b.shape)


@REGISTRY.op(
    "spsolve",
    doc="""x with a @ x = b by a direct sparse LU (SuperLU through scipy.sparse.linalg.splu, COLAMD ordering).
a is a square float32, float64, complex64 or complex128 matrix in any sparse layout; b a finite dense vector
[n] or block [n, k] of a's dtype. A singular a is INVALID_ARGUMENT (SINGULAR). To solve with the same a many
times, factorize it once and call solve.""",
    args=[Arg("a", TENSOR, "The square matrix [n, n].", layouts=SPARSE_LAYOUTS),
          Arg("b", TENSOR, "Right-hand side [n] or block of them [n, k].", layouts=("dense",))],
    outputs=[Output("x", "dense", "The solution, b's shape.")],
    check=check_spsolve,
)
def spsolve(a: SparseTensor, b: np.ndarray) -> np.ndarray:
    matrix = _matrix(a, "a", "spsolve")
    rhs = _finite_rhs(b, "spsolve")
    return np.ascontiguousarray(_splu(matrix, "spsolve").solve(rhs))


def check_factorize(a: SparseTensor) -> Plan:
    """A square matrix. The factor is a list of four tensors whose sizes the entries decide."""
    _check_matrix(a, "a", "factorize")
    return Plan()


@REGISTRY.op(
    "factorize",
    doc="""The sparse LU factorization of a square matrix (SuperLU, scipy.sparse.linalg.splu) as a list of four
tensors [L, U, perm_r, perm_c] with Pr @ a @ Pc = L @ U (L unit lower triangular CSR, U upper triangular
CSR, perm_r and perm_c int64 permutations, as scipy's SuperLU object defines them). Call it with keep=true
and pass the four handles to solve as factor: the factor stays on the server, counts against the store's
budget (its L and U bytes), belongs to its tenant and goes with delete (each of the four handles). Without
keep, the four tensors come back. Same dtypes and SINGULAR refusal as spsolve.""",
    args=[Arg("a", TENSOR, "The square matrix [n, n].", layouts=SPARSE_LAYOUTS)],
    outputs=[Output("factor", "tensor_list", "[L, U, perm_r, perm_c].")],
    check=check_factorize,
)
def factorize(a: SparseTensor) -> tuple[list[Any]]:
    lu = _splu(_matrix(a, "a", "factorize"), "factorize")
    return ([_csr_tensor(lu.L), _csr_tensor(lu.U), lu.perm_r.astype(np.int64), lu.perm_c.astype(np.int64)],)


def _csr_tensor(m) -> SparseTensor:
    sp, _ = _scipy("factorize")
    csr = sp.csr_array(m)
    csr.sort_indices()
    return SparseTensor(layout="csr", compressed_indices=csr.indptr.astype(np.int64),
                        plain_indices=csr.indices.astype(np.int64), values=csr.data, dense_shape=csr.shape)


def _check_factor(factor: list[Any]) -> SparseTensor:
    """factorize's four tensors as their metadata shows them: two square matrices of one order and
    dtype, two integer vectors of that length. Returns L."""
    if len(factor) != 4:
        raise _bad(f"factor has {len(factor)} tensors; solve needs factorize's four [L, U, perm_r, perm_c]",
                   Reason.BAD_FACTOR)
    lower, upper, perm_r, perm_c = factor
    if not (isinstance(lower, SparseTensor) and isinstance(upper, SparseTensor)):
        raise _bad("factor[0] and factor[1] must be factorize's sparse L and U", Reason.BAD_FACTOR)
    n, _ = _check_matrix(lower, "factor[0]", "solve")
    _check_matrix(upper, "factor[1]", "solve")
    if shape_of(upper) != shape_of(lower) or upper.dtype != lower.dtype:
        raise _bad(f"factor[1] is {shape_of(upper)} {upper.dtype} and factor[0] {shape_of(lower)} {lower.dtype}; "
                   "solve needs factorize's L and U of one order and dtype", Reason.BAD_FACTOR)
    for i, perm in ((2, perm_r), (3, perm_c)):
        if not (isinstance(perm, np.ndarray) and perm.ndim == 1 and perm.dtype.kind in "iu" and perm.size == n):
            raise _not_a_permutation(i, n)
    return lower


def _not_a_permutation(i: int, n: int) -> InvalidArgumentError:
    return _bad(f"factor[{i}] must be a permutation of range({n}) (factorize's perm_{'r' if i == 2 else 'c'})",
                Reason.BAD_FACTOR)


def _factor(factor: list[Any]) -> tuple[sp.csr_array, sp.csr_array, np.ndarray, np.ndarray]:
    """A checked factor's L and U as scipy CSRs and its permutations, refused where the entries show
    it is not factorize's: L or U not triangular, a permutation that repeats an index."""
    lower, upper, perm_r, perm_c = factor
    L, U = _matrix(lower, "factor[0]", "solve"), _matrix(upper, "factor[1]", "solve")
    n = L.shape[0]
    for i, (m, lower) in enumerate(((L, True), (U, False))):
        m.indptr, m.indices = m.indptr.astype(np.int64, copy=False), m.indices.astype(np.int64, copy=False)
        row = sk.misplaced_row(m.indptr, m.indices, lower)
        if row >= 0:
            raise _bad(f"factor[{i}] is not {'lower' if lower else 'upper'} triangular (row {row}); solve needs "
                       f"factorize's {'L' if lower else 'U'}", Reason.BAD_FACTOR)
    perms = []
    for i, perm in ((2, perm_r), (3, perm_c)):
        if not np.array_equal(np.sort(perm), np.arange(n)):
            raise _not_a_permutation(i, n)
        perms.append(perm.astype(np.intp))
    return L, U, perms[0], perms[1]


def check_solve(factor: list[Any], b: np.ndarray) -> Plan:
    """factorize's four tensors (``_check_factor``); b [n] or [n, k] of the factor's dtype, the shape
    and dtype of x."""
    lower = _check_factor(factor)
    _check_rhs(b, int(lower.dense_shape[0]), lower.dtype, "solve")
    return Plan(dtype=lower.dtype, layout="dense", shape=b.shape)


@REGISTRY.op(
    "solve",
    doc="""x with a @ x = b from a factorization that factorize made (kept: pass its four handles as factor): two
sparse triangular solves (held to scipy.sparse.linalg.spsolve_triangular), no new factorization. b is a finite dense
vector [n] or block [n, k] of the factor's dtype. A factor that is not factorize's shape (four tensors:
triangular L and U of one order, two permutations) is INVALID_ARGUMENT (BAD_FACTOR).""",
    args=[Arg("factor", TENSORS, "factorize's [L, U, perm_r, perm_c] (handles).",
              layouts=(*SPARSE_LAYOUTS, "dense")),
          Arg("b", TENSOR, "Right-hand side [n] or block of them [n, k].", layouts=("dense",))],
    outputs=[Output("x", "dense", "The solution, b's shape.")],
    check=check_solve,
)
def solve(factor: list[Any], b: np.ndarray) -> np.ndarray:
    L, U, perm_r, perm_c = _factor(factor)
    rhs = _finite_rhs(b, "solve")
    # Pr a Pc = L U: a x = b is L U (Pc^T x) = Pr b.
    y = np.empty((rhs[0].size, rhs.shape[0]), rhs.dtype)  # a right-hand side a row, each contiguous
    y[:, perm_r] = rhs.reshape(rhs.shape[0], -1).T
    for column in y:
        sk.unit_lower_solve(L.indptr, L.indices, L.data, column)
        row = sk.upper_solve(U.indptr, U.indices, U.data, column)
        if row >= 0:
            raise _bad(f"factor[1] has a zero on its diagonal (row {row}); solve needs factorize's U",
                       Reason.BAD_FACTOR)
    return np.ascontiguousarray(y[:, perm_c].T.reshape(rhs.shape))
