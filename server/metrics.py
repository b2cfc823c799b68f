"""Observability: request ids, the Prometheus metrics of ``GET /metrics`` and the JSON log lines.

Each wire opens a ``RequestInfo`` when a request arrives (``Metrics.begin``) and closes it when
the reply is done (``Metrics.end``); in between it is the ``current`` context variable, so the
service code and every log line of the request can reach it without passing it around.
"""

from __future__ import annotations

import bisect
import json
import logging
import re
import threading
import time
import uuid
from contextvars import ContextVar, Token
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

__all__ = ["RequestInfo", "Metrics", "JsonFormatter", "current", "request_id_from", "CONTENT_TYPE_LATEST"]

access_log = logging.getLogger("sparseserve.access")

# Ids are echoed into headers, trailing metadata and log lines: only a safe alphabet goes back.
_VALID_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Small calls take about a millisecond; the default buckets start at 5 ms.
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def request_id_from(value: str | None) -> str:
    """The client's id when it is 1-128 characters of ``[A-Za-z0-9._:-]``, else a fresh one."""
    if value and _VALID_ID.fullmatch(value):
        return value
    return uuid.uuid4().hex


class RequestInfo:
    """What the access line and the metrics say about one request; the wire and the service
    fill it in as they learn it (the op once parsed, the tenant once authenticated)."""

    __slots__ = ("_given_id", "_request_id", "wire", "op", "code", "tenant", "bytes_in", "bytes_out", "start",
                 "deadline")

    def __init__(self, wire: str, op: str, given_id: str | None):
        self._given_id = given_id  # the caller's x-request-id, unchecked
        self._request_id: str | None = None
        self.wire = wire
        self.op = op
        self.code = "OK"
        self.tenant = ""
        self.bytes_in = 0
        self.bytes_out = 0
        self.start = time.perf_counter()
        self.deadline: float | None = None  # time.monotonic() of the caller's deadline

    @property
    def request_id(self) -> str:
        """``request_id_from`` the caller's id, on first use: most gRPC calls neither fail nor
        log, and a fresh id costs a system call for its random bytes."""
        if self._request_id is None:
            with _FIRST_USE:  # a kernel thread's log line and the loop's error must not make two
                if self._request_id is None:
                    self._request_id = request_id_from(self._given_id)
        return self._request_id


_FIRST_USE = threading.Lock()
current: ContextVar[RequestInfo | None] = ContextVar("sparseserve_request", default=None)


class Observed(Protocol):
    """What the gauges read of the service (``service.Service``)."""

    store: Any  # stats() and spill_stats() -> (handles, bytes); spilled, dropped: counts
    # cluster, only with --dask-scheduler (so read with getattr): stats() -> (handles, bytes, blocks)
    buffers: Any  # free_bytes, reused, allocated
    running: int
    queued: int


class _ServiceCollector:
    """Gauges read at scrape time, so the request path pays nothing for them."""

    def __init__(self, service: Observed):
        self.service = service

    def collect(self):
        handles, nbytes = self.service.store.stats()
        yield GaugeMetricFamily("sparseserve_store_bytes", "Bytes held by the handle store", value=nbytes)
        yield GaugeMetricFamily("sparseserve_store_handles", "Tensors held by the handle store", value=handles)
        store = self.service.store
        files, file_bytes = store.spill_stats()
        yield GaugeMetricFamily("sparseserve_spill_bytes", "Bytes of the handle store's files in --spill-dir",
                                value=file_bytes)
        yield GaugeMetricFamily("sparseserve_spill_handles", "Handles with a file in --spill-dir", value=files)
        yield CounterMetricFamily("sparseserve_store_spilled", "Handles evicted from memory to --spill-dir "
                                  "(they stay valid)", value=store.spilled)
        dropped = CounterMetricFamily("sparseserve_store_dropped", "Handles the store let go without a delete, "
                                      "by the reason their next use is told", labels=["reason"])
        for reason, count in store.dropped.items():
            dropped.add_metric([reason], count)
        yield dropped
        yield GaugeMetricFamily("sparseserve_in_flight_requests",
                                "Calls running in the kernel pool now, counted against --max-concurrency",
                                value=self.service.running)
        yield GaugeMetricFamily("sparseserve_queue_depth",
                                "Calls waiting for a --max-concurrency slot (at most --max-queue)",
                                value=self.service.queued)
        buffers = self.service.buffers
        yield GaugeMetricFamily("sparseserve_buffer_pool_bytes",
                                "Freed upload buffers kept for the next uploads (at most --buffer-pool-bytes)",
                                value=buffers.free_bytes)
        takes = CounterMetricFamily("sparseserve_buffer_pool_takes",
                                    "Upload buffers of 4 MiB and up, by whether a kept one served",
                                    labels=["outcome"])
        takes.add_metric(["reused"], buffers.reused)
        takes.add_metric(["allocated"], buffers.allocated)
        yield takes
        cluster = getattr(self.service, "cluster", None)
        if cluster is not None:  # --dask-scheduler: the partitioned tensors this replica made
            handles, nbytes, blocks = cluster.stats()
            yield GaugeMetricFamily("sparseserve_partitioned_handles", "Partitioned tensors this replica made, "
                                    "held on the Dask workers (counted against --dask-store-bytes)", value=handles)
            yield GaugeMetricFamily("sparseserve_partitioned_bytes", "Bytes of the partitioned tensors this "
                                    "replica made (against --dask-store-bytes)", value=nbytes)
            yield GaugeMetricFamily("sparseserve_partitioned_blocks", "Row blocks of the partitioned tensors "
                                    "this replica made, on the Dask workers", value=blocks)


# A row of ``_RequestTotals``: these, then one count per latency bucket.
_COUNT, _SECONDS, _IN, _OUT, _BUCKET0 = range(5)


class _RequestTotals:
    """Per (wire, op, code): requests, their seconds (sum and histogram buckets) and bytes in and
    out, turned into Prometheus families when scraped. prometheus_client's Counter and Histogram
    take a lock on each update, five per request; these are plain numbers, added to on the event
    loop's thread, the only one that ends requests (both wires' handlers run on it)."""

    def __init__(self):
        self.bounds = (*_BUCKETS, float("inf"))
        self.rows: dict[tuple[str, str, str], list] = {}

    def add(self, key: tuple[str, str, str], seconds: float, bytes_in: int, bytes_out: int) -> None:
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = [0, 0.0, 0, 0, *[0] * len(self.bounds)]
        row[_COUNT] += 1
        row[_SECONDS] += seconds
        row[_IN] += bytes_in
        row[_OUT] += bytes_out
        row[_BUCKET0 + bisect.bisect_left(self.bounds, seconds)] += 1  # the first bound >= seconds

    def collect(self):
        rows = [(key, list(row)) for key, row in list(self.rows.items())]  # a snapshot: the loop goes on
        requests = CounterMetricFamily("sparseserve_requests", "Requests by wire, op and result code",
                                       labels=["wire", "op", "code"])
        for key, row in rows:
            requests.add_metric(key, row[_COUNT])
        yield requests
        latency: dict[tuple[str, str], list] = {}
        moved: dict[str, list] = {}
        for (wire, op, _), row in rows:
            into = latency.setdefault((wire, op), [0] * len(self.bounds) + [0.0])  # buckets, then the sum
            for i, n in enumerate(row[_BUCKET0:]):
                into[i] += n
            into[-1] += row[_SECONDS]
            totals = moved.setdefault(wire, [0, 0])
            totals[0] += row[_IN]
            totals[1] += row[_OUT]
        seconds = HistogramMetricFamily("sparseserve_request_seconds", "Request latency by wire and op",
                                        labels=["wire", "op"])
        for labels, counts in latency.items():
            cumulative, buckets = 0, []
            for bound, n in zip(self.bounds, counts):
                cumulative += n
                buckets.append((floatToGoString(bound), cumulative))
            seconds.add_metric(labels, buckets, counts[-1])
        yield seconds
        for index, name, doc in ((0, "sparseserve_received_bytes", "Request bytes received"),
                                 (1, "sparseserve_sent_bytes", "Response bytes sent")):
            family = CounterMetricFamily(name, doc, labels=["wire"])
            for wire, totals in moved.items():
                family.add_metric([wire], totals[index])
            yield family


class _SolverIterations:
    """Iterations run by the solver ops (cg, bicgstab, ...), by op. Process-wide, as the ops
    reach no service: a kernel thread adds a solve's iterations when it ends (under a lock)."""

    def __init__(self):
        self.totals: dict[str, int] = {}
        self.lock = threading.Lock()

    def add(self, op: str, iterations: int) -> None:
        with self.lock:
            self.totals[op] = self.totals.get(op, 0) + int(iterations)

    def collect(self):
        family = CounterMetricFamily("sparseserve_solver_iterations", "Iterations run by the solver ops, by op",
                                     labels=["op"])
        with self.lock:
            for op, total in sorted(self.totals.items()):
                family.add_metric([op], total)
        yield family


SOLVER_ITERATIONS = _SolverIterations()


class Metrics:
    """The service's own registry (not prometheus_client's global one: a test may run several
    services in one process)."""

    def __init__(self, service: Observed):
        self.registry = CollectorRegistry(auto_describe=False)
        self.totals = _RequestTotals()
        self.registry.register(self.totals)
        self.fallbacks = Counter("sparseserve_device_fallbacks", "Calls a GPU worker ran on the CPU kernel "
                                 "instead, by op and reason", ["op", "reason"], registry=self.registry)
        self.registry.register(_ServiceCollector(service))
        self.registry.register(SOLVER_ITERATIONS)

    def begin(self, wire: str, op: str, request_id: str | None) -> tuple[RequestInfo, Token]:
        info = RequestInfo(wire, op, request_id)
        return info, current.set(info)

    def end(self, info: RequestInfo, token: Token) -> None:
        seconds = time.perf_counter() - info.start
        current.reset(token)
        self.totals.add((info.wire, info.op, info.code), seconds, info.bytes_in, info.bytes_out)
        if access_log.isEnabledFor(logging.INFO):
            access_log.info("request", extra={"fields": {
                "request_id": info.request_id, "wire": info.wire, "op": info.op, "code": info.code,
                "seconds": round(seconds, 6), "bytes_in": info.bytes_in, "bytes_out": info.bytes_out,
                "tenant": info.tenant}})

    def count_fallback(self, op: str, reason: str) -> None:
        self.fallbacks.labels(op, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def name_op(name: str, known) -> None:
    """Label the current request with its op once the wire has parsed it; names not in ``known``
    share one label, so a client cannot grow the metrics without bound."""
    info = current.get()
    if info is not None:
        info.op = name if name in known else "unknown"


def count_sent(nbytes: int) -> None:
    """Bytes of a reply written piece by piece (server streams)."""
    info = current.get()
    if info is not None:
        info.bytes_out += nbytes


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``json.dumps`` escapes quotes and newlines in messages, so a
    message cannot break or forge a line. Lines logged while a request runs carry its id."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
                 "message": record.getMessage()}
        info = current.get()
        if info is not None:
            entry["request_id"] = info.request_id
        fields = getattr(record, "fields", None)
        if fields:
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)
