"""The solvers' kernels give the same bits on every CPU (issue 37).

Their sums are written in one order (kernels/solvers.py): a row of the SpMV left to right, a
block of a dot product in four interleaved lanes. Each check below holds the compiled kernels to
that order computed by numpy's sequential ``add.accumulate`` (no vectorised reduction), in this
process and in processes where numba compiles for other CPUs (``NUMBA_CPU_NAME``: ``haswell``
for AVX2, ``skylake-avx512`` for AVX-512, each with its own cache; numpy's OpenBLAS told the
same), and the whole ``cg`` solve of those processes to this one's, bit for bit. A kernel
compiled with fastmath ``reassoc`` fails the row check on the random matrix here (its rows have
30 entries, which the vectoriser splits by its width).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

# numba's name for the CPU, and OpenBLAS's (numpy's BLAS picks its kernels by the CPU too: the
# solvers keep BLAS out of their sums, and this holds them to it).
CPUS = {"haswell": "Haswell", "skylake-avx512": "SkylakeX"}

# Run in this process and in the others: prints a JSON of what each check found.
PROBE = r'''
import json, sys
sys.path[:0] = [sys.argv[1]]
from test_kernels_same_bits import fingerprints
print(json.dumps(fingerprints()))
'''


def poisson(k: int) -> sp.csr_array:
    t = sp.diags_array([-np.ones(k - 1), 2 * np.ones(k), -np.ones(k - 1)], offsets=[-1, 0, 1])
    return sp.csr_array(sp.kron(t, sp.eye_array(k)) + sp.kron(sp.eye_array(k), t))


def sequential(values: np.ndarray) -> float:
    """values summed left to right (numpy's accumulate adds one after another)."""
    return float(np.add.accumulate(values)[-1]) if values.size else 0.0


def row_sums(a: sp.csr_array, x: np.ndarray) -> np.ndarray:
    products = a.data * x[a.indices]
    return np.array([sequential(products[a.indptr[i]:a.indptr[i + 1]]) for i in range(a.shape[0])])


def lane_dot(x: np.ndarray, y: np.ndarray) -> float:
    """x . y as one block of kernels/solvers.py sums it: lane k holds elements i = k mod 4 (the
    tail after the last whole group of four in lane 0), added as (l0 + l1) + (l2 + l3)."""
    whole = x.size // 4 * 4
    products = x * y
    lanes = [sequential(products[k:whole:4]) for k in range(4)]
    if whole < x.size:
        lanes[0] = sequential(np.concatenate([[lanes[0]], products[whole:]]))
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])


def fingerprints() -> dict[str, object]:
    """Each kernel against its written order (True where equal bit for bit), and the bits of a
    whole cg solve on a packed matrix."""
    from sparseserve.kernels import solvers as sk
    from sparseserve import SparseTensor
    from sparseserve.server.ops.solvers import _cg, operator_of

    rng = np.random.default_rng(37)
    found: dict[str, object] = {}
    wide = sp.random_array((3000, 3000), density=0.01, format="csr", rng=rng)  # 30 entries a row
    x = rng.standard_normal(3000)
    y = np.empty(3000)
    sk.spmv_rows(wide.indptr, wide.indices, wide.data, x, y, 0, 3000)
    found["csr rows"] = bool((y == row_sums(wide, x)).all())
    a = poisson(130)  # packed, and big enough for the parallel products
    a.data = a.data * 0.7  # values that round differently in another order
    x = rng.standard_normal(a.shape[0])
    packed = sk.Csr(a.indptr, a.indices, a.data)
    assert packed.packed is not None and packed.parallel
    y = np.empty(a.shape[0])
    dot = sk.spmv_dot(packed, x, y)
    found["packed rows"] = bool((y == row_sums(a, x)).all())
    blocks = [lane_dot(x[lo:lo + sk.BLOCK], y[lo:lo + sk.BLOCK]) for lo in range(0, x.size, sk.BLOCK)]
    found["dot"] = dot == float(np.sum(blocks))
    t = SparseTensor(layout="csr", compressed_indices=a.indptr, plain_indices=a.indices, values=a.data,
                     dense_shape=list(a.shape))
    n = a.shape[0]
    solution, info, iterations = _cg(operator_of(t), np.ones(n), np.zeros(n), 1e-10, 0.0, None, "jacobi")
    found["cg"] = [hashlib.sha256(solution.tobytes()).hexdigest(), int(info), int(iterations)]
    return found


def test_the_kernels_sum_in_their_written_order_here():
    found = fingerprints()
    assert found["csr rows"] and found["packed rows"] and found["dot"], found


@pytest.mark.parametrize("cpu", CPUS)
def test_other_cpus_give_this_ones_bits(cpu, tmp_path):
    """numba compiling for AVX2 and for AVX-512 (a separate cache each): the same bits as here."""
    here = fingerprints()
    env = {**os.environ, "NUMBA_CPU_NAME": cpu, "OPENBLAS_CORETYPE": CPUS[cpu],
           "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    run = subprocess.run([sys.executable, "-c", PROBE, str(Path(__file__).resolve().parent)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    there = json.loads(run.stdout.strip().splitlines()[-1])
    assert there["csr rows"] and there["packed rows"] and there["dot"], there
    assert there["cg"] == here["cg"] and here["cg"][1] == 0
