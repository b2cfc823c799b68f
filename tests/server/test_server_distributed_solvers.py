"""Solvers on a partitioned matrix (``--dask-scheduler``): ``cg`` and ``bicgstab`` iterate on the
replica while each product runs on the workers holding the blocks (``partition.Krylov``,
``cluster.BlockOperator``). Against the single-node op on the same matrix: the same x, info,
iterations and residual bit for bit in process (the sums are taken in the same order), with
blocks of very uneven sizes, a COO matrix, a block of right-hand sides and x0; the matrix is
never gathered (the replica's --max-result-bytes is below its size); the single-node checks
and messages; ilu0 refused; the actors gone after a solve; a real server over both wires, with
progress and a deadline passing mid-solve. A LocalCluster of 2 worker processes on loopback.
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np
import pytest
import scipy.sparse as sp

from distributed import Client, LocalCluster

from sparseserve import SparseTensor
from sparseserve.core.tensor import HandleRef
from sparseserve.errors import (DeadlineExceededError, InvalidArgumentError, ResourceExhaustedError,
                                UnimplementedError)
from sparseserve.server.config import ServerConfig
from sparseserve.server.metrics import SOLVER_ITERATIONS
from sparseserve.server.ops import REGISTRY
from sparseserve.server.service import Service

from conftest import ServerProcess, make_client, run_op
from helpers import eventually

pytestmark = pytest.mark.timeout(300)

# Below every matrix's size here: a partitioned matrix the replica tried to gather would be
# refused (RESULT_TOO_LARGE), so an answer shows the products ran on the blocks.
GATHER_LIMIT = 16 << 10


def poisson(k: int) -> sp.csr_array:
    t = sp.diags_array([-np.ones(k - 1), 2 * np.ones(k), -np.ones(k - 1)], offsets=[-1, 0, 1])
    return sp.csr_array(sp.kron(t, sp.eye_array(k)) + sp.kron(sp.eye_array(k), t))


def arrow(n: int) -> sp.csr_array:
    """SPD (diagonally dominant), its first row full (a fifth of the entries). Tridiagonal besides,
    so that Jacobi does not leave a rank-2 change of the identity (cg would take 3 iterations)."""
    diagonals = [-np.ones(n - 1), 4.0 + np.arange(n) % 17, -np.ones(n - 1)]
    a = sp.lil_array(sp.diags_array(diagonals, offsets=[-1, 0, 1]))
    a[0, :] = 1.0
    a[:, 0] = 1.0
    a[0, 0] = 2.0 * n
    return sp.csr_array(a)


def csr(a) -> SparseTensor:
    a = sp.csr_array(a)
    return SparseTensor(layout="csr", compressed_indices=a.indptr.astype(np.int64),
                        plain_indices=a.indices.astype(np.int64), values=a.data, dense_shape=list(a.shape))


def coo_shuffled(a) -> SparseTensor:
    """COO with its entries in a random order: the blocks convert their own rows to CSR."""
    c = sp.coo_array(a)
    order = np.random.default_rng(3).permutation(c.nnz)
    return SparseTensor(indices=np.stack([c.row, c.col], axis=1)[order].astype(np.int64), values=c.data[order],
                        dense_shape=list(a.shape))


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=logging.CRITICAL, memory_limit="2GiB") as c:
        yield c


@pytest.fixture(scope="module")
def starting(cluster):
    """A real server on the cluster, started at once: it warms up while the tests in process run."""
    srv = ServerProcess("--dask-scheduler", cluster.scheduler_address, "--max-result-bytes", str(GATHER_LIMIT),
                        wait_ready=False)
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def dask(cluster):
    with Client(cluster.scheduler_address, set_as_default=False) as client:
        yield client


@pytest.fixture(scope="module")
def service(cluster, starting):
    s = Service(ServerConfig(dask_scheduler=cluster.scheduler_address, max_result_bytes=GATHER_LIMIT), REGISTRY)
    yield s
    s.close()


def put(svc: Service, tensor, partitions: int = 3) -> HandleRef:
    return HandleRef(asyncio.run(svc.put(tensor, "", partitions))[0])


def solve(svc: Service, op: str, **args) -> dict:
    return dict(asyncio.run(svc.execute(op, args, False, "")))


def actors(dask: Client) -> list[str]:
    """The solver actors the scheduler still holds."""
    return dask.run_on_scheduler(lambda dask_scheduler: [
        str(k) for k in dask_scheduler.tasks if str(k).startswith("SolverRows")])


# ------------------------------------------------------------------ in process: the answers
@pytest.mark.parametrize("op,matrix,preconditioner", [
    ("cg", "poisson", "none"), ("cg", "poisson", "jacobi"), ("cg", "arrow", "none"), ("cg", "arrow", "jacobi"),
    ("cg", "arrow-coo", "jacobi"), ("cg", "poisson-float32", "jacobi"), ("bicgstab", "poisson", "none"),
    ("bicgstab", "arrow", "jacobi")])
def test_partitioned_solve_equals_single_node(service, dask, op, matrix, preconditioner):
    a = poisson(20) if matrix.startswith("poisson") else arrow(700)
    tensor = coo_shuffled(a) if matrix.endswith("coo") else csr(a.astype(np.float32) if "32" in matrix else a)
    handle = put(service, tensor, partitions=5 if matrix == "arrow" else 3)
    bounds = service.cluster.lookup(handle.handle, "").bounds
    if matrix == "arrow":  # cut by stored entries: the full first row alone, then 175 rows a block
        assert bounds == [0, 1, 176, 351, 526, 700]
    b = np.random.default_rng(1).standard_normal(a.shape[0]).astype(tensor.dtype)  # float32: solved in float32
    before = SOLVER_ITERATIONS.totals.get(op, 0)
    rtol = 1e-5 if tensor.dtype == np.float32 else 1e-10
    got = solve(service, op, a=handle, b=b, preconditioner=preconditioner, rtol=rtol)
    counted = SOLVER_ITERATIONS.totals[op] - before
    x, info, iterations, residual = run_op(op, a=tensor, b=b, preconditioner=preconditioner, rtol=rtol)
    assert got["x"].dtype == x.dtype == tensor.dtype
    np.testing.assert_array_equal(got["x"], x)  # the same sums in the same order: bit for bit
    assert (got["info"], got["iterations"], got["residual_norm"]) == (info, iterations, residual)
    assert info == 0 and iterations > 5
    assert counted == iterations  # in /metrics, as a single node's solve
    eventually(lambda: not actors(dask))  # one solve's actors go with it


def test_a_block_of_right_hand_sides_and_x0(service):
    a = arrow(700)
    handle = put(service, csr(a))
    rng = np.random.default_rng(2)
    b, x0 = rng.standard_normal((700, 3)), rng.standard_normal((700, 3))
    got = solve(service, "cg", a=handle, b=b, x0=x0, preconditioner="jacobi", rtol=1e-10)
    want = run_op("cg", a=csr(a), b=b, x0=x0, preconditioner="jacobi", rtol=1e-10)
    for name, value in zip(("x", "info", "iterations", "residual_norm"), want):
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    assert got["x"].shape == (700, 3) and (got["info"] == 0).all()
    np.testing.assert_allclose(a @ got["x"], b, atol=1e-8)
    kept = dict(asyncio.run(service.execute("cg", {"a": handle, "b": b, "x0": x0, "preconditioner": "jacobi",
                                                   "rtol": 1e-10}, True, "")))
    assert all(isinstance(h, HandleRef) for h in kept.values())  # kept in the replica's store, as any answer
    np.testing.assert_array_equal(asyncio.run(service.get(kept["x"].handle, "")), got["x"])


def test_the_matrix_is_never_gathered(service):
    handle = put(service, csr(poisson(20)))
    assert service.cluster.lookup(handle.handle, "").nbytes > GATHER_LIMIT
    with pytest.raises(ResourceExhaustedError) as err:  # gmres has no plan: it would gather
        solve(service, "gmres", a=handle, b=np.ones(400))
    assert err.value.reason == "RESULT_TOO_LARGE"
    assert solve(service, "cg", a=handle, b=np.ones(400))["info"] == 0


# ------------------------------------------------------------------ in process: the checks
def test_bad_input_gets_the_single_node_errors(service, dask):
    square = put(service, csr(poisson(20)))
    not_square = put(service, csr(sp.random_array((60, 40), density=0.2, rng=0) + sp.eye_array(60, 40)))
    cases = [({"a": not_square, "b": np.ones(60)}, "NOT_SQUARE", "[60, 40]"),
             ({"a": square, "b": np.ones(399)}, "SHAPE_MISMATCH", "[400]"),
             ({"a": square, "b": np.r_[np.ones(399), np.inf]}, "NOT_FINITE", "b"),
             ({"a": square, "b": np.ones(400), "preconditioner": "ilu"}, "BAD_PRECONDITIONER", "preconditioner")]
    for args, reason, named in cases:
        for op in ("cg", "bicgstab"):
            with pytest.raises(InvalidArgumentError) as err:
                solve(service, op, **args)
            assert err.value.reason == reason and named in err.value.message, err.value
    with pytest.raises(UnimplementedError) as unimplemented:
        solve(service, "cg", a=square, b=np.ones(400), preconditioner="ilu0")
    assert unimplemented.value.reason == "PRECONDITIONER_NOT_PARTITIONED"
    assert "'ilu0'" in unimplemented.value.message and "partitioned" in unimplemented.value.message
    # A zero on the diagonal, found by the blocks: named by its row in the whole matrix.
    holed = poisson(20).tolil()
    holed[350, 350] = 0.0
    with pytest.raises(InvalidArgumentError) as err:
        solve(service, "cg", a=put(service, csr(holed)), b=np.ones(400), preconditioner="jacobi")
    assert err.value.reason == "SINGULAR_PRECONDITIONER" and "a[350, 350]" in err.value.message
    eventually(lambda: not actors(dask))


def test_x0_mb_and_a_matrix_m_on_a_partitioned_matrix(service, dask):
    """scipy's x0='Mb' starts from M @ b there too (the blocks' Jacobi), bit for bit the single
    node's solve; a matrix M is refused, as ilu0 is."""
    a = arrow(700)
    handle = put(service, csr(a))
    b = np.random.default_rng(5).standard_normal(700)
    got = solve(service, "cg", a=handle, b=b, x0_mb=True, preconditioner="jacobi", rtol=1e-10)
    want = run_op("cg", a=csr(a), b=b, x0_mb=True, preconditioner="jacobi", rtol=1e-10)
    for name, value in zip(("x", "info", "iterations", "residual_norm"), want):
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    with pytest.raises(UnimplementedError) as err:
        solve(service, "cg", a=handle, b=b, m=csr(sp.eye_array(700)))
    assert err.value.reason == "PRECONDITIONER_NOT_PARTITIONED" and "m (a preconditioner matrix)" in err.value.message
    eventually(lambda: not actors(dask))


# ------------------------------------------------------------------ a real server
@pytest.fixture(scope="module")
def served(starting):
    starting.wait_for("ready", 120)
    return starting


def test_over_both_wires_with_progress(served):
    a = poisson(20)
    b = np.random.default_rng(5).standard_normal(400)
    want = run_op("cg", a=csr(a), b=b, preconditioner="jacobi")
    reports: list[dict] = []
    with make_client(served, "grpc") as grpc_client, make_client(served, "rest-json") as rest_client:
        handle = grpc_client.put(csr(a), partitions=3)
        watched = grpc_client.cg(handle, b, preconditioner="jacobi", progress=reports.append)
        for got in (watched, rest_client.cg(handle, b, preconditioner="jacobi")):
            np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=0)
            assert (int(got[1]), int(got[2])) == (0, int(want[2]))
            assert float(got[3]) == pytest.approx(float(want[3]), rel=1e-12)
        steps = [r["iteration"] for r in reports]
        assert steps == sorted(set(steps)) and steps[-1] == int(want[2]), steps


def test_a_deadline_mid_solve_abandons_it_and_frees_the_actors(served, dask):
    with make_client(served, "grpc", timeout=1.5) as c:
        handle = c.put(csr(poisson(20)), partitions=3)
        start = time.monotonic()
        with pytest.raises(DeadlineExceededError):  # rtol = atol = 0: it would run 1,000,000 iterations
            c.cg(handle, np.ones(400), rtol=0.0, maxiter=1_000_000)
        assert time.monotonic() - start < 5
        eventually(lambda: not actors(dask))
        x, info, _, _ = c.cg(handle, np.ones(400))  # the server goes on answering
        assert int(info) == 0
