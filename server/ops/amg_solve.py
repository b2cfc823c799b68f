"""``amg_solve``: multigrid as the solver (pyamg's ``ml.solve``), cycles of the kept hierarchy
(``multigrid.py``) until the residual passes, or a Krylov solver (``accel``) preconditioned by
one cycle, as ``preconditioner="amg"`` runs it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sparseserve.core.errors import InvalidArgumentError
from sparseserve.core.reasons import Reason
from sparseserve.kernels import multigrid as mk
from sparseserve.kernels import solvers as sk

from ..argtypes import FLOAT, OPTIONAL_INT, TENSOR, choice
from ..limits import between_iterations
from ..metrics import SOLVER_ITERATIONS
from ..registry import REGISTRY, Arg, Plan
from ._amg_options import AMG_OPTIONS_ARG
from ._layouts import SPARSE_LAYOUTS
from .multigrid import Hierarchy
from .solvers import _OUTPUTS, _bicgstab, _cg, _operator, _scipy_solve, _solve_columns, check_system

__all__ = ["check_amg_solve", "amg_solve"]


ACCELS = ("cg", "bicgstab", "gmres", "minres")
for _name in ("amg_solve",):  # its series exported from the start, at 0 (rate() needs a first sample)
    SOLVER_ITERATIONS.add(_name, 0)


def _cycles(operator: Any, b: np.ndarray, x: np.ndarray, rtol: float, atol: float,
            maxiter: int | None) -> tuple[np.ndarray, int, int]:
    """pyamg's ``ml.solve`` without acceleration: a cycle, then the true residual tested against
    max(atol, rtol * norm(b)), until it passes or ``maxiter`` cycles (100 by default, pyamg's)
    ran. b = 0 gives x = 0 at once, as the Krylov solvers do."""
    hierarchy: Hierarchy = operator.amg
    b_norm = math.sqrt(sk.blocked_dot(b, b))
    if b_norm == 0:
        return np.zeros_like(b), 0, 0
    tol = max(atol, rtol * b_norm)
    maxiter = 100 if maxiter is None else maxiter
    r = np.empty_like(b)
    for iteration in range(maxiter):
        hierarchy.cycle(x, b)
        if hierarchy.levels:
            mk.residual(hierarchy.levels[0].a, x, b, r)
        else:
            r = b - operator.matvec(x)
        r_norm = math.sqrt(sk.blocked_dot(r, r))
        between_iterations("amg_solve", iteration=iteration + 1, residual_norm=r_norm)
        if r_norm < tol:
            return x, 0, iteration + 1
    return x, maxiter, maxiter


def check_amg_solve(a, b, x0=None, rtol: float = 1e-5, atol: float = 0.0, maxiter=None, accel=None,
                    amg_options=None) -> Plan:
    plan = check_system("amg_solve", a, b, x0, rtol, atol, maxiter)
    if accel == "minres" and atol != 0:
        raise InvalidArgumentError(f"atol must be 0 with accel 'minres' (scipy's minres stops on rtol only), not "
                                   f"{atol}", reason=Reason.BAD_TOLERANCE)
    return plan


@REGISTRY.op(
    "amg_solve",
    doc="""Algebraic multigrid as the solver (pyamg's smoothed_aggregation_solver(A).solve(b, tol,
accel=...)): pyamg's hierarchy for amg_options, built once per held matrix and kept with it (charged
to its handle in the tenant's store budget), cycled by our parallel kernels. Without accel, each
iteration is one cycle (amg_options' cycle, V by default) followed by the true residual, stopping
once norm(b - A x) < max(atol, rtol * norm(b)) (at least one cycle, as pyamg); maxiter null is
pyamg's 100. With accel 'cg', 'bicgstab', 'gmres' or 'minres', that op runs with preconditioner
'amg' (its rules: cg's stopping test is pyamg's cg's, maxiter null is 100 here too; progress is
reported under the accelerating op's name). a is any square 2-D sparse layout, sent or held by a
handle; b is [n] or a block [n, k] (columns solved one after another); float32 stays float32 when
a and b are; outputs as cg's. Bad options are INVALID_ARGUMENT naming the option and its rule
(BAD_AMG_OPTION). A partitioned matrix is gathered here first, as for every op without a partitioned
plan. The caller's deadline is checked after every iteration.""",
    args=[Arg("a", TENSOR, "The square sparse matrix A.", layouts=SPARSE_LAYOUTS),
          Arg("b", TENSOR, "Right-hand side [n], or a block of them [n, k].", layouts=("dense",)),
          Arg("x0", TENSOR, "Starting guess, b's shape (zeros when null).", default=None, layouts=("dense",)),
          Arg("rtol", FLOAT, "Relative tolerance (pyamg's tol).", default=1e-5),
          Arg("atol", FLOAT, "Absolute tolerance: stop when norm(r) < max(atol, rtol * norm(b)).", default=0.0),
          Arg("maxiter", OPTIONAL_INT, "Iteration limit (null: 100, as pyamg).", default=None),
          Arg("accel", choice(*ACCELS, reason=Reason.BAD_ACCEL),
              "Krylov acceleration, preconditioned by one cycle (null: none, cycles alone).", default=None),
          Arg("amg_options", AMG_OPTIONS_ARG, "pyamg's smoothed-aggregation options (null: pyamg's defaults); "
              "see docs/solvers.md, 'Multigrid'.", default=None)],
    outputs=_OUTPUTS, check=check_amg_solve, iterative=True)
def amg_solve(a, b, dtype: np.dtype, x0=None, rtol: float = 1e-5, atol: float = 0.0, maxiter=None, accel=None,
              amg_options=None):
    operator = _operator("amg_solve", a, b, x0, dtype, "amg", amg_options)
    maxiter = 100 if maxiter is None else maxiter
    if accel is None:
        return _solve_columns("amg_solve", operator, b, x0,
                              lambda bc, xc: _cycles(operator, bc, xc, rtol, atol, maxiter))
    if accel == "cg":
        return _solve_columns("amg_solve", operator, b, x0,
                              lambda bc, xc: _cg(operator, bc, xc, rtol, atol, maxiter, "amg"))
    if accel == "bicgstab":
        return _solve_columns("amg_solve", operator, b, x0,
                              lambda bc, xc: _bicgstab(operator, bc, xc, rtol, atol, maxiter, "amg"))
    return _solve_columns("amg_solve", operator, b, x0, lambda bc, xc: _scipy_solve(
        accel, operator, bc, xc, rtol, atol, maxiter, "amg"))

