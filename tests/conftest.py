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

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent

# The shared test modules (one comparison, one set of inputs): their asserts explain themselves.
pytest.register_assert_rewrite("helpers", "strategies")

# CI (CI=true) draws the same examples on every run, so a landing is judged on the inputs that
# were checked before it; a developer's runs keep drawing new ones and find what is left.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_sessionstart(session):
    """Compile every kernel into numba's disk cache before the first test, so that no test's
    time limit (pytest-timeout's 300 s) has to cover a fresh clone's cold compile (2-5 min, more
    on a loaded machine); servers and in-process tests then load the kernels from the cache
    in seconds. Where the cache is warm this takes those seconds."""
    start = time.monotonic()
    # A cold compile is CPU-bound in one thread: the kernel modules are compiled in two processes
    # at once (a fresh clone's 267 s -> ~150 s on 2 cores), split by source size. A function both
    # compile may keep only one process's signatures in numba's index (each writes it whole), so
    # the full warm-up runs after them, loading the rest and compiling anything missing.
    halves: list[list[str]] = [[], []]
    weights = [0, 0]
    for path in sorted((ROOT / "kernels").glob("*.py"), key=lambda p: -p.stat().st_size):
        if "def warm_up" in path.read_text() and path.stem != "__init__":
            lighter = weights.index(min(weights))
            halves[lighter].append(path.stem)
            weights[lighter] += path.stat().st_size
    code = ("import importlib, sys\nfor name in sys.argv[1:]:\n"
            "    importlib.import_module('sparseserve.kernels.' + name).warm_up()\n")
    workers = [subprocess.Popen([sys.executable, "-c", code, *half], cwd=ROOT) for half in halves if half]
    for worker in workers:
        worker.wait(timeout=1800)
    subprocess.run([sys.executable, "-c", "from sparseserve.kernels import warm_up; warm_up()"],
                   cwd=ROOT, check=True, timeout=1800)
    seconds = time.monotonic() - start
    if seconds > 30:
        print(f"\nkernels compiled into numba's cache in {seconds:.0f} s")


class ServerProcess:
    """``sparseserve serve`` in a child process; ports are read from its "listening" line."""

    def __init__(self, *flags: str, env: dict[str, str] | None = None, wait_ready: bool = True,
                 timeout: float = 120.0):  # kernels load from the cache pytest_sessionstart fills
        cmd = [sys.executable, "-m", "sparseserve.cli", "serve", "--grpc-port", "0", "--http-port", "0",
               "--log-level", "warning", *flags]
        self.events: list[dict] = []
        self.stderr_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"sparseserve-{os.getpid()}-{id(self)}.log"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr,
                                     env={**os.environ, **(env or {})}, cwd=ROOT)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
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
    srv = ServerProcess()
    yield srv
    code = srv.stop()
    assert code == 0, f"server exited with {code}: {srv.log()}"


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
