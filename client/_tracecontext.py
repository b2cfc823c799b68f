"""The caller's trace, sent with each call: W3C Trace Context (``traceparent``, ``tracestate``)
as gRPC metadata and HTTP headers, so the server's span of the call is a child of the caller's
current OpenTelemetry span (docs/tracing.md).

The SDK does not depend on OpenTelemetry and never imports it first: a program that has made a
span has imported ``opentelemetry.trace``, and one that has not can have no current span. So a
call costs a dictionary lookup where OpenTelemetry is not loaded, and a context-variable read
where it is but no span is current; only then is anything sent.
"""

from __future__ import annotations

import sys

__all__ = ["trace_headers"]

_NONE: dict[str, str] = {}


def trace_headers() -> dict[str, str]:
    """``traceparent`` (and ``tracestate``, baggage: whatever the application's propagators
    write) for the current span; empty when there is none. Keys are lower case, as gRPC metadata
    needs."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return _NONE
    from opentelemetry import propagate  # loaded once the application has a span

    carrier: dict[str, str] = {}
    propagate.inject(carrier)  # the global propagators: W3C Trace Context and baggage by default
    return carrier
