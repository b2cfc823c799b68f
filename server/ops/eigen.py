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

Each op's ``check`` makes the refusals the metadata decides (one 2-D matrix of a dtype the
drivers take, square and non-empty where the op needs it, k's range, which, b's shape and
dtype, a factor's four tensors); the kernels raise only what the entries decide (values that
are not finite, a matrix that is not Hermitian, a singular one, a factor that is not
triangular or whose permutations are not).
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

from ..argtypes import FLOAT, INT, TENSOR, TENSORS, choice
from ..limits import between_iterations
from ..registry import REGISTRY, Arg, Output, Plan
from ._layouts import SPARSE_LAYOUTS, as_coo
from ._sputils import shape_of

if TYPE_CHECKING:
    import scipy.sparse as sp
    import scipy.sparse.linalg as sla

DTYPES = ("float32", "float64", "complex64", "complex128")  # what ARPACK and SuperLU are built for
EIGSH_WHICH = choice("LM", "SM", "LA", "SA", "BE", reason=Reason.BAD_WHICH,
                     hint="eigsh takes LM/SM (magnitude), LA/SA (algebraic) or BE (both ends)")
SVDS_WHICH = choice("LM", "SM", reason=Reason.BAD_WHICH, hint="svds takes LM (largest) or SM (smallest)")


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


def _with_deadline(solve, operator: SpmvOperator):
    """The shift-invert solve, counted and held to the deadline as the products are (ARPACK calls it
    in place of them)."""
    def apply(x):
        between_iterations(operator.op_name, iteration=operator.products)
        operator.products += 1
        return solve(x)
    return apply


# ------------------------------------------------------------------ eigsh
def check_eigsh(a: SparseTensor, k: int = 6, which: str = "LM", sigma: float | None = None,
                tol: float = 0.0) -> Plan:
    """A square matrix, 1 <= k < n, a finite sigma, a finite tol >= 0; w is [k] of a's real dtype."""
    n, _ = _check_matrix(a, "a", "eigsh")
    _check_k(k, n, "n, the matrix's order", "eigsh")
    if sigma is not None and not math.isfinite(sigma):
        raise _bad(f"sigma is {sigma}; eigsh needs a finite shift", Reason.NOT_FINITE)
    if not (math.isfinite(tol) and tol >= 0):
        raise _bad(f"tol is {tol}; eigsh needs a finite tol >= 0", Reason.BAD_TOL)
    return Plan(dtype=_real(a.dtype), layout="dense", shape=(k,))


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
    args=[Arg("a", TENSOR, "The symmetric (Hermitian) matrix [n, n].", layouts=SPARSE_LAYOUTS),
          Arg("k", INT, "How many eigenvalues (1 <= k < n).", default=6),
          Arg("which", EIGSH_WHICH, "Which k: LM, SM, LA, SA or BE (of the shifted problem with sigma).",
              default="LM"),
          Arg("sigma", FLOAT, "Shift for shift-invert mode (finite); none: plain mode.", default=None),
          Arg("tol", FLOAT, "Relative accuracy of the eigenvalues (0: machine precision).", default=0.0)],
    outputs=[Output("w", "dense", "The k eigenvalues [k], ascending (real)."),
             Output("v", "dense", "Their eigenvectors as columns [n, k] (unit norm; each up to sign/phase).")],
    check=check_eigsh,
    iterative=True,
)
def eigsh(a: SparseTensor, k: int = 6, which: str = "LM", sigma: float | None = None,
          tol: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    matrix = _matrix(a, "a", "eigsh")
    sp, sla = _scipy("eigsh")
    n = matrix.shape[0]
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
        extra = {"sigma": sigma, "OPinv": sla.LinearOperator(matrix.shape, _with_deadline(lu.solve, operator),
                                                             dtype=matrix.dtype)}
    w, v = sla.eigsh(operator.linear_operator(), k=k, which=which, tol=tol, v0=start_vector(n, matrix.dtype),
                     **extra)
    return np.ascontiguousarray(w), np.ascontiguousarray(v)


# ------------------------------------------------------------------ svds
def check_svds(a: SparseTensor, k: int = 6, which: str = "LM") -> Plan:
    """A matrix [m, n], 1 <= k < min(m, n); u is [m, k] of a's dtype."""
    m, n = _check_matrix(a, "a", "svds", square=False)
    _check_k(k, min(m, n), "min(m, n)", "svds")
    return Plan(dtype=a.dtype, layout="dense", shape=(m, k))


@REGISTRY.op(
    "svds",
    doc="""k singular values and vectors of a sparse matrix (scipy.sparse.linalg.svds with ARPACK, our parallel
SpMV for a @ x and a^H @ x). which: LM (largest) or SM (smallest). a is float32, float64, complex64 or
complex128 [m, n], any sparse layout; 1 <= k < min(m, n). Outputs as scipy returns them: s ascending.
Iterative: bounded by the caller's deadline, checked at every matrix product.""",
    args=[Arg("a", TENSOR, "The matrix [m, n].", layouts=SPARSE_LAYOUTS),
          Arg("k", INT, "How many singular values (1 <= k < min(m, n)).", default=6),
          Arg("which", SVDS_WHICH, "LM (largest) or SM (smallest).", default="LM")],
    outputs=[Output("u", "dense", "Left singular vectors as columns [m, k]."),
             Output("s", "dense", "The k singular values [k], ascending."),
             Output("vt", "dense", "Right singular vectors as rows [k, n].")],
    check=check_svds,
    iterative=True,
)
def svds(a: SparseTensor, k: int = 6, which: str = "LM") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    matrix = _matrix(a, "a", "svds")
    _, sla = _scipy("svds")
    v0 = start_vector(min(matrix.shape), matrix.dtype)
    operator = SpmvOperator(matrix, "svds", adjoint=True).linear_operator()
    u, s, vt = sla.svds(operator, k=k, which=which, solver="arpack", v0=v0)
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
