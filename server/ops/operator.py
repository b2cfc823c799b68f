"""A square sparse matrix ready to iterate with, kept with a held tensor while it lives.

``operator_of(a)`` gives the ``Operator`` of a checked square 2-D matrix: its CSR arrays in the
solve's dtype (``kernels/solvers.py``'s ``Csr``, packed where the entries allow) and its
preconditioners made on first use (Jacobi's inverse diagonal, the ILU(0) factor). For a held
(read-only) tensor, a handle, they are made once and kept with it, as ``gather.py`` keeps its
run pointers: a handle solved again skips them. The Krylov solvers (``solvers.py``), the
multigrid hierarchy (``multigrid.py``, whose finest level shares these arrays) and the
eigensolvers build on it.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

import numpy as np

from sparseserve.core.errors import InvalidArgumentError
from sparseserve.core.reasons import Reason
from sparseserve.core.tensor import SparseTensor
from sparseserve.kernels import frozen
from sparseserve.kernels import solvers as sk

from .linalg import csr_arrays, matrix_rep

__all__ = ["Operator", "operator_of", "inverse_diagonal", "solver_dtype"]


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
