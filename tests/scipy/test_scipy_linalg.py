"""scipy's own tests of its sparse solvers, run against ``sparseserve.linalg`` (issue 37, part 3).

The test modules that ship inside the installed scipy (``scipy/sparse/linalg/_isolve/tests``,
``_dsolve/tests``, ``_eigen/arpack/tests``, ``_eigen/tests/test_svds.py``) run in a pytest of
their own, with ``_adapter.py`` as its plugin: scipy's ``cg``, ``bicgstab``, ``gmres``,
``minres``, ``spsolve``, ``factorized``, ``eigsh`` and ``svds`` call ours, the matrix put on the
session's server. Every one of those tests passes, or is listed in ``refused.txt`` with the
reason sparseserve refuses what it asks; a listed test that passes fails this test as much as an
unlisted one that fails, so the list stays exact.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import scipy

HERE = Path(__file__).resolve().parent
SCIPY = Path(scipy.__file__).resolve().parent
EXTRA: list[str] = []
MODULES = ["sparse/linalg/_isolve/tests/test_iterative.py", "sparse/linalg/_isolve/tests/test_minres.py",
           "sparse/linalg/_dsolve/tests/test_linsolve.py", "sparse/linalg/_eigen/arpack/tests/test_arpack.py",
           "sparse/linalg/_eigen/tests/test_svds.py"]


def refused() -> list[tuple[str, re.Pattern, str]]:
    """(pattern, its regex, reason) of each line of refused.txt: ``<test id> | <reason>``, where
    ``*`` in the id stands for any text (scipy's ids hold brackets, which stay literal)."""
    entries = []
    for line in (HERE / "refused.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        pattern, _, reason = (part.strip() for part in line.partition(" | "))
        assert reason, f"refused.txt: {line!r} gives no reason"
        entries.append((pattern, re.compile(".*".join(map(re.escape, pattern.split("*"))) + r"\Z"), reason))
    return entries


def run_scipy_tests(target: str, report: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPARSESERVE_TARGET": target, "SCIPY_ADAPTER_REPORT": str(report),
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    # Its own rootdir and no ini file: scipy's conftest.py (markers, fixtures) applies, ours does not.
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "_adapter", "-p", "no:cacheprovider", "-q", "--tb=no",
                           "--rootdir", str(SCIPY), "--confcutdir", str(SCIPY), "-c", os.devnull, *EXTRA,
                           *(str(SCIPY / m) for m in MODULES)],
                          env=env, cwd=SCIPY, capture_output=True, text=True, timeout=280)


def test_scipy_solver_tests_pass_or_are_refused_for_a_listed_reason(server, tmp_path):
    report = tmp_path / "outcomes.json"
    run = run_scipy_tests(server.grpc_target, report)
    assert report.exists(), f"scipy's tests did not run:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    outcomes = json.loads(report.read_text())
    entries = refused()

    def listed(test: str) -> str | None:
        return next((pattern for pattern, regex, _ in entries if regex.match(test)), None)

    failed = {t: o["why"] for t, o in outcomes.items() if o["outcome"] == "failed"}
    passed = sorted(t for t, o in outcomes.items() if o["outcome"] == "passed")
    unlisted = [f"{t}: {why}" for t, why in sorted(failed.items()) if listed(t) is None]
    listed_passing = [f"{t} (listed as {listed(t)})" for t in passed if listed(t) is not None]
    stale = [pattern for pattern, regex, _ in entries if not any(regex.match(t) for t in failed)]
    print(f"scipy's solver tests against sparseserve.linalg: {len(passed)} pass, {len(failed)} refused "
          f"({len(entries)} reasons listed), {len(outcomes) - len(passed) - len(failed)} skipped by scipy")
    assert not unlisted, "failing, and not in refused.txt:\n" + "\n".join(unlisted)
    assert not listed_passing, "passing now: take them out of refused.txt:\n" + "\n".join(listed_passing)
    assert not stale, "refused.txt lines that match no failing test:\n" + "\n".join(stale)
    assert len(passed) > 100, f"only {len(passed)} of scipy's tests ran and passed: did scipy's modules move?"
