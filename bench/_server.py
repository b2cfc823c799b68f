"""A real ``sparseserve serve`` process for the service benchmarks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


class BenchServer:
    """``sparseserve serve`` on free ports; ``startup_s`` is the time from launch to "ready"."""

    def __init__(self, *flags: str, env_overrides: dict[str, str] | None = None, timeout: float = 300.0):
        start = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sparseserve.cli", "serve", "--grpc-port", "0", "--http-port", "0",
             "--log-level", "warning", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, **(env_overrides or {})})
        events: dict[str, dict] = {}
        deadline = time.monotonic() + timeout
        while "ready" not in events:
            line = self.proc.stdout.readline()
            if not line or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the server did not become ready")
            try:
                event = json.loads(line)
            except ValueError:
                continue
            events[event.get("event")] = event
        self.startup_s = time.perf_counter() - start
        self.grpc_target = f"127.0.0.1:{events['listening']['grpc_port']}"
        self.http_url = f"http://127.0.0.1:{events['listening']['http_port']}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)

    def __enter__(self) -> "BenchServer":
        return self

    def __exit__(self, *_exc) -> None:
        self.stop()
