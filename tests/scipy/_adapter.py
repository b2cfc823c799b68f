"""A pytest plugin that runs scipy's own tests of its sparse solvers against ``sparseserve.linalg``
(issue 37, part 3). Loaded by ``test_scipy_linalg.py`` into a pytest of its own (``-p _adapter``):

- scipy.sparse.linalg's ``cg``, ``bicgstab``, ``gmres``, ``minres``, ``spsolve``, ``factorized``,
  ``eigsh`` and ``svds`` become thin wrappers that put the matrix a test hands them on a real server
  (``SPARSESERVE_TARGET``) and call ``sparseserve.linalg``'s function of the same name with every
  other argument as the test gave it, so scipy's assertions judge our answers and our errors;
- of scipy's test modules only the tests of those functions run (``_selected``);
- each test's outcome is written to ``SCIPY_ADAPTER_REPORT`` (JSON: id -> outcome and, for a
  failure, its last line), which the caller holds to ``refused.txt``.

The wrapper adds nothing of its own: whatever a test passes that ``sparseserve.linalg`` cannot do
(a ``LinearOperator`` as A, a callback, complex values) reaches it and is refused there.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from typing import Any

import numpy as np
import pytest

WRAPPED = ("cg", "bicgstab", "gmres", "minres", "spsolve", "factorized", "eigsh", "svds")
# Where scipy's test modules import them from (each module's own binding is replaced).
MODULES = ("scipy.sparse.linalg", "scipy.sparse.linalg._isolve", "scipy.sparse.linalg._dsolve",
           "scipy.sparse.linalg._eigen", "scipy.sparse.linalg._eigen.arpack")

_state: dict[str, Any] = {"outcomes": {}}


# ------------------------------------------------------------------ the wrappers
@contextlib.contextmanager
def _on_server(A: Any):
    """A as sparseserve.linalg takes it: a scipy sparse matrix or an array is put on the server
    (and deleted after the call); anything else (a LinearOperator) is handed over as it is."""
    import scipy.sparse as sp

    if sp.issparse(A) or isinstance(A, (np.ndarray, list)):
        held = _state["client"].put(A if sp.issparse(A) else sp.csr_array(np.asarray(A)))
        try:
            yield held
        finally:
            held.delete()
    else:
        yield A


def _wrapper(name: str):
    from sparseserve import linalg

    ours = getattr(linalg, name)

    @functools.wraps(ours)  # scipy's test ids name the solver by __name__
    def call(A, *args, **kwargs):
        with _on_server(A) as held:
            return ours(held, *args, **kwargs)
    call.__sparseserve__ = True  # type: ignore[attr-defined]
    return call


def pytest_configure(config):
    import importlib

    from sparseserve import Client

    _state["client"] = Client(os.environ["SPARSESERVE_TARGET"])
    wrappers = {name: _wrapper(name) for name in WRAPPED}
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name, wrapper in wrappers.items():
            if hasattr(module, name):
                setattr(module, name, wrapper)


def pytest_unconfigure(config):
    if "client" in _state:
        _state.pop("client").close()
    report = os.environ.get("SCIPY_ADAPTER_REPORT")
    if report:
        with open(report, "w") as fh:
            json.dump(_state["outcomes"], fh, indent=0, sort_keys=True)


# ------------------------------------------------------------------ which of scipy's tests run
def _ours(fn: Any) -> bool:
    return getattr(fn, "__sparseserve__", False)


def _selected(item: pytest.Item) -> bool:
    """The tests of the wrapped functions alone: in test_iterative.py those whose solver is one
    of ours (scipy's other solvers are not sparseserve's) and TestGMRES; test_minres.py whole;
    in test_linsolve.py spsolve's and factorized's classes (not the test of SuperLU's binding);
    in test_arpack.py eigsh's tests; in test_svds.py the ARPACK, LOBPCG and PROPACK classes (each
    a solver of the server's svds)."""
    module = item.path.name
    name = getattr(item, "originalname", item.name)
    cls = item.cls.__name__ if item.cls is not None else ""
    params = item.callspec.params if hasattr(item, "callspec") else {}
    if module == "test_iterative.py":
        if cls:
            return cls == "TestGMRES"
        if "solver" in params:
            return _ours(params["solver"])
        return "case" in params and _ours(getattr(params["case"], "solver", None))
    if module == "test_minres.py":
        return True
    if module == "test_linsolve.py":  # test_gssv_badinput is of SuperLU's own binding
        return cls in ("TestFactorized", "TestLinsolve") and name != "test_gssv_badinput"
    if module == "test_arpack.py":
        return name in ("test_symmetric_modes", "test_hermitian_modes", "test_symmetric_starting_vector",
                        "test_symmetric_no_convergence", "test_eigsh_for_k_greater")
    if module == "test_svds.py":
        return cls in ("Test_SVDS_once", "Test_SVDS_ARPACK", "Test_SVDS_LOBPCG", "Test_SVDS_PROPACK")
    return False


def pytest_collection_modifyitems(config, items):
    keep = [item for item in items if _selected(item)]
    config.hook.pytest_deselected(items=[item for item in items if not _selected(item)])
    items[:] = keep


# ------------------------------------------------------------------ what each test did
def test_id(nodeid: str) -> str:
    """A test's id without the folders: ``test_iterative.py::test_convergence[poisson1d-cg]``."""
    path, _, rest = nodeid.partition("::")
    return f"{os.path.basename(path)}::{rest}"


def pytest_runtest_logreport(report):
    outcomes = _state["outcomes"]
    key = test_id(report.nodeid)
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        why = crash.message if crash is not None else str(report.longrepr).strip().splitlines()[-1]
        outcomes[key] = {"outcome": "failed", "why": why.splitlines()[0][:300] if why else ""}
    elif report.skipped and key not in outcomes:
        outcomes[key] = {"outcome": "xfailed" if hasattr(report, "wasxfail") else "skipped"}
    elif report.when == "call" and report.passed:
        outcomes[key] = {"outcome": "xpassed" if hasattr(report, "wasxfail") else "passed"}
