"""``Client`` and ``AsyncClient``: one surface over gRPC and REST (docs/sdk.md).

A client turns its target into ``Settings`` and picks its transport once, in the constructor
(``_transport``: gRPC or REST, blocking or awaited); every call after that goes to the
transport, whichever wire it speaks. What is left here is what both wires share: binding
arguments, the catalogue, and shaping results.

The op methods are not written here: ``_ops`` (generated from the op registry by
``make sdk``) holds one typed method per op, which both clients inherit. An op a newer server
adds is callable with no SDK change all the same, by a method built from the server's
catalogue (``ListOps``, see ``__getattr__``) or by name (``c.call("reorder", st)``).
"""

from __future__ import annotations

import inspect
import types
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ._ops import AsyncClientOps, ClientOps
from ._pipeline import Pipeline
from ._progress import Progress, reporter
from ._remote import RemoteTensor
from ._transport import (DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_STREAM_ABOVE_BYTES, AsyncTransport, OnProgress, Outputs,
                         Settings, Stored, Transport)
from ._transport_grpc import AsyncGrpcTransport, GrpcTransport
from ._transport_rest import AsyncRestTransport, RestTransport
from .core.codec import DEFAULT_CHUNK_BYTES
from .core.convert import as_tensor, is_tensor_like
from .core.tensor import HandleRef, SparseTensor, TensorInfo

__all__ = ["Client", "AsyncClient"]

# The transport of each wire: the one place a client looks at which wire it speaks.
_BLOCKING: dict[str, Callable[[Settings], Transport]] = {"grpc": GrpcTransport, "rest": RestTransport}
_AWAITED: dict[str, Callable[[Settings], AsyncTransport]] = {"grpc": AsyncGrpcTransport,
                                                             "rest": AsyncRestTransport}


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


def _finished(moved: Any, progress: Progress | None) -> Any:
    """What a shared-memory put or get returned (``Stored``, or the tensor): one copy on this
    host, so its progress is complete at once."""
    if progress is not None:
        progress.finish(int(moved.nbytes))
    return moved


def _counting(progress: Progress | None) -> tuple:
    """A transport's put or get arguments after the first: none more when nothing is counted,
    so a transport that takes no progress (a test's recording one) is called as ever."""
    return () if progress is None else (progress,)


def _check_progress(progress: Any) -> None:
    """``progress=`` of an op call: a callable (``put``'s True, a tqdm bar, means nothing for an
    op's iterations)."""
    if not callable(progress):
        raise TypeError(f"progress must be a callable taking a report dict (op, iteration, residual_norm), "
                        f"not {type(progress).__name__}")


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
                                       for p in params if p.name not in ("keep", "request_id", "progress")]
    try:
        return args == [(a["name"], a["required"], a["default"]) for a in entry["args"]]
    except (ValueError, TypeError):  # a default numpy will not compare to a bool
        return False


def _setting(name: str) -> property:
    """A client attribute read from its settings: fixed when it was made, as its transport's."""
    return property(lambda self: getattr(self._settings, name), doc=f"``{name}`` as the client was made with.")


class _Base:
    """What both clients share: settings, the catalogue, binding, result shaping."""

    target = _setting("target")
    wire = _setting("wire")
    tls = _setting("tls")
    token = _setting("token")
    timeout = _setting("timeout")
    encoding = _setting("encoding")
    chunk_bytes = _setting("chunk_bytes")
    stream_above_bytes = _setting("stream_above_bytes")

    def __init__(self, target: str, *, token: str | None = None, timeout: float | None = None,
                 encoding: str = "protobuf", chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 stream_above_bytes: int = DEFAULT_STREAM_ABOVE_BYTES, ca_file: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None):
        self._settings = Settings.parse(target, ca_file=ca_file, cert_file=cert_file, key_file=key_file,
                                        token=token, timeout=timeout, encoding=encoding,
                                        chunk_bytes=chunk_bytes, max_message_bytes=max_message_bytes,
                                        stream_above_bytes=stream_above_bytes)
        self._catalogue: dict[str, dict] | None = None
        self.device: str | None = None

    if TYPE_CHECKING:  # each client builds the method of an op from the server's catalogue its way
        def __getattr__(self, name: str) -> Any: ...

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

    def _remote(self, stored: Stored, tensor: Any) -> RemoteTensor:
        return RemoteTensor(stored.handle, TensorInfo.of(tensor, stored.nbytes), client=self)

    def _shape_result(self, outputs: Outputs) -> Any:
        """One output as it is, several as a tuple in declared order; a list output as a Python
        list; handles (keep) as ``RemoteTensor``s."""
        def shaped(v):
            if isinstance(v, list):
                return [shaped(x) for x in v]
            return RemoteTensor(v.handle, v.info, client=self) if isinstance(v, HandleRef) else v

        values = tuple(shaped(v) for _, v in outputs)
        return values[0] if len(values) == 1 else values

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
        if op.get("iterative"):  # as the generated methods: only ops that report progress say so
            params.append(inspect.Parameter("progress", inspect.Parameter.KEYWORD_ONLY, default=None))
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
    it, the system's roots; ``cert_file`` and ``key_file`` (PEM) are the client certificate and
    its key that a server with --tls-client-ca asks for (mutual TLS: its subject's CN is the tenant).
    """

    def __init__(self, target: str, **kwargs: Any):
        super().__init__(target, **kwargs)
        self._transport: Transport = _BLOCKING[self._settings.wire](self._settings)

    def _known_catalogue(self) -> dict[str, dict]:
        return self.list_ops()

    def list_ops(self) -> dict[str, dict]:
        """The server's op catalogue, by name (fetched once, then cached)."""
        if self._catalogue is None:
            return self._set_catalogue(*self._transport.list_ops())
        return self._catalogue

    def call(self, op: str, *args: Any, keep: bool = False, request_id: str | None = None,
             progress: OnProgress | None = None, **kwargs: Any) -> Any:
        """Run any op by name; several outputs come back as a tuple in declared order.
        ``request_id``: the id the server logs this call under (default: a fresh one).
        ``progress``: called with each progress report of an iterative op (a dict: ``op``,
        ``iteration``, ``residual_norm``) while it runs, at most every 50 ms and for its last
        iteration; gRPC only (docs/sdk.md, "Progress of long ops")."""
        named = self._bind(op, args, kwargs, self.list_ops() if args else self._catalogue)
        if progress is not None:
            _check_progress(progress)
            return self._shape_result(self._transport.execute_watched(op, named, keep, request_id, progress))
        return self._shape_result(self._transport.execute(op, named, keep, request_id))

    def pipeline(self) -> Pipeline:
        """Queue ops to run on the server in one request (see ``sparseserve._pipeline``)."""
        return Pipeline(self, self.list_ops())

    def _run_pipeline(self, steps: list, outputs: list[str], keep: bool) -> Any:
        return self._shape_result(self._transport.run_pipeline(steps, outputs, keep))

    def __getattr__(self, name: str):
        op = self._op_attr(name, self.list_ops() if not name.startswith("_") else {})
        return self._method(op, lambda *a, keep=False, request_id=None, progress=None, **k:
                            self.call(name, *a, keep=keep, request_id=request_id, progress=progress, **k))

    def put(self, tensor: Any, *, shared_memory: bool = False, partitions: int = 0,
            progress: Any = None) -> RemoteTensor:
        """Keep a tensor on the server (any size: gRPC streams it in chunks). ``shared_memory``:
        hand it over through a shared-memory segment (gRPC, server on this host).
        ``partitions``: cut it into that many row blocks held by the Dask workers of a server
        started with --dask-scheduler; the handle is used like any other. ``progress``: True
        draws a tqdm bar, a callable is called as ``progress(done_bytes, total_bytes)`` as the
        bytes go (``sparseserve._progress``)."""
        tensor = as_tensor(tensor)
        _check_put_options(shared_memory, partitions)
        with reporter(progress, "put") as counted:
            if shared_memory:
                return self._remote(_finished(self._transport.put_shared(tensor), counted), tensor)
            return self._remote(self._transport.put(tensor, partitions, *_counting(counted)), tensor)

    def get(self, handle: HandleRef | str, *, shared_memory: bool = False, progress: Any = None) -> Any:
        """Fetch a kept tensor (``shared_memory``: through a segment, and ``progress`` as ``put``)."""
        with reporter(progress, "get") as counted:
            if shared_memory:
                return _finished(self._transport.get_shared(_handle_of(handle)), counted)
            return self._transport.get(_handle_of(handle), *_counting(counted))

    def delete(self, handle: HandleRef | str) -> None:
        """Free a kept tensor."""
        self._transport.delete(_handle_of(handle))

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient(_Base, AsyncClientOps):
    """The same surface as ``Client``, with ``await``. Op methods of ops the server adds beyond
    those this SDK knows need ``await c.list_ops()`` first (or ``await c.call(name, ...)``)."""

    def __init__(self, target: str, **kwargs: Any):
        super().__init__(target, **kwargs)
        self._transport: AsyncTransport = _AWAITED[self._settings.wire](self._settings)

    async def list_ops(self) -> dict[str, dict]:
        if self._catalogue is None:
            return self._set_catalogue(*await self._transport.list_ops())
        return self._catalogue

    async def call(self, op: str, *args: Any, keep: bool = False, request_id: str | None = None,
                   progress: OnProgress | None = None, **kwargs: Any) -> Any:
        """As ``Client.call``; ``progress`` may also be a coroutine function (each report awaited)."""
        named = self._bind(op, args, kwargs, (await self.list_ops()) if args else self._catalogue)
        if progress is not None:
            _check_progress(progress)
            return self._shape_result(await self._transport.execute_watched(op, named, keep, request_id, progress))
        return self._shape_result(await self._transport.execute(op, named, keep, request_id))

    def pipeline(self) -> Pipeline:
        """As ``Client.pipeline``; ``await client.list_ops()`` once first, and ``await p.run()``."""
        if self._catalogue is None:
            raise RuntimeError("call `await client.list_ops()` once before building a pipeline")
        return Pipeline(self, self._catalogue)

    async def _run_pipeline(self, steps: list, outputs: list[str], keep: bool) -> Any:
        return self._shape_result(await self._transport.run_pipeline(steps, outputs, keep))

    def __getattr__(self, name: str):
        if self._catalogue is None and not name.startswith("_"):
            raise AttributeError(f"{name!r} is not an op this SDK knows: `await client.list_ops()` once "
                                 "makes the server's ops methods, or use `await client.call(name, ...)`")
        op = self._op_attr(name, self._catalogue or {})

        async def method(*a, keep=False, request_id=None, progress=None, **k):
            return await self.call(name, *a, keep=keep, request_id=request_id, progress=progress, **k)

        return self._method(op, method)

    async def put(self, tensor: Any, *, shared_memory: bool = False, partitions: int = 0,
                  progress: Any = None) -> RemoteTensor:
        tensor = as_tensor(tensor)
        _check_put_options(shared_memory, partitions)
        with reporter(progress, "put") as counted:
            if shared_memory:
                return self._remote(_finished(await self._transport.put_shared(tensor), counted), tensor)
            return self._remote(await self._transport.put(tensor, partitions, *_counting(counted)), tensor)

    async def get(self, handle: HandleRef | str, *, shared_memory: bool = False, progress: Any = None) -> Any:
        with reporter(progress, "get") as counted:
            if shared_memory:
                return _finished(await self._transport.get_shared(_handle_of(handle)), counted)
            return await self._transport.get(_handle_of(handle), *_counting(counted))

    async def delete(self, handle: HandleRef | str) -> None:
        await self._transport.delete(_handle_of(handle))

    async def close(self) -> None:
        await self._transport.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
