"""Shared fixtures: a real ``sparseserve serve`` process on free ports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from queue import Empty, Queue

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent

# The shared test modules (one comparison, one set of inputs) and the folders' shared helpers
# (ops/_compressed.py, gpu/_gpu_calls.py, oracle/_oracle.py): their asserts explain themselves.
pytest.register_assert_rewrite("helpers", "strategies", "_compressed", "_gpu_calls", "_oracle")

# CI (CI=true) draws the same examples on every run, so a landing is judged on the inputs that
# were checked before it; a developer's runs keep drawing new ones and find what is left.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


# What the session starts before the tests need it: the final kernel warm-up, the session's server.
_early: dict = {}

# A worker of pytest_sessionstart: warms up the kernel module named on each line of its stdin,
# then answers with a line of how many signatures numba had to compile so far (not in its cache).
_WARM_UP_WORKER = """
import importlib, sys
from numba.core.registry import CPUDispatcher
for name in sys.stdin:
    importlib.import_module('sparseserve.kernels.' + name.strip()).warm_up()
    kernels = [m for key, m in list(sys.modules.items()) if key.startswith('sparseserve.kernels.')]
    print(sum(sum(d.stats.cache_misses.values()) for m in kernels for d in vars(m).values()
              if isinstance(d, CPUDispatcher)), flush=True)
"""


def pytest_sessionstart(session):
    """Compile every kernel into numba's disk cache before the first test, so that no test's
    time limit (pytest-timeout's 300 s) has to cover a fresh clone's cold compile (2-5 min, more
    on a loaded machine); servers and in-process tests then load the kernels from the cache
    in seconds. Where the cache is warm this takes those seconds.

    With pytest-xdist (``make test`` runs ``-n 2``) the controller compiles, and waits for the
    final warm-up, before its workers start; they find the cache warm."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    start = time.monotonic()
    # A cold compile is CPU-bound in one thread: two processes (more where there are the cores)
    # compile the kernel modules at once, each taking the next module, largest source first, when
    # it is done with one. Their compile times differ fourfold whatever their size, so a split
    # made beforehand left one process idle for a fifth of a fresh clone's compile.
    modules: Queue[str] = Queue()
    for path in sorted((ROOT / "kernels").glob("*.py"), key=lambda p: -p.stat().st_size):
        if "def warm_up" in path.read_text() and path.stem != "__init__":
            modules.put(path.stem)
    compiled: list[int] = []  # the workers' answers: anything but zeros means something was compiled

    def drive(worker: subprocess.Popen) -> None:
        assert worker.stdin is not None and worker.stdout is not None
        with worker.stdin, worker.stdout:
            while True:
                try:
                    name = modules.get_nowait()
                except Empty:
                    return
                worker.stdin.write(name + "\n")
                worker.stdin.flush()
                answer = worker.stdout.readline()
                if not answer:  # it failed (its error is on stderr): the full warm-up after says so
                    compiled.append(1)
                    return
                compiled.append(int(answer))

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2
    count = max(2, min(4, cores))
    workers = [subprocess.Popen([sys.executable, "-c", _WARM_UP_WORKER], cwd=ROOT, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE) for _ in range(count)]
    drivers = [threading.Thread(target=drive, args=(worker,)) for worker in workers]
    for thread in drivers:
        thread.start()
    for thread, worker in zip(drivers, workers):
        thread.join()
        worker.wait(timeout=1800)
    # A function two workers compiled may keep only one's signatures in numba's index (each writes
    # it whole): where anything was compiled, a full warm-up loads the rest and compiles what is
    # missing. Where all came from the cache, it has every signature already.
    if any(compiled):  # pytest collects the tests meanwhile (seconds on one core)
        _early["warm_up"] = subprocess.Popen(
            [sys.executable, "-c", "from sparseserve.kernels import warm_up; warm_up()"], cwd=ROOT)
        if session.config.pluginmanager.hasplugin("dsession"):  # xdist's controller collects nothing
            _finish_warm_up()
    seconds = time.monotonic() - start
    if seconds > 30:
        print(f"\nkernels compiled into numba's cache in {seconds:.0f} s")


def pytest_collection(session):
    # The session's server starts (~4 s, most of it on a core of its own) while pytest collects.
    _early["server"] = ServerProcess(wait=False)


def _finish_warm_up() -> None:
    warm_up = _early.pop("warm_up", None)
    if warm_up is not None and warm_up.wait(timeout=1800) != 0:
        raise subprocess.CalledProcessError(warm_up.returncode, warm_up.args)


# make test's two processes each take whole files, in the order collected (--no-loadscope-reorder):
# the folders whose files run longest (scipy's own suites, one test of 45 s; a real server each,
# Dask clusters) go first, so that the many short files fill the end and neither process is left
# alone on a long one (xdist's own order, by number of tests, ran scipy's last, alone).
LONG_FIRST = ("scipy", "server", "sdk")


def pytest_collection_modifyitems(session, config, items):
    def rank(item) -> int:
        folder = item.path.parent.name
        return LONG_FIRST.index(folder) if folder in LONG_FIRST else len(LONG_FIRST)
    items.sort(key=rank)  # stable: each file's own order kept


def pytest_collection_finish(session):
    _finish_warm_up()
    needed = not session.config.option.collectonly and any("server" in getattr(item, "fixturenames", ())
                                                               for item in session.items)
    if not needed:
        _early.pop("server").stop(signal.SIGKILL)


def pytest_sessionfinish(session):
    # What was started early and never used (when collection failed, say) ends with the session.
    if (srv := _early.pop("server", None)) is not None:
        srv.stop(signal.SIGKILL)
    if (warm_up := _early.pop("warm_up", None)) is not None:
        warm_up.wait()


class ServerProcess:
    """``sparseserve serve`` in a child process; ports are read from its "listening" line.

    Started with ``--no-warm-up`` unless the flags say ``--warm-up``: a server loads its kernels
    from the numba cache pytest_sessionstart filled as its calls first need them, rather than all
    of them (about 4 s of a core per server, some 60 servers a run) before it is ready. The tests
    of warming up and readiness ask for the warm-up."""

    def __init__(self, *flags: str, env: dict[str, str] | None = None, wait_ready: bool = True,
                 timeout: float = 120.0,  # kernels load from the cache pytest_sessionstart fills
                 wait: bool = True):  # False: started(...) waits for it later
        warm_up = () if {"--warm-up", "--no-warm-up"} & set(flags) else ("--no-warm-up",)
        cmd = [sys.executable, "-m", "sparseserve.cli", "serve", "--grpc-port", "0", "--http-port", "0",
               "--log-level", "warning", *warm_up, *flags]
        self.events: list[dict] = []
        self.stderr_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"sparseserve-{os.getpid()}-{id(self)}.log"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr,
                                     env={**os.environ, **(env or {})}, cwd=ROOT)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if wait:
            self.started(wait_ready, timeout)

    def started(self, wait_ready: bool = True, timeout: float = 120.0) -> ServerProcess:
        """Wait for the "listening" line (and with ``wait_ready`` the "ready" one); its ports."""
        try:
            listening = self.wait_for("listening", timeout)
            self.grpc_port = listening["grpc_port"]
            self.http_port = listening["http_port"]
            self.grpc_target = f"127.0.0.1:{self.grpc_port}"
            self.http_url = f"http://127.0.0.1:{self.http_port}"
            if wait_ready:
                self.wait_for("ready", timeout)
        except BaseException:  # a server that never got ready must not outlive the test run
            self.proc.kill()
            self.proc.wait()
            raise
        return self

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.events.append(json.loads(line))
            except ValueError:
                pass

    def wait_for(self, event: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.events:
                if e.get("event") == event:
                    return e
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()}")
            time.sleep(0.05)
        raise TimeoutError(f"no {event!r} event within {timeout} s: {self.log()}")

    def log(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")[-4000:]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()
        return self.proc.returncode


@pytest.fixture(params=["numpy-stand-in", "cupy"])
def array_backend(request):
    """The GPU backend twice: numpy and scipy.sparse standing in for CuPy (always), and CuPy
    itself, which skips with the reason where CuPy or a GPU is missing."""
    from sparseserve.server.device import ArrayBackend, GpuUnavailable

    if request.param == "numpy-stand-in":
        return ArrayBackend.numpy_stand_in()
    try:
        return ArrayBackend.cupy()
    except GpuUnavailable as exc:
        pytest.skip(f"no CuPy GPU backend here: {exc}")


@pytest.fixture(scope="session")
def server():
    srv = (_early.pop("server", None) or ServerProcess(wait=False)).started()
    yield srv
    code = srv.stop()
    assert code == 0, f"server exited with {code}: {srv.log()}"


# Flags more than one module's server has: shared_server starts one server for them all.
ONE_KERNEL_SLOT = ("--workers", "1", "--max-concurrency", "1", "--max-queue", "2")  # overload, solver_progress
ONE_TOKEN = "one-test-token"
ONE_TOKEN_INFO_LOGS = ("--log-level", "info", "--token", ONE_TOKEN)  # observability, docs_offline


@pytest.fixture(scope="session")
def shared_server():
    """``shared_server(*flags)``: one server per set of flags for the whole session, so that
    modules wanting the same flags share it instead of each starting one (3-5 s a start). Use it
    only for a server no test stops or breaks; each is stopped, and must exit 0, at the end."""
    started: dict[tuple[str, ...], ServerProcess] = {}

    def get(*flags: str) -> ServerProcess:
        if flags not in started:
            started[flags] = ServerProcess(*flags)
        return started[flags]

    yield get
    for flags, srv in started.items():
        code = srv.stop()
        assert code == 0, f"server {flags} exited with {code}: {srv.log()}"


# The three ways the SDK can reach a server.
WIRES = ("grpc", "rest-protobuf", "rest-json")


def make_client(server: ServerProcess, wire: str, **kwargs):
    from sparseserve import Client

    if wire == "grpc":
        return Client(server.grpc_target, **kwargs)
    return Client(server.http_url, encoding="protobuf" if wire == "rest-protobuf" else "json", **kwargs)


@pytest.fixture(params=WIRES)
def client(request, server):
    with make_client(server, request.param) as c:
        yield c


def pytest_configure(config):
    _hold_plans_to_results()


def _hold_plans_to_results() -> None:
    """Every op call this process makes (the in-process tests of ops/, oracle/, gpu/, kernels/)
    also checks that its check's plan says what the CPU kernel made: the first output's dtype,
    layout and shape, where the plan names them. Servers are processes of their own."""
    import numpy as np

    from sparseserve import SparseTensor
    from sparseserve.server.registry import OpDef

    real = OpDef.run_plan

    def run_plan(self, device, plan):
        outputs = real(self, device, plan)
        out = outputs[0]
        if device == "cpu" and not isinstance(out, list):
            sparse = isinstance(out, SparseTensor)
            made = (out.layout if sparse else "dense", np.dtype(out.dtype),
                    tuple(out.dense_shape) if sparse else tuple(np.shape(out)))
            said = (plan.layout, plan.dtype, plan.shape)
            for what, got, want in zip(("layout", "dtype", "shape"), made, said):
                assert want is None or got == want, f"{self.name}'s plan says {what} {want}, its kernel made {got}"
        return outputs

    OpDef.run_plan = run_plan  # type: ignore[method-assign]


def run_op(name: str, **kwargs):
    """Bind and run a registered op in-process, as the server does (one output, or a tuple)."""
    from sparseserve.server.ops import REGISTRY

    op = REGISTRY.get(name)
    out = op.run("cpu", op.bind(kwargs))
    return out if len(out) > 1 else out[0]


def op_raises(cls, reason: str, name: str, **kwargs):
    """Run an op expecting ``cls`` with ``reason``; returns the error."""
    with pytest.raises(cls) as info:
        run_op(name, **kwargs)
    assert info.value.reason == reason, info.value
    return info.value
