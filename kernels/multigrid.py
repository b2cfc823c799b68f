"""Kernels of the algebraic multigrid cycle (``server/ops/multigrid.py``): Gauss-Seidel and
Jacobi smoothing passes, the residual, and the coarse-grid correction, each over CSR arrays.

Gauss-Seidel is sequential by nature. A level's rows are cut into ``gs_blocks`` fixed blocks
(chosen from the matrix alone, never from the thread count); each block is swept in order, as
pyamg's ``gauss_seidel`` sweeps the whole matrix, reading its own rows' new values and the other
blocks' values from before the sweep ("hybrid" Gauss-Seidel, as hypre's default smoother). The
blocks then run on as many threads as there are, and the answer is the same bits with one thread
or many. A level small enough for one block is swept exactly as pyamg sweeps it.

Every row sum runs left to right with no fastmath flags, so that no compiler choice of vector
width changes a bit (the solvers' determinism rule, ``kernels/solvers.py``). Values float32 or
float64, indices int32 or int64; the caller validates; nothing here raises.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._parallel import PARALLEL_LOCK, PARALLEL_MIN
from ._sort import frozen
from .linalg import N_GATHER_CHUNKS, U, balanced_bounds, spmv_par, spmv_rows
from .solvers import diagonal, pack

__all__ = ["Matrix", "gs_blocks", "gauss_seidel", "jacobi", "residual", "restrict", "prolong_add", "lanczos_step",
           "lanczos_next", "symmetric_strength", "warm_up"]

# Rows a Gauss-Seidel block holds at least, and the most blocks a level is cut into: 1M rows
# make 16 blocks, whose boundaries couple about 3% of a 2-D grid's rows through old values.
GS_BLOCK_ROWS = 1 << 15
GS_MAX_BLOCKS = 16


def gs_blocks(ptr: np.ndarray) -> np.ndarray:
    """Row bounds of the Gauss-Seidel blocks of a CSR matrix (about equal entries each): a
    function of the matrix only, so every thread count sweeps the same blocks."""
    n = ptr.size - 1
    count = max(1, min(GS_MAX_BLOCKS, n // GS_BLOCK_ROWS))
    return balanced_bounds(ptr, count) if count > 1 else np.array([0, n], np.int64)


class Matrix:
    """A level's CSR arrays (read-only) with their parallel row split, made once; a big square
    one whose entries pack (``kernels/solvers.pack``: 3 bytes an entry, where CSR with int32
    indices takes 12) is swept and multiplied from its packed entries, the same numbers in the
    same order (the sweeps and the residual are bound by memory)."""

    def __init__(self, ptr: np.ndarray, idx: np.ndarray, vals: np.ndarray, n_cols: int,
                 packed: tuple[np.ndarray, ...] | None = None, shared: bool = False):
        self.shared = shared  # the arrays (and packed entries) belong to another holder: not in nbytes
        self.ptr, self.idx, self.vals = frozen(ptr), frozen(idx), frozen(vals)
        self.n_rows, self.n_cols = ptr.size - 1, n_cols
        self.parallel = vals.size >= PARALLEL_MIN
        self.bounds = balanced_bounds(self.ptr, N_GATHER_CHUNKS) if self.parallel else \
            np.array([0, self.n_rows], np.int64)
        if packed is None and self.parallel and self.n_rows == n_cols:
            packed = pack(self.ptr, self.idx, self.vals)
        self.packed = packed  # (ptr, offsets, codes, table): these arrays' entries, packed

    @property
    def nbytes(self) -> int:
        if self.shared:
            return self.bounds.nbytes
        packed = sum(a.nbytes for a in self.packed[1:]) if self.packed is not None else 0
        return self.ptr.nbytes + self.idx.nbytes + self.vals.nbytes + self.bounds.nbytes + packed


# ------------------------------------------------------------------ Gauss-Seidel
# A sweep is bound by the chain from row to row (row i reads the x[i - 1] the row before just
# wrote): the update multiplies by 1 / a_ii, a division off that chain, where pyamg divides on it
# (a quarter less time a sweep, measured on Poisson 1000^2: 7.9 against 10.5 ms on one core; the
# last bit may differ from pyamg's).
@njit(nogil=True, cache=True)
def _gs_rows(ptr, idx, vals, x, old, b, lo, hi, forward):
    """One sweep over rows [lo, hi) in order (or reversed): x[i] = (b[i] - sum_j a_ij x[j]) / a_ii,
    x[j] the new value for j in the block, ``old[j]`` for j outside it (pyamg's gauss_seidel:
    the last stored diagonal entry is the pivot; a row without one is left as it is)."""
    count = hi - lo
    for step in range(count):
        i = lo + step if forward else hi - 1 - step
        rsum = x.dtype.type(0)
        diag = x.dtype.type(0)
        for p in range(U(ptr[i]), U(ptr[i + 1])):
            j = idx[p]
            if j == i:
                diag = vals[p]
            elif lo <= j < hi:
                rsum += vals[p] * x[U(j)]
            else:
                rsum += vals[p] * old[U(j)]
        if diag != 0:
            x[i] = (b[i] - rsum) * (x.dtype.type(1) / diag)


@njit(nogil=True, cache=True, parallel=True)
def _gs_par(ptr, idx, vals, x, old, b, blocks, forward):
    for c in prange(blocks.size - 1):
        _gs_rows(ptr, idx, vals, x, old, b, blocks[c], blocks[c + 1], forward)


@njit(nogil=True, cache=True)
def _gs_packed_rows(ptr, offsets, codes, table, x, old, b, lo, hi, forward):
    """``_gs_rows`` over packed entries (column i + offset, value table[code])."""
    count = hi - lo
    for step in range(count):
        i = lo + step if forward else hi - 1 - step
        rsum = x.dtype.type(0)
        diag = x.dtype.type(0)
        for p in range(U(ptr[i]), U(ptr[i + 1])):
            offset = offsets[p]
            value = table[U(codes[p])]
            if offset == 0:
                diag = value
            else:
                j = i + offset
                if lo <= j < hi:
                    rsum += value * x[U(j)]
                else:
                    rsum += value * old[U(j)]
        if diag != 0:
            x[i] = (b[i] - rsum) * (x.dtype.type(1) / diag)


@njit(nogil=True, cache=True, parallel=True)
def _gs_packed_par(ptr, offsets, codes, table, x, old, b, blocks, forward):
    for c in prange(blocks.size - 1):
        _gs_packed_rows(ptr, offsets, codes, table, x, old, b, blocks[c], blocks[c + 1], forward)


def gauss_seidel(a: Matrix, blocks: np.ndarray, x: np.ndarray, b: np.ndarray, sweeps: tuple[bool, ...]) -> None:
    """Gauss-Seidel sweeps on A x = b in place, one per entry of ``sweeps`` (True forward, False
    backward: pyamg's 'symmetric' is (True, False)), over ``blocks`` (``gs_blocks``)."""
    b = frozen(b)
    for forward in sweeps:
        if blocks.size == 2:
            if a.packed is not None:
                _gs_packed_rows(*a.packed, x, x, b, 0, a.n_rows, forward)
            else:
                _gs_rows(a.ptr, a.idx, a.vals, x, x, b, 0, a.n_rows, forward)
            continue
        old = frozen(x.copy())
        with PARALLEL_LOCK:
            if a.packed is not None:
                _gs_packed_par(*a.packed, x, old, b, blocks, forward)
            else:
                _gs_par(a.ptr, a.idx, a.vals, x, old, b, blocks, forward)


# ------------------------------------------------------------------ Jacobi, residual
@njit(nogil=True, cache=True)
def _residual_rows(ptr, idx, vals, x, b, r, lo, hi):
    """r = b - A x over rows [lo, hi), each row's product summed left to right."""
    for i in range(lo, hi):
        acc = r.dtype.type(0)
        for p in range(U(ptr[i]), U(ptr[i + 1])):
            acc += vals[p] * x[U(idx[p])]
        r[i] = b[i] - acc


@njit(nogil=True, cache=True, parallel=True)
def _residual_par(ptr, idx, vals, x, b, r, bounds):
    for c in prange(bounds.size - 1):
        _residual_rows(ptr, idx, vals, x, b, r, bounds[c], bounds[c + 1])


@njit(nogil=True, cache=True, parallel=True)
def _residual_packed_par(ptr, offsets, codes, table, x, b, r, bounds):
    for c in prange(bounds.size - 1):
        for i in range(bounds[c], bounds[c + 1]):
            acc = r.dtype.type(0)
            for p in range(U(ptr[i]), U(ptr[i + 1])):
                acc += table[U(codes[p])] * x[U(i + offsets[p])]
            r[i] = b[i] - acc


def residual(a: Matrix, x: np.ndarray, b: np.ndarray, r: np.ndarray) -> None:
    """r = b - A x (r a separate array)."""
    x, b = frozen(x), frozen(b)
    if not a.parallel:
        _residual_rows(a.ptr, a.idx, a.vals, x, b, r, 0, a.n_rows)
    else:
        with PARALLEL_LOCK:
            if a.packed is not None:
                _residual_packed_par(*a.packed, x, b, r, a.bounds)
            else:
                _residual_par(a.ptr, a.idx, a.vals, x, b, r, a.bounds)


@njit(nogil=True, cache=True)
def _jacobi_rows(ptr, idx, vals, dinv, omega, x, old, b, lo, hi):
    """x = old + omega D^-1 (b - A old) over rows [lo, hi) (pyamg's jacobi)."""
    for i in range(lo, hi):
        acc = x.dtype.type(0)
        for p in range(U(ptr[i]), U(ptr[i + 1])):
            acc += vals[p] * old[U(idx[p])]
        x[i] = old[i] + omega * dinv[i] * (b[i] - acc)


@njit(nogil=True, cache=True, parallel=True)
def _jacobi_par(ptr, idx, vals, dinv, omega, x, old, b, bounds):
    for c in prange(bounds.size - 1):
        _jacobi_rows(ptr, idx, vals, dinv, omega, x, old, b, bounds[c], bounds[c + 1])


def jacobi(a: Matrix, dinv: np.ndarray, omega: float, x: np.ndarray, b: np.ndarray, iterations: int) -> None:
    """``iterations`` damped Jacobi passes on A x = b in place (``dinv``: 1 / diag(A), 0 where
    the diagonal is 0, so that such a row stays as it is)."""
    b, dinv = frozen(b), frozen(dinv)
    w = x.dtype.type(omega)
    for _ in range(iterations):
        old = frozen(x.copy())
        if not a.parallel:
            _jacobi_rows(a.ptr, a.idx, a.vals, dinv, w, x, old, b, 0, a.n_rows)
        else:
            with PARALLEL_LOCK:
                _jacobi_par(a.ptr, a.idx, a.vals, dinv, w, x, old, b, a.bounds)


# ------------------------------------------------------------------ grid transfers
def restrict(r_matrix: Matrix, v: np.ndarray, out: np.ndarray) -> None:
    """out = R v (R the restriction, stored as its own CSR)."""
    v = frozen(v)
    if not r_matrix.parallel:
        spmv_rows(r_matrix.ptr, r_matrix.idx, r_matrix.vals, v, out, 0, r_matrix.n_rows)
    else:
        with PARALLEL_LOCK:
            spmv_par(r_matrix.ptr, r_matrix.idx, r_matrix.vals, v, out, r_matrix.bounds)


@njit(nogil=True, cache=True)
def _prolong_rows(ptr, idx, vals, xc, x, lo, hi):
    """x += P xc over rows [lo, hi)."""
    for i in range(lo, hi):
        acc = x.dtype.type(0)
        for p in range(U(ptr[i]), U(ptr[i + 1])):
            acc += vals[p] * xc[U(idx[p])]
        x[i] += acc


@njit(nogil=True, cache=True, parallel=True)
def _prolong_par(ptr, idx, vals, xc, x, bounds):
    for c in prange(bounds.size - 1):
        _prolong_rows(ptr, idx, vals, xc, x, bounds[c], bounds[c + 1])


def prolong_add(p_matrix: Matrix, xc: np.ndarray, x: np.ndarray) -> None:
    """x += P xc (the coarse-grid correction)."""
    xc = frozen(xc)
    if not p_matrix.parallel:
        _prolong_rows(p_matrix.ptr, p_matrix.idx, p_matrix.vals, xc, x, 0, p_matrix.n_rows)
    else:
        with PARALLEL_LOCK:
            _prolong_par(p_matrix.ptr, p_matrix.idx, p_matrix.vals, xc, x, p_matrix.bounds)


# ------------------------------------------------------------------ Lanczos (the spectral radius of D^-1 A)
# One step on S = D^-1/2 A D^-1/2 is the SpMV w = A u (u = s v, s = D^-1/2) and the three passes
# below; the dot products sum fixed blocks of ``SUM_BLOCK`` elements, then the blocks in order, so
# the estimate is the same bits on any thread count.
SUM_BLOCK = 4096


@njit(nogil=True, cache=True, parallel=True)
def _step_pass(w, s, v_prev, v, beta, partial):
    """w = s * w - beta * v_prev; partial[block] = (w . v, w . w)."""
    n = w.size
    for blk in prange(partial.shape[0]):
        wv = 0.0
        ww = 0.0
        for i in range(blk * SUM_BLOCK, min(n, (blk + 1) * SUM_BLOCK)):
            wi = s[i] * w[i] - beta * v_prev[i]
            w[i] = wi
            wv += wi * v[i]
            ww += wi * wi
        partial[blk, 0] = wv
        partial[blk, 1] = ww


@njit(nogil=True, cache=True, parallel=True)
def _next_pass(w, v, v_prev, u, s, alpha, inv_beta):
    n = w.size
    for blk in prange((n + SUM_BLOCK - 1) // SUM_BLOCK):
        for i in range(blk * SUM_BLOCK, min(n, (blk + 1) * SUM_BLOCK)):
            vi = v[i]
            v_prev[i] = vi
            vi = (w[i] - alpha * vi) * inv_beta
            v[i] = vi
            u[i] = s[i] * vi


def lanczos_step(w: np.ndarray, s: np.ndarray, v_prev: np.ndarray, v: np.ndarray, beta: float) -> tuple[float, float]:
    """After w = A u: w = s * w - beta * v_prev in place; returns (alpha, beta_next): alpha = w . v
    and beta_next = norm(w - alpha v) (from w . w - alpha^2, one pass: Paige's form)."""
    partial = np.zeros(((w.size + SUM_BLOCK - 1) // SUM_BLOCK, 2))
    with PARALLEL_LOCK:
        _step_pass(w, frozen(s), frozen(v_prev), frozen(v), float(beta), partial)
    alpha, ww = partial.sum(axis=0)
    return float(alpha), float(np.sqrt(max(ww - alpha * alpha, 0.0)))


def lanczos_next(w: np.ndarray, v: np.ndarray, v_prev: np.ndarray, u: np.ndarray, s: np.ndarray, alpha: float,
                 beta: float) -> None:
    """v_prev = v; v = (w - alpha v) / beta; u = s * v (the next step's SpMV input)."""
    with PARALLEL_LOCK:
        _next_pass(frozen(w), v, v_prev, u, frozen(s), float(alpha), 1.0 / beta)


# ------------------------------------------------------------------ strength of connection
@njit(nogil=True, cache=True)
def _strength_rows(ptr, idx, vals, theta2, diag, counts, out_ptr, out_idx, out_vals, fill, lo, hi):
    """pyamg's symmetric measure over rows [lo, hi): the diagonal and every a_ij with
    |a_ij|^2 >= theta^2 |a_ii| |a_jj| kept, as |a_ij| over the row's largest kept |a_ij|."""
    for i in range(lo, hi):
        bound = theta2 * diag[i]
        if not fill:
            count = 0
            for p in range(U(ptr[i]), U(ptr[i + 1])):
                j = idx[p]
                if j == i or vals[p] * vals[p] >= bound * diag[j]:
                    count += 1
            counts[i] = count
            continue
        q = out_ptr[i]
        largest = 0.0
        for p in range(U(ptr[i]), U(ptr[i + 1])):
            j = idx[p]
            if j == i or vals[p] * vals[p] >= bound * diag[j]:
                out_idx[q] = j
                value = abs(vals[p])
                out_vals[q] = value
                largest = max(largest, value)
                q += 1
        if largest != 0:
            scale = 1.0 / largest
            for r in range(out_ptr[i], q):
                out_vals[r] = out_vals[r] * scale


@njit(nogil=True, cache=True, parallel=True)
def _strength_par(ptr, idx, vals, theta2, diag, counts, out_ptr, out_idx, out_vals, fill, bounds):
    for c in prange(bounds.size - 1):
        _strength_rows(ptr, idx, vals, theta2, diag, counts, out_ptr, out_idx, out_vals, fill, bounds[c],
                       bounds[c + 1])


def symmetric_strength(ptr: np.ndarray, idx: np.ndarray, vals: np.ndarray, theta: float):
    """(ptr, idx, vals) of pyamg's ``symmetric_strength_of_connection`` of a CSR matrix (its
    diagonal summed over repeats), in parallel: the same entries and values."""
    n = ptr.size - 1
    diag = np.abs(diagonal(frozen(ptr), frozen(idx), frozen(vals))).astype(np.float64)
    bounds = balanced_bounds(ptr, N_GATHER_CHUNKS) if vals.size >= PARALLEL_MIN else np.array([0, n], np.int64)
    counts = np.zeros(n, np.int64)
    out_ptr = np.zeros(n + 1, np.int64)
    args = (frozen(ptr), frozen(idx), frozen(vals), float(theta) ** 2, frozen(diag))
    empty_idx, empty_vals = np.zeros(0, idx.dtype), np.zeros(0, vals.dtype)
    with PARALLEL_LOCK:
        _strength_par(*args, counts, frozen(out_ptr), empty_idx, empty_vals, False, bounds)
        np.cumsum(counts, out=out_ptr[1:])
        out_idx, out_vals = np.empty(int(out_ptr[-1]), idx.dtype), np.empty(int(out_ptr[-1]), vals.dtype)
        _strength_par(*args, counts, frozen(out_ptr), out_idx, out_vals, True, bounds)
    return out_ptr.astype(ptr.dtype), out_idx, out_vals


def warm_up() -> None:
    """Compile (or load) each kernel for float64 and float32 with int32 indices, sequential and
    parallel paths."""
    for dtype in (np.float64, np.float32):
        ptr = np.array([0, 2, 4], np.int32)
        idx = np.array([0, 1, 0, 1], np.int32)
        a = Matrix(ptr, idx, np.array([4, 1, 1, 3], dtype), 2)
        x, b, r = np.zeros(2, dtype), np.ones(2, dtype), np.empty(2, dtype)
        two = np.array([0, 1, 2], np.int64)
        gauss_seidel(a, np.array([0, 2], np.int64), x, b, (True, False))
        gauss_seidel(a, two, x, b, (True,))
        jacobi(a, np.ones(2, dtype), 1.0, x, b, 1)
        residual(a, x, b, r)
        restrict(a, x, r)
        prolong_add(a, x, r)
        _jacobi_par(a.ptr, a.idx, a.vals, frozen(np.ones(2, dtype)), dtype(1), x, frozen(x.copy()), frozen(b), two)
        _residual_par(a.ptr, a.idx, a.vals, frozen(x), frozen(b), r, two)
        _prolong_par(a.ptr, a.idx, a.vals, frozen(x), r, two)
        spmv_par(a.ptr, a.idx, a.vals, frozen(x), r, two)
        packed = pack(a.ptr, a.idx, a.vals)
        assert packed is not None
        _gs_packed_rows(*packed, x, x, frozen(b), 0, 2, True)
        _gs_packed_rows(*packed, x, frozen(x.copy()), frozen(b), 0, 2, True)
        _gs_packed_par(*packed, x, frozen(x.copy()), frozen(b), two, True)
        _residual_packed_par(*packed, frozen(x), frozen(b), r, two)
    w, s, vp, v, u = (np.ones(3) for _ in range(5))
    alpha, beta = lanczos_step(w, s, vp, v, 0.5)
    lanczos_next(w, v, vp, u, s, alpha, 2.0)
    for dtype in (np.float64, np.float32):
        for index in (np.int32, np.int64):
            symmetric_strength(np.array([0, 2, 4], index), np.array([0, 1, 0, 1], index),
                               np.array([4, 1, 1, 3], dtype), 0.25)
