"""What both wires' two ends share beyond the tensor codecs: header and metadata names, the
HTTP status of each error code, gRPC channel options, and the pipeline request's protobuf
form."""

from __future__ import annotations

from typing import Any, Iterator

from ..v1 import sparseserve_pb2 as pb
from .codec import value_from_pb, value_to_pb

PROTOBUF = "application/x-protobuf"
# The HTTP header and gRPC metadata key a caller's request id travels in.
REQUEST_ID_KEY = "x-request-id"
# The HTTP header of the caller's timeout, in seconds (gRPC has its own deadline).
TIMEOUT_KEY = "x-request-timeout"
# Upload's gRPC metadata key (REST: the query parameter "partitions") asking for a partitioned put.
PARTITIONS_KEY = "x-partitions"
# The error code an HTTP status stands for, where a reply carries no error body of ours.
HTTP_TO_CODE = {400: "INVALID_ARGUMENT", 422: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED",
                403: "PERMISSION_DENIED", 404: "NOT_FOUND", 413: "RESOURCE_EXHAUSTED",
                429: "RESOURCE_EXHAUSTED", 501: "UNIMPLEMENTED", 503: "UNAVAILABLE",
                504: "DEADLINE_EXCEEDED"}
# HTTP/2 flow-control windows start at 64 KiB and grow only as gRPC probes the link: the
# first large transfer on a connection then ran at a quarter of the speed of later ones.
# Starting each stream with room for a few chunks removes that ramp (server and SDK).
GRPC_WINDOW_OPTIONS = (("grpc.http2.lookahead_bytes", 16 << 20),)


def pipeline_request(steps: list[tuple[str, str, dict[str, Any]]], outputs: list[str],
                     keep: bool) -> pb.PipelineRequest:
    """(name, op, args) steps as a ``PipelineRequest``."""
    return pb.PipelineRequest(
        steps=[pb.PipelineStep(name=name, op=op, args={k: value_to_pb(v) for k, v in args.items()})
               for name, op, args in steps], outputs=outputs, keep=keep)


def pipeline_from_pb(msg: pb.PipelineRequest) -> tuple[list[tuple[str, str, dict[str, Any]]], list[str], bool]:
    """The server side of ``pipeline_request``."""
    steps = [(step.name, step.op, {k: value_from_pb(v, f"{step.name or i}.{k}") for k, v in step.args.items()})
             for i, step in enumerate(msg.steps)]
    return steps, list(msg.outputs), msg.keep


def iter_slices(pieces: list, size: int = 4 << 20) -> Iterator:
    """Pieces cut to at most ``size`` bytes, so that sockets get bounded writes."""
    for piece in pieces:
        view = memoryview(piece).cast("B")
        for start in range(0, len(view), size):
            yield view[start:start + size]
