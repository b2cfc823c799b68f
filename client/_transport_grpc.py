"""The gRPC transports: ``GrpcTransport`` on a ``grpc`` channel, ``AsyncGrpcTransport`` on a
``grpc.aio`` one. Both build their requests and read their replies with the same functions
(``_wire``, ``core.codec``, ``core.frames``); they differ only where one awaits.

Execute, ExecuteStream, ExecutePipeline, Upload and Download carry bytes the SDK frames and
parses itself (``core.frames``, ``core.codec``: each tensor copied once, where protobuf
messages copy it several times); ListOps, Delete and the shared-memory calls go through the
generated stub. A shared-memory put is two calls: RegisterSegment (the server makes a segment
for this tenant), then PutShared once the tensor is written into it (``_shm``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from types import ModuleType, SimpleNamespace
from typing import Any, Iterator, cast

import grpc
import grpc.aio

from . import _shm, _wire
from ._tracecontext import trace_headers
from ._transport import AsyncTransport, Catalogue, OnProgress, Outputs, Settings, Step, Stored, Tensor, Transport
from ._progress import Progress, upload_frames
from ._progress import assemble as assemble_counted
from .core.codec import ChunkAssembler, assemble
from .core.frames import (MessageAssembler, assemble_message, execute_request_bytes, execute_request_pieces,
                          message_frames, outputs_from_bytes, progress_message_from_bytes)
from .core.errors import InternalError
from .core.wire import GRPC_WINDOW_OPTIONS, REQUEST_ID_KEY, pipeline_request
from .v1 import sparseserve_pb2 as pb
from .v1 import sparseserve_pb2_grpc as pb_grpc
from .core.reasons import Reason

__all__ = ["GrpcTransport", "AsyncGrpcTransport"]

Metadata = tuple[tuple[str, str], ...]


def _raw_methods(channel: Any) -> SimpleNamespace:
    """The methods whose messages the SDK frames and parses itself, as bytes (a sync or an aio
    channel)."""
    service = "/" + pb.DESCRIPTOR.services_by_name["SparseService"].full_name
    return SimpleNamespace(
        upload=channel.stream_unary(f"{service}/Upload", request_serializer=None,
                                    response_deserializer=pb.Handle.FromString),
        download=channel.unary_stream(f"{service}/Download", request_serializer=pb.Handle.SerializeToString,
                                      response_deserializer=None),
        execute=channel.unary_unary(f"{service}/Execute", request_serializer=None, response_deserializer=None),
        execute_stream=channel.stream_stream(f"{service}/ExecuteStream", request_serializer=None,
                                             response_deserializer=None),
        execute_with_progress=channel.unary_stream(f"{service}/ExecuteWithProgress", request_serializer=None,
                                                   response_deserializer=None),
        execute_pipeline=channel.unary_unary(f"{service}/ExecutePipeline",
                                             request_serializer=pb.PipelineRequest.SerializeToString,
                                             response_deserializer=None))


@contextlib.contextmanager
def _sdk_errors(request_id: str | None) -> Iterator[None]:
    """A failed call (``grpc.aio``'s errors are ``grpc.RpcError``s too) as the SDK's error."""
    try:
        yield
    except grpc.RpcError as exc:
        raise _wire.grpc_error(exc, request_id) from None


def _no_answer(request_id: str | None) -> InternalError:
    """A progress stream that ended with no answer and no error: a server bug, said as one."""
    return InternalError("the server ended the ExecuteWithProgress stream without an answer",
                         reason=Reason.NO_ANSWER, request_id=_wire.new_request_id(request_id))


class _Channel:
    """What both gRPC transports hold: the channel, its methods, and each call's metadata."""

    def __init__(self, settings: Settings, grpc_api: ModuleType):
        self.settings = settings
        options = [("grpc.max_receive_message_length", settings.max_message_bytes),
                   ("grpc.max_send_message_length", settings.max_message_bytes), *GRPC_WINDOW_OPTIONS]
        if settings.tls:
            mine = settings.client_cert
            credentials = grpc.ssl_channel_credentials(root_certificates=settings.ca_pem,
                                                       private_key=mine.key_pem if mine else None,
                                                       certificate_chain=mine.cert_pem if mine else None)
            self._channel = grpc_api.secure_channel(settings.address, credentials, options=options)
        else:
            self._channel = grpc_api.insecure_channel(settings.address, options=options)
        self._stub = pb_grpc.SparseServiceStub(self._channel)
        self._raw = _raw_methods(self._channel)
        self._fixed_metadata: Metadata = _wire.call_metadata(settings.token)

    @property
    def _metadata(self) -> Metadata:
        """Every call's metadata: the token, and the caller's trace where it has a current span."""
        traced = trace_headers()
        return (*self._fixed_metadata, *traced.items()) if traced else self._fixed_metadata

    # A request id goes out only when the caller picks one; otherwise the server assigns it
    # and errors bring it back. Sending a fresh one on every call cost a small call ~60 µs of
    # client CPU and ~30 µs of the server's (metadata is no bargain in grpcio).
    def _metadata_with(self, request_id: str | None) -> Metadata:
        return self._metadata if request_id is None else (*self._metadata, (REQUEST_ID_KEY, request_id))

    def _streams(self, pieces: list) -> bool:
        """Whether an Execute request of these pieces goes by ExecuteStream."""
        return sum(len(p) for p in pieces) > self.settings.stream_above_bytes

    def _upload_metadata(self, partitions: int) -> Metadata:
        return _wire.upload_metadata(self._metadata, partitions)


class GrpcTransport(_Channel, Transport):
    """The blocking gRPC transport."""

    def __init__(self, settings: Settings):
        super().__init__(settings, grpc)

    def _unary(self, method: Any, request: Any, request_id: str | None = None) -> Any:
        with _sdk_errors(request_id):
            return method(request, timeout=self.settings.timeout, metadata=self._metadata_with(request_id))

    def list_ops(self) -> Catalogue:
        return _wire.catalogue_from_pb(self._unary(self._stub.ListOps, pb.ListOpsRequest()))

    def execute(self, op: str, args: dict[str, Any], keep: bool, request_id: str | None) -> Outputs:
        pieces = execute_request_pieces(op, args, keep)
        if not self._streams(pieces):
            return outputs_from_bytes(self._unary(self._raw.execute, b"".join(pieces), request_id))
        with _sdk_errors(request_id):
            frames = self._raw.execute_stream(message_frames(pieces, self.settings.chunk_bytes),
                                              timeout=self.settings.timeout,
                                              metadata=self._metadata_with(request_id))
            return outputs_from_bytes(cast(bytes, assemble_message(frames, "reply")))  # a view reads as well

    def execute_watched(self, op: str, args: dict[str, Any], keep: bool, request_id: str | None,
                        on_progress: OnProgress) -> Outputs:
        # The request goes as one message (no framed variant): hold big matrices by handle.
        with _sdk_errors(request_id):
            call = self._raw.execute_with_progress(execute_request_bytes(op, args, keep),
                                                   timeout=self.settings.timeout,
                                                   metadata=self._metadata_with(request_id))
            try:
                for message in call:
                    got = progress_message_from_bytes(message)
                    if isinstance(got, list):  # the answer
                        return got
                    on_progress(got)
            except BaseException:  # the callback failed, or Ctrl-C: the server abandons the work
                call.cancel()
                raise
        raise _no_answer(request_id)

    def run_pipeline(self, steps: list[Step], outputs: list[str], keep: bool) -> Outputs:
        return outputs_from_bytes(self._unary(self._raw.execute_pipeline, pipeline_request(steps, outputs, keep)))

    def put(self, tensor: Tensor, partitions: int, progress: Progress | None = None) -> Stored:
        # With progress, grpc's thread that sends the stream counts it (and calls the callback).
        with _sdk_errors(None):
            reply = self._raw.upload(upload_frames(tensor, self.settings.chunk_bytes, progress),
                                     timeout=self.settings.timeout, metadata=self._upload_metadata(partitions))
        return Stored(reply.handle, reply.nbytes)

    def get(self, handle: str, progress: Progress | None = None) -> Tensor:
        with _sdk_errors(None):
            return assemble_counted(self._raw.download(pb.Handle(handle=handle), timeout=self.settings.timeout,
                                                       metadata=self._metadata), progress)

    def delete(self, handle: str) -> None:
        self._unary(self._stub.Delete, pb.DeleteRequest(handle=handle))

    def put_shared(self, tensor: Tensor) -> Stored:
        outgoing = _shm.Outgoing.of(tensor)
        lease = self._unary(self._stub.RegisterSegment, outgoing.registration())
        with _shm.segment_of(outgoing, lease) as request:
            reply = self._unary(self._stub.PutShared, request)
        return Stored(reply.handle, reply.nbytes)

    def get_shared(self, handle: str) -> Tensor:
        return _shm.claim(self._unary(self._stub.GetShared, pb.Handle(handle=handle)))

    def close(self) -> None:
        self._channel.close()


class AsyncGrpcTransport(_Channel, AsyncTransport):
    """The gRPC transport on ``grpc.aio``."""

    def __init__(self, settings: Settings):
        super().__init__(settings, grpc.aio)

    async def _unary(self, method: Any, request: Any, request_id: str | None = None) -> Any:
        with _sdk_errors(request_id):
            return await method(request, timeout=self.settings.timeout, metadata=self._metadata_with(request_id))

    async def list_ops(self) -> Catalogue:
        return _wire.catalogue_from_pb(await self._unary(self._stub.ListOps, pb.ListOpsRequest()))

    async def execute(self, op: str, args: dict[str, Any], keep: bool, request_id: str | None) -> Outputs:
        pieces = execute_request_pieces(op, args, keep)
        if not self._streams(pieces):
            return outputs_from_bytes(await self._unary(self._raw.execute, b"".join(pieces), request_id))
        assembler = MessageAssembler("reply")
        with _sdk_errors(request_id):
            async for frame in self._raw.execute_stream(message_frames(pieces, self.settings.chunk_bytes),
                                                        timeout=self.settings.timeout,
                                                        metadata=self._metadata_with(request_id)):
                assembler.add(frame)
        return outputs_from_bytes(cast(bytes, assembler.finish()))  # a view reads as well

    async def execute_watched(self, op: str, args: dict[str, Any], keep: bool, request_id: str | None,
                              on_progress: OnProgress) -> Outputs:
        with _sdk_errors(request_id):
            call = self._raw.execute_with_progress(execute_request_bytes(op, args, keep),
                                                   timeout=self.settings.timeout,
                                                   metadata=self._metadata_with(request_id))
            try:
                async for message in call:
                    got = progress_message_from_bytes(message)
                    if isinstance(got, list):  # the answer
                        return got
                    answer = on_progress(got)
                    if inspect.isawaitable(answer):
                        await answer
            except BaseException:  # the callback failed, or the task was cancelled: the server abandons the work
                call.cancel()
                raise
        raise _no_answer(request_id)

    async def run_pipeline(self, steps: list[Step], outputs: list[str], keep: bool) -> Outputs:
        return outputs_from_bytes(await self._unary(self._raw.execute_pipeline,
                                                    pipeline_request(steps, outputs, keep)))

    async def put(self, tensor: Tensor, partitions: int, progress: Progress | None = None) -> Stored:
        with _sdk_errors(None):
            reply = await self._raw.upload(upload_frames(tensor, self.settings.chunk_bytes, progress),
                                           timeout=self.settings.timeout, metadata=self._upload_metadata(partitions))
        return Stored(reply.handle, reply.nbytes)

    async def get(self, handle: str, progress: Progress | None = None) -> Tensor:
        with _sdk_errors(None):
            call = self._raw.download(pb.Handle(handle=handle), timeout=self.settings.timeout,
                                      metadata=self._metadata)
            if progress is None:
                return assemble([chunk async for chunk in call], "tensor")
            assembler = ChunkAssembler("tensor")
            async for chunk in call:
                progress.frame_in(assembler, chunk)
            return assembler.finish()

    async def delete(self, handle: str) -> None:
        await self._unary(self._stub.Delete, pb.DeleteRequest(handle=handle))

    async def put_shared(self, tensor: Tensor) -> Stored:
        outgoing = _shm.Outgoing.of(tensor)
        lease = await _shm.registered_async(self._unary(self._stub.RegisterSegment, outgoing.registration()))
        async with _shm.segment_of_async(outgoing, lease) as request:
            reply = await self._unary(self._stub.PutShared, request)
        return Stored(reply.handle, reply.nbytes)

    async def get_shared(self, handle: str) -> Tensor:
        reply = await self._unary(self._stub.GetShared, pb.Handle(handle=handle))
        return await asyncio.to_thread(_shm.claim, reply)

    async def close(self) -> None:
        await self._channel.close()
