"""Sans-IO halves of the SDK's transports: building requests and reading
replies for both wires. The sync and async clients share these and differ
only in how they do IO."""

from __future__ import annotations

import json
import uuid
from typing import Any, cast

import grpc

from .core.codec import tensor_from_bytes, tensor_pieces, value_from_pb
from .core.frames import execute_request_bytes, outputs_from_bytes
from .core.jsoncodec import dumps, loads, tensor_from_json, tensor_to_json, value_to_json
from .core.wire import (HTTP_TO_CODE, PARTITIONS_KEY, PROTOBUF, TIMEOUT_KEY, iter_slices,
                        pipeline_request)
from .core.errors import (REASON_METADATA_KEY, REQUEST_ID_METADATA_KEY, DeadlineExceededError, SparseServeError,
                     UnavailableError, error_for_code, error_for_grpc_status)
from .v1 import sparseserve_pb2 as pb
from .core.reasons import Reason

# ------------------------------------------------------------------ protobuf
def pipeline_json(steps: list[tuple[str, str, dict[str, Any]]], outputs: list[str], keep: bool) -> bytes:
    """The JSON body of ``POST /v1/pipelines``."""
    return dumps({"steps": [{"name": name, "op": op, "args": {k: value_to_json(v) for k, v in args.items()}}
                            for name, op, args in steps],
                  "outputs": outputs, "keep": keep})


def catalogue_from_pb(resp: pb.ListOpsResponse) -> tuple[str, list[dict[str, Any]]]:
    ops = []
    for op in resp.ops:
        ops.append({
            "name": op.name, "doc": op.doc,
            "args": [{"name": a.name, "type": a.type, "required": a.required, "doc": a.doc,
                      "default": value_from_pb(a.default, a.name) if a.HasField("default") else None,
                      "layouts": list(a.layouts)} for a in op.args],
            "outputs": [{"name": o.name, "type": o.type, "doc": o.doc} for o in op.outputs],
            "iterative": op.iterative,
        })
    return resp.device, ops


def grpc_error(exc: grpc.RpcError, request_id: str | None = None) -> SparseServeError:
    """The SDK error for a failed gRPC call; its request id is the server's, else the one sent,
    else (the server never answered) a fresh one."""
    code = exc.code()
    details = exc.details() or code.name
    metadata = exc.trailing_metadata() or ()
    meta = {k: v for k, v in metadata}
    return error_for_grpc_status(code, details, meta.get(REASON_METADATA_KEY) or _core_reason(code, details),
                                 new_request_id(meta.get(REQUEST_ID_METADATA_KEY) or request_id))


def _core_reason(code: grpc.StatusCode, details: str) -> str | None:
    """The reason of an error gRPC made itself, where the server's handler sent none: a message
    over its size limit (the details say which side refused), or a connection lost or never
    made (UNAVAILABLE without our trailer: CONNECTION, as the REST transport says)."""
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details:
        return Reason.REQUEST_TOO_LARGE if details.startswith("SERVER:") else Reason.RESPONSE_TOO_LARGE
    if code == grpc.StatusCode.UNAVAILABLE:
        return Reason.CONNECTION
    return None


def call_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def new_request_id(chosen: str | None = None) -> str:
    return chosen or uuid.uuid4().hex


# ------------------------------------------------------------------ REST
def json_body(args: dict[str, Any]) -> bytes:
    return dumps({k: value_to_json(v) for k, v in args.items()})


def outputs_from_json(obj: dict) -> list[tuple[str, Any]]:
    """Named outputs of a JSON reply. The server writes every tensor as an object, so an array
    is a list output (its tensors, or with keep their handles), empty or not."""
    return [(name, [tensor_from_json(v, f"{name}[{i}]") for i, v in enumerate(value)]
             if isinstance(value, list) else tensor_from_json(value, name))
            for name, value in obj["outputs"].items()]


def rest_execute(op: str, args: dict[str, Any], keep: bool, encoding: str) -> dict[str, Any]:
    """The request arguments of ``POST /v1/ops/{op}``."""
    if encoding == "protobuf":
        return {"content": execute_request_bytes(op, args, keep),
                "headers": {"content-type": PROTOBUF}}
    return {"content": json_body(args), "params": {"keep": "true"} if keep else None,
            "headers": {"content-type": "application/json"}}


def rest_pipeline(steps: list, outputs: list[str], keep: bool, encoding: str) -> dict[str, Any]:
    """The request arguments of ``POST /v1/pipelines``."""
    if encoding == "protobuf":
        return {"content": pipeline_request(steps, outputs, keep).SerializeToString(),
                "headers": {"content-type": PROTOBUF}}
    return {"content": pipeline_json(steps, outputs, keep), "headers": {"content-type": "application/json"}}


def rest_outputs(content: bytes | memoryview, encoding: str) -> list[tuple[str, Any]]:
    """The outputs of a ``POST /v1/ops/{op}`` reply."""
    if encoding == "protobuf":
        return outputs_from_bytes(cast(bytes, content))  # a view reads as well
    return outputs_from_json(loads(content))


def rest_put(tensor: Any, encoding: str, *, streamed: bool = False, partitions: int = 0) -> dict[str, Any]:
    """The request arguments of ``POST /v1/tensors``. ``streamed``: a protobuf body goes as a
    list of its pieces (views of the arrays' own memory, no joined copy; a list, so that a
    request retried on a new connection sends them again) with its Content-Length."""
    headers = {"accept": "application/json"}
    params = {"partitions": str(partitions)} if partitions else None
    if encoding == "protobuf":
        pieces = tensor_pieces(tensor)
        headers |= {"content-type": PROTOBUF, "content-length": str(sum(len(p) for p in pieces))}
        content = list(iter_slices(pieces)) if streamed else b"".join(pieces)
    else:
        content = dumps(tensor_to_json(tensor))
        headers["content-type"] = "application/json"
    return {"content": content, "headers": headers, "params": params}


def upload_metadata(metadata: tuple, partitions: int) -> tuple:
    """Upload's gRPC metadata, with the partitions asked for."""
    return (*metadata, (PARTITIONS_KEY, str(partitions))) if partitions else metadata


def http_headers(token: str | None, encoding: str, timeout: float | None = None) -> dict[str, str]:
    headers = {"accept": PROTOBUF if encoding == "protobuf" else "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    if timeout is not None:  # the server abandons the work when the SDK stops waiting for it
        headers[TIMEOUT_KEY] = repr(float(timeout))
    return headers


def http_error(status: int, body: bytes, request_id: str | None = None) -> SparseServeError:
    """The SDK error for an HTTP error response (the JSON error body of docs/contract.md ("Errors"));
    ``request_id`` (the response's header, else the one sent) when the body has none."""
    try:
        err = json.loads(body)["error"]
        return error_for_code(err["code"], err["message"], err.get("reason"),
                              new_request_id(err.get("request_id") or request_id))
    except (ValueError, KeyError, TypeError):
        code = HTTP_TO_CODE.get(status, "INTERNAL" if status >= 500 else "UNKNOWN")
        return error_for_code(code, f"HTTP {status}: {body[:200]!r}", request_id=new_request_id(request_id))


def transport_error(exc: Exception, request_id: str | None = None) -> SparseServeError:
    """Timeouts and connection failures (httpx's, or the socket's and http.client's under
    ``_http``) as SDK errors, with the id sent, else a fresh one."""
    import httpx

    request_id = new_request_id(request_id)
    if isinstance(exc, (httpx.TimeoutException, TimeoutError)):
        return DeadlineExceededError(f"no answer within the timeout: {exc}", reason=Reason.TIMEOUT,
                                     request_id=request_id)
    return UnavailableError(f"cannot reach the server: {exc}", reason=Reason.CONNECTION, request_id=request_id)


def decode_rest_tensor(content: bytes | memoryview, content_type: str) -> Any:
    if content_type.startswith(PROTOBUF):
        return tensor_from_bytes(content, "tensor")
    return tensor_from_json(loads(content), "tensor")


