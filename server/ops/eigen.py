"""Eigenvalues, singular values and direct solves: ``eigsh``, ``svds``, ``spsolve``, ``factorize``, ``solve``.

scipy's drivers do the numerics (ARPACK for ``eigsh``/``svds``, SuperLU for the direct solves);
what is ours is the operator: ARPACK sees a ``LinearOperator`` whose products are the parallel
CSR SpMV of ``kernels/linalg.py``, on a CSR made once per call. Each product is also where the
caller's deadline is checked (``between_iterations``): ARPACK calls it every Lanczos step, so a
call past its deadline is abandoned there.

A factorization is kept as four ordinary tensors, ``[L, U, perm_r, perm_c]`` (the list output
``factor``): ``Pr @ A @ Pc = L @ U`` as scipy's ``splu`` defines them. Plain tensors need nothing
new from the store: they count against its budget, spill to disk, stay with their tenant and go
with ``delete`` like any handle. ``solve`` rebuilds the answer with two triangular solves
(``kernels/solvers.py``, held to scipy's ``spsolve_triangular``); SuperLU's own solve object is
faster per solve (measured in ``docs/solvers.md``) but is no tensor, so it could not be spilled,
downloaded or kept durable.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from sparseserve.core.errors import InvalidArgumentError, UnimplementedError
from sparseserve.core.tensor import SparseTensor
from sparseserve.core.reasons import Reason
from sparseserve.kernels import linalg as lk
from sparseserve.kernels import solvers as sk

from ..argtypes import FLOAT, INT, STRING, TENSOR, TENSORS
from ..limits import between_iterations
from ..registry import REGISTRY, Arg, Output
from ._layouts import as_coo

if TYPE_CHECKING:
    import scipy.sparse as sp
    import scipy.sparse.linalg as sla

SPARSE = ("coo", "csr", "csc", "bsr", "bsc")
DTYPES = ("float32", "float64", "complex64", "complex128")  # what ARPACK and SuperLU are built for
EIGSH_WHICH = ("LM", "SM", "LA", "SA", "BE")
SVDS_WHICH = ("LM", "SM")


# ------------------------------------------------------------------ validation
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


def _matrix(a: SparseTensor, name: str, op: str, square: bool = True) -> sp.csr_array:
    """``a`` as a scipy CSR (int64 indices, duplicates summed), after the checks every op here makes."""
    sp, _ = _scipy(op)
    if a.dense_ndim or a.batch_ndim or a.ndim != 2:
        raise _bad(f"{name} has shape {list(a.dense_shape)} ({a.layout}); {op} needs one 2-D sparse matrix "
                   "(no batch or dense dimensions)", Reason.RANK)
    if a.dtype.name not in DTYPES:
        raise _bad(f"{name} has dtype {a.dtype}; {op} takes {', '.join(DTYPES)} (cast it first)",
                   Reason.UNSUPPORTED_DTYPE)
    m, n = (int(d) for d in a.dense_shape)
    if square and m != n:
        raise _bad(f"{name} has shape [{m}, {n}]; {op} needs a square matrix", Reason.NOT_SQUARE)
    if m == 0 or n == 0:
        raise _bad(f"{name} has shape [{m}, {n}]; {op} needs a non-empty matrix", Reason.EMPTY)
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


def _rhs(b: np.ndarray, n: int, dtype: np.dtype, op: str) -> np.ndarray:
    """``b`` a finite vector [n] or block [n, k] of ``dtype``."""
    if not isinstance(b, np.ndarray):
        raise _bad(f"b is a sparse tensor; {op} needs a dense vector [n] or block [n, k]", Reason.NOT_DENSE)
    if b.ndim not in (1, 2) or b.shape[0] != n:
        raise _bad(f"b has shape {list(b.shape)}; {op} needs [{n}] or [{n}, k] to match the matrix's {n} rows",
                   Reason.SHAPE_MISMATCH)
    if b.dtype != dtype:
        raise _bad(f"b has dtype {b.dtype} and the matrix {dtype}; {op} needs one dtype (cast b)",
                   Reason.DTYPE_MISMATCH)
    if not np.isfinite(b).all():
        raise _bad(f"b holds nan or inf; {op} needs finite values", Reason.NOT_FINITE)
    return b


def _which(which: str, allowed: tuple[str, ...], op: str) -> str:
    if which not in allowed:
        raise _bad(f"which is {which!r}; {op} takes one of {', '.join(allowed)}", Reason.BAD_WHICH)
    return which


def _k(k: int, below: int, what: str, op: str) -> int:
    if not 1 <= k < below:
        raise _bad(f"k is {k}; {op} needs 1 <= k < {what} ({below}) for ARPACK", Reason.K_OUT_OF_RANGE)
    return k


def _check_hermitian(a: sp.csr_array, op: str) -> None:
    """ARPACK's symmetric driver answers nonsense for a matrix that is not: refuse one whose
    difference from its conjugate transpose is more than rounding."""
    diff = a - a.conj().T
    scale = float(np.abs(a.data).max(initial=0.0))
    worst = float(np.abs(diff.data).max(initial=0.0))
    if worst > 64 * np.finfo(a.dtype).eps * scale:
        kind = "Hermitian" if a.dtype.kind == "c" else "symmetric"
        raise _bad(f"a is not {kind} (|a - a^H| reaches {worst:.3g}); {op} needs a {kind} matrix "
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

    def product(self, arrays, rows: int, x: np.ndarray) -> np.ndarray:
        """``arrays``' CSR matrix times the vector or block ``x``."""
        between_iterations(self.op_name, iteration=self.products)
        self.products += 1
        ptr, idx, vals = arrays
        x = np.ascontiguousarray(x, dtype=vals.dtype)
        if x.ndim == 1:
            return lk.spmv(ptr, idx, vals, x, rows, False)
        return lk.spmm(ptr, idx, vals, x, rows, False)


def _checked(solve, operator: SpmvOperator):
    """The shift-invert solve, checking the deadline as the products do (ARPACK calls it in place of them)."""
    def apply(x):
        between_iterations(operator.op_name, iteration=operator.products)
        operator.products += 1
        return solve(x)
    return apply


# ------------------------------------------------------------------ eigsh
@REGISTRY.op(
    "eigsh",
    doc="""k eigenvalues and eigenvectors of a real symmetric or complex Hermitian sparse matrix
(scipy.sparse.linalg.eigsh: ARPACK's implicitly restarted Lanczos, with our parallel SpMV as the operator).
which: LM/SM (largest/smallest magnitude), LA/SA (largest/smallest algebraic), BE (both ends).
With sigma, shift-invert mode: the eigenvalues nearest sigma, through a SuperLU factorization of a - sigma I.
a is float32, float64, complex64 or complex128 (one 2-D matrix, any sparse layout); 1 <= k < n.
A matrix that is not symmetric (Hermitian) beyond rounding is refused (NOT_HERMITIAN). ARPACK that does not
converge is INTERNAL with scipy's message. Iterative: bounded by the caller's deadline, checked at every
matrix product.""",
    args=[Arg("a", TENSOR, "The symmetric (Hermitian) matrix [n, n].", layouts=SPARSE),
          Arg("k", INT, "How many eigenvalues (1 <= k < n).", default=6),
          Arg("which", STRING, "Which k: LM, SM, LA, SA or BE (of the shifted problem with sigma).",
              default="LM"),
          Arg("sigma", FLOAT, "Shift for shift-invert mode (finite); none: plain mode.", default=None),
          Arg("tol", FLOAT, "Relative accuracy of the eigenvalues (0: machine precision).", default=0.0)],
    outputs=[Output("w", "dense", "The k eigenvalues [k], ascending (real)."),
             Output("v", "dense", "Their eigenvectors as columns [n, k] (unit norm; each up to sign/phase).")],
    iterative=True,
)
def eigsh(a: SparseTensor, k: int = 6, which: str = "LM", sigma: float | None = None,
          tol: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    matrix = _matrix(a, "a", "eigsh")
    sp, sla = _scipy("eigsh")
    n = matrix.shape[0]
    _k(k, n, "n, the matrix's order", "eigsh")
    _which(which, EIGSH_WHICH, "eigsh")
    if sigma is not None and not math.isfinite(sigma):
        raise _bad(f"sigma is {sigma}; eigsh needs a finite shift", Reason.NOT_FINITE)
    if not (math.isfinite(tol) and tol >= 0):
        raise _bad(f"tol is {tol}; eigsh needs a finite tol >= 0", Reason.BAD_TOL)
    _check_hermitian(matrix, "eigsh")
    operator = SpmvOperator(matrix, "eigsh")
    extra: dict[str, Any] = {}
    if sigma is not None:
        # What scipy itself would do for a sparse matrix: SuperLU of (a - sigma I), its solve as OPinv.
        shifted = (matrix - sigma * sp.eye_array(n, dtype=matrix.dtype, format="csr")).tocsc()
        try:
            lu = sla.splu(shifted)
        except RuntimeError:
            raise _bad(f"a - sigma I is singular for sigma = {sigma}; choose a shift that is not an eigenvalue",
                       Reason.SINGULAR) from None
        extra = {"sigma": sigma, "OPinv": sla.LinearOperator(matrix.shape, _checked(lu.solve, operator),
                                                             dtype=matrix.dtype)}
    w, v = sla.eigsh(operator.linear_operator(), k=k, which=which, tol=tol, v0=start_vector(n, matrix.dtype),
                     **extra)
    return np.ascontiguousarray(w), np.ascontiguousarray(v)


# ------------------------------------------------------------------ svds
@REGISTRY.op(
    "svds",
    doc="""k singular values and vectors of a sparse matrix (scipy.sparse.linalg.svds with ARPACK, our parallel
SpMV for a @ x and a^H @ x). which: LM (largest) or SM (smallest). a is float32, float64, complex64 or
complex128 [m, n], any sparse layout; 1 <= k < min(m, n). Outputs as scipy returns them: s ascending.
Iterative: bounded by the caller's deadline, checked at every matrix product.""",
    args=[Arg("a", TENSOR, "The matrix [m, n].", layouts=SPARSE),
          Arg("k", INT, "How many singular values (1 <= k < min(m, n)).", default=6),
          Arg("which", STRING, "LM (largest) or SM (smallest).", default="LM")],
    outputs=[Output("u", "dense", "Left singular vectors as columns [m, k]."),
             Output("s", "dense", "The k singular values [k], ascending."),
             Output("vt", "dense", "Right singular vectors as rows [k, n].")],
    iterative=True,
)
def svds(a: SparseTensor, k: int = 6, which: str = "LM") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    matrix = _matrix(a, "a", "svds", square=False)
    _, sla = _scipy("svds")
    _k(k, min(matrix.shape), "min(m, n)", "svds")
    _which(which, SVDS_WHICH, "svds")
    v0 = start_vector(min(matrix.shape), matrix.dtype)
    operator = SpmvOperator(matrix, "svds", adjoint=True).linear_operator()
    u, s, vt = sla.svds(operator, k=k, which=which, solver="arpack", v0=v0)
    return np.ascontiguousarray(u), np.ascontiguousarray(s), np.ascontiguousarray(vt)


# ------------------------------------------------------------------ direct solves
def _splu(matrix: sp.csr_array, op: str):
    _, sla = _scipy(op)
    try:
        return sla.splu(matrix.tocsc())
    except RuntimeError:
        raise _singular("a", op) from None


@REGISTRY.op(
    "spsolve",
    doc="""x with a @ x = b by a direct sparse LU (SuperLU through scipy.sparse.linalg.splu, COLAMD ordering).
a is a square float32, float64, complex64 or complex128 matrix in any sparse layout; b a finite dense vector
[n] or block [n, k] of a's dtype. A singular a is INVALID_ARGUMENT (SINGULAR). To solve with the same a many
times, factorize it once and call solve.""",
    args=[Arg("a", TENSOR, "The square matrix [n, n].", layouts=SPARSE),
          Arg("b", TENSOR, "Right-hand side [n] or block of them [n, k].", layouts=("dense",))],
    outputs=[Output("x", "dense", "The solution, b's shape.")],
)
def spsolve(a: SparseTensor, b: np.ndarray) -> np.ndarray:
    matrix = _matrix(a, "a", "spsolve")
    rhs = _rhs(b, matrix.shape[0], matrix.dtype, "spsolve")
    return np.ascontiguousarray(_splu(matrix, "spsolve").solve(rhs))


@REGISTRY.op(
    "factorize",
    doc="""The sparse LU factorization of a square matrix (SuperLU, scipy.sparse.linalg.splu) as a list of four
tensors [L, U, perm_r, perm_c] with Pr @ a @ Pc = L @ U (L unit lower triangular CSR, U upper triangular
CSR, perm_r and perm_c int64 permutations, as scipy's SuperLU object defines them). Call it with keep=true
and pass the four handles to solve as factor: the factor stays on the server, counts against the store's
budget (its L and U bytes), belongs to its tenant and goes with delete (each of the four handles). Without
keep, the four tensors come back. Same dtypes and SINGULAR refusal as spsolve.""",
    args=[Arg("a", TENSOR, "The square matrix [n, n].", layouts=SPARSE)],
    outputs=[Output("factor", "tensor_list", "[L, U, perm_r, perm_c].")],
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


def _factor(factor: list[Any]) -> tuple[sp.csr_array, sp.csr_array, np.ndarray, np.ndarray]:
    """factorize's four tensors, checked: two triangular CSR matrices of one order and two permutations."""
    if len(factor) != 4:
        raise _bad(f"factor has {len(factor)} tensors; solve needs factorize's four [L, U, perm_r, perm_c]",
                   Reason.BAD_FACTOR)
    lower, upper, perm_r, perm_c = factor
    if not (isinstance(lower, SparseTensor) and isinstance(upper, SparseTensor)):
        raise _bad("factor[0] and factor[1] must be factorize's sparse L and U", Reason.BAD_FACTOR)
    L, U = _matrix(lower, "factor[0]", "solve"), _matrix(upper, "factor[1]", "solve")
    n = L.shape[0]
    if U.shape != L.shape or U.dtype != L.dtype:
        raise _bad(f"factor[1] is {list(U.shape)} {U.dtype} and factor[0] {list(L.shape)} {L.dtype}; "
                   "solve needs factorize's L and U of one order and dtype", Reason.BAD_FACTOR)
    for i, (m, lower) in enumerate(((L, True), (U, False))):
        m.indptr, m.indices = m.indptr.astype(np.int64, copy=False), m.indices.astype(np.int64, copy=False)
        row = sk.misplaced_row(m.indptr, m.indices, lower)
        if row >= 0:
            raise _bad(f"factor[{i}] is not {'lower' if lower else 'upper'} triangular (row {row}); solve needs "
                       f"factorize's {'L' if lower else 'U'}", Reason.BAD_FACTOR)
    perms = []
    for i, perm in ((2, perm_r), (3, perm_c)):
        if not (isinstance(perm, np.ndarray) and perm.ndim == 1 and perm.dtype.kind in "iu"
                and perm.size == n and np.array_equal(np.sort(perm), np.arange(n))):
            raise _bad(f"factor[{i}] must be a permutation of range({n}) (factorize's perm_"
                       f"{'r' if i == 2 else 'c'})", Reason.BAD_FACTOR)
        perms.append(perm.astype(np.intp))
    return L, U, perms[0], perms[1]


@REGISTRY.op(
    "solve",
    doc="""x with a @ x = b from a factorization that factorize made (kept: pass its four handles as factor): two
sparse triangular solves (held to scipy.sparse.linalg.spsolve_triangular), no new factorization. b is a finite dense
vector [n] or block [n, k] of the factor's dtype. A factor that is not factorize's shape (four tensors:
triangular L and U of one order, two permutations) is INVALID_ARGUMENT (BAD_FACTOR).""",
    args=[Arg("factor", TENSORS, "factorize's [L, U, perm_r, perm_c] (handles).", layouts=(*SPARSE, "dense")),
          Arg("b", TENSOR, "Right-hand side [n] or block of them [n, k].", layouts=("dense",))],
    outputs=[Output("x", "dense", "The solution, b's shape.")],
)
def solve(factor: list[Any], b: np.ndarray) -> np.ndarray:
    L, U, perm_r, perm_c = _factor(factor)
    rhs = _rhs(b, L.shape[0], L.dtype, "solve")
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
