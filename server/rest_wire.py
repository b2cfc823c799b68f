"""The REST wire (docs/contract.md ("REST")): FastAPI routes derived from the registry.

Bodies are JSON, or ``application/x-protobuf`` carrying the gRPC messages; the
same ``Service`` answers both. Each op gets its own route so that the OpenAPI
schema at ``/docs`` documents its arguments; the schemas come from the
registry's argument types.
"""

from __future__ import annotations

import hmac
import logging
from importlib.metadata import PackageNotFoundError, version as installed_version
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi_standalone_docs import StandaloneDocs
from starlette.requests import ClientDisconnect

from sparseserve.core.codec import tensor_from_bytes, tensor_pieces
from sparseserve.core.frames import execute_request_from_bytes, outputs_to_bytes
from sparseserve.core.jsoncodec import dumps, is_tensor_json, loads, tensor_from_json, tensor_to_json
from sparseserve.core.tensor import OutputRef
from sparseserve.core.wire import HTTP_TO_CODE, REQUEST_ID_KEY, TIMEOUT_KEY, iter_slices, pipeline_from_pb
from sparseserve.core.errors import (InternalError, InvalidArgumentError, ResourceExhaustedError,
                                SparseServeError, UnauthenticatedError)
from sparseserve.core.reasons import Reason
from sparseserve.kernels.text import json_depth
from sparseserve.v1 import sparseserve_pb2 as pb

from . import tracing
from .buffers import arriving
from .limits import deadline_from_timeout
from .metrics import CONTENT_TYPE_LATEST, current
from .registry import OpDef
from .service import Service, partitions_from_text
from .sizes import arguments_nbytes
from .tenants import call_tenant, common_name

__all__ = ["create_app", "PROTOBUF"]

log = logging.getLogger("sparseserve.rest")
PROTOBUF = "application/x-protobuf"
# Body problems that are "not the schema" (422) rather than a bad value (400).
_SCHEMA_REASONS = {"BAD_JSON", "BAD_BODY", "UNKNOWN_ARGUMENT", "MISSING_ARGUMENT", "BAD_ARGUMENT_TYPE"}


def _wants_protobuf(request: Request) -> bool:
    """Protobuf replies when asked for by Accept, or, with no preference, to protobuf requests."""
    accept = request.headers.get("accept", "*/*")
    if PROTOBUF in accept:
        return True
    return accept.strip() in ("", "*/*") and _is_protobuf_body(request)


def _is_protobuf_body(request: Request) -> bool:
    return request.headers.get("content-type", "").startswith(PROTOBUF)


def error_response(err: SparseServeError) -> JSONResponse:
    tracing.record_error(err)
    info = current.get()
    if info is not None:
        info.code = err.code
        err.request_id = info.request_id
    status = 422 if err.code == "INVALID_ARGUMENT" and err.reason in _SCHEMA_REASONS else err.http_status
    # A body left unread: the connection cannot carry another request, so it closes.
    headers = {"connection": "close"} if err.reason == Reason.BODY_TIMEOUT else None
    return JSONResponse(err.to_json(), status_code=status, headers=headers)


_REQUEST_ID_HEADER = REQUEST_ID_KEY.encode()
_TIMEOUT_HEADER = TIMEOUT_KEY.encode()
# The "op" label of the routes that are not an op's; any other path is "unknown", so a client's
# paths cannot make new label values.
_ROUTE_OPS = {("GET", "/v1/ops"): "list_ops", ("POST", "/v1/tensors"): "put", ("POST", "/v1/pipelines"): "pipeline",
              ("GET", "/healthz"): "healthz", ("GET", "/readyz"): "readyz", ("GET", "/docs"): "docs",
              ("GET", "/redoc"): "docs", ("GET", "/openapi.json"): "openapi", ("GET", "/v2/health/live"): "v2_live",
              ("GET", "/v2/health/ready"): "v2_ready", ("GET", "/v2"): "v2_metadata"}
_HANDLE_OPS = {"GET": "get", "DELETE": "delete"}


def _route_op(service: Service, method: str, path: str) -> str:
    if path.startswith("/v1/ops/"):
        name = path[len("/v1/ops/"):]
        return name if method == "POST" and name in service.registry.ops else "unknown"
    if path.startswith("/v1/tensors/"):
        return _HANDLE_OPS.get(method, "unknown")
    if path.startswith(("/docs/", "/redoc/")):  # the pages' scripts, style sheet and images
        return "docs"
    return _ROUTE_OPS.get((method, path), "unknown")


class _Observe:
    """Every HTTP request gets a request id (the x-request-id header of every response, error
    bodies, log lines), metrics and an access line. Plain ASGI rather than BaseHTTPMiddleware,
    which would buffer streamed bodies; it also turns bugs into the INTERNAL error body here,
    inside the request's context, instead of in Starlette's outermost handler."""

    def __init__(self, app, service: Service):
        self.app = app
        self.service = service

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = next((v.decode("latin-1") for k, v in scope["headers"] if k == _REQUEST_ID_HEADER), None)
        counted = scope["path"] != "/metrics"  # the operator's scrapes are not traffic
        metrics = self.service.metrics
        info, token = metrics.begin("rest", _route_op(self.service, scope["method"], scope["path"]), given)
        span = tracing.rest_request(scope)
        header = (_REQUEST_ID_HEADER, info.request_id.encode())
        started = False

        async def counted_receive():
            message = await receive()
            info.bytes_in += len(message.get("body", b""))
            return message

        async def observed_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", ()), header]
                status = message["status"]
                tracing.responded(span, status)
                if status >= 400 and info.code == "OK":  # an error not raised as ours (404 route, ...)
                    info.code = HTTP_TO_CODE.get(status, "INTERNAL" if status >= 500 else "UNKNOWN")
            else:
                info.bytes_out += len(message.get("body", b""))
            await send(message)

        timeout = next((v.decode("latin-1") for k, v in scope["headers"] if k == _TIMEOUT_HEADER), None)
        try:
            if timeout is not None:
                try:
                    info.deadline = deadline_from_timeout(timeout, f"the {TIMEOUT_KEY} header")
                except SparseServeError as err:
                    return await error_response(err)(scope, receive, observed_send)
            await self.app(scope, counted_receive, observed_send)
        except ClientDisconnect:  # the client went away mid-body: nobody to answer, as gRPC's CANCELLED
            info.code = "CANCELLED"
        except Exception as exc:
            if started:
                info.code = "INTERNAL"
                raise
            log.exception("unexpected error")  # keep serving; say it was a bug
            await error_response(InternalError(f"{type(exc).__name__}: {exc}"))(scope, receive, observed_send)
        finally:
            tracing.finish(span, info)
            if counted:
                metrics.end(info, token)
            else:
                current.reset(token)


def _tenant(service: Service, request: Request) -> str:
    """The caller's tenant (``tenants.call_tenant``): under mutual TLS from the client
    certificate's subject, which the ASGI TLS extension carries (``client_cert_name``, RFC 4514;
    ``app.py`` puts it in the scope, as uvicorn does not)."""
    authorization = request.headers.get("authorization")
    if not service.config.tls_client_ca:
        return service.tenant_for(authorization)
    tls = request.scope.get("extensions", {}).get("tls") or {}
    subject = tls.get("client_cert_name")
    return call_tenant(service, authorization, common_name(subject) if subject else None)


def _check_metrics_token(service: Service, authorization: str | None) -> None:
    expected = service.config.metrics_token
    if not expected:
        return
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), expected.encode()):
        raise UnauthenticatedError("GET /metrics needs the metrics token (Authorization: Bearer ..., "
                                   "the server's --metrics-token)",
                                   reason=Reason.BAD_TOKEN if authorization else Reason.MISSING_TOKEN)


async def _read_body(request: Request, service: Service) -> bytes | memoryview:
    limit = service.config.max_request_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ResourceExhaustedError(f"the request body has {declared} bytes, over the limit of {limit} "
                                     "bytes (--max-request-bytes)", reason=Reason.REQUEST_TOO_LARGE)
    too_large = ResourceExhaustedError(f"the request body is over the limit of {limit} bytes "
                                       "(--max-request-bytes)", reason=Reason.REQUEST_TOO_LARGE)
    # Each read brings bytes within --body-timeout, or the call fails and what it took goes back.
    parts = arriving(request.stream(), service.config.body_timeout, "the request body")
    if declared is not None and declared.isdigit():
        # The size is known: one buffer (from the pool, or numpy's with huge pages), each
        # part copied once to its place.
        body = service.buffers.take(int(declared))
        filled = 0
        async for part in parts:
            if filled + len(part) > body.size:
                raise InvalidArgumentError("the request body is longer than its Content-Length",
                                           reason=Reason.BAD_BODY)
            body[filled:filled + len(part)] = np.frombuffer(part, np.uint8)
            filled += len(part)
        return memoryview(body.data)[:filled]
    pieces, size = [], 0
    async for part in parts:
        pieces.append(part)
        size += len(part)
        if size > limit:
            raise too_large
    return b"".join(pieces)


def _parse_json(body: bytes | memoryview, max_depth: int) -> Any:
    """The JSON value of ``body``, refused past --max-json-depth levels of nesting (a tensor
    needs its rank plus two)."""
    try:
        obj = loads(body)
    except RecursionError:  # deeper than Python's parser goes (about a thousand levels)
        raise ResourceExhaustedError(f"the JSON body nests deeper than Python's parser allows, over the limit "
                                     f"of {max_depth} levels (--max-json-depth)", reason=Reason.JSON_TOO_DEEP) from None
    except ValueError as exc:
        raise InvalidArgumentError(f"the body is not valid JSON: {exc}", reason=Reason.BAD_JSON) from None
    depth = json_depth(np.frombuffer(body, np.uint8))
    if depth > max_depth:
        raise ResourceExhaustedError(f"the JSON body nests {depth} levels deep, over the limit of {max_depth} "
                                     "levels (--max-json-depth)", reason=Reason.JSON_TOO_DEEP)
    return obj


def _json_arg(value: Any, name: str) -> Any:
    """A JSON argument value: tensors and pipeline references decoded (in lists too), the rest
    as is."""
    if _is_ref_json(value):
        return OutputRef(value["ref"])
    if is_tensor_json(value):
        return tensor_from_json(value, name)
    if isinstance(value, list) and value and all(is_tensor_json(v) or _is_ref_json(v) for v in value):
        return [_json_arg(v, f"{name}[{i}]") for i, v in enumerate(value)]
    return value


def _is_ref_json(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("ref"), str)


def _decode_pipeline_body(body: bytes | memoryview, protobuf: bool, max_depth: int):
    """(steps, outputs, keep) of a protobuf PipelineRequest or its JSON form."""
    if protobuf:
        return pipeline_from_pb(_parse_message(pb.PipelineRequest, body))
    obj = _parse_json(body, max_depth)
    if not isinstance(obj, dict) or not isinstance(obj.get("steps"), list) \
            or not all(isinstance(step, dict) for step in obj["steps"]):
        raise InvalidArgumentError('the body must be {"steps": [{"name", "op", "args"}, ...], "outputs": '
                                   '[...], "keep": false}', reason=Reason.BAD_JSON)
    steps = []
    for i, step in enumerate(obj["steps"]):
        name, op, args = step.get("name", ""), step.get("op"), step.get("args", {})
        if not isinstance(name, str) or not isinstance(op, str) or not isinstance(args, dict):
            raise InvalidArgumentError(f"steps[{i}] needs a string op, an optional string name and an "
                                       "object of args", reason=Reason.BAD_JSON)
        steps.append((name, op, {k: _json_arg(v, f"{name or i}.{k}") for k, v in args.items()}))
    outputs = obj.get("outputs", [])
    if not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs):
        raise InvalidArgumentError("outputs must be a list of \"<step>.<output>\" names", reason=Reason.BAD_JSON)
    return steps, outputs, bool(obj.get("keep", False))


def _version() -> str:
    """The installed distribution's version; the package's own where it runs from a source tree
    on sys.path with no distribution installed (it must still serve)."""
    try:
        return installed_version("sparseserve")
    except PackageNotFoundError:
        from sparseserve.core import __version__

        return __version__


def create_app(service: Service) -> FastAPI:
    app = FastAPI(
        title="sparseserve",
        version="1",
        description="Sparse tensor compute over REST. Every op also takes "
                    "`application/x-protobuf` bodies carrying `sparseserve.v1.ExecuteRequest`.",
        # Swagger UI would send the document to validator.swagger.io to show a badge.
        swagger_ui_parameters={"validatorUrl": None},
    )
    # /docs and /redoc load their scripts, style sheet and images from /docs/... and /redoc/...
    # (the files fastapi-standalone-docs installs), without web fonts: nothing from another host,
    # so they work offline. Like /docs and /openapi.json, the files need no token.
    StandaloneDocs(app)

    @app.exception_handler(SparseServeError)
    async def _service_error(request: Request, err: SparseServeError):
        return error_response(err)

    app.add_middleware(_Observe, service=service)

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request):
        """Prometheus text: the operator's, not a tenant's. With --metrics-token it needs that
        token (Authorization: Bearer), else none, like /healthz."""
        _check_metrics_token(service, request.headers.get("authorization"))
        return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", tags=["health"])
    async def healthz():
        """Liveness: the process is up and its event loop answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz():
        """Readiness: kernels compiled or loaded from cache."""
        body = {"status": "ready" if service.ready else "warming up", "device": service.device}
        return JSONResponse(body, status_code=200 if service.ready else 503)

    # The Open Inference Protocol's (KServe v2) names for the same two questions, and its server
    # metadata. Its health answers are 200 for true and a 4xx for false (400, as Triton's).
    @app.get("/v2/health/live", tags=["health"])
    async def v2_health_live():
        """Liveness (as /healthz: the event loop answers), for Open Inference Protocol clients."""
        return {"live": True}

    @app.get("/v2/health/ready", tags=["health"])
    async def v2_health_ready():
        """Readiness (as /readyz), for Open Inference Protocol clients: `{"ready": true}`, or 400 and
        `{"ready": false}` until the kernels are compiled or loaded from cache."""
        ready = (await readyz()).status_code == 200
        return JSONResponse({"ready": ready}, status_code=200 if ready else 400)

    server_metadata = {"name": "sparseserve", "version": _version(), "extensions": []}

    @app.get("/v2", tags=["health"])
    async def v2_metadata():
        """Server metadata (Open Inference Protocol): name, version, and the protocol extensions
        served (none)."""
        return server_metadata

    @app.get("/v1/ops", tags=["ops"])
    async def list_ops(request: Request):
        """The op catalogue: every op with its arguments, types, defaults, outputs and docs."""
        _tenant(service, request)
        return {"device": service.device, "ops": service.catalogue()}

    for op in service.registry:
        _add_op_route(app, service, op)

    @app.post("/v1/ops/{op}", tags=["ops"], include_in_schema=False)
    async def unknown_op(op: str):
        service.registry.get(op)  # raises NOT_FOUND

    @app.post("/v1/tensors", tags=["tensors"])
    async def put_tensor(request: Request):
        """Store a tensor (JSON tensor or protobuf `Tensor`) and return its handle. `?partitions=N`
        (a server with --dask-scheduler): cut it into N row blocks on the Dask workers."""
        tenant = _tenant(service, request)
        body = await _read_body(request, service)
        decode = _decode_pb_tensor if _is_protobuf_body(request) else _decode_json_tensor
        partitions = partitions_from_text(request.query_params.get("partitions"), "the partitions query parameter")
        tensor = await service.run(tracing.traced("decode", decode), body, service.config.max_json_depth)
        handle, nbytes = await service.put(tensor, tenant, partitions)
        if _wants_protobuf(request):
            return Response(pb.Handle(handle=handle, nbytes=nbytes).SerializeToString(), media_type=PROTOBUF)
        return {"handle": handle, "nbytes": nbytes}

    @app.get("/v1/tensors/{handle}", tags=["tensors"])
    async def get_tensor(handle: str, request: Request):
        """Fetch a stored tensor (JSON, or protobuf `Tensor` with `Accept: application/x-protobuf`)."""
        tensor = await service.get(handle, _tenant(service, request))
        if _wants_protobuf(request):
            # The message streams as its pieces, the arrays straight from the store's memory.
            pieces = await service.run(tracing.traced("encode", tensor_pieces), tensor)
            return StreamingResponse(iter_slices(pieces), media_type=PROTOBUF,
                                     headers={"content-length": str(sum(len(p) for p in pieces))})
        # Encoded off the loop, as the protobuf pieces are: a big tensor's text takes a while.
        body = await service.run(tracing.traced("encode", lambda: dumps(tensor_to_json(tensor))))
        return Response(body, media_type="application/json")

    @app.delete("/v1/tensors/{handle}", tags=["tensors"])
    async def delete_tensor(handle: str, request: Request):
        await service.delete(handle, _tenant(service, request))
        return {"deleted": True}

    @app.post("/v1/pipelines", tags=["pipelines"], openapi_extra=_PIPELINE_BODY)
    async def run_pipeline(request: Request):
        """Run a short chain of ops in one request: a step's argument `{"ref": "<step>.<output>"}`
        is an output of an earlier step. Every step is checked before the first runs; `outputs`
        (default: the last step's) come back, or their handles with `keep`."""
        tenant = _tenant(service, request)
        body = await _read_body(request, service)
        steps, outputs, keep = await service.run(tracing.traced("decode", _decode_pipeline_body), body,
                                                 _is_protobuf_body(request), service.config.max_json_depth,
                                                 nbytes=len(body))
        results = await service.execute_pipeline(steps, outputs, keep, tenant)
        return await _outputs_response(service, request, results, "pipeline result")

    _add_tensor_schemas(app, tokens=bool(service.tokens))
    return app


_PIPELINE_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {
        "type": "object", "required": ["steps"], "additionalProperties": False,
        "properties": {
            "steps": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["op"], "additionalProperties": False,
                "properties": {"name": {"type": "string"}, "op": {"type": "string"},
                               "args": {"type": "object", "description": "as for the op; "
                                        "{\"ref\": \"<step>.<output>\"} names an earlier output"}}}},
            "outputs": {"type": "array", "items": {"type": "string"}},
            "keep": {"type": "boolean"}}}},
    PROTOBUF: {"schema": {"type": "string", "format": "binary"}}}}}


def _add_tensor_schemas(app: FastAPI, *, tokens: bool) -> None:
    """Put the JSON tensor forms of docs/contract.md ("REST") into the OpenAPI components, and, on a server
    with tokens, the bearer scheme on the routes that need one: /docs then has an Authorize
    button, and "Try it out" sends the token."""
    from fastapi.openapi.utils import get_openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            components = schema.setdefault("components", {})
            components.setdefault("schemas", {}).update(TENSOR_SCHEMAS)
            if tokens:
                components["securitySchemes"] = {"bearer": {
                    "type": "http", "scheme": "bearer", "description": "A token of --token or --token-file"}}
                for path, item in schema.get("paths", {}).items():
                    if path.startswith("/v1/"):
                        for operation in item.values():
                            operation["security"] = [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the schema


_INT_LIST = {"type": "array", "items": {"type": "integer"}}
_NESTED = {"description": "A nested list of numbers (complex: [re, im] pairs; non-finite floats "
                          "as \"NaN\", \"Infinity\", \"-Infinity\")"}
TENSOR_SCHEMAS = {
    "SparseTensorJSON": {
        "type": "object",
        "description": "A sparse tensor. COO: indices [nnz, sparse_ndim], values, dense_shape. "
                       "CSR/CSC/BSR/BSC: compressed_indices, plain_indices, values, dense_shape, "
                       "layout, blocksize.",
        "properties": {
            "layout": {"type": "string", "enum": ["coo", "csr", "csc", "bsr", "bsc"]},
            "dtype": {"type": "string"},
            "dense_shape": _INT_LIST,
            "indices": {"type": "array", "items": _INT_LIST},
            "values": _NESTED,
            "compressed_indices": _NESTED,
            "plain_indices": _NESTED,
            "index_dtype": {"type": "string", "enum": ["int32", "int64"]},
            "blocksize": _INT_LIST,
        },
        "required": ["values", "dense_shape"],
    },
    "DenseTensorJSON": {
        "type": "object",
        "properties": {"dtype": {"type": "string"}, "shape": _INT_LIST, "data": {"type": "array"}},
        "required": ["shape", "data"],
    },
    "HandleJSON": {"type": "object", "properties": {"handle": {"type": "string"}},
                   "required": ["handle"]},
    "Tensor": {"oneOf": [{"$ref": "#/components/schemas/SparseTensorJSON"},
                         {"$ref": "#/components/schemas/DenseTensorJSON"},
                         {"$ref": "#/components/schemas/HandleJSON"},
                         {"type": "array", "description": "A dense tensor as a nested list"}]},
}


def _decode_json_tensor(body: bytes, max_depth: int):
    return tensor_from_json(_parse_json(body, max_depth), "tensor")


def _parse_message(cls, body: bytes | memoryview):
    try:
        return cls.FromString(body)
    except Exception:  # protobuf raises DecodeError, or others on some inputs
        raise InvalidArgumentError(f"the body is not a sparseserve.v1.{cls.__name__} message",
                                   reason=Reason.BAD_BODY) from None


def _decode_pb_tensor(body: bytes, max_depth: int):
    return tensor_from_bytes(body, "tensor")


def _decode_op_body(body: bytes, protobuf: bool, max_depth: int) -> tuple[dict[str, Any], bool]:
    """(arguments, keep) from a protobuf ExecuteRequest or a JSON object of named arguments."""
    if protobuf:
        _, args, keep = execute_request_from_bytes(body)  # the op is the path's
        return args, keep
    obj = _parse_json(body, max_depth) if body else {}
    if not isinstance(obj, dict):
        raise InvalidArgumentError("the body must be a JSON object of named arguments", reason=Reason.BAD_JSON)
    return {name: _json_arg(v, name) for name, v in obj.items()}, False


def _op_schema(op: OpDef) -> dict:
    props = {a.name: {**a.type.schema, "description": a.doc} for a in op.args}
    for a in op.args:
        if not a.required and a.default is not None:
            props[a.name]["default"] = a.default
    return {"type": "object", "properties": props,
            "required": [a.name for a in op.args if a.required], "additionalProperties": False}


async def _outputs_response(service: Service, request: Request, outputs: list[tuple[str, Any]], what: str):
    """Named outputs as an ExecuteResponse (over the message limit: refused, keep=true then) or
    as JSON, as the request's Accept asks."""
    if _wants_protobuf(request):
        size = service.check_result_size([t for _, t in outputs], service.config.max_request_bytes, what)
        body = await service.run(tracing.traced("encode", outputs_to_bytes), outputs, nbytes=size)
        return Response(body, media_type=PROTOBUF)
    body = await service.run(tracing.traced("encode", lambda: dumps({"outputs": {
                                 n: [tensor_to_json(x) for x in t] if isinstance(t, list) else tensor_to_json(t)
                                 for n, t in outputs}})),
                             nbytes=arguments_nbytes(t for _, t in outputs))
    return Response(body, media_type="application/json")


def _add_op_route(app: FastAPI, service: Service, op: OpDef) -> None:
    outputs = ", ".join(f"`{o.name}` ({o.type})" for o in op.outputs)
    openapi_extra = {"requestBody": {"required": True, "content": {
        "application/json": {"schema": _op_schema(op)},
        PROTOBUF: {"schema": {"type": "string", "format": "binary"}}}}}

    async def run_op(request: Request, keep: bool = False):
        tenant = _tenant(service, request)
        body = await _read_body(request, service)
        protobuf = _is_protobuf_body(request)
        args, keep_in_body = await service.run(tracing.traced("decode", _decode_op_body), body, protobuf,
                                               service.config.max_json_depth, nbytes=len(body))
        keep = keep or keep_in_body
        outputs = await service.execute(op.name, args, keep, tenant)
        return await _outputs_response(service, request, outputs, f"{op.name} result")

    run_op.__name__ = f"op_{op.name}"
    app.add_api_route(f"/v1/ops/{op.name}", run_op, methods=["POST"], tags=["ops"],
                      summary=op.doc.splitlines()[0], description=f"{op.doc}\n\nOutputs: {outputs}.",
                      openapi_extra=openapi_extra)
