"""``Client`` and ``AsyncClient``: one surface over gRPC and REST (SPEC section 7).

The op methods are not written here: ``_ops`` (generated from the op registry by
``make sdk``) holds one typed method per op, which both clients inherit. An op a newer server
adds is callable with no SDK change all the same, by a method built from the server's
catalogue (``ListOps``, see ``__getattr__``) or by name (``c.call("reorder", st)``).
"""

from __future__ import annotations

import asyncio
import inspect
import ssl
import types
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import numpy as np

from . import _http, _malloc, _shm, _wire
from .core.codec import DEFAULT_CHUNK_BYTES, assemble, iter_chunks
from .core.convert import as_tensor, is_tensor_like
from .core.frames import MessageAssembler, assemble_message, execute_request_pieces, message_frames, outputs_from_bytes
from ._http_async import AsyncConnections
from ._ops import AsyncClientOps, ClientOps
from ._pipeline import Pipeline
from ._remote import RemoteTensor
from .core.tensor import HandleRef, SparseTensor
from .core.wire import REQUEST_ID_KEY
from .v1 import sparseserve_pb2 as pb
from .v1 import sparseserve_pb2_grpc as pb_grpc

__all__ = ["Client", "AsyncClient"]

DEFAULT_MAX_MESSAGE_BYTES = 256 << 20
# HTTP/2 flow-control windows start at 64 KiB and grow only as gRPC probes the link: the
# first large transfer on a connection then ran at a quarter of the speed of later ones.
# Starting each stream with room for a few chunks removes that ramp (server and SDK).
GRPC_WINDOW_OPTIONS = (("grpc.http2.lookahead_bytes", 16 << 20),)
# Over gRPC, a call whose request passes this size goes by ExecuteStream: one 16 MB unary
# request took 2-3 times as long as the same bytes in a stream of 1 MiB frames, while a
# stream costs a small call 0.5 ms more than a unary one (so small requests stay unary,
# even where the reply may be big).
DEFAULT_STREAM_ABOVE_BYTES = 1 << 20


def _raw_methods(channel) -> SimpleNamespace:
    """The methods whose messages the SDK frames and parses itself, as bytes (sync or aio
    channel): Upload's and Download's chunks (``_codec``), and Execute's and ExecutePipeline's
    tensors (``_frames``), each copied once where protobuf messages copy them several times."""
    service = "/" + pb.DESCRIPTOR.services_by_name["SparseService"].full_name
    return SimpleNamespace(
        upload=channel.stream_unary(f"{service}/Upload", request_serializer=None,
                                    response_deserializer=pb.Handle.FromString),
        download=channel.unary_stream(f"{service}/Download", request_serializer=pb.Handle.SerializeToString,
                                      response_deserializer=None),
        execute=channel.unary_unary(f"{service}/Execute", request_serializer=None, response_deserializer=None),
        execute_stream=channel.stream_stream(f"{service}/ExecuteStream", request_serializer=None,
                                             response_deserializer=None),
        execute_pipeline=channel.unary_unary(f"{service}/ExecutePipeline",
                                             request_serializer=pb.PipelineRequest.SerializeToString,
                                             response_deserializer=None))


def _split_target(target: str) -> tuple[str, str, bool]:
    """(wire, address, tls): "http(s)://..." speaks REST, "grpc(s)://host:port" or "host:port"
    gRPC; https and grpcs use TLS."""
    if target.startswith(("http://", "https://")):
        return "rest", target.rstrip("/"), target.startswith("https://")
    for scheme in ("grpc://", "grpcs://"):
        if target.startswith(scheme):
            return "grpc", target[len(scheme):], scheme == "grpcs://"
    return "grpc", target, False


def _read_ca(ca_file: str) -> bytes:
    """The PEM bytes of ``ca_file``, checked now so a bad file fails here, not at the first call."""
    try:
        with open(ca_file, "rb") as fh:
            pem = fh.read()
        ssl.create_default_context(cadata=pem.decode("ascii"))
    except (OSError, ssl.SSLError, UnicodeDecodeError) as exc:
        raise ValueError(f"ca_file {ca_file!r} must be a readable PEM CA certificate: {exc}") from None
    return pem


def _prepare(value: Any) -> Any:
    """SDK inputs -> what the codecs send: tensor-likes become tensors, recursively in lists."""
    if isinstance(value, (SparseTensor, HandleRef, np.ndarray)):  # the common case, sent as it is
        return value
    if is_tensor_like(value):
        return as_tensor(value)
    if isinstance(value, (list, tuple)) and any(is_tensor_like(v) for v in value):
        return [_prepare(v) for v in value]
    return value


def _check_put_options(shared_memory: bool, partitions: int) -> None:
    if shared_memory and partitions:
        raise ValueError("put: partitions goes over the network to the Dask workers; "
                         "leave shared_memory off")


def _handle_of(h: HandleRef | str) -> str:
    return h.handle if isinstance(h, HandleRef) else str(h)


def _declared_as(fn, entry: dict) -> bool:
    """Whether the generated method ``fn`` has the arguments (names, order, defaults) of the
    catalogue entry ``entry``."""
    args = getattr(fn, "_sparseserve_args", None)
    if args is None:
        params = list(inspect.signature(fn).parameters.values())[1:]
        args = fn._sparseserve_args = [(p.name, p.default is inspect.Parameter.empty,
                                        None if p.default is inspect.Parameter.empty else p.default)
                                       for p in params if p.name not in ("keep", "request_id")]
    try:
        return args == [(a["name"], a["required"], a["default"]) for a in entry["args"]]
    except (ValueError, TypeError):  # a default numpy will not compare to a bool
        return False


class _Base:
    """What both clients share: target parsing, the catalogue, binding, result shaping."""

    def __init__(self, target: str, *, token: str | None = None, timeout: float | None = None,
                 encoding: str = "protobuf", chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 stream_above_bytes: int = DEFAULT_STREAM_ABOVE_BYTES, ca_file: str | None = None):
        if encoding not in ("protobuf", "json"):
            raise ValueError("encoding must be 'protobuf' or 'json'")
        self.target = target
        self.wire, self._address, self.tls = _split_target(target)
        if ca_file is not None and not self.tls:
            raise ValueError(f"ca_file is for TLS targets (grpcs://host:port or https://...); "
                             f"{target!r} is plaintext")
        # None: the system's roots, for gRPC and for httpx alike.
        self._ca_pem = _read_ca(ca_file) if ca_file is not None else None
        self.token = token
        self.timeout = timeout
        self.encoding = encoding
        self.chunk_bytes = chunk_bytes
        self._max_message_bytes = max_message_bytes
        self.stream_above_bytes = stream_above_bytes
        self._catalogue: dict[str, dict] | None = None
        self.device: str | None = None
        self._metadata = _wire.call_metadata(token)
        self._headers = _wire.http_headers(token, encoding, timeout)
        _malloc.keep_transfer_buffers()  # once per process: see _malloc
        self._grpc_options = [("grpc.max_receive_message_length", max_message_bytes),
                              ("grpc.max_send_message_length", max_message_bytes),
                              *GRPC_WINDOW_OPTIONS]

    def _open_channel(self, grpc_api):
        """A channel from ``grpc`` or ``grpc.aio``: TLS for grpcs:// targets, plaintext otherwise."""
        if not self.tls:
            return grpc_api.insecure_channel(self._address, options=self._grpc_options)
        credentials = grpc.ssl_channel_credentials(root_certificates=self._ca_pem)
        return grpc_api.secure_channel(self._address, credentials, options=self._grpc_options)

    def _rest_transports(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(httpx's arguments, the arguments of ``_http``'s connections or None where a proxy
        applies): the same TLS context for both, and whether a proxy applies read once, when
        httpx reads the environment too."""
        if not self.tls:
            context = None
        elif self._ca_pem:
            context = ssl.create_default_context(cadata=self._ca_pem.decode("ascii"))
        else:
            context = httpx.create_ssl_context()
        direct = None
        if _http.direct_route(self._address):
            direct = {"base_url": self._address, "headers": self._headers, "timeout": self.timeout,
                      "context": context}
        return {"base_url": self._address, "timeout": self.timeout, "headers": self._headers,
                "verify": context or True}, direct

    def _checked(self, response, request_id: str | None):
        """``response`` (httpx's or ``_http``'s), or the SDK error its status stands for."""
        if response.status_code >= 400:
            raise _wire.http_error(response.status_code, bytes(response.content),
                                   response.headers.get(REQUEST_ID_KEY, request_id))
        return response

    # ------------------------------------------------------------ catalogue
    def _set_catalogue(self, device: str, ops: list[dict]) -> dict[str, dict]:
        self.device = device
        self._catalogue = {op["name"]: op for op in ops}
        for name in [n for n, v in vars(self).items() if getattr(v, "_sparseserve_op", False)]:
            del self.__dict__[name]  # methods made from the catalogue before: made again on use
        return self._catalogue

    def _bind(self, op: str, args: tuple, kwargs: dict, catalogue: dict | None) -> dict[str, Any]:
        named = dict(kwargs)
        if args:
            if catalogue is None or op not in catalogue:
                raise TypeError(f"{op}: positional arguments need the op in the server's catalogue; "
                                "pass them by name")
            names = [a["name"] for a in catalogue[op]["args"]]
            if len(args) > len(names):
                raise TypeError(f"{op} takes {len(names)} arguments, {len(args)} given")
            for name, value in zip(names, args):
                if name in named:
                    raise TypeError(f"{op} got two values for argument {name!r}")
                named[name] = value
        return {k: _prepare(v) for k, v in named.items()}

    def _shape_result(self, outputs: list[tuple[str, Any]]) -> Any:
        """One output as it is, several as a tuple in declared order; a list output as a Python
        list; handles (keep) as ``RemoteTensor``s."""
        def shaped(v):
            if isinstance(v, list):
                return [shaped(x) for x in v]
            return RemoteTensor(v.handle, client=self) if isinstance(v, HandleRef) else v

        values = tuple(shaped(v) for _, v in outputs)
        return values[0] if len(values) == 1 else values

    # A request id goes out only when the caller picks one; otherwise the server assigns it
    # and errors bring it back. Sending a fresh one on every call cost a small gRPC call ~60 µs
    # of client CPU and ~30 µs of the server's (metadata is no bargain in grpcio).
    def _call_ids(self, request_id: str | None) -> tuple[str | None, tuple]:
        """(the caller's request id or None, gRPC metadata) of one call."""
        if request_id is None:
            return None, self._metadata
        return request_id, (*self._metadata, (REQUEST_ID_KEY, request_id))

    def _http_ids(self, request_id: str | None, kwargs: dict) -> str | None:
        """The caller's id of one REST call (None: none chosen), added to ``kwargs``' headers."""
        if request_id is not None:
            kwargs["headers"] = {**(kwargs.get("headers") or {}), REQUEST_ID_KEY: request_id}
        return request_id

    def _method(self, op: dict, fn):
        """``fn`` dressed as the op's method (name, docs, signature) and kept on the instance,
        so later calls find it without ``__getattr__`` (building one took ~10% of a small call)."""
        fn._sparseserve_op = True
        self.__dict__[op["name"]] = fn
        fn.__name__ = op["name"]
        fn.__qualname__ = f"{type(self).__name__}.{op['name']}"
        args = "\n".join(f"    {a['name']} ({a['type']}): {a['doc']}" for a in op["args"])
        outs = "\n".join(f"    {o['name']} ({o['type']}): {o['doc']}" for o in op["outputs"])
        fn.__doc__ = f"{op['doc']}\n\nArguments:\n{args}\n\nReturns:\n{outs}"
        params = [inspect.Parameter(a["name"], inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    default=inspect.Parameter.empty if a["required"] else a["default"])
                  for a in op["args"]]
        params.append(inspect.Parameter("keep", inspect.Parameter.KEYWORD_ONLY, default=False))
        params.append(inspect.Parameter("request_id", inspect.Parameter.KEYWORD_ONLY, default=None))
        fn.__signature__ = inspect.Signature(params)
        return fn

    def _known_catalogue(self) -> dict[str, dict] | None:
        """The server's catalogue, where this client has it (``Client`` fetches it)."""
        return self._catalogue

    def _op_method(self, fn):
        """The generated op method ``fn`` (``_ops``) bound to this client and kept on the
        instance, as the catalogue-built methods are. Where the client has the server's
        catalogue, it follows it: no method for an op the server lacks (AttributeError), and
        the catalogue-built one for an op the server declares differently (another version)."""
        name = fn.__name__
        catalogue = self._known_catalogue()
        if catalogue is not None:
            entry = catalogue.get(name)
            if entry is None:
                raise AttributeError(f"{type(self).__name__} has no attribute or op {name!r}")
            if not _declared_as(fn, entry):
                return self.__getattr__(name)
        method = types.MethodType(fn, self)
        self.__dict__[name] = method
        return method

    def _op_attr(self, name: str, catalogue: dict):
        if name.startswith("_") or name not in catalogue:
            raise AttributeError(f"{type(self).__name__} has no attribute or op {name!r}")
        return catalogue[name]

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._catalogue or ()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.target!r})"


class Client(_Base, ClientOps):
    """A blocking client.

    ``Client("localhost:50051")`` speaks gRPC; ``Client("http://localhost:8000")``
    speaks REST (protobuf bodies by default, ``encoding="json"`` for JSON).
    ``grpcs://host:port`` and ``https://...`` use TLS, trusting the PEM ``ca_file`` or, without
    it, the system's roots.
    """

    def __init__(self, target: str, **kwargs: Any):
        super().__init__(target, **kwargs)
        if self.wire == "grpc":
            self._channel = self._open_channel(grpc)
            self._stub = pb_grpc.SparseServiceStub(self._channel)
            self._raw = _raw_methods(self._channel)
        else:
            # The standard library's connections where they can go straight to the server
            # (a quarter of httpx's CPU per call: ``_http``), httpx through a proxy.
            options, direct = self._rest_transports()
            self._http = _http.Connections(**direct) if direct else httpx.Client(**options)

    # ---------------------------------------------------------------- IO
    def _grpc(self, method, request, request_id: str | None = None):
        rid, metadata = self._call_ids(request_id)
        try:
            return method(request, timeout=self.timeout, metadata=metadata)
        except grpc.RpcError as exc:
            raise _wire.grpc_error(exc, rid) from None

    def _http_call(self, method: str, path: str, *, request_id: str | None = None, **kwargs):
        rid = self._http_ids(request_id, kwargs)
        try:
            response = self._http.request(method, path, **kwargs)
        except (httpx.HTTPError, *_http.TRANSPORT_ERRORS) as exc:
            raise _wire.transport_error(exc, rid) from None
        return self._checked(response, rid)

    def _known_catalogue(self) -> dict[str, dict]:
        return self.list_ops()

    def list_ops(self) -> dict[str, dict]:
        """The server's op catalogue, by name (fetched once, then cached)."""
        if self._catalogue is None:
            if self.wire == "grpc":
                device, ops = _wire.catalogue_from_pb(self._grpc(self._stub.ListOps, pb.ListOpsRequest()))
            else:
                body = self._http_call("GET", "/v1/ops", headers={"accept": "application/json"}).json()
                device, ops = body["device"], body["ops"]
            self._set_catalogue(device, ops)
        return self._catalogue

    def call(self, op: str, *args: Any, keep: bool = False, request_id: str | None = None, **kwargs: Any) -> Any:
        """Run any op by name; several outputs come back as a tuple in declared order.
        ``request_id``: the id the server logs this call under (default: a fresh one)."""
        named = self._bind(op, args, kwargs, self.list_ops() if args else self._catalogue)
        if self.wire == "grpc":
            pieces = execute_request_pieces(op, named, keep)
            if sum(len(p) for p in pieces) > self.stream_above_bytes:
                rid, metadata = self._call_ids(request_id)
                try:
                    reply = assemble_message(self._raw.execute_stream(message_frames(pieces, self.chunk_bytes),
                                                                      timeout=self.timeout, metadata=metadata),
                                             "reply")
                except grpc.RpcError as exc:
                    raise _wire.grpc_error(exc, rid) from None
            else:
                reply = self._grpc(self._raw.execute, b"".join(pieces), request_id)
            outputs = outputs_from_bytes(reply)
        else:
            response = self._http_call("POST", f"/v1/ops/{op}", request_id=request_id,
                                       **_wire.rest_execute(op, named, keep, self.encoding))
            outputs = _wire.rest_outputs(response.content, self.encoding)
        return self._shape_result(outputs)

    def pipeline(self) -> Pipeline:
        """Queue ops to run on the server in one request (see ``sparseserve._pipeline``)."""
        return Pipeline(self, self.list_ops())

    def _run_pipeline(self, steps: list, outputs: list[str], keep: bool) -> Any:
        if self.wire == "grpc":
            reply = self._grpc(self._raw.execute_pipeline, _wire.pipeline_request(steps, outputs, keep))
            return self._shape_result(outputs_from_bytes(reply))
        response = self._http_call("POST", "/v1/pipelines", **_wire.rest_pipeline(steps, outputs, keep, self.encoding))
        return self._shape_result(_wire.rest_outputs(response.content, self.encoding))

    def __getattr__(self, name: str):
        op = self._op_attr(name, self.list_ops() if not name.startswith("_") else {})
        return self._method(op, lambda *a, keep=False, request_id=None, **k:
                            self.call(name, *a, keep=keep, request_id=request_id, **k))

    def put(self, tensor: Any, *, shared_memory: bool = False, partitions: int = 0) -> RemoteTensor:
        """Keep a tensor on the server (any size: gRPC streams it in chunks). ``shared_memory``:
        hand it over through a shared-memory segment (gRPC, server on this host).
        ``partitions``: cut it into that many row blocks held by the Dask workers of a server
        started with --dask-scheduler; the handle is used like any other."""
        tensor = as_tensor(tensor)
        _check_put_options(shared_memory, partitions)
        if shared_memory:
            return _shm.put(self, tensor)
        if self.wire == "grpc":
            rid, metadata = self._call_ids(None)
            try:
                reply = self._raw.upload(iter_chunks(tensor, self.chunk_bytes), timeout=self.timeout,
                                          metadata=_wire.upload_metadata(metadata, partitions))
            except grpc.RpcError as exc:
                raise _wire.grpc_error(exc, rid) from None
            return RemoteTensor(reply.handle, nbytes=reply.nbytes, client=self)
        body = self._http_call("POST", "/v1/tensors", **_wire.rest_put(tensor, self.encoding, streamed=True,
                                                                       partitions=partitions)).json()
        return RemoteTensor(body["handle"], nbytes=body["nbytes"], client=self)

    def get(self, handle: HandleRef | str, *, shared_memory: bool = False) -> Any:
        """Fetch a kept tensor (``shared_memory``: through a segment, as ``put``)."""
        if shared_memory:
            return _shm.get(self, _handle_of(handle))
        if self.wire == "grpc":
            rid, metadata = self._call_ids(None)
            try:
                stream = self._raw.download(pb.Handle(handle=_handle_of(handle)), timeout=self.timeout,
                                             metadata=metadata)
                return assemble(stream, "tensor")
            except grpc.RpcError as exc:
                raise _wire.grpc_error(exc, rid) from None
        response = self._http_call("GET", f"/v1/tensors/{_handle_of(handle)}")
        return _wire.decode_rest_tensor(response.content, response.headers.get("content-type", ""))

    def delete(self, handle: HandleRef | str) -> None:
        """Free a kept tensor."""
        if self.wire == "grpc":
            self._grpc(self._stub.Delete, pb.DeleteRequest(handle=_handle_of(handle)))
        else:
            self._http_call("DELETE", f"/v1/tensors/{_handle_of(handle)}")

    def close(self) -> None:
        if self.wire == "grpc":
            self._channel.close()
        else:
            self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient(_Base, AsyncClientOps):
    """The same surface as ``Client``, with ``await``. Op methods of ops the server adds beyond
    those this SDK knows need ``await c.list_ops()`` first (or ``await c.call(name, ...)``)."""

    def __init__(self, target: str, **kwargs: Any):
        super().__init__(target, **kwargs)
        if self.wire == "grpc":
            self._channel = self._open_channel(grpc.aio)
            self._stub = pb_grpc.SparseServiceStub(self._channel)
            self._raw = _raw_methods(self._channel)
        else:
            # Calls on asyncio connections (``_http_async``: a small call's client CPU a fifth of
            # httpx's), big bodies read by the blocking ones in a thread; httpx through a proxy.
            options, direct = self._rest_transports()
            self._direct = _http.Connections(**direct) if direct else None
            self._http = AsyncConnections(**direct) if direct else httpx.AsyncClient(**options)

    async def _grpc(self, method, request, request_id: str | None = None):
        rid, metadata = self._call_ids(request_id)
        try:
            return await method(request, timeout=self.timeout, metadata=metadata)
        except grpc.RpcError as exc:
            raise _wire.grpc_error(exc, rid) from None

    async def _http_call(self, method: str, path: str, *, request_id: str | None = None, **kwargs):
        rid = self._http_ids(request_id, kwargs)
        try:
            response = await self._http.request(method, path, **kwargs)
        except (httpx.HTTPError, *_http.TRANSPORT_ERRORS) as exc:
            raise _wire.transport_error(exc, rid) from None
        return self._checked(response, rid)

    async def list_ops(self) -> dict[str, dict]:
        if self._catalogue is None:
            if self.wire == "grpc":
                device, ops = _wire.catalogue_from_pb(await self._grpc(self._stub.ListOps, pb.ListOpsRequest()))
            else:
                body = (await self._http_call("GET", "/v1/ops", headers={"accept": "application/json"})).json()
                device, ops = body["device"], body["ops"]
            self._set_catalogue(device, ops)
        return self._catalogue

    async def call(self, op: str, *args: Any, keep: bool = False, request_id: str | None = None,
                   **kwargs: Any) -> Any:
        named = self._bind(op, args, kwargs, (await self.list_ops()) if args else self._catalogue)
        if self.wire == "grpc":
            pieces = execute_request_pieces(op, named, keep)
            if sum(len(p) for p in pieces) > self.stream_above_bytes:
                assembler = MessageAssembler("reply")
                rid, metadata = self._call_ids(request_id)
                try:
                    async for frame in self._raw.execute_stream(message_frames(pieces, self.chunk_bytes),
                                                                timeout=self.timeout, metadata=metadata):
                        assembler.add(frame)
                except grpc.RpcError as exc:
                    raise _wire.grpc_error(exc, rid) from None
                reply = assembler.finish()
            else:
                reply = await self._grpc(self._raw.execute, b"".join(pieces), request_id)
            outputs = outputs_from_bytes(reply)
        else:
            response = await self._http_call("POST", f"/v1/ops/{op}", request_id=request_id,
                                             **_wire.rest_execute(op, named, keep, self.encoding))
            outputs = _wire.rest_outputs(response.content, self.encoding)
        return self._shape_result(outputs)

    def pipeline(self) -> Pipeline:
        """As ``Client.pipeline``; ``await client.list_ops()`` once first, and ``await p.run()``."""
        if self._catalogue is None:
            raise RuntimeError("call `await client.list_ops()` once before building a pipeline")
        return Pipeline(self, self._catalogue)

    async def _run_pipeline(self, steps: list, outputs: list[str], keep: bool) -> Any:
        if self.wire == "grpc":
            reply = await self._grpc(self._raw.execute_pipeline, _wire.pipeline_request(steps, outputs, keep))
            return self._shape_result(outputs_from_bytes(reply))
        response = await self._http_call("POST", "/v1/pipelines",
                                         **_wire.rest_pipeline(steps, outputs, keep, self.encoding))
        return self._shape_result(_wire.rest_outputs(response.content, self.encoding))

    def __getattr__(self, name: str):
        if self._catalogue is None and not name.startswith("_"):
            raise AttributeError(f"{name!r} is not an op this SDK knows: `await client.list_ops()` once "
                                 "makes the server's ops methods, or use `await client.call(name, ...)`")
        op = self._op_attr(name, self._catalogue or {})

        async def method(*a, keep=False, request_id=None, **k):
            return await self.call(name, *a, keep=keep, request_id=request_id, **k)

        return self._method(op, method)

    async def put(self, tensor: Any, *, shared_memory: bool = False, partitions: int = 0) -> RemoteTensor:
        tensor = as_tensor(tensor)
        _check_put_options(shared_memory, partitions)
        if shared_memory:
            return await _shm.put_async(self, tensor)
        if self.wire == "grpc":
            rid, metadata = self._call_ids(None)
            try:
                reply = await self._raw.upload(iter_chunks(tensor, self.chunk_bytes), timeout=self.timeout,
                                                metadata=_wire.upload_metadata(metadata, partitions))
            except grpc.RpcError as exc:
                raise _wire.grpc_error(exc, rid) from None
            return RemoteTensor(reply.handle, nbytes=reply.nbytes, client=self)
        # Our connections send the body's pieces as they are; httpx's async client needs them joined.
        body = (await self._http_call("POST", "/v1/tensors", **_wire.rest_put(
            tensor, self.encoding, streamed=self._direct is not None, partitions=partitions))).json()
        return RemoteTensor(body["handle"], nbytes=body["nbytes"], client=self)

    async def get(self, handle: HandleRef | str, *, shared_memory: bool = False) -> Any:
        if shared_memory:
            return await _shm.get_async(self, _handle_of(handle))
        if self.wire == "grpc":
            rid, metadata = self._call_ids(None)
            try:
                call = self._raw.download(pb.Handle(handle=_handle_of(handle)), timeout=self.timeout,
                                           metadata=metadata)
                return assemble([chunk async for chunk in call], "tensor")
            except grpc.RpcError as exc:
                raise _wire.grpc_error(exc, rid) from None
        path = f"/v1/tensors/{_handle_of(handle)}"
        if self._direct is None:
            response = await self._http_call("GET", path)
        else:  # read into one buffer by a thread (``_http``; httpx reads a body a quarter as fast)
            try:
                response = self._checked(await asyncio.to_thread(self._direct.request, "GET", path), None)
            except _http.TRANSPORT_ERRORS as exc:
                raise _wire.transport_error(exc) from None
        return _wire.decode_rest_tensor(response.content, response.headers.get("content-type", ""))

    async def delete(self, handle: HandleRef | str) -> None:
        if self.wire == "grpc":
            await self._grpc(self._stub.Delete, pb.DeleteRequest(handle=_handle_of(handle)))
        else:
            await self._http_call("DELETE", f"/v1/tensors/{_handle_of(handle)}")

    async def close(self) -> None:
        if self.wire == "grpc":
            await self._channel.close()
        else:
            await self._http.aclose()
            if self._direct is not None:
                self._direct.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
