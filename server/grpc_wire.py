"""The gRPC wire: ``sparseserve.v1.SparseService`` on grpc.aio, plus the
standard health checking and reflection services."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator, TypeVar

import grpc
from grpc._cython import cygrpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sparseserve.core.codec import ChunkAssembler, iter_chunks, value_to_pb
from sparseserve.core.frames import (MessageAssembler, execute_request_from_bytes, message_frames, outputs_pieces,
                                outputs_to_bytes, progress_result_bytes)
from sparseserve.core.wire import GRPC_WINDOW_OPTIONS
from sparseserve.core.wire import PARTITIONS_KEY, REQUEST_ID_KEY, pipeline_from_pb
from sparseserve.core.errors import REASON_METADATA_KEY, REQUEST_ID_METADATA_KEY, InternalError, SparseServeError
from sparseserve.core.reasons import Reason
from sparseserve.v1 import sparseserve_pb2 as pb
from sparseserve.v1 import sparseserve_pb2_grpc as pb_grpc

from . import tracing
from .buffers import arriving
from .limits import deadline_from_remaining, progress_sink, seconds_left
from .metrics import Metrics, RequestInfo, count_sent, current
from .service import Service, partitions_from_text
from .store import STORE_LIMIT, STORE_REASON
from .tenants import call_tenant

__all__ = ["create_grpc_server", "catalogue_to_pb"]

log = logging.getLogger("sparseserve.grpc")
_HEALTH_SERVICE = "sparseserve.v1.SparseService"


def catalogue_to_pb(catalogue: list[dict[str, Any]], device: str) -> pb.ListOpsResponse:
    ops = []
    for entry in catalogue:
        args = []
        for a in entry["args"]:
            arg = pb.ArgDef(name=a["name"], type=a["type"], required=a["required"], doc=a["doc"],
                            layouts=a["layouts"])
            if not a["required"] and a["default"] is not None:
                arg.default.CopyFrom(value_to_pb(a["default"]))
            args.append(arg)
        ops.append(pb.OpDef(name=entry["name"], doc=entry["doc"], args=args,
                            outputs=[pb.OutputDef(**o) for o in entry["outputs"]],
                            iterative=entry.get("iterative", False)))
    return pb.ListOpsResponse(ops=ops, device=device)


async def _abort(context: grpc.aio.ServicerContext, err: SparseServeError):
    metadata = [(REASON_METADATA_KEY, err.reason)]
    tracing.record_error(err)
    info = current.get()
    if info is not None:
        info.code = err.code
        metadata.append((REQUEST_ID_METADATA_KEY, info.request_id))
    context.set_trailing_metadata(tuple(metadata))
    try:
        await context.abort(err.grpc_status, err.message)
    except _CALL_ALREADY_ENDED:
        # Nobody to tell: gRPC itself refused a message over the size limit (the request
        # stream then ends early here), or the call was cancelled meanwhile.
        if info is not None:
            info.code = "CANCELLED"
        raise asyncio.CancelledError from None


# What abort raises when the call has already ended (grpc has no public name for it).
_CALL_ALREADY_ENDED = getattr(cygrpc, "ExecuteBatchError", grpc.RpcError)
E = TypeVar("E", bound=BaseException)


def _tenant(service: Service, context: grpc.aio.ServicerContext) -> str:
    if service.config.tls_client_ca:  # mutual TLS: the handshake verified the certificate
        names = context.auth_context().get("x509_common_name") or [b""]
        authorization = _metadata_value(context, "authorization") if service.tokens else None
        return call_tenant(service, authorization, names[0].decode("utf-8", errors="replace"))
    if not service.tokens:  # no tokens, one tenant: the metadata need not be read
        return ""
    return service.tenant_for(_metadata_value(context, "authorization"))


class SparseServicer(pb_grpc.SparseServiceServicer):
    """The methods' bodies. Errors are ``_observed``'s to answer: a ``SparseServeError`` becomes
    its gRPC status, anything else INTERNAL."""

    def __init__(self, service: Service):
        self.service = service

    async def _response(self, outputs: list[tuple[str, Any]], what: str) -> bytes:
        """Outputs as a serialized ExecuteResponse, refused when over the message limit (keep=true
        then)."""
        size = self.service.check_result_size([t for _, t in outputs], self.service.config.max_request_bytes, what)
        return await self.service.run(tracing.traced("encode", outputs_to_bytes), outputs, nbytes=size)

    async def Execute(self, request: bytes, context) -> bytes:
        tenant = _tenant(self.service, context)
        op, args, keep = await self.service.run(tracing.traced("decode", execute_request_from_bytes), request,
                                                nbytes=len(request))
        outputs = await self.service.execute(op, args, keep, tenant)
        return await self._response(outputs, f"{op} result")

    async def ExecuteStream(self, request_iterator: AsyncIterator[bytes], context):
        """Execute, the request and the reply in ``MessageFrame``s. The reply is not held to
        the message limit: frames of any number travel (--max-result-bytes still applies)."""
        tenant = _tenant(self.service, context)
        assembler = MessageAssembler("request", max_bytes=self.service.config.max_request_bytes,
                                     allocate=self.service.buffers.take)
        async for frame in request_iterator:
            assembler.add(frame)
        request = assembler.finish()
        op, args, keep = await self.service.run(tracing.traced("decode", execute_request_from_bytes), request,
                                                nbytes=len(request))
        outputs = await self.service.execute(op, args, keep, tenant)
        for frame in message_frames(tracing.traced("encode", outputs_pieces)(outputs)):
            await context.write(frame)
            count_sent(len(frame))

    async def ExecuteWithProgress(self, request: bytes, context):
        """Execute, with an iterative op's progress streamed before its answer (``_Watch``). A
        caller that cancels the call abandons the work: the kernel thread stops at its next
        iteration rather than running on for nobody."""
        tenant = _tenant(self.service, context)
        op, args, keep = await self.service.run(tracing.traced("decode", execute_request_from_bytes), request,
                                                nbytes=len(request))
        watch = _Watch(asyncio.get_running_loop())
        token = progress_sink.set(watch.report)  # Service.run copies the context into the kernel thread
        try:
            work = asyncio.ensure_future(self.service.execute(op, args, keep, tenant))
        finally:
            progress_sink.reset(token)
        written = None
        try:
            while True:
                waiting = asyncio.ensure_future(watch.queue.get())
                await asyncio.wait((work, waiting), return_when=asyncio.FIRST_COMPLETED)
                if not waiting.done():
                    waiting.cancel()
                    break
                written = watch.latest(waiting.result())
                await self._write(context, written)
            outputs = work.result()  # the op's error, if any, ends the stream as Execute's would
        except BaseException:  # cancelled (the caller went away, or its deadline), or an error
            watch.cancelled = True
            work.cancel()
            raise
        if watch.newest is not None and watch.newest is not written:  # the last iteration, held back
            await self._write(context, watch.newest)
        size = self.service.check_result_size([t for _, t in outputs], self.service.config.max_request_bytes,
                                              f"{op} result")
        reply = await self.service.run(tracing.traced("encode", progress_result_bytes), outputs, nbytes=size)
        await context.write(reply)
        count_sent(len(reply))

    @staticmethod
    async def _write(context, report: dict[str, Any]) -> None:
        progress = pb.Progress(op=report["op"], iteration=int(report.get("iteration", 0)))
        if report.get("residual_norm") is not None:  # eigsh reports its operator applications alone
            progress.residual_norm = float(report["residual_norm"])
        message = pb.ExecuteProgress(progress=progress).SerializeToString()
        await context.write(message)
        count_sent(len(message))

    async def Upload(self, request_iterator: AsyncIterator[bytes], context) -> pb.Handle:
        tenant = _tenant(self.service, context)
        partitions = partitions_from_text(_metadata_value(context, PARTITIONS_KEY), f"{PARTITIONS_KEY} metadata")
        assembler = ChunkAssembler("tensor", max_bytes=self.service.upload_budget(),
                                   limit=STORE_LIMIT, reason=STORE_REASON, allocate=self.service.buffers.take)
        async for frame in request_iterator:
            assembler.add(frame)
        tensor = tracing.traced("decode", assembler.finish)()
        handle, nbytes = await self.service.put(tensor, tenant, partitions)
        return pb.Handle(handle=handle, nbytes=nbytes)

    async def Download(self, request: pb.Handle, context):
        tensor = await self.service.get(request.handle, _tenant(self.service, context))
        for frame in iter_chunks(tensor):
            await context.write(frame)
            count_sent(len(frame))

    async def ExecutePipeline(self, request: pb.PipelineRequest, context) -> bytes:
        tenant = _tenant(self.service, context)
        steps, chosen, keep = tracing.traced("decode", pipeline_from_pb)(request)
        outputs = await self.service.execute_pipeline(steps, chosen, keep, tenant)
        return await self._response(outputs, "pipeline result")

    # Shared memory (--allow-shared-memory; ``service.shared`` refuses otherwise). A put is
    # RegisterSegment, whose segment only the same tenant may then hand to PutShared (server/shm.py).
    async def RegisterSegment(self, request: pb.RegisterSegmentRequest, context) -> pb.RegisterSegmentResponse:
        tenant = _tenant(self.service, context)
        # On the loop (a create and an fstat): no await between making the segment and replying.
        return self.service.shared.register(tenant, request.nbytes, self.service.store.budget_bytes)

    async def PutShared(self, request: pb.SharedTensor, context) -> pb.Handle:
        tenant = _tenant(self.service, context)
        shared = self.service.shared
        tensor = await self.service.run(shared.read, request, tenant, self.service.store.budget_bytes)
        handle, nbytes = await self.service.put(tensor, tenant)
        return pb.Handle(handle=handle, nbytes=nbytes)

    async def GetShared(self, request: pb.Handle, context) -> pb.SharedTensor:
        tenant = _tenant(self.service, context)
        shared = self.service.shared
        tensor = await self.service.get(request.handle, tenant)
        return await self.service.run(shared.export, tensor)

    async def Delete(self, request: pb.DeleteRequest, context) -> pb.DeleteResponse:
        await self.service.delete(request.handle, _tenant(self.service, context))
        return pb.DeleteResponse(deleted=True)

    async def ListOps(self, request: pb.ListOpsRequest, context) -> pb.ListOpsResponse:
        _tenant(self.service, context)
        return catalogue_to_pb(self.service.catalogue(), self.service.device)


# The least time between two progress messages of one call. A solver may iterate 100,000 times
# a second: handing each report to the event loop would cost it more than its iterations do,
# and no one reads 20 lines a second anyway. 50 ms keeps a progress bar smooth; the last
# iteration always goes out (``_Watch.unsent``), so the final residual is the answer's.
PROGRESS_INTERVAL = 0.05


class _Abandoned(SparseServeError):
    """Raised in the kernel thread of a watched call whose caller has gone: it ends the work
    at the next iteration. Nobody receives it (the call has ended)."""

    code, grpc_status = "CANCELLED", grpc.StatusCode.CANCELLED


class _Watch:
    """One ExecuteWithProgress call's progress: ``report`` runs in the kernel thread (as
    ``limits.progress_sink``), keeps every report as the latest and hands one to the event loop
    at most every ``PROGRESS_INTERVAL``; the handler reads them from ``queue``."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.cancelled = False  # set on the loop, read in the thread: a plain bool suffices (one writer)
        self.newest: dict[str, Any] | None = None  # the last report: once the work is done, its last iteration
        self._sent_at = float("-inf")

    def report(self, fields: dict[str, Any]) -> None:
        if self.cancelled:
            raise _Abandoned("the caller stopped watching; the work was abandoned", reason=Reason.CALLER_CANCELLED)
        self.newest = fields
        now = time.monotonic()
        if now - self._sent_at >= PROGRESS_INTERVAL:
            self._sent_at = now
            self.loop.call_soon_threadsafe(self.queue.put_nowait, fields)

    def latest(self, report: dict[str, Any]) -> dict[str, Any]:
        """The newest report queued (a slow reader skips those it fell behind on)."""
        while not self.queue.empty():
            report = self.queue.get_nowait()
        return report


# Upload's chunks and Execute's requests arrive, and Download's and Execute's replies
# leave, as serialized bytes: ``_codec`` and ``_frames`` frame and parse them (one copy of
# the arrays, where protobuf messages cost several), and a malformed message becomes
# INVALID_ARGUMENT in the handler rather than a failure inside grpc's deserializer.
_RAW_REQUESTS = {"Upload", "Execute", "ExecuteStream", "ExecuteWithProgress"}
_RAW_RESPONSES = {"Download", "Execute", "ExecuteStream", "ExecutePipeline", "ExecuteWithProgress"}
# The "op" label of a method: its name, but for Execute's the op it runs (set once parsed).
_METHOD_OPS = {"Execute": "unknown", "ExecuteStream": "unknown", "ExecuteWithProgress": "unknown",
               "ExecutePipeline": "pipeline"}


def _metadata_value(context, key: str) -> str | None:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v
    return None


async def _counted(frames: AsyncIterator[bytes], info: RequestInfo, body_timeout: float) -> AsyncIterator[bytes]:
    """A request stream's messages, counted, each within --body-timeout of the last."""
    async for frame in arriving(frames, body_timeout, "the request stream"):
        info.bytes_in += len(frame)
        yield frame


def _detached(err: E) -> E:
    """``err`` and the exceptions it was raised in the handling of, without their tracebacks.
    grpc keeps an abort on the call's state after the call (until the server's next call), and
    with it the error being handled; a traceback's frames would keep what the handler held, an
    upload's buffer among them."""
    link: BaseException | None = err
    while link is not None:
        link.__traceback__ = None
        link = link.__context__
    return err


def _observed(metrics: Metrics, method: str, handler, streamed_request: bool, body_timeout: float):
    """``handler`` with a request id, metrics, an access line and its errors answered: one wrapper
    for every method, so that no handler has to remember them."""
    op = _METHOD_OPS.get(method, method)
    service_name = pb.DESCRIPTOR.services_by_name["SparseService"].full_name

    async def observed(request, context):
        info, token = metrics.begin("grpc", op, _metadata_value(context, REQUEST_ID_KEY))
        span = tracing.grpc_request(service_name, method, context)
        info.deadline = deadline_from_remaining(context.time_remaining())
        if streamed_request:
            request = _counted(request, info, body_timeout)
        else:
            info.bytes_in = len(request) if isinstance(request, bytes) else request.ByteSize()
        try:
            reply = await handler(request, context)
            if reply is not None:
                info.bytes_out += len(reply) if isinstance(reply, bytes) else reply.ByteSize()
            return reply
        except SparseServeError as err:
            await _abort(context, _detached(err))
        except grpc.aio.AbortError:  # _abort recorded the code
            raise
        except asyncio.CancelledError:  # gRPC cancels the handler at the caller's deadline too
            left = seconds_left()
            info.code = "DEADLINE_EXCEEDED" if left is not None and left <= 0 else "CANCELLED"
            raise
        except Exception as exc:  # keep serving; say it was a bug
            log.exception("%s failed", method)
            _detached(exc)
            await _abort(context, InternalError(f"{type(exc).__name__}: {exc}"))
        finally:
            tracing.finish(span, info)
            metrics.end(info, token)

    return observed


def _add_servicer(servicer: SparseServicer, server: grpc.aio.Server) -> None:
    """What the generated ``add_SparseServiceServicer_to_server`` does, derived from the service
    descriptor, with the chunk streams left as bytes."""
    service = pb.DESCRIPTOR.services_by_name["SparseService"]
    kinds = {(False, False): grpc.unary_unary_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler,
             (False, True): grpc.unary_stream_rpc_method_handler,
             (True, True): grpc.stream_stream_rpc_method_handler}
    handlers = {}
    for method in service.methods:
        make = kinds[method.client_streaming, method.server_streaming]
        request, response = getattr(pb, method.input_type.name), getattr(pb, method.output_type.name)
        handlers[method.name] = make(
            _observed(servicer.service.metrics, method.name, getattr(servicer, method.name),
                      method.client_streaming, servicer.service.config.body_timeout),
            request_deserializer=None if method.name in _RAW_REQUESTS else request.FromString,
            response_serializer=None if method.name in _RAW_RESPONSES else response.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)


def create_grpc_server(service: Service) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """The grpc.aio server bound to --host/--grpc-port; returns (server, port, health)."""
    limit = service.config.max_request_bytes
    # Explicit limits: gRPC's default receive limit is 4 MiB. Replies are held to
    # the same limit (checked before encoding); bigger tensors stream via Download.
    options = [
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", limit + (1 << 20)),
        ("grpc.so_reuseport", 0),
        *GRPC_WINDOW_OPTIONS,
        *keepalive_options(service.config.keepalive_seconds),
    ]
    server = grpc.aio.server(options=options)
    _add_servicer(SparseServicer(service), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (pb.DESCRIPTOR.services_by_name["SparseService"].full_name,
             health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    address = f"{service.config.host}:{service.config.grpc_port}"
    if service.config.tls_cert and service.config.tls_key:  # the flags' check: both or neither
        port = server.add_secure_port(address, _server_credentials(service.config))
    else:
        port = server.add_insecure_port(address)
    return server, port, health_servicer


# How often a client may ping a connection on which the server sends nothing: gRPC's own
# default is every 5 minutes, and a third ping sooner is answered with GOAWAY "too_many_pings",
# failing the calls on the connection. Here: every 5 s, or every half --keepalive-seconds when
# that is sooner, so a client with a keepalive as short as the server's keeps its connection.
CLIENT_PING_SECONDS = 5.0


def keepalive_options(seconds: float) -> list[tuple[str, int]]:
    """The server's keepalive: a connection silent for ``seconds`` is pinged, and one whose peer
    does not acknowledge within ``seconds`` more is closed, cancelling its calls (a client whose
    process stopped, or whose host vanished, leaving the TCP connection half open: its calls'
    buffers go back). gRPC's defaults would wait two hours, and then a minute for the ack
    (``ping_timeout_ms``, which bounds every ping, keepalive's too). Pings go out however long a
    call runs without data (``max_pings_without_data`` 0: an upload from a client that stopped
    answering sends the server nothing) and with no call in flight; clients may ping too (see
    ``CLIENT_PING_SECONDS``)."""
    ms = max(1, round(seconds * 1000))
    client_ms = max(1, round(min(seconds / 2, CLIENT_PING_SECONDS) * 1000))
    return [("grpc.keepalive_time_ms", ms), ("grpc.keepalive_timeout_ms", ms), ("grpc.http2.ping_timeout_ms", ms),
            ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0),
            ("grpc.http2.min_ping_interval_without_data_ms", client_ms)]


def _server_credentials(config) -> grpc.ServerCredentials:
    """TLS with the server's certificate; with --tls-client-ca, a client certificate signed by
    that CA is required in the handshake (mutual TLS), before any call is read."""
    with open(config.tls_cert, "rb") as cert, open(config.tls_key, "rb") as key:
        pair = (key.read(), cert.read())
    if not config.tls_client_ca:
        return grpc.ssl_server_credentials([pair])
    with open(config.tls_client_ca, "rb") as ca:
        return grpc.ssl_server_credentials([pair], root_certificates=ca.read(), require_client_auth=True)


async def set_serving(health_servicer, serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ("", _HEALTH_SERVICE):
        await health_servicer.set(name, status)
