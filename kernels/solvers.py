"""Kernels of the Krylov solvers (``server/ops/solvers.py``): the vector work of an iteration
fused into as few passes as the algorithm allows, the Jacobi and ILU(0) preconditioners, and
the SpMV with the dot product the next step needs taken while its rows are in cache.

A conjugate-gradient iteration is then one SpMV (``spmv_dot``), one pass updating x and r and
measuring r (``cg_update``), and one writing the next direction (``cg_direction``): about one
pass over the vectors, where scipy makes eight. Every sum is taken over fixed blocks of
``BLOCK`` elements, then the blocks' sums added in order (numpy's pairwise sum): the answer, and
so the iteration count, does not depend on how many threads ran the blocks (below
``PARALLEL_MIN`` everything runs in the calling thread, with the same blocks).

Nor on the CPU: these kernels are compiled without fastmath flags, so no compiler may reorder a
sum or fuse a multiply-add, and a block's sum is written as four interleaved lanes (element i in
lane i % 4, added as (l0 + l1) + (l2 + l3)) that the vectoriser keeps in registers whatever their
width: AVX2 and AVX-512 machines give the same bits (tests/kernels/test_kernels_same_bits.py
compiles them for both). bench/solvers.py measured the lanes as fast as the reassociated loop.
Values float32 or float64; the caller validates; nothing here raises.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._parallel import PARALLEL_LOCK, PARALLEL_MIN
from ._sort import frozen
from .linalg import N_GATHER_CHUNKS, U, balanced_bounds, spmv_par, spmv_rows

__all__ = ["Csr", "BicgVectors", "spmv_dot", "spmv_dot_lockstep", "spmv_dots", "blocked_dot", "blocked_dots",
           "spmv_into", "cg_update", "cg_direction", "diagonal", "ilu0", "ilu0_solve", "warm_up"]

BLOCK = 4096  # elements a partial sum covers

# How cg_update finds the preconditioned residual z: z = r (none), z = dinv * r (jacobi, never
# stored), or z given (ilu0, from the triangular solves).
NONE, JACOBI, GIVEN = 0, 1, 2


class Csr:
    """A square matrix's CSR arrays with its SpMV's row split (computed once per matrix): chunks
    of about equal entries whose bounds fall on ``BLOCK`` boundaries; and, for a big matrix that
    allows it, the same entries packed (``pack``), which the parallel products read instead."""

    def __init__(self, ptr: np.ndarray, idx: np.ndarray, vals: np.ndarray):
        # read-only, as kernels/linalg.py passes them: one compiled signature per dtype
        self.ptr, self.idx, self.vals = frozen(ptr), frozen(idx), frozen(vals)
        self.n = ptr.size - 1
        bounds = balanced_bounds(ptr, N_GATHER_CHUNKS)
        self.bounds = np.unique(np.concatenate([[0], np.minimum((bounds + BLOCK // 2) // BLOCK * BLOCK, self.n),
                                                [self.n]])).astype(np.int64)
        self.parallel = vals.size >= PARALLEL_MIN
        self.packed = pack(self.ptr, self.idx, self.vals) if self.parallel else None


# ------------------------------------------------------------------ packed entries
# A solver's SpMV streams the whole matrix every iteration and is bound by memory: CSR float64
# with int32 indices moves 12 bytes an entry. Matrices from stencils and graphs (a PDE's
# Laplacian, an adjacency or incidence matrix) mostly have few distinct values and their entries
# near the diagonal, so an entry packs into 3 bytes: its column as an int16 offset from its row
# and its value as a uint8 code into a table of at most 256 values (index and value compression,
# Kourtis, Goumas and Koziris, CF 2008). The products are the same numbers in the same order:
# bit for bit the CSR kernel's. bench/solvers.py has the measurement.
PACK_VALUES = 256
_PACK_SLOTS = 1024  # open addressing for the distinct values: at most a quarter full
OFFSET_MIN, OFFSET_MAX = -(1 << 15), (1 << 15) - 1  # int16


@njit(nogil=True, cache=True)
def _pack(ptr, idx, bits, offsets, codes, table):
    """Fills offsets (column - row) and codes (the value's slot in table, by its bits); returns
    the number of distinct values, or -1 as soon as an offset or the count does not fit."""
    slots = np.full(_PACK_SLOTS, -1, np.int64)
    count = 0
    for i in range(ptr.size - 1):
        for p in range(U(ptr[i]), U(ptr[i + 1])):
            offset = np.int64(idx[p]) - i
            if offset < OFFSET_MIN or offset > OFFSET_MAX:
                return -1
            offsets[p] = offset
            key = np.uint64(bits[p])
            slot = (key * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(54)  # 10 bits: _PACK_SLOTS
            while slots[slot] >= 0 and table[slots[slot]] != bits[p]:
                slot = (slot + np.uint64(1)) & np.uint64(_PACK_SLOTS - 1)
            if slots[slot] < 0:
                if count == PACK_VALUES:
                    return -1
                table[count] = bits[p]
                slots[slot] = count
                count += 1
            codes[p] = slots[slot]
    return count


def pack(ptr: np.ndarray, idx: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, ...] | None:
    """(ptr, offsets, codes, values table) of a matrix whose entries fit (see above); else None."""
    if vals.dtype.kind != "f":
        return None
    bits = vals.view(np.uint64 if vals.itemsize == 8 else np.uint32)
    offsets, codes = np.empty(vals.size, np.int16), np.empty(vals.size, np.uint8)
    table = np.empty(PACK_VALUES, bits.dtype)
    count = _pack(ptr, idx, bits, offsets, codes, table)
    if count < 0:
        return None
    return ptr, frozen(offsets), frozen(codes), frozen(table[:count].view(vals.dtype))


@njit(nogil=True, cache=True)
def packed_rows(ptr, offsets, codes, table, x, y, lo, hi):
    """``spmv_rows`` over packed entries (no prefetch: the columns are near the rows)."""
    for i in range(lo, hi):
        acc = y.dtype.type(0)
        for p in range(U(ptr[i]), U(ptr[i + 1])):
            acc += table[U(codes[p])] * x[U(i + offsets[p])]
        y[i] = acc


@njit(nogil=True, cache=True, parallel=True)
def _packed_par(ptr, offsets, codes, table, x, y, bounds):
    for c in prange(bounds.size - 1):
        packed_rows(ptr, offsets, codes, table, x, y, bounds[c], bounds[c + 1])


def n_blocks(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK


# ------------------------------------------------------------------ SpMV (+ the dot it feeds)
@njit(nogil=True, cache=True)
def _dot_range(x, y, lo, hi):
    """x . y over [lo, hi) in four lanes (see the module's docstring)."""
    s0 = s1 = s2 = s3 = 0.0
    i, end = U(lo), U(lo) + (U(hi) - U(lo)) // U(4) * U(4)
    while i < end:
        s0 += x[i] * y[i]
        s1 += x[i + 1] * y[i + 1]
        s2 += x[i + 2] * y[i + 2]
        s3 += x[i + 3] * y[i + 3]
        i += U(4)
    for j in range(i, U(hi)):
        s0 += x[j] * y[j]
    return (s0 + s1) + (s2 + s3)


@njit(nogil=True, cache=True)
def _dot_blocks(x, y, lo, hi, partial):
    """partial[b] = x . y over block b, for the blocks of [lo, hi) (lo on a block boundary)."""
    for b in range(lo // BLOCK, (hi + BLOCK - 1) // BLOCK):
        partial[b] = _dot_range(x, y, b * BLOCK, min(hi, (b + 1) * BLOCK))


@njit(nogil=True, cache=True, parallel=True)
def _spmv_dot_par(ptr, idx, vals, x, y, bounds, partial):
    for c in prange(bounds.size - 1):
        spmv_rows(ptr, idx, vals, x, y, bounds[c], bounds[c + 1])
        _dot_blocks(x, y, bounds[c], bounds[c + 1], partial)


@njit(nogil=True, cache=True, parallel=True)
def _packed_dot_par(ptr, offsets, codes, table, x, y, bounds, partial):
    for c in prange(bounds.size - 1):
        packed_rows(ptr, offsets, codes, table, x, y, bounds[c], bounds[c + 1])
        _dot_blocks(x, y, bounds[c], bounds[c + 1], partial)


def spmv_dot(a: Csr, x: np.ndarray, y: np.ndarray) -> float:
    """y = A @ x in place, and returns x . y (the rows of y read back while in cache)."""
    partial = np.zeros(n_blocks(a.n))
    x = frozen(x)
    if not a.parallel:
        spmv_rows(a.ptr, a.idx, a.vals, x, y, 0, a.n)
        _dot_blocks(x, y, 0, a.n, partial)
    else:
        with PARALLEL_LOCK:
            if a.packed is None:
                _spmv_dot_par(a.ptr, a.idx, a.vals, x, y, a.bounds, partial)
            else:
                _packed_dot_par(*a.packed, x, y, a.bounds, partial)
    return float(partial.sum())


def spmv_into(a: Csr, x: np.ndarray, y: np.ndarray) -> None:
    """y = A @ x in place (the operator handed to scipy's drivers and to eigen solvers)."""
    x = frozen(x)
    if not a.parallel:
        spmv_rows(a.ptr, a.idx, a.vals, x, y, 0, a.n)
        return
    with PARALLEL_LOCK:
        if a.packed is None:
            spmv_par(a.ptr, a.idx, a.vals, x, y, a.bounds)
        else:
            _packed_par(*a.packed, x, y, a.bounds)


@njit(nogil=True, cache=True, parallel=True)
def _lockstep_par(ptr, idx, vals, x, y, live, bounds, partial):
    for c in prange(bounds.size - 1):
        for lo in range(bounds[c], bounds[c + 1], BLOCK):  # a block of A's rows, in cache for every vector
            hi = min(bounds[c + 1], lo + BLOCK)
            for j in live:
                spmv_rows(ptr, idx, vals, x[j], y[j], lo, hi)
                _dot_blocks(x[j], y[j], lo, hi, partial[j])


@njit(nogil=True, cache=True, parallel=True)
def _packed_lockstep_par(ptr, offsets, codes, table, x, y, live, bounds, partial):
    for c in prange(bounds.size - 1):
        for lo in range(bounds[c], bounds[c + 1], BLOCK):
            hi = min(bounds[c + 1], lo + BLOCK)
            for j in live:
                packed_rows(ptr, offsets, codes, table, x[j], y[j], lo, hi)
                _dot_blocks(x[j], y[j], lo, hi, partial[j])


def spmv_dot_lockstep(a: Csr, x: np.ndarray, y: np.ndarray, live: np.ndarray) -> np.ndarray:
    """``spmv_dot`` for the vectors ``live`` of a block x [k, n] at once (y [k, n] written for
    them): A's rows read once for all, each product and dot the bits ``spmv_dot`` gives alone.
    Returns the k dots (0 where not live)."""
    partial = np.zeros((x.shape[0], n_blocks(a.n)))
    x = frozen(x)
    if not a.parallel:
        for j in live:
            spmv_rows(a.ptr, a.idx, a.vals, x[j], y[j], 0, a.n)
            _dot_blocks(x[j], y[j], 0, a.n, partial[j])
    else:
        with PARALLEL_LOCK:
            if a.packed is None:
                _lockstep_par(a.ptr, a.idx, a.vals, x, y, live, a.bounds, partial)
            else:
                _packed_lockstep_par(*a.packed, x, y, live, a.bounds, partial)
    return np.array([row.sum() for row in partial])  # each as spmv_dot sums its partials


# ------------------------------------------------------------------ conjugate gradients
@njit(nogil=True, cache=True, inline="always")
def _cg_update_at(x, r, p, q, dinv, alpha, mode, i):
    """x[i] += alpha p[i], r[i] -= alpha q[i]; returns (r[i]^2, r[i]^2 dinv[i] or 0)."""
    x[i] += alpha * p[i]
    ri = r[i] - alpha * q[i]
    r[i] = ri
    rr = ri * ri
    return rr, rr * dinv[i] if mode == 1 else 0.0


@njit(nogil=True, cache=True)
def _cg_update_range(x, r, p, q, dinv, alpha, mode, lo, hi):
    rr0 = rr1 = rr2 = rr3 = rz0 = rz1 = rz2 = rz3 = 0.0  # four lanes of each sum
    i, end = U(lo), U(lo) + (U(hi) - U(lo)) // U(4) * U(4)
    while i < end:
        a, b = _cg_update_at(x, r, p, q, dinv, alpha, mode, i)
        rr0 += a
        rz0 += b
        a, b = _cg_update_at(x, r, p, q, dinv, alpha, mode, i + 1)
        rr1 += a
        rz1 += b
        a, b = _cg_update_at(x, r, p, q, dinv, alpha, mode, i + 2)
        rr2 += a
        rz2 += b
        a, b = _cg_update_at(x, r, p, q, dinv, alpha, mode, i + 3)
        rr3 += a
        rz3 += b
        i += U(4)
    for j in range(i, U(hi)):
        a, b = _cg_update_at(x, r, p, q, dinv, alpha, mode, j)
        rr0 += a
        rz0 += b
    return (rr0 + rr1) + (rr2 + rr3), (rz0 + rz1) + (rz2 + rz3)


@njit(nogil=True, cache=True, parallel=True)
def _cg_update_par(x, r, p, q, dinv, alpha, mode, partial):
    n = x.size
    for b in prange(partial.shape[0]):
        rr, rz = _cg_update_range(x, r, p, q, dinv, alpha, mode, b * BLOCK, min(n, (b + 1) * BLOCK))
        partial[b, 0] = rr
        partial[b, 1] = rz


@njit(nogil=True, cache=True)
def _cg_update_seq(x, r, p, q, dinv, alpha, mode, partial):
    n = x.size
    for b in range(partial.shape[0]):
        rr, rz = _cg_update_range(x, r, p, q, dinv, alpha, mode, b * BLOCK, min(n, (b + 1) * BLOCK))
        partial[b, 0] = rr
        partial[b, 1] = rz


def cg_update(x, r, p, q, dinv, alpha: float, mode: int) -> tuple[float, float]:
    """x += alpha p, r -= alpha q in one pass; returns (r . r, r . dinv r) (the second only for
    JACOBI, else 0)."""
    partial = np.zeros((n_blocks(x.size), 2))
    if x.size < PARALLEL_MIN:
        _cg_update_seq(x, r, p, q, dinv, alpha, mode, partial)
    else:
        with PARALLEL_LOCK:
            _cg_update_par(x, r, p, q, dinv, alpha, mode, partial)
    rr, rz = partial.sum(axis=0)
    return float(rr), float(rz)


@njit(nogil=True, cache=True)
def _cg_direction_range(p, r, w, beta, mode, lo, hi):
    for i in range(U(lo), U(hi)):
        if mode == 0:
            p[i] = r[i] + beta * p[i]
        elif mode == 1:
            p[i] = w[i] * r[i] + beta * p[i]
        else:
            p[i] = w[i] + beta * p[i]


@njit(nogil=True, cache=True, parallel=True)
def _cg_direction_par(p, r, w, beta, mode):
    n = p.size
    for b in prange((n + BLOCK - 1) // BLOCK):
        _cg_direction_range(p, r, w, beta, mode, b * BLOCK, min(n, (b + 1) * BLOCK))


def cg_direction(p, r, w, beta: float, mode: int) -> None:
    """p = z + beta p, z being r (NONE), w * r (JACOBI, w = 1 / diag A) or w itself (GIVEN)."""
    if p.size < PARALLEL_MIN:
        _cg_direction_range(p, r, w, beta, mode, 0, p.size)
        return
    with PARALLEL_LOCK:
        _cg_direction_par(p, r, w, beta, mode)


# ------------------------------------------------------------------ BiCGSTAB
@njit(nogil=True, cache=True)
def _dots_range(u, y, lo, hi):
    """(u . y, y . y) over [lo, hi) in four lanes each."""
    return _dot_range(u, y, lo, hi), _dot_range(y, y, lo, hi)


@njit(nogil=True, cache=True)
def _dots_blocks(u, y, lo, hi, partial):
    for b in range(lo // BLOCK, (hi + BLOCK - 1) // BLOCK):
        uy, yy = _dots_range(u, y, b * BLOCK, min(hi, (b + 1) * BLOCK))
        partial[b, 0] = uy
        partial[b, 1] = yy


@njit(nogil=True, cache=True, parallel=True)
def _spmv_dots_par(ptr, idx, vals, x, y, u, bounds, partial):
    for c in prange(bounds.size - 1):
        spmv_rows(ptr, idx, vals, x, y, bounds[c], bounds[c + 1])
        _dots_blocks(u, y, bounds[c], bounds[c + 1], partial)


@njit(nogil=True, cache=True, parallel=True)
def _packed_dots_par(ptr, offsets, codes, table, x, y, u, bounds, partial):
    for c in prange(bounds.size - 1):
        packed_rows(ptr, offsets, codes, table, x, y, bounds[c], bounds[c + 1])
        _dots_blocks(u, y, bounds[c], bounds[c + 1], partial)


def spmv_dots(a: Csr, x: np.ndarray, y: np.ndarray, u: np.ndarray) -> tuple[float, float]:
    """y = A @ x in place; returns (u . y, y . y)."""
    partial = np.zeros((n_blocks(a.n), 2))
    x = frozen(x)
    if not a.parallel:
        spmv_rows(a.ptr, a.idx, a.vals, x, y, 0, a.n)
        _dots_blocks(u, y, 0, a.n, partial)
    else:
        with PARALLEL_LOCK:
            if a.packed is None:
                _spmv_dots_par(a.ptr, a.idx, a.vals, x, y, u, a.bounds, partial)
            else:
                _packed_dots_par(*a.packed, x, y, u, a.bounds, partial)
    uy, yy = partial.sum(axis=0)
    return float(uy), float(yy)


def blocked_dot(x: np.ndarray, y: np.ndarray) -> float:
    """x . y summed as ``spmv_dot`` sums it (fixed blocks of elements, then the blocks in order),
    for a loop whose products are made elsewhere (a partitioned matrix's) to take the same numbers."""
    partial = np.zeros(n_blocks(x.size))
    _dot_blocks(frozen(x), y, 0, x.size, partial)
    return float(partial.sum())


def blocked_dots(u: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(u . y, y . y) summed as ``spmv_dots`` sums them."""
    partial = np.zeros((n_blocks(y.size), 2))
    _dots_blocks(u, y, 0, y.size, partial)
    uy, yy = partial.sum(axis=0)
    return float(uy), float(yy)


@njit(nogil=True, cache=True)
def _bicg_direction_range(p, r, v, dinv, phat, beta, omega, first, mode, lo, hi):
    for i in range(U(lo), U(hi)):
        pi = r[i] if first else (p[i] - omega * v[i]) * beta + r[i]
        p[i] = pi
        if mode == 1:
            phat[i] = dinv[i] * pi


@njit(nogil=True, cache=True)
def _bicg_half_range(r, v, dinv, shat, alpha, mode, lo, hi):
    for i in range(U(lo), U(hi)):
        ri = r[i] - alpha * v[i]
        r[i] = ri
        if mode == 1:
            shat[i] = dinv[i] * ri
    return _dot_range(r, r, lo, hi)  # the block again, from L1


@njit(nogil=True, cache=True)
def _bicg_update_range(x, r, t, rtilde, phat, shat, alpha, omega, lo, hi):
    for i in range(U(lo), U(hi)):
        x[i] += alpha * phat[i] + omega * shat[i]
        r[i] = r[i] - omega * t[i]
    return _dots_range(rtilde, r, lo, hi)[::-1]  # (r . r, rtilde . r), the block again from L1


@njit(nogil=True, cache=True)
def _bicg_pass_block(b, stage, x, r, p, v, t, rtilde, dinv, phat, shat, alpha, beta, omega, first, mode,
                     partial):
    """Block b of one of BiCGSTAB's three vector passes (its partial sums into partial[b])."""
    lo, hi = b * BLOCK, min(r.size, (b + 1) * BLOCK)
    if stage == 0:
        _bicg_direction_range(p, r, v, dinv, phat, beta, omega, first, mode, lo, hi)
    elif stage == 1:
        partial[b, 0] = _bicg_half_range(r, v, dinv, shat, alpha, mode, lo, hi)
    else:
        rr, rho = _bicg_update_range(x, r, t, rtilde, phat, shat, alpha, omega, lo, hi)
        partial[b, 0] = rr
        partial[b, 1] = rho


@njit(nogil=True, cache=True, parallel=True)
def _bicg_passes_par(stage, x, r, p, v, t, rtilde, dinv, phat, shat, alpha, beta, omega, first, mode,
                     partial):
    for b in prange(partial.shape[0]):
        _bicg_pass_block(b, stage, x, r, p, v, t, rtilde, dinv, phat, shat, alpha, beta, omega, first, mode,
                         partial)


@njit(nogil=True, cache=True)
def _bicg_passes_seq(stage, x, r, p, v, t, rtilde, dinv, phat, shat, alpha, beta, omega, first, mode,
                     partial):
    for b in range(partial.shape[0]):  # small vectors: no thread woken
        _bicg_pass_block(b, stage, x, r, p, v, t, rtilde, dinv, phat, shat, alpha, beta, omega, first, mode,
                         partial)


class BicgVectors:
    """The vectors of one BiCGSTAB solve and its three fused passes (scipy's loop otherwise):
    ``direction`` p = (p - omega v) beta + r (and phat = dinv p for JACOBI); ``half`` r -= alpha v
    returning r . r (and shat = dinv r); ``update`` x += alpha phat + omega shat, r -= omega t
    returning (r . r, rtilde . r). Without JACOBI, phat and shat are p and r themselves, or the
    caller fills them (GIVEN)."""

    def __init__(self, x, r, mode: int, dinv):
        n, dtype = r.size, r.dtype
        self.x, self.r, self.rtilde, self.mode, self.dinv = x, r, r.copy(), mode, dinv
        self.p, self.v, self.t = np.zeros(n, dtype), np.zeros(n, dtype), np.zeros(n, dtype)
        self.phat = self.p if mode == NONE else np.zeros(n, dtype)
        self.shat = self.r if mode == NONE else np.zeros(n, dtype)
        self.partial = np.zeros((n_blocks(n), 2))

    def _run(self, stage: int, alpha=0.0, beta=0.0, omega=0.0, first=False) -> np.ndarray:
        self.partial[:] = 0
        args = (stage, self.x, self.r, self.p, self.v, self.t, self.rtilde, self.dinv, self.phat, self.shat,
                alpha, beta, omega, first, 1 if self.mode == JACOBI else 0, self.partial)
        if self.r.size < PARALLEL_MIN:
            _bicg_passes_seq(*args)
        else:
            with PARALLEL_LOCK:
                _bicg_passes_par(*args)
        return self.partial.sum(axis=0)

    def direction(self, beta: float, omega: float, first: bool) -> None:
        self._run(0, beta=beta, omega=omega, first=first)

    def half(self, alpha: float) -> float:
        return float(self._run(1, alpha=alpha)[0])

    def update(self, alpha: float, omega: float) -> tuple[float, float]:
        rr, rho = self._run(2, alpha=alpha, omega=omega)
        return float(rr), float(rho)


# ------------------------------------------------------------------ preconditioners
@njit(nogil=True, cache=True)
def diagonal(ptr, idx, vals):
    """The diagonal of a square CSR (repeated entries summed, as the SpMV sums them)."""
    n = ptr.size - 1
    d = np.zeros(n, vals.dtype)
    for i in range(n):
        for k in range(ptr[i], ptr[i + 1]):
            if idx[k] == i:
                d[i] += vals[k]
    return d


@njit(nogil=True, cache=True)
def ilu0(ptr, idx, vals):
    """ILU(0) of a CSR with sorted, unrepeated columns in each row: (lu, diag_pos, status).
    ``lu`` holds L (unit lower, diagonal implied) below and U on and above the diagonal, on A's
    own pattern; ``diag_pos[i]`` is row i's diagonal entry. ``status``: -1 done, else the first
    row whose diagonal is missing or whose pivot came out zero (the factor is then unusable)."""
    n = ptr.size - 1
    lu = vals.copy()
    diag_pos = np.full(n, -1, np.int64)
    where = np.full(n, -1, np.int64)  # column -> position in the current row, -1 outside it
    for i in range(n):
        for k in range(ptr[i], ptr[i + 1]):
            where[idx[k]] = k
            if idx[k] == i:
                diag_pos[i] = k
        for k in range(ptr[i], ptr[i + 1]):
            j = idx[k]
            if j >= i:
                break
            lu[k] /= lu[diag_pos[j]]
            factor = lu[k]
            for m in range(diag_pos[j] + 1, ptr[j + 1]):
                w = where[idx[m]]
                if w >= 0:
                    lu[w] -= factor * lu[m]
        for k in range(ptr[i], ptr[i + 1]):
            where[idx[k]] = -1
        if diag_pos[i] < 0 or lu[diag_pos[i]] == 0:
            return lu, diag_pos, i
    return lu, diag_pos, -1


@njit(nogil=True, cache=True)
def ilu0_solve(ptr, idx, lu, diag_pos, r, z):
    """z = (LU)^-1 r: forward then backward substitution; returns r . z (what cg needs next)."""
    n = ptr.size - 1
    for i in range(n):
        acc = r[i]
        for k in range(ptr[i], diag_pos[i]):
            acc -= lu[k] * z[idx[k]]
        z[i] = acc
    rz = 0.0
    for i in range(n - 1, -1, -1):
        acc = z[i]
        for k in range(diag_pos[i] + 1, ptr[i + 1]):
            acc -= lu[k] * z[idx[k]]
        z[i] = acc / lu[diag_pos[i]]
        rz += r[i] * z[i]
    return rz


# ------------------------------------------------------------------ a kept factorization's solves
# solve (server/ops/eigen.py) applies factorize's L and U with these rather than scipy's
# spsolve_triangular: on the 2-D Poisson matrix of a 300 x 300 grid (4.45M entries in each of L
# and U) a solve took 0.19 s with it, of which 0.08 s of checks (docs/solvers.md has the figures
# after). Rows in order, each entry once, one right-hand side b [n] in place (a column at a time:
# an accumulator per row ran 2.5x as fast as updating a row of a block in memory).
@njit(nogil=True, cache=True)
def misplaced_row(ptr, idx, lower):
    """The first row with an entry on the wrong side of the diagonal (above it for a lower
    triangular matrix, below for an upper one), or -1."""
    for i in range(ptr.size - 1):
        for p in range(ptr[i], ptr[i + 1]):
            if (idx[p] > i) if lower else (idx[p] < i):
                return i
    return -1


@njit(nogil=True, cache=True)
def unit_lower_solve(ptr, idx, vals, b):
    """b = L^-1 b for L lower triangular with a unit diagonal (its stored diagonal not read)."""
    for i in range(b.size):
        acc = b[i]
        for p in range(ptr[i], ptr[i + 1]):
            j = idx[p]
            if j < i:
                acc -= vals[p] * b[j]
        b[i] = acc


@njit(nogil=True, cache=True)
def upper_solve(ptr, idx, vals, b):
    """b = U^-1 b for U upper triangular; returns the first row whose diagonal is 0 (b is then
    partly solved) or -1."""
    for i in range(b.size - 1, -1, -1):
        acc = b[i]
        diagonal = vals.dtype.type(0)
        for p in range(ptr[i], ptr[i + 1]):
            j = idx[p]
            if j > i:
                acc -= vals[p] * b[j]
            elif j == i:
                diagonal += vals[p]
        if diagonal == 0:
            return i
        b[i] = acc / diagonal
    return -1


def warm_up() -> None:
    for dtype in (np.float64, np.float32):
        for index in (np.int32, np.int64):
            ptr = np.array([0, 2, 4], index)
            idx = np.array([0, 1, 0, 1], index)
            vals = np.array([4, 1, 1, 3], dtype)
            a = Csr(ptr, idx, vals)
            x, y = np.ones(2, dtype), np.empty(2, dtype)
            spmv_dot(a, x, y)
            spmv_into(a, x, y)
            bounds = np.array([0, 2], np.int64)
            _spmv_dot_par(a.ptr, a.idx, a.vals, frozen(x), y, bounds, np.zeros(1))
            spmv_par(a.ptr, a.idx, a.vals, frozen(x), y, bounds)
            packed = pack(a.ptr, a.idx, a.vals)
            assert packed is not None
            _packed_par(*packed, frozen(x), y, bounds)
            _packed_dot_par(*packed, frozen(x), y, bounds, np.zeros(1))
            _packed_dots_par(*packed, frozen(x), y, x, bounds, np.zeros((1, 2)))
            d = diagonal(a.ptr, a.idx, a.vals)
            if index == np.int64:  # solve's, for the factors factorize makes (int64 indices)
                misplaced_row(ptr, idx, True)
                unit_lower_solve(ptr, idx, frozen(vals), y)
                upper_solve(ptr, idx, frozen(vals), y)
            lu, diag_pos, _ = ilu0(a.ptr, a.idx, a.vals)
            ilu0_solve(a.ptr, a.idx, frozen(lu), frozen(diag_pos), x, y)
        r, p, q = np.ones(2, dtype), np.ones(2, dtype), np.ones(2, dtype)
        partial = np.zeros((1, 2))
        for mode in (NONE, JACOBI, GIVEN):
            _cg_update_seq(x, r, p, q, d, 0.5, mode, partial)
            _cg_direction_range(p, r, d, 0.5, mode, 0, 2)
        _cg_update_par(x, r, p, q, d, 0.5, NONE, partial)
        _cg_direction_par(p, r, d, 0.5, NONE)
        for mode in (NONE, JACOBI, GIVEN):
            vectors = BicgVectors(x.copy(), r.copy(), mode, d if mode == JACOBI else np.zeros(0, dtype))
            vectors.direction(0.5, 0.5, True)
            vectors.half(0.5)
            vectors.update(0.5, 0.5)
            args = (0, vectors.x, vectors.r, vectors.p, vectors.v, vectors.t, vectors.rtilde, vectors.dinv,
                    vectors.phat, vectors.shat, 0.5, 0.5, 0.5, True, 0, vectors.partial)
            _bicg_passes_par(*args)
        spmv_dots(a, x, y, r)
        _spmv_dots_par(a.ptr, a.idx, a.vals, frozen(x), y, r, np.array([0, 2], np.int64), np.zeros((1, 2)))
