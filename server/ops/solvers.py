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
from typing import Any, Callable, cast

import numpy as np

from sparseserve.core.errors import InvalidArgumentError, SparseServeError, UnimplementedError
from sparseserve.core.tensor import SparseTensor
from sparseserve.core.reasons import Reason
from sparseserve.kernels import solvers as sk
from sparseserve.kernels import frozen

from ..argtypes import BOOL, FLOAT, INT, OPTIONAL_INT, TENSOR, choice
from ..limits import between_iterations
from ..metrics import SOLVER_ITERATIONS
from ..partition import Krylov
from ..registry import REGISTRY, Arg, Output, Plan
from ._amg_options import AMG_OPTIONS_ARG
from ._layouts import SPARSE_LAYOUTS
from ._sputils import shape_of
from .linalg import matrix_dims
from .multigrid import hierarchy_of
from .operator import Operator, inverse_diagonal, operator_of, solver_dtype

__all__ = ["Operator", "operator_of", "inverse_diagonal", "solver_dtype", "check_system", "check_cg",
           "check_bicgstab", "check_gmres", "check_minres"]

PRECONDITIONERS = ("none", "jacobi", "ilu0", "amg")
PRECONDITIONER = choice(*PRECONDITIONERS, reason=Reason.BAD_PRECONDITIONER)


# ------------------------------------------------------------------ the matrix with its multigrid hierarchy
class _WithAmg:
    """A kept ``Operator`` with the multigrid hierarchy of this call's ``amg_options``
    (preconditioner 'amg', ``multigrid.hierarchy_of``): its cycle is M^-1, the rest is the
    operator's."""

    def __init__(self, operator: Operator, hierarchy: Any):
        self.operator, self.amg = operator, hierarchy
        self.n, self.dtype, self.csr = operator.n, operator.dtype, operator.csr

    def preconditioner(self, name: str) -> Callable[[np.ndarray], np.ndarray] | None:
        return self.amg.apply if name == "amg" else self.operator.preconditioner(name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.operator, name)


def _check_amg(op: str, preconditioner: str, amg_options) -> None:
    if amg_options is not None and preconditioner != "amg":
        raise InvalidArgumentError(f"amg_options is read only with preconditioner='amg' ({op} was given "
                                   f"preconditioner={preconditioner!r})", reason=Reason.BAD_AMG_OPTION)


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
    # inf is scipy's too: the first test of the residual stops the solve at once (info 0).
    for name, value in (("rtol", rtol), ("atol", atol)):
        if not value >= 0:  # nan is no number
            raise InvalidArgumentError(f"{name} must be a number >= 0 (inf stops at once), not {value}",
                                       reason=Reason.BAD_TOLERANCE)
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


# ------------------------------------------------------------------ scipy's M as a matrix, x0 = 'Mb', a shift
def _check_start_and_m(op: str, n: int, x0, x0_mb: bool, m, preconditioner: str) -> None:
    """``x0_mb`` (scipy's ``x0='Mb'``) comes without an x0; ``m`` (scipy's ``M`` given as a matrix,
    applied as M @ r: an approximation of A^-1) is one real [n, n] matrix, sparse or dense, given
    instead of a named preconditioner."""
    if x0_mb and x0 is not None:
        raise InvalidArgumentError(f"x0_mb starts {op} from M @ b (scipy's x0='Mb'); give it or x0, not both",
                                   reason=Reason.EXCLUSIVE_ARGUMENTS)
    if m is None:
        return
    if preconditioner != "none":
        raise InvalidArgumentError(f"m is a preconditioner (applied as M @ r, as scipy's M); give it or "
                                   f"preconditioner={preconditioner!r}, not both", reason=Reason.EXCLUSIVE_ARGUMENTS)
    if isinstance(m, SparseTensor):
        batch, rows, cols = matrix_dims(m, "m", op)
    else:
        batch, (rows, cols) = (), (m.shape if m.ndim == 2 else (-1, -1))
    if batch or (rows, cols) != (n, n):
        raise InvalidArgumentError(f"m has shape {shape_of(m)}; it must be a matrix of a's shape [{n}, {n}]",
                                   reason=Reason.SHAPE_MISMATCH)
    if m.dtype.kind not in "iuf":
        raise InvalidArgumentError(f"m has dtype {m.dtype}; the solvers take real numbers",
                                   reason=Reason.UNSUPPORTED_DTYPE)


def _m_product(m, dtype: np.dtype) -> Callable[[np.ndarray], np.ndarray] | None:
    """r -> M @ r in the solve's dtype for a checked ``m`` (None without one); a held sparse M
    keeps its CSR arrays as a held A does."""
    if m is None:
        return None
    if isinstance(m, SparseTensor):
        return operator_of(m, dtype).matvec
    dense = np.ascontiguousarray(m, dtype)
    return lambda r: dense @ r


def _start_mb(operator: Any, b: np.ndarray, preconditioner: str, given) -> np.ndarray:
    """scipy's x0='Mb': M @ b (each column of a block), M the preconditioner the solve applies
    (``given``, a named one, or the identity for 'none')."""
    if given is not None:
        apply = given
    elif preconditioner == "jacobi":  # a partitioned matrix's operator has jacobi() alone
        dinv = operator.jacobi()
        apply = lambda r: dinv * r  # noqa: E731
    else:
        apply = operator.preconditioner(preconditioner)
    b = np.asarray(b, operator.dtype)
    if apply is None:
        return b.copy()
    if b.ndim == 1:
        return np.asarray(apply(b), operator.dtype)
    return np.stack([np.asarray(apply(np.ascontiguousarray(b[:, j])), operator.dtype) for j in range(b.shape[1])],
                    axis=1)


class _Shifted:
    """A - shift I, for the residual minres reports when scipy's driver solved with ``shift``
    (the driver itself takes A and the shift, as scipy's minres does)."""

    def __init__(self, operator: Operator, shift: float):
        self.operator, self.shift = operator, shift
        self.n, self.dtype = operator.n, operator.dtype

    def matvec(self, x: np.ndarray) -> np.ndarray:
        return self.operator.matvec(x) - self.dtype.type(self.shift) * x

    def __getattr__(self, name: str) -> Any:
        return getattr(self.operator, name)


def _prepared(op: str, a, b, x0, dtype: np.dtype, preconditioner: str, m, x0_mb: bool, amg_options=None):
    """(operator, x0, M @ r or None) of a checked call: b and x0 found finite, the start M @ b
    made for x0_mb."""
    operator = _operator(op, a, b, x0, dtype, preconditioner, amg_options)
    given = _m_product(m, dtype)
    return operator, (_start_mb(operator, b, preconditioner, given) if x0_mb else x0), given


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
        residual = bc - operator.matvec(x)
        norms.append(math.sqrt(sk.blocked_dot(residual, residual)))
    if b.ndim == 1:
        return xs[0], np.int64(infos[0]), np.int64(iterations[0]), np.float64(norms[0])
    return (np.stack(xs, axis=1), np.array(infos, np.int64), np.array(iterations, np.int64),
            np.array(norms, np.float64))


def _block_solve(operator: Operator, b: np.ndarray, x0, rtol: float, atol: float, maxiter: int | None,
                 preconditioner: str) -> tuple[Any, ...]:
    """cg's answer to a block b [n, k]: its columns' solves run side by side (``_cg_lockstep``)."""
    bt = np.array(b.T, dtype=operator.dtype, order="C")  # [k, n]: each vector contiguous
    x = np.zeros_like(bt) if x0 is None else np.array(x0.T, dtype=operator.dtype, order="C")
    x, info, iterations = _cg_lockstep(operator, bt, x, rtol, atol, maxiter, preconditioner)
    SOLVER_ITERATIONS.add("cg", int(iterations.sum()))
    norms = []
    for j in range(bt.shape[0]):
        residual = bt[j] - operator.matvec(x[j])
        norms.append(math.sqrt(sk.blocked_dot(residual, residual)))
    return np.ascontiguousarray(x.T), info, iterations, np.array(norms)


# ------------------------------------------------------------------ cg: our loop, fused kernels
def _start(operator: Operator, b: np.ndarray, x: np.ndarray, rtol: float, atol: float,
           maxiter: int | None) -> tuple[float, int, np.ndarray] | None:
    """scipy's opening of cg and bicgstab: the absolute tolerance max(atol, rtol * norm(b)), the
    iteration limit (10 n by default) and the first residual; None for b = 0 (x = 0 at once)."""
    b_norm = math.sqrt(sk.blocked_dot(b, b))  # numpy's norm is BLAS's: its last bit varies by CPU
    if b_norm == 0:
        return None
    r = b - operator.matvec(x) if x.any() else b.copy()
    return max(atol, rtol * b_norm), 10 * operator.n if maxiter is None else maxiter, r


def _cg_preconditioning(operator: Operator, preconditioner: str) -> tuple[int, Callable[..., float]]:
    """How cg's kernels take the preconditioner (``mode``: none, jacobi, or z given in w), and
    ``preconditioned(r, w, rr)``: r . M^-1 r, writing z = M^-1 r into w for ilu0 and amg (rr is
    r . r, the answer without one)."""
    if preconditioner == "jacobi":
        return sk.JACOBI, lambda r, dinv, rr: sk.blocked_dot(r, dinv * r)
    if preconditioner == "ilu0":
        ilu = operator.ilu0()
        return sk.GIVEN, lambda r, w, rr: float(sk.ilu0_solve(ilu[0], ilu[1], ilu[2], ilu[3], r, w))
    if preconditioner == "amg":  # one multigrid cycle writes z into w

        def cycle(r: np.ndarray, w: np.ndarray, rr: float) -> float:
            cast(_WithAmg, operator).amg.apply_into(r, w)
            return sk.blocked_dot(r, w)
        return sk.GIVEN, cycle
    return sk.NONE, lambda r, w, rr: rr


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
    mode, preconditioned = _cg_preconditioning(operator, preconditioner)
    w = operator.jacobi() if mode == sk.JACOBI else np.empty(n, operator.dtype) if mode == sk.GIVEN else empty
    rr = sk.blocked_dot(r, r)

    def preconditioned_dot() -> float:
        return preconditioned(r, w, rr)

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


def _cg_lockstep(operator: Operator, b: np.ndarray, x: np.ndarray, rtol: float, atol: float, maxiter: int | None,
                 preconditioner: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_cg`` on each vector of a block b [k, n] (starts x [k, n], updated in place), the k
    iterations run side by side so that each SpMV reads the matrix once for all of them
    (``spmv_dot_lockstep``): every vector's numbers, and so its x, info and iterations, are
    ``_cg``'s alone, bit for bit. A vector leaves the block when it meets its tolerance."""
    k, n = b.shape
    limit = 10 * n if maxiter is None else maxiter
    info, iterations = np.full(k, limit, np.int64), np.full(k, limit, np.int64)
    mode, preconditioned = _cg_preconditioning(operator, preconditioner)
    dinv = operator.jacobi() if mode == sk.JACOBI else np.zeros(0, operator.dtype)
    p, q, r = np.zeros((k, n), operator.dtype), np.empty((k, n), operator.dtype), np.empty((k, n), operator.dtype)
    w = np.empty((k, n), operator.dtype) if mode == sk.GIVEN else None
    tolerance, rr, rz, rz_prev = np.zeros(k), np.zeros(k), np.zeros(k), np.ones(k)
    live = []
    for j in range(k):
        start = _start(operator, b[j], x[j], rtol, atol, maxiter)
        if start is None:  # b_j = 0: x_j = 0 at once, as scipy
            x[j], info[j], iterations[j] = 0, 0, 0
            continue
        tolerance[j], _, r[j] = start
        rr[j] = sk.blocked_dot(r[j], r[j])
        rz[j] = preconditioned(r[j], dinv if w is None else w[j], rr[j])
        live.append(j)
    with np.errstate(all="ignore"):
        for iteration in range(limit):
            for j in [j for j in live if math.sqrt(rr[j]) < tolerance[j]]:
                info[j], iterations[j] = 0, iteration
                live.remove(j)
            if not live:
                break
            for j in live:
                sk.cg_direction(p[j], r[j], dinv if w is None else w[j],
                                float(rz[j] / rz_prev[j]) if iteration else 0.0, mode)
            pq = sk.spmv_dot_lockstep(operator.csr, p, q, np.array(live, np.int64))
            for j in live:
                alpha = float(rz[j] / pq[j])
                rr[j], rz_jacobi = sk.cg_update(x[j], r[j], p[j], q[j], dinv, alpha, mode)
                rz_prev[j] = rz[j]
                rz[j] = rz_jacobi if mode == sk.JACOBI else preconditioned(r[j], dinv if w is None else w[j], rr[j])
            between_iterations("cg", iteration=iteration + 1, residual_norm=math.sqrt(max(rr[j] for j in live)))
    return x, info, iterations


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
    mode = {"none": sk.NONE, "jacobi": sk.JACOBI, "ilu0": sk.GIVEN, "amg": sk.GIVEN}[preconditioner]
    dinv = operator.jacobi() if mode == sk.JACOBI else np.zeros(0, operator.dtype)
    ilu = operator.ilu0() if preconditioner == "ilu0" else None
    amg = cast(_WithAmg, operator).amg if preconditioner == "amg" else None
    v = sk.BicgVectors(x, r, mode, dinv)
    rr = sk.blocked_dot(r, r)
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
            elif amg is not None:
                amg.apply_into(v.p, v.phat)
            rv, _ = operator.spmv_dots(v.phat, v.v, v.rtilde)
            if rv == 0:
                return x, -11, iteration
            alpha = rho / np.float64(rv)
            if math.sqrt(v.half(float(alpha))) < atol:
                x += float(alpha) * v.phat
                return x, 0, iteration + 1
            if ilu is not None:
                sk.ilu0_solve(*ilu, frozen(v.r), v.shat)
            elif amg is not None:
                amg.apply_into(v.r, v.shat)
            ts, tt = operator.spmv_dots(v.shat, v.t, v.r)
            omega = np.float64(ts) / np.float64(tt)
            rr, rho_next = v.update(float(alpha), float(omega))
            rho_prev, rho = rho, np.float64(rho_next)
            between_iterations("bicgstab", iteration=iteration + 1, residual_norm=math.sqrt(rr))
    return x, maxiter, maxiter


# ------------------------------------------------------------------ the others: scipy's drivers
def _scipy_solve(op: str, operator: Operator, b, x, rtol, atol, maxiter, preconditioner, given=None, **extra):
    """scipy's ``op`` driver over our SpMV, its M the named preconditioner or ``given`` (M @ r of
    a matrix M, ``_m_product``); ``extra`` goes to the driver."""
    try:
        from scipy.sparse import linalg as spla
    except ImportError:
        raise UnimplementedError(f"{op} runs scipy's driver on the server; install scipy there "
                                 "(pip install scipy)", reason=Reason.MISSING_DEPENDENCY) from None
    n, dtype = operator.n, operator.dtype
    a = spla.LinearOperator((n, n), matvec=operator.matvec, dtype=dtype)
    m_solve = given if given is not None else operator.preconditioner(preconditioner)
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
    try:
        x, info = solver(a, b, x, **kwargs)
    except SparseServeError:
        raise
    except ValueError as exc:  # minres's tests of the values: A or M not symmetric, M indefinite
        reason = Reason.INDEFINITE_PRECONDITIONER if "preconditioner" in str(exc) else Reason.NOT_HERMITIAN
        raise InvalidArgumentError(f"{op}: scipy's driver stopped on the values: {exc} ({op} needs a symmetric A "
                                   "and a symmetric positive definite preconditioner)", reason=reason) from None
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
'none', 'jacobi' (diag(A)^-1), 'ilu0' (incomplete LU with zero fill on A's pattern) or 'amg' (one cycle
of pyamg's smoothed-aggregation multigrid, amg_options as pyamg names them: symmetry, strength,
aggregate, smooth, presmoother, postsmoother or smoother, cycle, max_levels, max_coarse, coarse_solver);
for a handle the CSR arrays and the preconditioner (the multigrid hierarchy too, charged to the
handle in the tenant's store budget) are computed once and kept with it. m is scipy's M given as a
matrix (sparse, any layout, or dense [n, n]), applied as M @ r, an approximation of A^-1, instead of a
named preconditioner (cg and bicgstab then run scipy's own loop over the two products); x0_mb starts
from M @ b (scipy's x0='Mb'; b itself without a preconditioner). rtol or atol inf stops before the
first iteration with info 0, as scipy's. info is scipy's: 0
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
            Arg("preconditioner", PRECONDITIONER, "'none', 'jacobi', 'ilu0' or 'amg'.", default="none"),
            *extra,
            Arg("m", TENSOR, "scipy's M as a matrix [n, n], applied as M @ r (null: the preconditioner's).",
                default=None, layouts=(*SPARSE_LAYOUTS, "dense")),
            Arg("x0_mb", BOOL, "Start from M @ b, scipy's x0='Mb' (x0 must be null).", default=False),
            Arg("amg_options", AMG_OPTIONS_ARG, "pyamg's smoothed-aggregation options for preconditioner 'amg' "
                "(null: pyamg's defaults); see docs/solvers.md, 'Multigrid'.", default=None)]


_OUTPUTS = [Output("x", "dense", "The solution, b's shape."),
            Output("info", "dense", "int64: 0 converged, else scipy's code (per column for a block)."),
            Output("iterations", "dense", "int64: iterations run (per column for a block)."),
            Output("residual_norm", "dense", "float64: norm(b - A x) (per column for a block).")]
_ATOL = "Absolute tolerance: stop when norm(r) < max(atol, rtol * norm(b))."


def _operator(op: str, a: SparseTensor, b: np.ndarray, x0: np.ndarray | None, dtype: np.dtype,
              preconditioner: str = "none", amg_options=None) -> Any:
    """A single node's operator for a checked call, once b and x0 are found finite; with
    preconditioner 'amg', with the matrix's kept hierarchy for ``amg_options``."""
    _check_finite(op, b, x0)
    operator = operator_of(a, dtype)
    if preconditioner != "amg":
        return operator
    return _WithAmg(operator, hierarchy_of(a, dtype, amg_options))


def check_cg(a, b, x0=None, rtol: float = 1e-5, atol: float = 0.0, maxiter=None,
             preconditioner: str = "none", m=None, x0_mb: bool = False, amg_options=None) -> Plan:
    plan = check_system("cg", a, b, x0, rtol, atol, maxiter)
    _check_start_and_m("cg", b.shape[0], x0, x0_mb, m, preconditioner)
    _check_amg("cg", preconditioner, amg_options)
    return plan


@REGISTRY.op(
    "cg",
    doc=f"""Conjugate gradients for a symmetric positive definite A (scipy.sparse.linalg.cg): stops when
norm(r) < max(atol, rtol * norm(b)) for the recurrence residual r, checked before each iteration, as
scipy; maxiter defaults to 10 n. With a preconditioner M the residual tested is still r (not M^-1 r).
Each iteration is one parallel SpMV and fused vector passes. On a partitioned matrix (--dask-scheduler)
the loop runs on the replica and each SpMV on the blocks where they are, with the single-node answer
(preconditioner 'none' or 'jacobi'; 'ilu0' and 'amg' are UNIMPLEMENTED there). {_COMMON_DOC}""",
    args=_args(_ATOL), outputs=_OUTPUTS, check=check_cg, iterative=True)
def cg(a, b, dtype: np.dtype, x0=None, rtol: float = 1e-5, atol: float = 0.0, maxiter=None,
       preconditioner: str = "none", m=None, x0_mb: bool = False, amg_options=None):
    operator, x0, given = _prepared("cg", a, b, x0, dtype, preconditioner, m, x0_mb, amg_options)
    if given is not None:  # M @ r is no mode of the fused kernels: scipy's loop over the two products
        return _solve_columns("cg", operator, b, x0, lambda bc, xc: _scipy_solve(
            "cg", operator, bc, xc, rtol, atol, maxiter, "none", given))
    if b.ndim == 2 and b.shape[1] > 1:
        return _block_solve(operator, b, x0, rtol, atol, maxiter, preconditioner)
    return _solve_columns("cg", operator, b, x0,
                          lambda bc, xc: _cg(operator, bc, xc, rtol, atol, maxiter, preconditioner))


def check_bicgstab(a, b, x0=None, rtol: float = 1e-5, atol: float = 0.0, maxiter=None,
                   preconditioner: str = "none", m=None, x0_mb: bool = False, amg_options=None) -> Plan:
    plan = check_system("bicgstab", a, b, x0, rtol, atol, maxiter)
    _check_start_and_m("bicgstab", b.shape[0], x0, x0_mb, m, preconditioner)
    _check_amg("bicgstab", preconditioner, amg_options)
    return plan


@REGISTRY.op(
    "bicgstab",
    doc=f"""BiCGSTAB for a general square A (scipy.sparse.linalg.bicgstab's iteration over fused
kernels): scipy's stopping rule norm(r) < max(atol, rtol * norm(b)) on r and halfway on s,
maxiter 10 n, and its breakdown codes (info -10, -11); an iteration converging halfway counts.
On a partitioned matrix it runs as cg does there. {_COMMON_DOC}""",
    args=_args(_ATOL), outputs=_OUTPUTS, check=check_bicgstab, iterative=True)
def bicgstab(a, b, dtype: np.dtype, x0=None, rtol: float = 1e-5, atol: float = 0.0, maxiter=None,
             preconditioner: str = "none", m=None, x0_mb: bool = False, amg_options=None):
    operator, x0, given = _prepared("bicgstab", a, b, x0, dtype, preconditioner, m, x0_mb, amg_options)
    if given is not None:  # as cg: scipy's loop
        return _solve_columns("bicgstab", operator, b, x0, lambda bc, xc: _scipy_solve(
            "bicgstab", operator, bc, xc, rtol, atol, maxiter, "none", given))
    return _solve_columns("bicgstab", operator, b, x0,
                          lambda bc, xc: _bicgstab(operator, bc, xc, rtol, atol, maxiter, preconditioner))


# ------------------------------------------------------------------ partitioned matrices (--dask-scheduler)
def _on_blocks(op: str, loop: Callable[..., tuple[np.ndarray, int, int]]) -> Callable[..., tuple[Any, ...]]:
    """``op`` on a partitioned matrix (``partition.Krylov``), given the plan's arguments: the
    cluster ran the op's check on the matrix's entry-less stand-in with the whole shape, so the
    refusals and their messages are the single node's; then the same ``loop`` over the blocks'
    products (``make_operator``), so the same answer."""
    def solve(make_operator, a, b, dtype: np.dtype, x0=None, rtol: float = 1e-5, atol: float = 0.0,
              maxiter=None, preconditioner: str = "none", m=None, x0_mb: bool = False, amg_options=None):
        if preconditioner == "amg":
            raise UnimplementedError(
                f"preconditioner 'amg' is not available for {op} on a partitioned matrix: its hierarchy is built "
                "from the whole matrix and its Gauss-Seidel sweeps run through it, which the row blocks cannot "
                "share out; use 'jacobi' or 'none', or put the matrix without partitions",
                reason=Reason.PRECONDITIONER_NOT_PARTITIONED)
        if m is not None:
            raise UnimplementedError(
                f"m (a preconditioner matrix) is not available for {op} on a partitioned matrix; use "
                "preconditioner='jacobi' or 'none', or put the matrix without partitions",
                reason=Reason.PRECONDITIONER_NOT_PARTITIONED)
        if preconditioner == "ilu0":
            raise UnimplementedError(
                f"preconditioner 'ilu0' is not available for {op} on a partitioned matrix: its triangular "
                "solves run row after row through the whole matrix, which the row blocks cannot share out; use "
                "'jacobi' or 'none', or put the matrix without partitions",
                reason=Reason.PRECONDITIONER_NOT_PARTITIONED)
        _check_finite(op, b, x0)
        operator = make_operator(dtype)
        if x0_mb:
            x0 = _start_mb(operator, b, preconditioner, None)
        return _solve_columns(op, operator, b, x0,
                              lambda bc, xc: loop(operator, bc, xc, rtol, atol, maxiter, preconditioner))
    return solve


REGISTRY.partitioned("cg", Krylov(_on_blocks("cg", _cg)))
REGISTRY.partitioned("bicgstab", Krylov(_on_blocks("bicgstab", _bicgstab)))


def check_gmres(a, b, x0=None, rtol: float = 1e-5, atol: float = 0.0, maxiter=None, preconditioner: str = "none",
                restart: int = 20, m=None, x0_mb: bool = False, amg_options=None) -> Plan:
    plan = check_system("gmres", a, b, x0, rtol, atol, maxiter)
    _check_start_and_m("gmres", b.shape[0], x0, x0_mb, m, preconditioner)
    _check_amg("gmres", preconditioner, amg_options)
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
          preconditioner: str = "none", restart: int = 20, m=None, x0_mb: bool = False, amg_options=None):
    operator, x0, given = _prepared("gmres", a, b, x0, dtype, preconditioner, m, x0_mb, amg_options)
    return _solve_columns("gmres", operator, b, x0, lambda bc, xc: _scipy_solve(
        "gmres", operator, bc, xc, rtol, atol, maxiter, preconditioner, given, restart=restart))


def check_minres(a, b, x0=None, rtol: float = 1e-5, atol: float = 0.0, maxiter=None,
                 preconditioner: str = "none", shift: float = 0.0, check: bool = False, m=None,
                 x0_mb: bool = False, amg_options=None) -> Plan:
    plan = check_system("minres", a, b, x0, rtol, atol, maxiter)
    _check_amg("minres", preconditioner, amg_options)
    if atol != 0:
        raise InvalidArgumentError(f"atol must be 0 for minres (scipy's minres stops on rtol only), not {atol}",
                                   reason=Reason.BAD_TOLERANCE)
    if not math.isfinite(shift):
        raise InvalidArgumentError(f"shift must be a finite number, not {shift}", reason=Reason.NOT_FINITE)
    _check_start_and_m("minres", b.shape[0], x0, x0_mb, m, preconditioner)
    return plan


@REGISTRY.op(
    "minres",
    doc=f"""MINRES for a symmetric (possibly indefinite) A (scipy.sparse.linalg.minres, its driver run
over our SpMV and preconditioner, which must be symmetric positive definite for the method's
guarantees): scipy's own stopping rule on rtol (scipy's minres has no atol: a nonzero atol is
INVALID_ARGUMENT), maxiter 5 n by default as scipy. shift solves (A - shift I) x = b, as scipy's
(residual_norm is then that system's); check=true first tests A and M for symmetry, as scipy's.
What scipy's driver finds in the values (A or M not symmetric, M indefinite) is INVALID_ARGUMENT
(NOT_HERMITIAN, INDEFINITE_PRECONDITIONER). {_COMMON_DOC}""",
    args=_args("Must be 0: scipy's minres has no absolute tolerance.", (
        Arg("shift", FLOAT, "Solve (A - shift I) x = b.", default=0.0),
        Arg("check", BOOL, "Test A and M for symmetry first (scipy's check).", default=False))),
    outputs=_OUTPUTS, check=check_minres, iterative=True)
def minres(a, b, dtype: np.dtype, x0=None, rtol: float = 1e-5, atol: float = 0.0, maxiter=None,
           preconditioner: str = "none", shift: float = 0.0, check: bool = False, m=None, x0_mb: bool = False,
           amg_options=None):
    operator, x0, given = _prepared("minres", a, b, x0, dtype, preconditioner, m, x0_mb, amg_options)
    residual_of = cast(Operator, _Shifted(operator, shift)) if shift else operator  # its matvec alone is used
    return _solve_columns("minres", residual_of, b, x0,
                          lambda bc, xc: _scipy_solve("minres", operator, bc, xc, rtol, atol, maxiter,
                                                      preconditioner, given, shift=shift, check=check))
