"""OpenTelemetry traces of the requests on both wires, exported over OTLP (docs/tracing.md).

Off unless an OTLP endpoint is given: ``--otlp-endpoint`` (``SPARSESERVE_OTLP_ENDPOINT``), or
OpenTelemetry's own ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``. Off,
every hook below returns at its first line: the OpenTelemetry SDK and its exporter are never
imported and no span is made. (FastAPI imports ``opentelemetry-api`` itself, for telemetry of its
own that stays off while no global provider is set: ours is kept private for that reason.)

On, each request is one SERVER span, named and attributed per OpenTelemetry's RPC and HTTP
conventions, continuing the caller's trace (``traceparent``, W3C Trace Context, as the SDK sends
it), with ``sparseserve.*`` attributes for the op, tenant, bytes in and out, and outcome. Within
it, child spans show where the time went: ``queue wait`` (for a --max-concurrency slot),
``decode``, ``validation``, ``kernel``, ``encode``; a pipeline's steps are ``pipeline step``
spans, and a merged batch (--batch-window-ms) is a ``batch`` span linked to each caller's
``batch wait``.

The request path's hooks are one line each: ``grpc_request``/``rest_request`` beside the wires'
``Metrics.begin`` and ``finish`` beside ``Metrics.end``; ``span(name)`` and ``traced(name, fn)``
around a phase; ``record_error`` where the wires answer an error.
"""

from __future__ import annotations

import os
import uuid
from contextlib import nullcontext
from importlib.metadata import version
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypeVar

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor

    from .config import ServerConfig
    from .metrics import RequestInfo

__all__ = ["configure", "enable", "disable", "shutdown", "grpc_request", "rest_request", "finish",
           "responded", "record_error", "span", "traced", "current_link", "batch_span", "SERVICE_NAME"]

SERVICE_NAME = "sparseserve"
F = TypeVar("F", bound=Callable[..., Any])

# Set by ``enable``: the tracer, its provider, and the parts of OpenTelemetry the on path uses.
_tracer: Any = None
_provider: Any = None
_otel: Any = None
_exporting = False  # the provider is ``configure``'s (OTLP), which ``shutdown`` flushes and stops
_NOOP = nullcontext()

# Outcomes that are the server's fault: the span's status is ERROR (OpenTelemetry's gRPC server
# rule; the HTTP rule, 5xx, gives the same set through the codes' HTTP statuses). A caller's
# mistake (INVALID_ARGUMENT, NOT_FOUND, ...) leaves it unset: the outcome is in the attributes.
_SERVER_FAULTS = frozenset({"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE",
                            "DATA_LOSS"})
# Probes and scrapes are not traffic: a trace per kubelet probe would bury the calls.
_UNTRACED_PATHS = frozenset({"/metrics", "/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"})


def endpoint_of(config: ServerConfig) -> str | None:
    """Where spans go, or None for tracing off: --otlp-endpoint, else OpenTelemetry's variables
    (``OTEL_SDK_DISABLED=true`` turns them off, as OpenTelemetry's SDKs do)."""
    if config.otlp_endpoint:
        return config.otlp_endpoint
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    return os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")


def configure(config: ServerConfig) -> bool:
    """Tracing on, exporting in batches over OTLP/gRPC, when an endpoint is set; whether it is on."""
    global _exporting
    if _tracer is not None:
        return True
    if not endpoint_of(config):
        return False
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise SystemExit(f"--otlp-endpoint (or OTEL_EXPORTER_OTLP_ENDPOINT) needs the tracing extra: pip install "
                         f"'sparseserve[tracing]' ({exc})") from None
    # The flag's endpoint as given; without it the exporter reads OpenTelemetry's variables itself
    # (the traces one first, and OTEL_EXPORTER_OTLP_HEADERS, _INSECURE, _CERTIFICATE, ...).
    enable(BatchSpanProcessor(OTLPSpanExporter(endpoint=config.otlp_endpoint or None)))
    _exporting = True
    return True


def enable(processor: SpanProcessor) -> None:
    """Tracing on, spans handed to ``processor`` (``configure``'s OTLP batches; the tests give an
    in-memory exporter's)."""
    global _tracer, _provider, _otel
    from opentelemetry import context, propagate, trace
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider

    ours = version("sparseserve")
    # Ours by default; OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override them.
    resource = Resource.create({"service.name": SERVICE_NAME, "service.version": ours,
                                "service.instance.id": str(uuid.uuid4()),
                                **OTELResourceDetector().detect().attributes})
    provider = TracerProvider(resource=resource)  # the sampler: OTEL_TRACES_SAMPLER, else parent-based
    provider.add_span_processor(processor)
    _otel = SimpleNamespace(context=context, propagate=propagate, trace=trace, Link=trace.Link,
                            SERVER=trace.SpanKind.SERVER, ERROR=trace.StatusCode.ERROR)
    _provider = provider
    _tracer = provider.get_tracer("sparseserve.server", ours)


def disable() -> None:
    """Tracing off, the spans still held sent first."""
    global _tracer, _provider, _exporting
    provider, _provider, _tracer, _exporting = _provider, None, None, False
    if provider is not None:
        provider.shutdown()


def shutdown() -> None:
    """At the server's stop: ``configure``'s exporter flushed and stopped."""
    if _exporting:
        disable()


# ------------------------------------------------------------------------------ request spans
class _RequestSpan:
    """A request's SERVER span, current (``context.attach``) until ``end``."""

    __slots__ = ("span", "token")

    def __init__(self, name: str, carrier: Mapping[str, str], attributes: dict[str, Any]):
        parent = _otel.propagate.extract(carrier)  # the caller's traceparent (none: a new trace)
        self.span = _tracer.start_span(name, context=parent, kind=_otel.SERVER, attributes=attributes)
        self.token = _otel.context.attach(_otel.trace.set_span_in_context(self.span, parent))

    def end(self, info: RequestInfo) -> None:
        span = self.span
        span.set_attributes({"sparseserve.op": info.op, "sparseserve.code": info.code,
                             "sparseserve.bytes_in": info.bytes_in, "sparseserve.bytes_out": info.bytes_out})
        if info.tenant:
            span.set_attribute("sparseserve.tenant", info.tenant)
        if info.code != "OK":
            # The id the error reply and log lines carry. Not on every span: a gRPC call that
            # succeeds makes none (a fresh one is a system call, ~0.1 ms on some VMs).
            span.set_attributes({"error.type": info.code, "sparseserve.request_id": info.request_id})
            if info.code in _SERVER_FAULTS:
                _failed(span)
        self.finish_wire(info)
        span.end()
        _otel.context.detach(self.token)

    def finish_wire(self, info: RequestInfo) -> None:
        """The wire's own attributes of the outcome."""


class _GrpcSpan(_RequestSpan):
    __slots__ = ()

    def finish_wire(self, info: RequestInfo) -> None:
        import grpc  # the wire has it loaded

        status = getattr(grpc.StatusCode, info.code, grpc.StatusCode.UNKNOWN)
        self.span.set_attributes({"rpc.response.status_code": status.name, "rpc.grpc.status_code": status.value[0]})


class _RestSpan(_RequestSpan):
    __slots__ = ("scope",)

    def __init__(self, scope: dict, attributes: dict[str, Any]):
        self.scope = scope
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        super().__init__(scope["method"], carrier, attributes)

    def finish_wire(self, info: RequestInfo) -> None:
        # The route FastAPI matched ("/v1/tensors/{handle}"): Starlette's router leaves it in the scope.
        route = getattr(self.scope.get("route"), "path", None)
        if route:
            self.span.set_attribute("http.route", route)
            self.span.update_name(f"{self.scope['method']} {route}")


def grpc_request(service: str, method: str, context: Any) -> _RequestSpan | None:
    """The span of a gRPC call to ``service/method`` (None: tracing off), current until ``finish``."""
    if _tracer is None:
        return None
    carrier = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
    full = f"{service}/{method}"
    # rpc.system.name and rpc.method (fully qualified) as the current conventions have them, and
    # the earlier rpc.system and rpc.service, which many backends still read.
    return _GrpcSpan(full, carrier, {"rpc.system.name": "grpc", "rpc.system": "grpc", "rpc.service": service,
                                     "rpc.method": full})


def rest_request(scope: dict) -> _RequestSpan | None:
    """The span of an HTTP request (None: tracing off, or a probe or scrape), current until ``finish``."""
    if _tracer is None or scope["path"] in _UNTRACED_PATHS:
        return None
    return _RestSpan(scope, {"http.request.method": scope["method"], "url.path": scope["path"],
                             "url.scheme": scope.get("scheme", "http")})


def responded(span: _RequestSpan | None, status: int) -> None:
    """The HTTP status of a REST request's reply."""
    if span is not None:
        span.span.set_attribute("http.response.status_code", status)
        if status >= 500:
            _failed(span.span)


def _failed(span: Any) -> None:
    """ERROR status, unless already set (with ``record_error``'s message)."""
    if span.status.is_unset:
        span.set_status(_otel.ERROR)


def finish(span: _RequestSpan | None, info: RequestInfo) -> None:
    """End a request's span with what ``info`` learnt of it."""
    if span is not None:
        span.end(info)


def record_error(err: Any) -> None:
    """The reason of the error a request is answered with (a ``SparseServeError``), and for the
    server's faults its message as the span's status."""
    if _tracer is None:
        return
    current = _otel.trace.get_current_span()
    current.set_attribute("sparseserve.reason", err.reason)
    if err.code in _SERVER_FAULTS:
        current.set_status(_otel.ERROR, err.message)


# -------------------------------------------------------------------------------- child spans
class _Phase:
    """A span with no children, a child of the current span, left out of the context: half
    the cost of ``start_as_current_span`` (which small calls, a span per phase, feel)."""

    __slots__ = ("name", "attributes", "span")

    def __init__(self, name: str, attributes: Mapping[str, Any] | None):
        self.name, self.attributes = name, attributes

    def __enter__(self) -> None:
        self.span = _tracer.start_span(self.name, attributes=self.attributes)

    def __exit__(self, kind: Any, error: Any, _traceback: Any) -> None:
        if error is not None:  # as start_as_current_span records one
            self.span.record_exception(error)
            self.span.set_status(_otel.ERROR, f"{kind.__name__}: {error}")
        self.span.end()


def span(name: str, attributes: Mapping[str, Any] | None = None, parent: bool = False) -> Any:
    """A context manager: a span of the request's ``name`` phase (tracing off: a shared no-op).
    With ``parent``, it is the current span inside, for spans of its own."""
    if _tracer is None:
        return _NOOP
    return _tracer.start_as_current_span(name, attributes=attributes) if parent else _Phase(name, attributes)


def traced(name: str, fn: F) -> F:
    """``fn`` whose calls are ``name`` spans (tracing off: ``fn`` itself), for work handed to
    ``Service.run``: its thread gets the request's context, so the span nests there too."""
    if _tracer is None:
        return fn

    def run(*args: Any, **kwargs: Any) -> Any:
        with _Phase(name, None):
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


def current_link() -> Any:
    """The current span's context, for a batch span to link to (tracing off: None)."""
    return None if _tracer is None else _otel.trace.get_current_span().get_span_context()


def batch_span(links: list[Any], calls: int) -> Any:
    """A merged batch's span: a trace of its own (it serves several), linked to each caller's."""
    if _tracer is None:
        return _NOOP
    return _tracer.start_as_current_span(
        "batch", context=_otel.context.Context(), attributes={"sparseserve.batch.calls": calls},
        links=[_otel.Link(link) for link in links if link is not None and link.is_valid])
