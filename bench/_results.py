"""Benchmark results as JSON: each benchmark writes ``bench/results/<name>.json`` (its figures,
the machine and the date), from which ``tools/render_bench.py`` renders the README's table and
the plots in ``docs/``. A figure is one row: what was measured, our seconds, and each peer's
seconds on the same data in the same run (a ratio is peer / ours: above 1, sparseserve is
faster)."""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    return {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
            "processor": platform.processor() or platform.machine()}


def record(name: str, rows: list[dict[str, Any]], **params: Any) -> Path:
    """Write one benchmark's rows (and the parameters it ran with) to ``bench/results/<name>.json``."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    body = {"benchmark": name, "date": datetime.date.today().isoformat(), "machine": machine(),
            "params": params, "rows": rows}
    path.write_text(json.dumps(body, indent=1, sort_keys=False) + "\n")
    return path
