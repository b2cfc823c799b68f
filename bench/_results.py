"""Benchmark results as JSON: each benchmark writes ``bench/results/<name>.json``, from which
``tools/render_bench.py`` renders the README's table, the full tables of docs/performance.md and
the plot in docs/.

A file holds ``benchmark`` (its name), ``command`` (how it was run), ``about`` (what it
measures, one paragraph), ``date``, ``machine`` (the CPU and the versions of the libraries
loaded), ``params`` (what it ran with: scale, repeats, sizes) and ``rows``. A row, as ``figure``
makes it, is one measure: ``case`` (what was measured; the README's table picks its rows by
case and peer), ``unit`` ("s", or a rate: "GB/s", "calls/s"), ``ours``, and where it was
compared, ``peer`` (the contender's name), ``peer_value`` (its figure on the same data in the
same run) and ``ratio``: how many times faster sparseserve is (peer's time / ours, or our rate /
the peer's; above 1, sparseserve is faster); then ``sizes`` (the counts the case ran at) and,
where useful, a ``note``.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

# Figures where more is better; every other unit is a time.
RATE_UNITS = frozenset({"GB/s", "calls/s"})

_LIBRARIES = ("numpy", "numba", "scipy", "torch", "tensorflow", "grpc", "distributed")


def figure(case: str, ours: float, peer: str | None = None, peer_value: float | None = None, *,
           unit: str = "s", sizes: dict[str, int] | None = None, note: str | None = None) -> dict[str, Any]:
    """One row of results; the ratio is computed here so that every file means the same by it."""
    row: dict[str, Any] = {"case": case, "unit": unit, "ours": ours}
    if peer is not None:
        faster = ours / peer_value if unit in RATE_UNITS else peer_value / ours
        row.update(peer=peer, peer_value=peer_value, ratio=faster)
    row["sizes"] = sizes or {}
    if note:
        row["note"] = note
    return row


def machine() -> dict[str, Any]:
    """What the figures were measured on: the CPU, the versions of the libraries loaded, and the
    load average over the last 1, 5 and 15 minutes as the run ends (the cores may be shared with
    other work; the benchmark's own threads count in it)."""
    versions = {name: sys.modules[name].__version__ for name in _LIBRARIES if name in sys.modules}
    return {"cpu": _cpu_model(), "cpus": os.cpu_count(), "machine": platform.machine(),
            "python": platform.python_version(), "libraries": versions,
            "load": [round(load, 2) for load in os.getloadavg()]}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):  # not Linux
        return platform.processor() or platform.machine()


def _command() -> str:
    """How this run was started: ``python -m bench.segment --scale 0.1``."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    start = ["python", "-m", spec.name.removesuffix(".__main__")] if spec else ["python", sys.argv[0]]
    return " ".join(start + sys.argv[1:])


def record(name: str, rows: list[dict[str, Any]], /, *, about: str = "", **params: Any) -> Path:
    """Write one benchmark's rows (and the parameters it ran with) to ``bench/results/<name>.json``."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    body = {"benchmark": name, "command": _command(), "about": about, "date": datetime.date.today().isoformat(),
            "machine": machine(), "params": params, "rows": rows}
    path.write_text(json.dumps(body, indent=1, ensure_ascii=False) + "\n")
    return path
