"""The Open Inference Protocol's (KServe v2) health and metadata paths, beside /healthz and /readyz:
the same answers, in the protocol's form, and like them (and the API docs) open without a token."""

from __future__ import annotations

import re
import signal
from importlib.metadata import version

import httpx
import pytest
from conftest import ServerProcess
from test_server_docs_offline import page_references

TOKEN = "health-test-token"


def test_a_ready_server_is_live_and_ready_on_both_paths(server):
    base = server.http_url
    assert httpx.get(f"{base}/healthz").status_code == 200
    live = httpx.get(f"{base}/v2/health/live")
    assert (live.status_code, live.json()) == (200, {"live": True})
    assert httpx.get(f"{base}/readyz").status_code == 200
    ready = httpx.get(f"{base}/v2/health/ready")
    assert (ready.status_code, ready.json()) == (200, {"ready": True})


def test_server_metadata_names_the_server_and_its_version(server):
    metadata = httpx.get(f"{server.http_url}/v2")
    assert metadata.status_code == 200 and metadata.headers["content-type"] == "application/json"
    assert metadata.json() == {"name": "sparseserve", "version": version("sparseserve"), "extensions": []}


def test_from_a_source_tree_the_version_is_the_packages_own(monkeypatch):
    """A server run with no installed distribution (the package on sys.path, as on a GPU host
    that could not pip install) still serves /v2, with sparseserve.__version__."""
    from importlib.metadata import PackageNotFoundError

    import sparseserve
    from sparseserve.server import rest_wire

    def missing(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(rest_wire, "installed_version", missing)
    assert rest_wire._version() == sparseserve.__version__ == version("sparseserve")


@pytest.fixture(scope="module")
def warming(tmp_path_factory):
    """A server with --token that is up but not ready: with an empty numba cache its warm-up
    compiles every kernel, which takes minutes; the tests run in its first seconds."""
    cold_cache = tmp_path_factory.mktemp("cold-numba-cache")
    srv = ServerProcess("--token", TOKEN, "--warm-up", env={"NUMBA_CACHE_DIR": str(cold_cache)}, wait_ready=False)
    yield srv
    srv.stop(signal.SIGKILL)  # a clean stop would wait for the compile to finish


def test_a_warming_server_is_live_but_not_ready_on_both_paths(warming):
    base = warming.http_url
    assert httpx.get(f"{base}/healthz").status_code == 200
    live = httpx.get(f"{base}/v2/health/live")
    assert (live.status_code, live.json()) == (200, {"live": True})
    assert httpx.get(f"{base}/readyz").json() == {"status": "warming up", "device": "cpu"}
    ready = httpx.get(f"{base}/v2/health/ready")
    # The protocol: 200 means true, a 4xx false.
    assert (ready.status_code, ready.json()) == (400, {"ready": False})
    assert not any(e.get("event") == "ready" for e in warming.events), "the server got ready during the test"


def test_probes_metadata_and_docs_need_no_token(warming):
    base = warming.http_url
    assert httpx.get(f"{base}/v1/ops").status_code == 401  # the token is required elsewhere
    assets = page_references(base, "/docs") + page_references(base, "/redoc")
    for path in ["/healthz", "/v2/health/live", "/v2", "/docs", "/redoc", "/openapi.json", *assets]:
        response = httpx.get(f"{base}{path}")
        assert response.status_code == 200, (path, response.status_code, response.text[:200])
    # Each has its own label in the request metrics; the docs' files count as "docs".
    metrics = httpx.get(f"{base}/metrics").text
    ops = set(re.findall(r'sparseserve_requests_total\{[^}]*op="([^"]+)"', metrics))
    assert {"list_ops", "healthz", "v2_live", "v2_metadata", "docs", "openapi"} <= ops and "unknown" not in ops, ops
