"""Progress of iterative ops: ExecuteWithProgress on gRPC and ``progress=`` in the SDK, against
real servers, with the plain call of the same solve as the reference."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from conftest import ONE_KERNEL_SLOT
from sparseserve import AsyncClient, Client
from sparseserve.errors import DeadlineExceededError, InvalidArgumentError, UnimplementedError

sp = pytest.importorskip("scipy.sparse")

# A 300 x 300 grid's Poisson matrix: cg to rtol 1e-8 takes about 550 iterations, half a second
# on one core, so a solve spans several 50 ms progress intervals.
GRID = 300
RTOL = 1e-8


def poisson(m: int):
    t = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(m, m))
    return (sp.kron(sp.eye(m), t) + sp.kron(t, sp.eye(m))).tocsr()


@pytest.fixture(scope="module")
def held(server):
    """The Poisson matrix kept on the shared server, a right-hand side, and plain cg's answer."""
    a = poisson(GRID)
    b = np.ones(a.shape[0])
    with Client(server.grpc_target) as c:
        h = c.put(a)
        plain = c.cg(h, b, rtol=RTOL)
        yield h, a, b, plain


@pytest.fixture(scope="module")
def one_worker(shared_server):
    """A server with one kernel slot (tests/server/test_server_overload.py's): work left running after its
    caller went would hold it."""
    return shared_server(*ONE_KERNEL_SLOT)


class Recorder:
    """A progress callback keeping each report and when it came."""

    def __init__(self):
        self.reports: list[dict] = []
        self.times: list[float] = []

    def __call__(self, report: dict) -> None:
        self.reports.append(report)
        self.times.append(time.monotonic())


def check_progress(rec: Recorder, answered: float, plain, watched) -> None:
    x, info, iterations, residual = watched
    assert len(rec.reports) >= 2, rec.reports
    assert {r["op"] for r in rec.reports} == {"cg"}
    steps = [r["iteration"] for r in rec.reports]
    assert steps == sorted(set(steps)) and steps[0] >= 1
    # The first report went out while the solve had most of its iterations ahead (however fast
    # the machine), and arrived before the answer.
    assert steps[0] < int(iterations) // 2 and rec.times[0] < answered, (steps, iterations)
    assert steps[-1] == int(iterations) == int(plain[2])  # the last iteration is always reported
    # The reports carry cg's recurrence residual; the answer's is norm(b - A x), equal to rounding.
    assert rec.reports[-1]["residual_norm"] == pytest.approx(float(residual), rel=1e-4)
    assert int(info) == 0
    np.testing.assert_allclose(x, plain[0], rtol=1e-12, atol=1e-14)


def test_progress_streams_while_cg_runs(server, held):
    handle, a, b, plain = held
    rec = Recorder()
    with Client(server.grpc_target) as c:
        watched = c.cg(handle, b, rtol=RTOL, progress=rec)
        answered = time.monotonic()
        check_progress(rec, answered, plain, watched)
        by_name = c.call("cg", a=handle, b=b, rtol=RTOL, progress=Recorder())
    np.testing.assert_allclose(a @ watched[0], b, atol=1e-5)
    np.testing.assert_allclose(by_name[0], plain[0], rtol=1e-12, atol=1e-14)


def test_async_client_progress_with_a_coroutine_callback(server, held):
    handle, _, b, plain = held
    rec = Recorder()

    async def on_progress(report):
        rec(report)
        await asyncio.sleep(0)

    async def main():
        async with AsyncClient(server.grpc_target) as c:
            watched = await c.cg(handle, b, rtol=RTOL, progress=on_progress)
            return watched, time.monotonic()

    watched, answered = asyncio.run(main())
    check_progress(rec, answered, plain, watched)


def test_the_catalogue_says_which_ops_are_iterative(server):
    for target in (server.grpc_target, server.http_url):
        with Client(target) as c:
            ops = c.list_ops()
            assert ops["cg"]["iterative"] is True
            assert ops["matmul"]["iterative"] is False


def test_a_call_that_is_not_iterative_just_answers(server, held):
    handle, a, b, _ = held
    rec = Recorder()
    with Client(server.grpc_target) as c:
        y = c.call("matmul", a=handle, b=b, progress=rec)
    np.testing.assert_allclose(y, a @ b)
    assert rec.reports == []


def test_errors_end_the_stream_as_execute_answers_them(server, held):
    handle, _, b, _ = held
    with Client(server.grpc_target) as c:
        with pytest.raises(InvalidArgumentError) as plain:
            c.cg(handle, b[:-1])
        with pytest.raises(InvalidArgumentError) as watched:
            c.cg(handle, b[:-1], progress=Recorder())
        assert (watched.value.reason, watched.value.message) == (plain.value.reason, plain.value.message)
        assert watched.value.reason not in ("", "INVALID_ARGUMENT")
        with pytest.raises(TypeError, match="progress must be a callable"):
            c.cg(handle, b, progress=True)
    rec = Recorder()
    with Client(server.grpc_target, timeout=0.5) as c:  # rtol 0: it would run 100,000 iterations
        with pytest.raises(DeadlineExceededError):
            c.cg(handle, b, rtol=0.0, maxiter=100_000, progress=rec)
    assert len(rec.reports) >= 2  # it failed mid-stream, after reporting


def test_rest_refuses_progress_naming_grpc(server, held):
    handle, _, b, _ = held
    with Client(server.http_url) as c:
        with pytest.raises(UnimplementedError, match="progress= on an op call needs the gRPC wire") as err:
            c.cg(handle, b, progress=Recorder())
        assert err.value.reason == "PROGRESS_NEEDS_GRPC"

    async def main():
        async with AsyncClient(server.http_url) as c:
            await c.call("cg", a=handle, b=b, progress=Recorder())

    with pytest.raises(UnimplementedError, match="gRPC"):
        asyncio.run(main())


class Stop(Exception):
    pass


def test_a_cancelled_watch_frees_the_worker(one_worker):
    a, b = poisson(GRID), np.ones(GRID * GRID)
    small, small_b = poisson(20), np.ones(400)

    def stop_at_second(report):
        if report["iteration"] > 1:
            raise Stop

    # timeout: were the abandoned solve still running, the next call would fail in 20 s, not 100.
    with Client(one_worker.grpc_target, timeout=20) as c:
        h = c.put(a)
        with pytest.raises(Stop):  # the callback's error cancels the call
            c.cg(h, b, rtol=0.0, maxiter=100_000, progress=stop_at_second)
        started = time.monotonic()
        x = c.cg(small, small_b)[0]
        # The abandoned solve had ~100 s to go on the only slot: this answer means it stopped.
        assert time.monotonic() - started < 5
        np.testing.assert_allclose(small @ x, small_b, atol=1e-4)

    async def cancelled_then_next():
        async with AsyncClient(one_worker.grpc_target, timeout=20) as c:
            first = asyncio.Event()
            solve = asyncio.ensure_future(c.cg(h, b, rtol=0.0, maxiter=100_000,
                                               progress=lambda report: first.set()))
            await asyncio.wait_for(first.wait(), 30)
            solve.cancel()
            with pytest.raises(asyncio.CancelledError):
                await solve
            started = time.monotonic()
            await c.cg(small, small_b)
            return time.monotonic() - started

    assert asyncio.run(cancelled_then_next()) < 5
