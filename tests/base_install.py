"""The base install (the SDK alone) in a subprocess: ``run_without_server_packages`` runs a snippet
with the server's (and optional peers') packages, ``BLOCKED``, made unimportable.

Imported as ``from base_install import ...`` by tests/deploy/test_deploy_packaging.py and
tests/sdk/test_sdk_cli.py (pytest puts ``tests/`` on the path for ``conftest.py``).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

# Run a snippet with the server's (and optional peers') packages made unimportable.
BLOCKED = ("numba", "llvmlite", "fastapi", "uvicorn", "starlette", "pydantic", "scipy", "torch",
           "grpc_health", "grpc_reflection", "orjson")
_BLOCKER = f"""
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError(f"{{name}} is blocked: not part of the base install")
sys.meta_path.insert(0, _Block())
"""


def run_without_server_packages(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _BLOCKER + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120)
