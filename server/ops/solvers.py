"""Krylov solvers after ``scipy.sparse.linalg``: ``cg``, ``bicgstab``, ``gmres`` and ``minres``,
the whole iteration on the server (only b and x travel).

Each answers as scipy does on the same problem: the same stopping rule (``norm(r) < max(atol,
rtol * norm(b))`` on the recurrence residual; minres and gmres by their own rules), the same
default ``maxiter`` (10 n), the same ``info`` (0 converged, else the iteration count reached,
scipy's negative breakdown codes as they are). ``cg`` and ``bicgstab`` are scipy's loops
rewritten over fused kernels (``kernels/solvers.py``: per SpMV about one pass over the
vectors); ``gmres`` and ``minres`` are scipy's own drivers run over our parallel SpMV and
preconditioners (scipy is then needed on the server, imported when they are called).

The four ops share one check (``check_system``: tolerances, maxiter, a square 2-D matrix, b's
and x0's shapes and dtypes, from metadata, on every path); the kernels refuse only what the
values decide (a non-finite b or x0, a zero pivot of a preconditioner). The matrix's CSR
arrays, its diagonal's inverse and its ILU(0) factor are kept with a held (read-only) tensor
while it lives, as ``gather.py`` keeps its run pointers: a handle solved again skips them. A
tensor sent inline has them computed per call.
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import Any, Callable

import numpy as np

from sparseserve.core.errors import InvalidArgumentError, UnimplementedError
from sparseserve.core.tensor import SparseTensor
from sparseserve.core.reasons import Reason
from sparseserve.kernels import solvers as sk
from sparseserve.kernels import frozen

from ..argtypes import FLOAT, INT, OPTIONAL_INT, TENSOR, choice
from ..limits import between_iterations
from ..metrics import SOLVER_ITERATIONS
from ..partition import Krylov
from ..registry import REGISTRY, Arg, Output, Plan
from ._layouts import SPARSE_LAYOUTS
from ._sputils import shape_of
from .linalg import csr_arrays, matrix_dims, matrix_rep

__all__ = ["Operator", "operator_of", "inverse_diagonal", "solver_dtype", "check_system", "check_cg",
           "check_bicgstab", "check_gmres", "check_minres"]

PRECONDITIONERS = ("none", "jacobi", "ilu0")
PRECONDITIONER = choice(*PRECONDITIONERS, reason=Reason.BAD_PRECONDITIONER)


# ------------------------------------------------------------------ the matrix, kept with its handle
class Operator:
    """A square sparse matrix ready to iterate with: CSR arrays in the compute dtype (float64,
    or float32 for a float32 matrix) and its preconditioners, made on first use."""

    def __init__(self, csr: sk.Csr):
        self.csr = csr
        self.n = csr.n
        self.dtype = csr.vals.dtype
        self._lock = threading.Lock()
        self._jacobi: np.ndarray | None = None
        self._ilu0: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    def matvec(self, x: np.ndarray) -> np.ndarray:
        y = np.empty(self.n, self.dtype)
        sk.spmv_into(self.csr, np.ascontiguousarray(x, self.dtype), y)
        return y

    def spmv_dot(self, x: np.ndarray, y: np.ndarray) -> float:
        """y = A @ x in place; returns x . y (a partitioned matrix's operator does the same)."""
        return sk.spmv_dot(self.csr, x, y)

    def spmv_dots(self, x: np.ndarray, y: np.ndarray, u: np.ndarray) -> tuple[float, float]:
        """y = A @ x in place; returns (u . y, y . y)."""
        return sk.spmv_dots(self.csr, x, y, u)

    def jacobi(self) -> np.ndarray:
        """1 / diag(A); a zero on the diagonal is refused."""
        with self._lock:
            if self._jacobi is None:
                self._jacobi = inverse_diagonal(sk.diagonal(self.csr.ptr, self.csr.idx, self.csr.vals))
            return self._jacobi

    def ilu0(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(ptr, idx, lu, diag_pos) of the ILU(0) factor on A's pattern (sorted, summed)."""
        with self._lock:
            if self._ilu0 is None:
                ptr, idx, vals = (frozen(v) for v in _canonical(self.csr.ptr, self.csr.idx, self.csr.vals))
                lu, diag_pos, bad = sk.ilu0(ptr, idx, vals)
                if bad >= 0:
                    raise InvalidArgumentError(
                        f"preconditioner 'ilu0' breaks down at row {bad}: its diagonal entry is missing or its "
                        "pivot is 0 (ILU(0) needs every diagonal entry stored and nonzero pivots)",
                        reason=Reason.SINGULAR_PRECONDITIONER)
                self._ilu0 = (ptr, idx, frozen(lu), frozen(diag_pos))
            return self._ilu0

    def preconditioner(self, name: str) -> Callable[[np.ndarray], np.ndarray] | None:
        """M^-1 as a function of a vector (None for 'none')."""
        if name == "jacobi":
            dinv = self.jacobi()
            return lambda r: dinv * r
        if name == "ilu0":
            ptr, idx, lu, diag_pos = self.ilu0()

            def solve(r: np.ndarray) -> np.ndarray:
                z = np.empty(self.n, self.dtype)
                sk.ilu0_solve(ptr, idx, lu, diag_pos, np.ascontiguousarray(r, self.dtype), z)
                return z
            return solve
        return None


def inverse_diagonal(d: np.ndarray) -> np.ndarray:
    """Jacobi's M^-1 from diag(A); a zero on the diagonal is refused."""
    zero = np.flatnonzero(d == 0)
    if zero.size:
        raise InvalidArgumentError(f"preconditioner 'jacobi' needs a nonzero diagonal; a[{zero[0]}, {zero[0]}] "
                                   "is 0", reason=Reason.SINGULAR_PRECONDITIONER)
    return 1 / d


def _canonical(ptr, idx, vals):
    """CSR arrays with columns ascending and unrepeated in each row (repeats summed)."""
    n = ptr.size - 1
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(ptr.astype(np.int64)))
    key = rows * n + idx.astype(np.int64)
    if key.size < 2 or bool((np.diff(key) > 0).all()):
        return ptr.astype(np.int64), idx.astype(np.int64), vals
    order = np.argsort(key, kind="stable")
    key = key[order]
    starts = np.flatnonzero(np.concatenate([[True], np.diff(key) > 0]))
    summed = np.add.reduceat(vals[order], starts)
    new_rows = key[starts] // n
    new_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(new_rows, minlength=n), out=new_ptr[1:])
    return new_ptr, key[starts] % n, summed


_KEPT: "weakref.WeakKeyDictionary[SparseTensor, dict[str, Operator]]" = weakref.WeakKeyDictionary()
_KEPT_LOCK = threading.Lock()


def solver_dtype(a_dtype: Any, b_dtype: Any = None) -> np.dtype:
    """The dtype a solve runs in: float32 where the matrix (and b) are float32, else float64
    (scipy's make_system: other real dtypes are solved in float64). Real dtypes only: the
    check refuses complex and bool first (``check_system``)."""
    if np.dtype(a_dtype) == np.float32 and (b_dtype is None or np.dtype(b_dtype) == np.float32):
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def operator_of(a: SparseTensor, dtype: Any = None) -> Operator:
    """``a`` (a checked square 2-D sparse matrix, any layout) as an ``Operator`` in ``dtype``
    (default: ``solver_dtype`` of a's), kept with ``a`` while it lives when ``a`` is read-only
    (a handle)."""
    dtype = np.dtype(dtype) if dtype is not None else solver_dtype(a.dtype)
    held = not any(arr.flags.writeable for arr in a.arrays())
    if held:
        with _KEPT_LOCK:
            kept = _KEPT.get(a, {}).get(dtype.name)
        if kept is not None:
            return kept
    ptr, idx, vals = csr_arrays(matrix_rep(a))
    operator = Operator(sk.Csr(ptr, idx, np.ascontiguousarray(vals, dtype)))
    if held:
        with _KEPT_LOCK:
            _KEPT.setdefault(a, {})[dtype.name] = operator
    return operator


# ------------------------------------------------------------------ the check the four ops share
def check_system(op: str, a, b, x0, rtol: float, atol: float, maxiter) -> Plan:
    """Every refusal of a solve that metadata decides: tolerances and maxiter, a square 2-D
    sparse matrix, b [n] or [n, k] and x0 of b's shape, real dtypes (``preconditioner`` is a
    choice, refused as the call binds). The plan's ``dtype`` is the solve's (``solver_dtype``),
    handed to the kernels as ``dtype``."""
    _check_limits(rtol, atol, maxiter)
    if not isinstance(b, np.ndarray):
        raise InvalidArgumentError(f"b must be a dense vector [n] or a block [n, k] for {op}, not a sparse tensor",
                                   reason=Reason.UNSUPPORTED_LAYOUT)
    if not isinstance(a, SparseTensor):
        raise InvalidArgumentError(f"a must be a sparse matrix (a handle or a sparse tensor) for {op}, not a "
                                   "dense array", reason=Reason.UNSUPPORTED_LAYOUT)
    for name, dtype in (("a", a.dtype), ("b", b.dtype)):
        if dtype.kind not in "iuf":
            raise InvalidArgumentError(f"{name} has dtype {dtype}; the solvers take real numbers (floats or "
                                       "integers, solved in float64; float32 stays float32)",
                                       reason=Reason.UNSUPPORTED_DTYPE)
    _check_vectors(_order(op, a), b, x0)
    dtype = solver_dtype(a.dtype, b.dtype)
    return Plan(args={"dtype": dtype}, dtype=dtype, layout="dense", shape=b.shape)


def _check_limits(rtol: float, atol: float, maxiter: int | None) -> None:
    for name, value in (("rtol", rtol), ("atol", atol)):
        if not (math.isfinite(value) and value >= 0):
            raise InvalidArgumentError(f"{name} must be a finite number >= 0, not {value}", reason=Reason.BAD_TOLERANCE)
    if maxiter is not None and maxiter < 1:
        raise InvalidArgumentError(f"maxiter must be at least 1 (or null for 10 n), not {maxiter}",
                                   reason=Reason.BAD_MAXITER)


def _order(op: str, a: SparseTensor) -> int:
    """n of a square 2-D matrix ``a`` [n, n] (no batch or dense dimensions)."""
    batch, m, n = matrix_dims(a, "a", op)
    if batch:
        raise InvalidArgumentError(f"a has shape {shape_of(a)}; {op} needs one 2-D matrix (no batch "
                                   "dimensions)", reason=Reason.RANK)
    if m != n:
        raise InvalidArgumentError(f"a has shape [{m}, {n}]; {op} needs a square matrix", reason=Reason.NOT_SQUARE)
    return n


def _check_vectors(n: int, b: np.ndarray, x0) -> None:
    if b.ndim not in (1, 2) or b.shape[0] != n:
        raise InvalidArgumentError(f"a has shape [{n}, {n}] and b has shape {shape_of(b)}; b must be [{n}] or "
                                   f"[{n}, k]", reason=Reason.SHAPE_MISMATCH)
    if x0 is None:
        return
    if not isinstance(x0, np.ndarray) or x0.shape != b.shape:
        raise InvalidArgumentError(f"x0 has shape {shape_of(x0)}; it must be dense with b's shape {shape_of(b)}",
                                   reason=Reason.SHAPE_MISMATCH)
    if x0.dtype.kind not in "iuf":
        raise InvalidArgumentError(f"x0 has dtype {x0.dtype}; the solvers take real numbers",
                                   reason=Reason.UNSUPPORTED_DTYPE)


def _check_finite(op: str, b: np.ndarray, x0: np.ndarray | None) -> None:
    """b and x0 hold finite numbers: their entries decide it, so each kernel asks (local and
    partitioned alike) before it builds anything."""
    for name, vector in (("b", b), ("x0", x0)):
        if vector is not None and vector.dtype.kind == "f" and not np.isfinite(vector).all():
            where = np.argwhere(~np.isfinite(vector))[0].tolist()
            raise InvalidArgumentError(f"{name} has a non-finite value at {where}; {op} needs finite numbers",
                                       reason=Reason.NOT_FINITE)


def _solve_columns(op: str, operator: Operator, b: np.ndarray, x0, solve_one) -> tuple[Any, ...]:
    """Runs ``solve_one(b, x0) -> (x, info, iterations)`` on b, or on each column of a block; adds
    the true residual norm and counts the iterations in /metrics."""
    dtype = operator.dtype
    columns = [b] if b.ndim == 1 else [b[:, j] for j in range(b.shape[1])]
    starts = [x0] if b.ndim == 1 or x0 is None else [x0[:, j] for j in range(b.shape[1])]
    if x0 is None:
        starts = [None] * len(columns)
    xs, infos, iterations, norms = [], [], [], []
    for column, start in zip(columns, starts):
        bc = np.array(column, dtype=dtype)
        xc = np.zeros(operator.n, dtype) if start is None else np.array(start, dtype=dtype)
        x, info, its = solve_one(bc, xc)
        SOLVER_ITERATIONS.add(op, its)
        xs.append(x)
        infos.append(info)
        iterations.append(its)
        norms.append(float(np.linalg.norm(bc - operator.matvec(x))))
    if b.ndim == 1:
        return xs[0], np.int64(infos[0]), np.int64(iterations[0]), np.float64(norms[0])
    return (np.stack(xs, axis=1), np.array(infos, np.int64), np.array(iterations, np.int64),
            np.array(norms, np.float64))


# ------------------------------------------------------------------ cg: our loop, fused kernels
def _start(operator: Operator, b: np.ndarray, x: np.ndarray, rtol: float, atol: float,
           maxiter: int | None) -> tuple[float, int, np.ndarray] | None:
    """scipy's opening of cg and bicgstab: the absolute tolerance max(atol, rtol * norm(b)), the
    iteration limit (10 n by default) and the first residual; None for b = 0 (x = 0 at once)."""
    b_norm = float(np.linalg.norm(b))
    if b_norm == 0:
        return None
    r = b - operator.matvec(x) if x.any() else b.copy()
    return max(atol, rtol * b_norm), 10 * operator.n if maxiter is None else maxiter, r


def _cg(operator: Operator, b: np.ndarray, x: np.ndarray, rtol: float, atol: float, maxiter: int | None,
        preconditioner: str) -> tuple[np.ndarray, int, int]:
    """scipy.sparse.linalg.cg's iteration, step for step (the same checks in the same places)."""
    n = operator.n
    start = _start(operator, b, x, rtol, atol, maxiter)
    if start is None:
        return b, 0, 0
    atol, maxiter, r = start
    p, q = np.zeros(n, operator.dtype), np.empty(n, operator.dtype)
    empty = np.zeros(0, operator.dtype)
    if preconditioner == "jacobi":
        mode, w = sk.JACOBI, operator.jacobi()
    elif preconditioner == "ilu0":
        mode, w = sk.GIVEN, np.empty(n, operator.dtype)
        ilu = operator.ilu0()
    else:
        mode, w = sk.NONE, empty
    rr = float(np.dot(r, r))

    def preconditioned_dot() -> float:  # r . M^-1 r (z kept in w for ilu0)
        if mode == sk.GIVEN:
            return float(sk.ilu0_solve(ilu[0], ilu[1], ilu[2], ilu[3], r, w))
        return float(np.dot(r, w * r)) if mode == sk.JACOBI else rr

    # numpy scalars, as scipy's: a breakdown (p . Ap = 0, a singular A) gives inf or nan and the
    # loop runs on to maxiter (info set), where Python floats would raise ZeroDivisionError.
    rz, rz_prev = np.float64(preconditioned_dot()), np.float64(1.0)
    with np.errstate(all="ignore"):
        for iteration in range(maxiter):
            if math.sqrt(rr) < atol:
                return x, 0, iteration
            sk.cg_direction(p, r, w, float(rz / rz_prev) if iteration else 0.0, mode)
            alpha = float(rz / np.float64(operator.spmv_dot(p, q)))
            rr, rz_jacobi = sk.cg_update(x, r, p, q, w if mode == sk.JACOBI else empty, alpha, mode)
            rz_prev = rz
            rz = np.float64(rz_jacobi if mode == sk.JACOBI else preconditioned_dot())
            between_iterations("cg", iteration=iteration + 1, residual_norm=math.sqrt(rr))
    return x, maxiter, maxiter


# ------------------------------------------------------------------ bicgstab: our loop, fused kernels
def _bicgstab(operator: Operator, b: np.ndarray, x: np.ndarray, rtol: float, atol: float, maxiter: int | None,
              preconditioner: str) -> tuple[np.ndarray, int, int]:
    """scipy.sparse.linalg.bicgstab's iteration, step for step: the same checks (its breakdown
    tolerances eps^2 and codes -10, -11) in the same places. A solve that converges halfway
    through an iteration (on s) counts that iteration."""
    start = _start(operator, b, x, rtol, atol, maxiter)
    if start is None:
        return b, 0, 0
    atol, maxiter, r = start
    breakdown = float(np.finfo(operator.dtype).eps) ** 2  # scipy's rhotol and omegatol
    mode = {"none": sk.NONE, "jacobi": sk.JACOBI, "ilu0": sk.GIVEN}[preconditioner]
    dinv = operator.jacobi() if mode == sk.JACOBI else np.zeros(0, operator.dtype)
    ilu = operator.ilu0() if mode == sk.GIVEN else None
    v = sk.BicgVectors(x, r, mode, dinv)
    rr = float(np.dot(r, r))
    rho, rho_prev, alpha, omega = np.float64(rr), np.float64(1.0), np.float64(0.0), np.float64(0.0)
    with np.errstate(all="ignore"):
        for iteration in range(maxiter):
            if math.sqrt(rr) < atol:
                return x, 0, iteration
            if abs(rho) < breakdown:
                return x, -10, iteration
            if iteration > 0:
                if abs(omega) < breakdown:
                    return x, -11, iteration
                v.direction(float((rho / rho_prev) * (alpha / omega)), float(omega), False)
            else:
                v.direction(0.0, 0.0, True)
            if ilu is not None:
                sk.ilu0_solve(*ilu, frozen(v.p), v.phat)
            rv, _ = operator.spmv_dots(v.phat, v.v, v.rtilde)
            if rv == 0:
                return x, -11, iteration
            alpha = rho / np.float64(rv)
            if math.sqrt(v.half(float(alpha))) < atol:
                x += float(alpha) * v.phat
                return x, 0, iteration + 1
            if ilu is not None:
                sk.ilu0_solve(*ilu, frozen(v.r), v.shat)
            ts, tt = operator.spmv_dots(v.shat, v.t, v.r)
            omega = np.float64(ts) / np.float64(tt)
            rr, rho_next = v.update(float(alpha), float(omega))
            rho_prev, rho = rho, np.float64(rho_next)
            between_iterations("bicgstab", iteration=iteration + 1, residual_norm=math.sqrt(rr))
    return x, maxiter, maxiter


# ------------------------------------------------------------------ the others: scipy's drivers
def _scipy_solve(op: str, operator: Operator, b, x, rtol, atol, maxiter, preconditioner, **extra):
    try:
        from scipy.sparse import linalg as spla
    except ImportError:
        raise UnimplementedError(f"{op} runs scipy's driver on the server; install scipy there "
                                 "(pip install scipy)", reason=Reason.MISSING_DEPENDENCY) from None
    n, dtype = operator.n, operator.dtype
    a = spla.LinearOperator((n, n), matvec=operator.matvec, dtype=dtype)
    m_solve = operator.preconditioner(preconditioner)
    m = None if m_solve is None else spla.LinearOperator((n, n), matvec=m_solve, dtype=dtype)
    count = [0]
    b_norm = float(np.linalg.norm(b))

    def callback(arg) -> None:
        count[0] += 1
        fields: dict[str, Any] = {"iteration": count[0]}
        if op == "gmres":  # its callback gets the preconditioned residual relative to norm(b)
            fields["residual_norm"] = float(arg) * b_norm
        between_iterations(op, **fields)

    solver = getattr(spla, op)
    kwargs: dict[str, Any] = {"rtol": rtol, "maxiter": maxiter, "M": m, "callback": callback, **extra}
    if op != "minres":
        kwargs["atol"] = atol
    if op == "gmres":
        kwargs["callback_type"] = "pr_norm"
    x, info = solver(a, b, x, **kwargs)
    return np.asarray(x, dtype), int(info), count[0]


# ------------------------------------------------------------------ declarations
SOLVERS = ("cg", "bicgstab", "gmres", "minres")
for _name in SOLVERS:  # each op's series exported from the start, at 0 (rate() needs a first sample)
    SOLVER_ITERATIONS.add(_name, 0)

_COMMON_DOC = """a is any square 2-D sparse layout (COO, CSR, CSC, BSR, BSC), sent or held by a handle;
b is a dense vector [n], or a block [n, k] whose columns are solved one after another (x, info,
iterations and residual_norm are then [n, k] and [k]). x0 (b's shape) is the first guess (zeros
by default). Real values only: float32 stays float32 when a and b are both float32, every other real
dtype is solved in float64 (as scipy does); complex and bool are INVALID_ARGUMENT. preconditioner is
'none', 'jacobi' (diag(A)^-1) or 'ilu0' (incomplete LU with zero fill on A's pattern); for a handle
the CSR arrays and the preconditioner are computed once and kept with it. info is scipy's: 0
converged, > 0 the iteration count reached without converging (no error), < 0 a breakdown;
residual_norm is norm(b - A x) of the returned x. Bad input (not square, b's shape, non-finite b
or x0, a preconditioner name, a tolerance) is INVALID_ARGUMENT naming it; the caller's deadline is
checked after every iteration (DEADLINE_EXCEEDED, the solve abandoned)."""


def _args(with_atol_doc: str, extra: tuple[Arg, ...] = ()) -> list[Arg]:
    return [Arg("a", TENSOR, "The square sparse matrix A.", layouts=SPARSE_LAYOUTS),
            Arg("b", TENSOR, "Right-hand side [n], or a block of them [n, k].", layouts=("dense",)),
            Arg("x0", TENSOR, "Starting guess, b's shape (zeros when null).", default=None, layouts=("dense",)),
            Arg("rtol", FLOAT, "Relative tolerance.", default=1e-5),
            Arg("atol", FLOAT, with_atol_doc, default=0.0),
            Arg("maxiter", OPTIONAL_INT, "Iteration limit (null: 10 n, as scipy).", default=None),
            Arg("preconditioner", PRECONDITIONER, "'none', 'jacobi' or 'ilu0'.", default="none"),
            *extra]


_OUTPUTS = [Output("x", "dense", "The solution, b's shape."),
            Output("info", "dense", "int64: 0 converged, else scipy's code (per column for a block)."),
            Output("iterations", "dense", "int64: iterations run (per column for a block)."),
            Output("residual_norm", "dense", "float64: norm(b - A x) (per column for a block).")]
_ATOL = "Absolute tolerance: stop when norm(r) < max(atol, rtol * norm(b))."


def _operator(op: str, a: SparseTensor, b: np.ndarray, x0: np.ndarray | None, dtype: np.dtype) -> Operator:
    """A single node's operator for a checked call, once b and x0 are found finite."""
    _check_finite(op, b, x0)
    return operator_of(a, dtype)


def check_cg(a, b, x0=None, rtol: float = 1e-5, atol: float = 0.0, maxiter=None,
             preconditioner: str = "none") -> Plan:
    return check_system("cg", a, b, x0, rtol, atol, maxiter)


@REGISTRY.op(
    "cg",
    doc=f"""Conjugate gradients for a symmetric positive definite A (scipy.sparse.linalg.cg): stops when
norm(r) < max(atol, rtol * norm(b)) for the recurrence residual r, checked before each iteration, as
scipy; maxiter defaults to 10 n. With a preconditioner M the residual tested is still r (not M^-1 r).
Each iteration is one parallel SpMV and fused vector passes. On a partitioned matrix (--dask-scheduler)
the loop runs on the replica and each SpMV on the blocks where they are, with the single-node answer
(preconditioner 'none' or 'jacobi'; 'ilu0' is UNIMPLEMENTED there). {_COMMON_DOC}""",
    args=_args(_ATOL), outputs=_OUTPUTS, check=check_cg, iterative=True)
def cg(a, b, dtype: np.dtype, x0=None, rtol: float = 1e-5, atol: float = 0.0, maxiter=None,
       preconditioner: str = "none"):
    operator = _operator("cg", a, b, x0, dtype)
    return _solve_columns("cg", operator, b, x0,
                          lambda bc, xc: _cg(operator, bc, xc, rtol, atol, maxiter, preconditioner))


def check_bicgstab(a, b, x0=None, rtol: float = 1e-5, atol: float = 0.0, maxiter=None,
                   preconditioner: str = "none") -> Plan:
    return check_system("bicgstab", a, b, x0, rtol, atol, maxiter)


@REGISTRY.op(
    "bicgstab",
    doc=f"""BiCGSTAB for a general square A (scipy.sparse.linalg.bicgstab's iteration over fused
kernels): scipy's stopping rule norm(r) < max(atol, rtol * norm(b)) on r and halfway on s,
maxiter 10 n, and its breakdown codes (info -10, -11); an iteration converging halfway counts.
On a partitioned matrix it runs as cg does there. {_COMMON_DOC}""",
    args=_args(_ATOL), outputs=_OUTPUTS, check=check_bicgstab, iterative=True)
def bicgstab(a, b, dtype: np.dtype, x0=None, rtol: float = 1e-5, atol: float = 0.0, maxiter=None,
             preconditioner: str = "none"):
    operator = _operator("bicgstab", a, b, x0, dtype)
    return _solve_columns("bicgstab", operator, b, x0,
                          lambda bc, xc: _bicgstab(operator, bc, xc, rtol, atol, maxiter, preconditioner))


# ------------------------------------------------------------------ partitioned matrices (--dask-scheduler)
def _on_blocks(op: str, loop: Callable[..., tuple[np.ndarray, int, int]]) -> Callable[..., tuple[Any, ...]]:
    """``op`` on a partitioned matrix (``partition.Krylov``), given the plan's arguments: the
    cluster ran the op's check on the matrix's entry-less stand-in with the whole shape, so the
    refusals and their messages are the single node's; then the same ``loop`` over the blocks'
    products (``make_operator``), so the same answer."""
    def solve(make_operator, a, b, dtype: np.dtype, x0=None, rtol: float = 1e-5, atol: float = 0.0,
              maxiter=None, preconditioner: str = "none"):
        if preconditioner == "ilu0":
            raise UnimplementedError(
                f"preconditioner 'ilu0' is not available for {op} on a partitioned matrix: its triangular "
                "solves run row after row through the whole matrix, which the row blocks cannot share out; use "
                "'jacobi' or 'none', or put the matrix without partitions",
                reason=Reason.PRECONDITIONER_NOT_PARTITIONED)
        _check_finite(op, b, x0)
        operator = make_operator(dtype)
        return _solve_columns(op, operator, b, x0,
                              lambda bc, xc: loop(operator, bc, xc, rtol, atol, maxiter, preconditioner))
    return solve


REGISTRY.partitioned("cg", Krylov(_on_blocks("cg", _cg)))
REGISTRY.partitioned("bicgstab", Krylov(_on_blocks("bicgstab", _bicgstab)))


def check_gmres(a, b, x0=None, rtol: float = 1e-5, atol: float = 0.0, maxiter=None, preconditioner: str = "none",
                restart: int = 20) -> Plan:
    plan = check_system("gmres", a, b, x0, rtol, atol, maxiter)
    if restart < 1:
        raise InvalidArgumentError(f"restart must be at least 1, not {restart}", reason=Reason.BAD_RESTART)
    return plan


@REGISTRY.op(
    "gmres",
    doc=f"""Restarted GMRES for a general square A (scipy.sparse.linalg.gmres with callback_type
'pr_norm', its driver run over our SpMV and preconditioner): maxiter counts restart cycles, as
scipy's (null: 10 n); iterations counts inner iterations; info is maxiter when not converged.
{_COMMON_DOC}""",
    args=_args(_ATOL, (Arg("restart", INT, "Inner iterations between restarts.", default=20),)),
    outputs=_OUTPUTS, check=check_gmres, iterative=True)
def gmres(a, b, dtype: np.dtype, x0=None, rtol: float = 1e-5, atol: float = 0.0, maxiter=None,
          preconditioner: str = "none", restart: int = 20):
    operator = _operator("gmres", a, b, x0, dtype)
    return _solve_columns("gmres", operator, b, x0, lambda bc, xc: _scipy_solve(
        "gmres", operator, bc, xc, rtol, atol, maxiter, preconditioner, restart=restart))


def check_minres(a, b, x0=None, rtol: float = 1e-5, atol: float = 0.0, maxiter=None,
                 preconditioner: str = "none") -> Plan:
    plan = check_system("minres", a, b, x0, rtol, atol, maxiter)
    if atol != 0:
        raise InvalidArgumentError(f"atol must be 0 for minres (scipy's minres stops on rtol only), not {atol}",
                                   reason=Reason.BAD_TOLERANCE)
    return plan


@REGISTRY.op(
    "minres",
    doc=f"""MINRES for a symmetric (possibly indefinite) A (scipy.sparse.linalg.minres, its driver run
over our SpMV and preconditioner, which must be symmetric positive definite for the method's
guarantees): scipy's own stopping rule on rtol (scipy's minres has no atol: a nonzero atol is
INVALID_ARGUMENT), maxiter 5 n by default as scipy. {_COMMON_DOC}""",
    args=_args("Must be 0: scipy's minres has no absolute tolerance."), outputs=_OUTPUTS, check=check_minres,
    iterative=True)
def minres(a, b, dtype: np.dtype, x0=None, rtol: float = 1e-5, atol: float = 0.0, maxiter=None,
           preconditioner: str = "none"):
    operator = _operator("minres", a, b, x0, dtype)
    return _solve_columns("minres", operator, b, x0, lambda bc, xc: _scipy_solve(
        "minres", operator, bc, xc, rtol, atol, maxiter, preconditioner))
