"""The monitoring files agree with the server: deploy/grafana/sparseserve.json (the Grafana
dashboard), its provisioning, deploy/prometheus/prometheus.yml and compose's ``monitoring``
profile (docs/monitoring.md).

- Every panel's and template variable's PromQL parses (``promql-parser``, Rust's PromQL parser
  bound for Python), and every metric it selects is one a real server exports: a server on a
  Dask cluster (so the partitioned tensors' gauges are there too), read at ``GET /metrics`` with
  prometheus_client's text parser after calls on both wires, a failing one and a partitioned put,
  so that the series made on first use exist. Histograms count as their ``_bucket``, ``_sum``
  and ``_count`` series and counters as ``_total``, as Prometheus stores them. Every label a
  selector matches or an aggregation keeps is one those metrics carry (or a target label), so
  no panel can ask for a tenant, which /metrics never names (docs/security.md). Every family
  the server exports has a panel, and docs/monitoring.md lists every panel and names no metric
  the server lacks.
- The partitioned tensors' gauges, which the Dask panels show, follow a put, a delete and an
  eviction by --dask-store-bytes.
- Device fallbacks happen on GPU workers only: their family's labels are read from the
  server's own ``Metrics`` after one ``count_fallback``, as the GPU backend reports it.
- ``docker compose --profile monitoring config`` (the real Compose v2 binary, as in
  tests/deploy/test_deploy.py) runs Prometheus and Grafana from pinned images, mounts these files
  where the configurations expect them, hands Prometheus the workers' metrics token, and leaves
  a plain ``up`` as it was. Prometheus finds exactly the compose services that run the server,
  on the REST port; Grafana's datasource is that Prometheus.
- ``promtool check config`` (Debian's prometheus package, its promtool taken out of the .deb
  into .cache/; skipped, saying why, where apt-get cannot fetch it) accepts the scrape config,
  and ``promtool check metrics`` finds nothing to say about the server's exposition.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from sparseserve import SparseTensor
from sparseserve.errors import NotFoundError
from sparseserve.server.config import ServerConfig

from conftest import ROOT, ServerProcess, make_client
from test_deploy import docker_compose, run_tool

DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "sparseserve.json"
PROVISIONING = DEPLOY / "grafana" / "provisioning"
PROMETHEUS_YML = DEPLOY / "prometheus" / "prometheus.yml"
HTTP_PORT = ServerConfig().http_port
MONITORING = {"prometheus", "grafana"}
# Series Prometheus makes itself for every target, which a panel may use.
PROMETHEUS_OWN: dict[str, set[str]] = {"up": set()}
# Labels Prometheus attaches to every series of a target (prometheus.yml's job and relabelling).
TARGET_LABELS = {"job", "instance"}
# What Grafana puts in place of its variables before a query goes out (a plausible value each).
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h", "$job": ".*",
                     "$instance": ".*"}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",),
            "summary": ("", "_sum", "_count"), "unknown": ("",)}
# The placeholder compose writes for Prometheus when SPARSESERVE_METRICS_TOKEN is unset.
PLACEHOLDER_TOKEN = "none"


# ------------------------------------------------------------------------ what the server exports
def series_labels(text: str) -> dict[str, set[str]]:
    """Prometheus text -> each series name Prometheus would store (a histogram's ``_bucket``,
    ``_sum`` and ``_count``, a counter's ``_total``) -> the label names its samples carry.
    A family without samples yet still names its series, with labels unknown (empty)."""
    series: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES[family.type]:
            series.setdefault(family.name + suffix, set())
        for sample in family.samples:
            if not sample.name.endswith("_created"):  # prometheus_client's, not stored as a series
                series.setdefault(sample.name, set()).update(sample.labels)
    return series


def scrape(server: ServerProcess) -> str:
    # As the compose profile's Prometheus asks with no metrics token set: the placeholder.
    response = httpx.get(f"{server.http_url}/metrics", headers={"authorization": f"Bearer {PLACEHOLDER_TOKEN}"})
    assert response.status_code == 200, response.text
    return response.text


def gpu_fallback_series() -> dict[str, set[str]]:
    """The device-fallback series as a GPU worker exports them: the server's Metrics, told of one
    fallback the way the GPU backend tells it (``on_fallback``)."""
    from sparseserve.server.buffers import BufferPool
    from sparseserve.server.metrics import Metrics

    class _Store:
        spilled = 0
        dropped: dict[str, int] = {}

        @staticmethod
        def stats():
            return 0, 0

        spill_stats = stats

    class _Service:
        store = _Store()
        buffers = BufferPool(0)
        running = queued = 0

    metrics = Metrics(_Service())
    metrics.count_fallback("matmul", "out_of_memory")
    return {name: labels for name, labels in series_labels(metrics.render().decode()).items()
            if name.startswith("sparseserve_device_fallbacks")}


@pytest.fixture(scope="module")
def dask_scheduler() -> Iterator[str]:
    """A Dask cluster in this process (threads: quick to start); the server connects over TCP."""
    distributed = pytest.importorskip("distributed")
    import logging

    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp://",
                                  host="127.0.0.1", dashboard_address=None, silence_logs=logging.CRITICAL) as cluster:
        yield cluster.scheduler_address


@pytest.fixture(scope="module")
def server(dask_scheduler) -> Iterator[ServerProcess]:
    srv = ServerProcess("--dask-scheduler", dask_scheduler, "--distribute-above-bytes", "0")
    yield srv
    code = srv.stop()
    assert code == 0, f"server exited with {code}: {srv.log()}"


TENSOR = SparseTensor(indices=[[0, 1], [3, 2], [7, 0], [9, 3]], values=[1.0, 2.0, 3.0, 4.0], dense_shape=[10, 4])


@pytest.fixture(scope="module")
def exported(server) -> dict[str, set[str]]:
    """Series name -> label names, of a server that has served calls on both wires, one of them
    refused, and holds a tensor partitioned in two blocks; a GPU worker's fallbacks added."""
    with make_client(server, "grpc") as grpc, make_client(server, "rest-json") as rest:
        for client in (grpc, rest):
            client.reorder(TENSOR)
            with pytest.raises(NotFoundError):
                client.get("no-such-handle")
        grpc.put(TENSOR, partitions=2)
    deadline = time.monotonic() + 10
    while True:  # a REST request is counted once its response is on its way: wait for it
        text = scrape(server)
        wires = {s.labels["wire"] for f in text_string_to_metric_families(text) for s in f.samples
                 if s.name == "sparseserve_requests_total"}
        if wires == {"grpc", "rest"} or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert wires == {"grpc", "rest"}, wires
    return {**series_labels(text), **gpu_fallback_series()}


# ------------------------------------------------------------------------ what the dashboard asks
@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(dashboard: dict) -> list[dict]:
    """Every panel, those inside collapsed rows too."""
    return [p for top in dashboard["panels"] for p in (top, *top.get("panels", []))]


def variable_query(variable: dict) -> str:
    query = variable["query"]
    return query["query"] if isinstance(query, dict) else query


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable; a variable's
    ``label_values(SELECTOR, label)`` is its selector."""
    found = [(f"panel {p['title']!r} target {t['refId']}", t["expr"])
             for p in all_panels(dashboard) for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable_query(variable))
            assert match, f"variable {variable['name']}: not label_values(SELECTOR, LABEL)"
            found.append((f"variable {variable['name']}", match.group(1)))
    assert found
    return found


def parse(where: str, expr: str) -> promql_parser.Expr:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"{where}: a Grafana variable this test does not know: {expr}"
    try:
        return promql_parser.parse(expr)
    except ValueError as exc:
        raise AssertionError(f"{where}: not PromQL ({exc}): {expr}") from None


def nodes(expr: promql_parser.Expr, kind: type) -> list:
    found: list = []
    promql_parser.walk(expr, lambda node: found.append(node) if isinstance(node, kind) else None)
    return found


def selectors(expr: promql_parser.Expr) -> list[promql_parser.VectorSelector]:
    return nodes(expr, promql_parser.VectorSelector)


# ------------------------------------------------------------------------ tests: the dashboard
def test_every_metric_a_panel_queries_is_one_the_server_exports(dashboard, exported):
    known = {**exported, **PROMETHEUS_OWN}
    queried = set()
    for where, expr in queries(dashboard):
        for selector in selectors(parse(where, expr)):
            assert selector.name, f"{where}: a selector without a metric name"
            assert selector.name in known, \
                f"{where}: {selector.name} is not exported (the server's series: {sorted(exported)})"
            queried.add(selector.name)
    # And the other way: every family the server exports is on the dashboard (but the times
    # prometheus_client's Counter adds, as ``_created`` gauges, at which each series began).
    families = {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in exported if not name.endswith("_created")}
    shown = {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in queried}
    assert families - shown == set(), "exported but on no panel"
    assert {"sparseserve_partitioned_blocks", "sparseserve_device_fallbacks_total",
            "sparseserve_request_seconds_bucket"} <= queried


def test_docs_monitoring_names_the_panels_and_only_exported_metrics(dashboard, exported):
    text = (ROOT / "docs" / "monitoring.md").read_text()
    families = set(exported) | {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in exported}
    named = set(re.findall(r"\bsparseserve_[a-z_]*[a-z]", text))
    assert named and named - families - set(PROMETHEUS_OWN) == set(), "docs/monitoring.md names metrics not exported"
    for panel in all_panels(dashboard):
        if panel["type"] != "row":
            assert f"| {panel['title']} |" in text, f"docs/monitoring.md's table lacks the panel {panel['title']!r}"


def test_every_label_a_panel_uses_is_one_its_metrics_carry(dashboard, exported):
    """Matchers and ``by (...)`` name labels of the metrics they apply to, or the target's: so no
    panel can split by tenant, a label /metrics never has."""
    labels_of = {**{name: labels | TARGET_LABELS for name, labels in exported.items()},
                 **{name: labels | TARGET_LABELS for name, labels in PROMETHEUS_OWN.items()}}
    labels_of = {name: labels | ({"le"} if name.endswith("_bucket") else set()) for name, labels in labels_of.items()}
    for where, expr in queries(dashboard):
        tree = parse(where, expr)
        for selector in selectors(tree):
            for matcher in selector.matchers.matchers:
                assert matcher.name in labels_of[selector.name], \
                    f"{where}: {selector.name} has no label {matcher.name!r} ({sorted(labels_of[selector.name])})"
        for aggregate in nodes(tree, promql_parser.AggregateExpr):
            if aggregate.modifier is None:
                continue
            below = set().union(*(labels_of[s.name] for s in selectors(aggregate.expr)))
            missing = set(aggregate.modifier.labels) - below
            assert not missing, f"{where}: {aggregate.op} by {sorted(missing)}, which its metrics lack"
    assert not any("tenant" in labels for labels in exported.values()), "/metrics names no tenant"


def test_the_dask_blocks_panel_counts_the_blocks(server):
    """The partitioned tensors' gauges (only with --dask-scheduler) follow a put and a delete."""
    def gauges() -> dict[str, float]:
        return {s.name: s.value for f in text_string_to_metric_families(scrape(server)) for s in f.samples
                if s.name.startswith("sparseserve_partitioned_")}

    before = gauges()
    with make_client(server, "grpc") as client:
        handle = client.put(TENSOR, partitions=2)
        held = gauges()
        client.delete(handle)
    assert held["sparseserve_partitioned_blocks"] - before["sparseserve_partitioned_blocks"] == 2
    assert held["sparseserve_partitioned_handles"] - before["sparseserve_partitioned_handles"] == 1
    assert held["sparseserve_partitioned_bytes"] > before["sparseserve_partitioned_bytes"]
    assert gauges() == before


def test_the_dask_gauges_let_go_of_an_evicted_tensor(dask_scheduler):
    """A partitioned tensor pushed out by --dask-store-bytes leaves the gauges too (the store's
    on_drop), as the service renders them at a scrape."""
    import asyncio

    from sparseserve.server.ops import REGISTRY
    from sparseserve.server.service import Service
    from sparseserve.server.sizes import tensor_nbytes

    def gauges() -> dict[str, float]:
        text = service.metrics.render().decode()
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name.startswith("sparseserve_partitioned_")}

    # Room for one TENSOR, not two: the second put evicts the first.
    service = Service(ServerConfig(dask_scheduler=dask_scheduler, dask_store_bytes=tensor_nbytes(TENSOR) * 3 // 2),
                      REGISTRY)
    try:
        asyncio.run(service.put(TENSOR, "", 2))
        one = gauges()
        asyncio.run(service.put(TENSOR, "", 3))
        assert gauges() == {"sparseserve_partitioned_handles": 1, "sparseserve_partitioned_blocks": 3,
                            "sparseserve_partitioned_bytes": one["sparseserve_partitioned_bytes"]}
        assert one["sparseserve_partitioned_blocks"] == 2 and service.cluster.store.dropped["evicted"] == 1
    finally:
        service.close()


def test_panels_follow_the_datasource_job_and_instance_variables(dashboard):
    RE = str(promql_parser.MatchOp.Re)  # =~ (MatchOp is not hashable)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("job", "instance"):
        assert variables[name]["type"] == "query" and variables[name]["datasource"]["uid"] == "${datasource}"
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    assert '$job' in variable_query(variables["instance"]), "instances of the chosen jobs"
    ids = set()
    for panel in all_panels(dashboard):
        assert panel["id"] not in ids, f"panel id {panel['id']} twice"
        ids.add(panel["id"])
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, f"{panel['title']}: outside the 24 columns"
        if panel["type"] == "row":
            continue
        assert panel.get("description"), f"{panel['title']}: say what it shows"
        for holder in (panel, *panel["targets"]):
            assert holder["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            where = f"panel {panel['title']!r} target {target['refId']}"
            for selector in selectors(promql_parser.parse(
                    target["expr"].replace("$__rate_interval", "1m"))):
                matchers = {(m.name, str(m.op), m.value) for m in selector.matchers.matchers}
                assert {("job", RE, "$job"), ("instance", RE, "$instance")} <= matchers, \
                    f"{where}: {selector.name} ignores the job and instance variables"
    # No two panels on the same cells.
    cells = [(x, y) for p in all_panels(dashboard) for g in [p["gridPos"]]
             for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])]
    assert len(cells) == len(set(cells)), "panels overlap"


# ------------------------------------------------------------------------ tests: compose, Prometheus
def compose_config(*profiles: str, env: dict[str, str] | None = None) -> dict:
    """``docker compose [--profile ...] config`` with nothing of this environment but ``env``."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
    command = [*docker_compose(), "-f", str(DEPLOY / "compose.yaml"), "--env-file", os.devnull,
               *(arg for profile in profiles for arg in ("--profile", profile)), "config", "--format", "json"]
    done = run_tool(command, {**base, **(env or {})})
    assert "is not set" not in done.stderr, f"a variable without a default: {done.stderr}"
    return json.loads(done.stdout)


def mounts(service: dict) -> dict[str, Path]:
    """Where a service sees each file bound from the host -> that file."""
    return {v["target"]: Path(v["source"]) for v in service.get("volumes", []) if v["type"] == "bind"}


def flag(command: list[str], name: str) -> str:
    values = [arg.split("=", 1)[1] for arg in command if arg.startswith(f"--{name}=")]
    assert len(values) == 1, f"--{name} in {command}"
    return values[0]


def test_the_monitoring_profile_runs_prometheus_and_grafana_on_these_files():
    plain = compose_config()
    assert set(plain["services"]) == {"cpu"}, "a plain `up` starts the CPU worker alone, as before"
    config = compose_config("monitoring")
    services = config["services"]
    assert set(services) == {"cpu"} | MONITORING
    assert re.fullmatch(r"prom/prometheus:v\d+\.\d+\.\d+", services["prometheus"]["image"])
    assert re.fullmatch(r"grafana/grafana:\d+\.\d+\.\d+", services["grafana"]["image"])
    for name in MONITORING:
        assert services[name]["profiles"] == ["monitoring"]
        assert all(p["host_ip"] == "127.0.0.1" for p in services[name]["ports"]), "loopback unless PUBLISH_ADDR"

    prometheus = services["prometheus"]
    command = prometheus["command"]
    assert mounts(prometheus)[flag(command, "config.file")] == PROMETHEUS_YML
    prometheus_port = int(flag(command, "web.listen-address").rsplit(":", 1)[1])
    assert {p["target"] for p in prometheus["ports"]} == {prometheus_port}

    grafana = services["grafana"]
    grafana_files = mounts(grafana)
    for kind in ("datasources", "dashboards"):
        assert grafana_files[f"/etc/grafana/provisioning/{kind}"] == PROVISIONING / kind
    provider = yaml.safe_load((PROVISIONING / "dashboards" / "sparseserve.yaml").read_text())["providers"][0]
    assert grafana_files[f"{provider['options']['path']}/{DASHBOARD.name}"] == DASHBOARD
    assert grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] in grafana_files
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "false", "anonymous viewers only when asked"
    assert compose_config("monitoring", env={"GRAFANA_ANONYMOUS": "true"})["services"]["grafana"]["environment"][
        "GF_AUTH_ANONYMOUS_ENABLED"] == "true"

    # Grafana's datasource is this Prometheus, and its step is Prometheus's scrape interval.
    source = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())["datasources"][0]
    url = httpx.URL(source["url"])
    assert (source["type"], url.host, url.port) == ("prometheus", "prometheus", prometheus_port)
    scrape_config = yaml.safe_load(PROMETHEUS_YML.read_text())
    assert source["jsonData"]["timeInterval"] == scrape_config["global"]["scrape_interval"]


def test_prometheus_scrapes_every_worker_compose_runs_with_the_metrics_token(server):
    workers = {name for name, s in compose_config("gpu", "distributed", "monitoring")["services"].items()
               if HTTP_PORT in {p["target"] for p in s.get("ports", [])}}
    assert workers == {"cpu", "gpu", "distributed"}
    (job,) = yaml.safe_load(PROMETHEUS_YML.read_text())["scrape_configs"]
    (sd,) = job["dns_sd_configs"]
    assert set(sd["names"]) == workers and sd["type"] == "A" and sd["port"] == HTTP_PORT
    (relabel,) = job["relabel_configs"]
    assert relabel["target_label"] == "instance" and relabel["replacement"] == f"${{1}}:{HTTP_PORT}"
    assert job["scheme"] == "http" and httpx.get(f"{server.http_url}{job['metrics_path']}").status_code == 200

    # The token: the workers require what compose hands Prometheus, in the file it reads.
    assert job["authorization"]["type"] == "Bearer"
    token = "a-metrics-token"
    config = compose_config("monitoring", env={"SPARSESERVE_METRICS_TOKEN": token})
    assert config["services"]["cpu"]["environment"]["SPARSESERVE_METRICS_TOKEN"] == token
    (given,) = config["services"]["prometheus"]["configs"]
    assert given["target"] == job["authorization"]["credentials_file"]
    assert config["configs"][given["source"]]["content"] == token
    unset = compose_config("monitoring")
    assert unset["services"]["cpu"]["environment"]["SPARSESERVE_METRICS_TOKEN"] == "", "unset: /metrics open"
    assert unset["configs"][given["source"]]["content"] == PLACEHOLDER_TOKEN  # which `scrape` sends


# ------------------------------------------------------------------------ tests: promtool
PROMTOOL_CACHE = ROOT / ".cache" / "promtool"


@pytest.fixture(scope="module")
def promtool() -> Path:
    """promtool out of Debian's prometheus package: the .deb fetched with ``apt-get download`` and
    only promtool taken out (nothing installed, no daemon), kept in .cache/ (about 2 s once)."""
    binary = PROMTOOL_CACHE / "promtool"
    if binary.exists():
        return binary
    if not (shutil.which("apt-get") and shutil.which("dpkg-deb")):
        pytest.skip("promtool comes from Debian's prometheus package: no apt-get and dpkg-deb here")
    download = PROMTOOL_CACHE / "download"
    download.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["apt-get", "download", "prometheus"], cwd=download, capture_output=True, text=True,
                          timeout=300)
    debs = sorted(download.glob("prometheus_*.deb"))
    if done.returncode != 0 or not debs:
        pytest.skip(f"apt-get download prometheus failed (apt-get update first?): {done.stderr.strip()[-300:]}")
    files = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(debs[-1])], capture_output=True, timeout=120,
                           check=True).stdout
    part = PROMTOOL_CACHE / "promtool.part"
    with tarfile.open(fileobj=io.BytesIO(files)) as tar:
        member = tar.extractfile("./usr/bin/promtool")
        assert member is not None, f"{debs[-1].name} has no usr/bin/promtool"
        part.write_bytes(member.read())
    part.chmod(0o755)
    part.rename(binary)
    shutil.rmtree(download)
    return binary


def test_promtool_accepts_the_scrape_config(promtool, tmp_path):
    # promtool opens credentials_file: the one compose mounts, here a file with a token in it.
    job = yaml.safe_load(PROMETHEUS_YML.read_text())["scrape_configs"][0]
    token = tmp_path / "token"
    token.write_text("a-metrics-token\n")
    config = tmp_path / "prometheus.yml"
    config.write_text(PROMETHEUS_YML.read_text().replace(job["authorization"]["credentials_file"], str(token)))
    done = subprocess.run([str(promtool), "check", "config", str(config)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_finds_nothing_wrong_in_what_the_server_exports(promtool, server):
    """``promtool check metrics``: Prometheus's own lint of the exposition (names, units, help)."""
    done = subprocess.run([str(promtool), "check", "metrics"], input=scrape(server), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done.stdout + done.stderr
