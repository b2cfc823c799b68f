"""Server settings: one table drives the command-line flags, the
``SPARSESERVE_*`` environment variables and their defaults (docs/operations.md)."""

from __future__ import annotations

import argparse
import math
import os
import ssl
from dataclasses import dataclass, fields

__all__ = ["ServerConfig", "build_parser", "config_from_args"]

MiB = 1 << 20
GiB = 1 << 30


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    grpc_port: int = 50051
    http_port: int = 8000
    device: str = "cpu"
    token: list[str] | None = None
    token_file: str | None = None
    max_request_bytes: int = 256 * MiB
    max_result_bytes: int = 1 * GiB
    store_bytes: int = 4 * GiB
    store_ttl: float = 3600.0
    tenant_store_bytes: int = 0  # 0: tenants share --store-bytes
    spill_dir: str | None = None  # None: an evicted handle is gone (NOT_FOUND, reason EVICTED)
    spill_bytes: int = 16 * GiB
    durable: bool = False  # with spill_dir: every kept tensor written through, restored at start
    buffer_pool_bytes: int = 1 * GiB  # 0: every upload buffer is fresh
    max_nnz: int = (1 << 31) - 1
    max_rank: int = 32
    max_json_depth: int = 64
    max_concurrency: int = 0  # 0: one per kernel worker thread
    max_queue: int = 64
    shutdown_grace: float = 10.0
    keepalive_seconds: float = 20.0  # gRPC: a silent peer pinged after this, dropped unanswered after as long again
    header_timeout: float = 20.0  # REST: a connection's request head must arrive within it
    body_timeout: float = 30.0  # both wires: each read of a request body (or stream message) must bring bytes
    batch_window_ms: float = 0.0  # 0: server-side batching off
    max_batch: int = 64
    allow_shared_memory: bool = False  # off: RegisterSegment, PutShared and GetShared are refused
    warm_up: bool = True  # off: ready at once, each kernel loaded on its first call
    shm_ttl: float = 60.0
    workers: int = 0  # 0: one per CPU core
    log_level: str = "info"
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None  # None: no client certificates (tenants, if any, by token)
    metrics_token: str | None = None  # None: /metrics needs no token
    dask_scheduler: str | None = None  # None: no scale-out, Dask not imported
    dask_connect_timeout: float = 10.0  # seconds start-up waits for the scheduler
    distribute_above_bytes: int = 1 * GiB  # 0: only put(partitions=N) partitions
    dask_store_bytes: int = 0  # 0: the Dask workers' memory limits added up
    tenant_dask_store_bytes: int = 0  # 0: tenants share --dask-store-bytes
    dask_tls_ca: str | None = None  # with dask_tls_cert and dask_tls_key: tls:// to the Dask cluster
    dask_tls_cert: str | None = None
    dask_tls_key: str | None = None
    otlp_endpoint: str | None = None  # None: no tracing (unless OTEL_EXPORTER_OTLP_ENDPOINT), OpenTelemetry not loaded

    def tokens(self) -> dict[str, str]:
        """token -> tenant name. Empty: no authentication."""
        tokens = {t: f"tenant-{i}" for i, t in enumerate(self.token or [])}
        if self.token_file:
            with open(self.token_file, encoding="utf-8") as fh:
                for line in fh:
                    line = line.strip()
                    if not line or line.startswith("#"):
                        continue
                    # "tenant-name token" or just "token"
                    parts = line.split()
                    tenant, token = (parts[0], parts[1]) if len(parts) > 1 else (f"tenant-{len(tokens)}", parts[0])
                    tokens[token] = tenant
        return tokens


# flag name -> (type, help). Defaults come from ServerConfig.
_FLAGS: dict[str, tuple[type, str]] = {
    "host": (str, "address both wires listen on"),
    "grpc_port": (int, "gRPC port (0 picks a free one)"),
    "http_port": (int, "REST port (0 picks a free one)"),
    "device": (str, "where kernels run: cpu, cuda or auto (cuda when CuPy finds a GPU)"),
    "token": (str, "a bearer token clients must send; repeat for several tenants"),
    "token_file": (str, "file with one token per line ('tenant token' or 'token'); each is a tenant"),
    "max_request_bytes": (int, "largest request message or body, in bytes; bigger tensors go through put"),
    "max_result_bytes": (int, "largest result an op may produce, checked before allocating"),
    "store_bytes": (int, "byte budget of the handle store; least recently used out first"),
    "store_ttl": (float, "seconds an unused handle lives"),
    "tenant_store_bytes": (int, "byte budget of one tenant's handles; a tenant over it loses its own least "
                                "recently used first (0: tenants share --store-bytes)"),
    "spill_dir": (str, "directory of the store's disk tier: an evicted handle's tensor is written there and "
                       "the handle stays valid (unset: an evicted handle is gone, NOT_FOUND with reason EVICTED)"),
    "spill_bytes": (int, "byte budget of the files in --spill-dir; past it the least recently used spilled "
                         "handles go for good"),
    "durable": (bool, "with --spill-dir: every put and kept result is written there (fsynced) before it is "
                      "answered, and a server restarted on the directory serves the same handles"),
    "buffer_pool_bytes": (int, "bytes of freed upload buffers (4 MiB and up) kept for the next uploads "
                               "instead of handed back to the kernel; one unused for 30 s is let go (0: "
                               "off)"),
    "max_nnz": (int, "most stored values one tensor may have, in a request or a result"),
    "max_rank": (int, "most dimensions one tensor (or shape argument) may have"),
    "max_json_depth": (int, "deepest nesting of lists and objects a JSON body may have"),
    "max_concurrency": (int, "kernel calls running at once (0: one per worker thread)"),
    "max_queue": (int, "calls waiting for a free --max-concurrency slot; past it, UNAVAILABLE at once"),
    "shutdown_grace": (float, "seconds in-flight requests get to finish after SIGTERM before they are "
                              "cancelled"),
    "keepalive_seconds": (float, "gRPC: a connection silent this long is pinged, and one whose peer does not answer "
                                 "within as long again is closed, its calls cancelled (clients may ping every 5 s, "
                                 "or every half of this when sooner)"),
    "header_timeout": (float, "REST: seconds a connection has to send a request's head (line and headers) from "
                              "when it opens or its request starts; past it the connection is closed"),
    "body_timeout": (float, "seconds each read of a request body (REST) or streamed request (gRPC Upload, "
                            "ExecuteStream) may wait for bytes; past it the call fails with DEADLINE_EXCEEDED, "
                            "reason BODY_TIMEOUT, and its buffer goes back"),
    "batch_window_ms": (float, "merge concurrent small calls to the same batchable op arriving within this "
                               "many milliseconds into one kernel call (0: off)"),
    "max_batch": (int, "most calls merged into one batch"),
    "warm_up": (bool, "load every kernel (from numba's disk cache, compiling what it lacks) before reporting "
                      "ready, so that no request waits on a compile; --no-warm-up: ready at once, each kernel "
                      "loaded on its first call (development and tests, where the cache is warm)"),
    "allow_shared_memory": (bool, "allow same-host transfers through POSIX shared memory (the SDK's put "
                                  "and get with shared_memory=True, for clients under the server's user); "
                                  "off, they are refused"),
    "shm_ttl": (float, "seconds a shared-memory segment (registered for a put, or written for a get) waits "
                       "to be claimed before the server unlinks it"),
    "workers": (int, "kernel worker threads (0: one per CPU core)"),
    "log_level": (str, "debug, info, warning or error"),
    "tls_cert": (str, "PEM certificate (chain) file; with --tls-key, gRPC serves TLS and REST HTTPS only"),
    "tls_key": (str, "PEM private key file of --tls-cert"),
    "tls_client_ca": (str, "PEM CA certificate(s) file: with --tls-cert, both wires require a client "
                           "certificate signed by it (mutual TLS), and its subject's CN is the tenant"),
    "metrics_token": (str, "a bearer token GET /metrics requires (unset: /metrics is open)"),
    "dask_scheduler": (str, "address of a Dask scheduler (tcp://HOST:PORT): partitioned tensors live on its "
                            "workers, and replicas on the same scheduler share their handles"),
    "dask_connect_timeout": (float, "seconds start-up waits to reach --dask-scheduler before it stops with "
                                    "the reason"),
    "distribute_above_bytes": (int, "with --dask-scheduler, a tensor stored (put, or an op's kept result) "
                                    "bigger than this is partitioned across the Dask workers (0: only "
                                    "when put asks for partitions)"),
    "dask_store_bytes": (int, "byte budget of the partitioned tensors this replica made; least recently "
                              "used out first (0: the Dask workers' memory limits added up)"),
    "tenant_dask_store_bytes": (int, "byte budget of one tenant's partitioned tensors made by this replica; a "
                                     "tenant over it loses its own least recently used first (0: tenants "
                                     "share --dask-store-bytes)"),
    "dask_tls_ca": (str, "PEM CA certificate the Dask scheduler's and workers' certificates are signed by; "
                         "with --dask-tls-cert and --dask-tls-key, a tls:// --dask-scheduler"),
    "dask_tls_cert": (str, "PEM certificate this replica presents to the Dask scheduler and workers"),
    "dask_tls_key": (str, "PEM private key of --dask-tls-cert"),
    "otlp_endpoint": (str, "OTLP/gRPC collector URL (http://HOST:4317, https:// for TLS) to send a trace of every "
                           "request to (the tracing extra; unset: OTEL_EXPORTER_OTLP_ENDPOINT, else no tracing)"),
}


def env_name(field: str) -> str:
    return "SPARSESERVE_" + field.upper()


def _env_bool(text: str, name: str, parser: argparse.ArgumentParser) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    parser.error(f"{name}={text!r}: say 1, true, yes or on, or 0, false, no or off")
    raise AssertionError("parser.error exits")


def build_parser(prog: str = "sparseserve serve") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Run the sparseserve gRPC and REST server.")
    defaults = ServerConfig()
    for field in fields(ServerConfig):
        kind, help_text = _FLAGS[field.name]
        env = os.environ.get(env_name(field.name))
        default = getattr(defaults, field.name)
        flag = "--" + field.name.replace("_", "-")
        if field.name == "token":
            env_tokens = env.split(",") if env else None
            parser.add_argument(flag, action="append", default=env_tokens,
                                help=f"{help_text} (env {env_name(field.name)}, comma-separated)")
            continue
        if kind is bool:  # --flag / --no-flag; the environment says 1/true/yes or 0/false/no
            if env is not None:
                default = _env_bool(env, env_name(field.name), parser)
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                                help=f"{help_text} (env {env_name(field.name)}; default {default})")
            continue
        if env is not None:
            default = kind(env)
        choices = ("cpu", "cuda", "auto") if field.name == "device" else None
        parser.add_argument(flag, type=kind, default=default, choices=choices,
                            help=f"{help_text} (env {env_name(field.name)}; default {default})")
    return parser


# gRPC message limits are C ints, and the send limit adds a MiB of room to the request one.
MAX_REQUEST_BYTES_LIMIT = (1 << 31) - 1 - MiB


def config_from_args(argv: list[str] | None = None) -> ServerConfig:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if not 0 < ns.max_request_bytes <= MAX_REQUEST_BYTES_LIMIT:
        parser.error(f"--max-request-bytes must be between 1 and {MAX_REQUEST_BYTES_LIMIT} (gRPC's "
                     f"message limit); larger tensors go up with put, which streams them")
    for name in ("max_result_bytes", "store_bytes", "spill_bytes", "max_nnz", "max_rank", "max_json_depth",
                 "max_batch"):
        if getattr(ns, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("tenant_store_bytes", "buffer_pool_bytes", "max_concurrency", "max_queue", "workers",
                 "shutdown_grace", "batch_window_ms", "distribute_above_bytes", "dask_store_bytes",
                 "tenant_dask_store_bytes"):
        if not getattr(ns, name) >= 0:  # NaN too
            parser.error(f"--{name.replace('_', '-')} must not be negative")
    for name in ("keepalive_seconds", "header_timeout", "body_timeout", "dask_connect_timeout"):
        if not 0 < getattr(ns, name) < math.inf:  # NaN too
            parser.error(f"--{name.replace('_', '-')} must be a positive number of seconds")
    if ns.durable and not ns.spill_dir:
        parser.error(f"--durable needs --spill-dir (or {env_name('spill_dir')}): durable handles are written "
                     "to files in that directory")
    _check_tls(parser, ns)
    _check_client_ca(parser, ns)
    _check_dask_tls(parser, ns)
    if ns.otlp_endpoint and not ns.otlp_endpoint.startswith(("http://", "https://")):
        parser.error(f"--otlp-endpoint {ns.otlp_endpoint!r} must be a URL starting http:// (plaintext) or https:// "
                     "(TLS), e.g. http://localhost:4317")
    return ServerConfig(**{f.name: getattr(ns, f.name) for f in fields(ServerConfig)})


def _check_tls(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    # Checked here, not at bind time: a half-configured TLS must not fall back to plaintext,
    # and a bad path should stop the process before it announces ports.
    given = {flag: path for flag, path in (("--tls-cert", ns.tls_cert), ("--tls-key", ns.tls_key)) if path}
    if len(given) == 1:
        flag, other, other_env = (("--tls-cert", "--tls-key", env_name("tls_key")) if "--tls-cert" in given
                                  else ("--tls-key", "--tls-cert", env_name("tls_cert")))
        parser.error(f"{flag} needs {other} too (or {other_env}): "
                     "TLS takes both a certificate and its key, or neither")
    for flag, path in given.items():
        try:
            with open(path, "rb") as fh:
                fh.read(1)
        except OSError as exc:
            parser.error(f"{flag} {path}: cannot read it ({exc.strerror})")
    if given:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(ns.tls_cert, ns.tls_key)
        except ssl.SSLError as exc:
            parser.error(f"--tls-cert {ns.tls_cert} and --tls-key {ns.tls_key} must be a PEM certificate "
                         f"and its private key: {exc}")


def _check_client_ca(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    # Mutual TLS is TLS first: without a server certificate there is no handshake to ask for one.
    if not ns.tls_client_ca:
        return
    if not ns.tls_cert:
        parser.error("--tls-client-ca needs --tls-cert and --tls-key: client certificates are asked for "
                     "in the TLS handshake")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ns.tls_client_ca)
    except (OSError, ssl.SSLError) as exc:
        parser.error(f"--tls-client-ca {ns.tls_client_ca} must be a readable PEM CA certificate: {exc}")


def _check_dask_tls(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    # All three or none, only with a scheduler, and tls:// exactly when they are given: a replica
    # must never fall back to plaintext towards a cluster that holds every tenant's blocks.
    flags = {"--dask-tls-ca": ns.dask_tls_ca, "--dask-tls-cert": ns.dask_tls_cert, "--dask-tls-key": ns.dask_tls_key}
    given = [flag for flag, path in flags.items() if path]
    scheduler = ns.dask_scheduler or ""
    if given and not scheduler:
        parser.error(f"{given[0]} is for the connection to the Dask cluster: give --dask-scheduler too")
    if given and len(given) < len(flags):
        missing = [flag for flag in flags if flag not in given]
        parser.error(f"{' and '.join(given)} need{'s' if len(given) == 1 else ''} {' and '.join(missing)} too: "
                     "TLS to Dask takes the CA, this replica's certificate and its key")
    if scheduler.startswith("tls://") and not given:
        parser.error(f"--dask-scheduler {scheduler} speaks TLS: give --dask-tls-ca, --dask-tls-cert and "
                     "--dask-tls-key")
    if given and not scheduler.startswith("tls://"):
        parser.error(f"--dask-tls-* given, but --dask-scheduler {scheduler} is not a tls:// address")
    if given:
        try:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ns.dask_tls_ca)
            context.load_cert_chain(ns.dask_tls_cert, ns.dask_tls_key)
        except (OSError, ssl.SSLError) as exc:
            parser.error(f"--dask-tls-ca {ns.dask_tls_ca}, --dask-tls-cert {ns.dask_tls_cert} and --dask-tls-key "
                         f"{ns.dask_tls_key} must be a readable PEM CA certificate, certificate and its key: {exc}")
