"""Observability: request ids, the Prometheus metrics of ``GET /metrics`` and the JSON log lines.

Each wire opens a ``RequestInfo`` when a request arrives (``Metrics.begin``) and closes it when
the reply is done (``Metrics.end``); in between it is the ``current`` context variable, so the
service code and every log line of the request can reach it without passing it around.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

if TYPE_CHECKING:
    from .service import Service

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


class _ServiceCollector:
    """Gauges read at scrape time, so the request path pays nothing for them."""

    def __init__(self, service: Service):
        self.service = service

    def collect(self):
        handles, nbytes = self.service.store.stats()
        yield GaugeMetricFamily("sparseserve_store_bytes", "Bytes held by the handle store", value=nbytes)
        yield GaugeMetricFamily("sparseserve_store_handles", "Tensors held by the handle store", value=handles)
        yield GaugeMetricFamily("sparseserve_in_flight_requests",
                                "Calls running in the kernel pool now, counted against --max-concurrency",
                                value=self.service.running)
        yield GaugeMetricFamily("sparseserve_queue_depth",
                                "Calls waiting for a --max-concurrency slot (at most --max-queue)",
                                value=self.service.queued)


class Metrics:
    """The service's own registry (not prometheus_client's global one: a test may run several
    services in one process)."""

    def __init__(self, service: Service):
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter("sparseserve_requests", "Requests by wire, op and result code",
                                ["wire", "op", "code"], registry=self.registry)
        self.seconds = Histogram("sparseserve_request_seconds", "Request latency by wire and op",
                                 ["wire", "op"], buckets=_BUCKETS, registry=self.registry)
        self.received = Counter("sparseserve_received_bytes", "Request bytes received", ["wire"],
                                registry=self.registry)
        self.sent = Counter("sparseserve_sent_bytes", "Response bytes sent", ["wire"], registry=self.registry)
        self.fallbacks = Counter("sparseserve_device_fallbacks", "Calls a GPU worker ran on the CPU kernel "
                                 "instead, by op and reason", ["op", "reason"], registry=self.registry)
        self.registry.register(_ServiceCollector(service))
        self._children: dict[tuple, tuple] = {}  # labels() takes a lock and builds keys; cache them

    def begin(self, wire: str, op: str, request_id: str | None) -> tuple[RequestInfo, Token]:
        info = RequestInfo(wire, op, request_id)
        return info, current.set(info)

    def end(self, info: RequestInfo, token: Token) -> None:
        seconds = time.perf_counter() - info.start
        current.reset(token)
        key = (info.wire, info.op, info.code)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self.requests.labels(*key), self.seconds.labels(info.wire, info.op),
                self.received.labels(info.wire), self.sent.labels(info.wire))
        count, latency, received, sent = children
        count.inc()
        latency.observe(seconds)
        received.inc(info.bytes_in)
        sent.inc(info.bytes_out)
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
