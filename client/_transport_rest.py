"""The REST transports: ``RestTransport``, blocking, and ``AsyncRestTransport``, which runs the
blocking one's calls in worker threads.

``RestTransport`` speaks through the standard library's keep-alive connections (``_http``:
a quarter of httpx's client CPU per call, bodies read straight into their buffer) where they
can go straight to the server, and through httpx where a proxy applies (httpx honours
``HTTP(S)_PROXY``; ``http.client`` knows nothing of proxies). When a request goes again after
a dropped connection: ``_http``'s docstring (idempotent methods, or a request the socket took
none of).

``AsyncRestTransport`` hands each call to a worker thread. ``bench/rest_async.py`` measured
that against asyncio connections of our own on the same server, taking turns: the threads
cost a small call ~0.16 ms more client CPU, were level with many calls in flight, and read a
large body 2-3 times as fast; the numbers and why that did not keep an HTTP/1.1 client of our
own on asyncio: docs/sdk.md.
"""

from __future__ import annotations

import asyncio
import contextvars
import ssl
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

import httpx

from . import _http, _wire
from ._tracecontext import trace_headers
from ._progress import Progress
from ._transport import (AsyncTransport, Catalogue, Outputs, Settings, Step, Stored, Tensor, Transport,
                         shared_memory_refused)
from .core.wire import REQUEST_ID_KEY

__all__ = ["RestTransport", "AsyncRestTransport"]

_T = TypeVar("_T")


def _session(settings: Settings, headers: dict[str, str]) -> _http.Connections | httpx.Client:
    """``_http``'s connections where no proxy applies to the server, else httpx's client; both
    with the same TLS context, the client certificate in it where there is one (whether a proxy
    applies is read once, when httpx reads it)."""
    if not settings.tls:
        context = None
    elif settings.ca_pem:
        context = ssl.create_default_context(cadata=settings.ca_pem.decode("ascii"))
    else:
        context = httpx.create_ssl_context()
    if context is not None and settings.client_cert is not None:  # mutual TLS
        context.load_cert_chain(settings.client_cert.cert_file, settings.client_cert.key_file)
    if _http.direct_route(settings.address):
        return _http.Connections(settings.address, headers=headers, timeout=settings.timeout, context=context)
    return httpx.Client(base_url=settings.address, timeout=settings.timeout, headers=headers,
                        verify=context or True)


class RestTransport(Transport):
    """The blocking REST transport (protobuf or JSON bodies, as ``settings.encoding`` says)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._session = _session(settings, _wire.http_headers(settings.token, settings.encoding,
                                                              settings.timeout))

    def _request(self, method: str, path: str, *, request_id: str | None = None,
                 **kwargs: Any) -> _http.Reply | httpx.Response:
        """One exchange, answered with a status below 400, or the SDK error it stands for."""
        if request_id is not None:
            kwargs["headers"] = {**(kwargs.get("headers") or {}), REQUEST_ID_KEY: request_id}
        traced = trace_headers()  # the caller's span, if it has one: the server's is its child
        if traced:
            kwargs["headers"] = {**(kwargs.get("headers") or {}), **traced}
        try:
            response = self._session.request(method, path, **kwargs)
        except (httpx.HTTPError, *_http.TRANSPORT_ERRORS) as exc:
            raise _wire.transport_error(exc, request_id) from None
        if response.status_code >= 400:
            raise _wire.http_error(response.status_code, bytes(response.content),
                                   response.headers.get(REQUEST_ID_KEY, request_id))
        return response

    def list_ops(self) -> Catalogue:
        body = self._request("GET", "/v1/ops", headers={"accept": "application/json"}).json()
        return body["device"], body["ops"]

    def execute(self, op: str, args: dict[str, Any], keep: bool, request_id: str | None) -> Outputs:
        encoding = self.settings.encoding
        response = self._request("POST", f"/v1/ops/{op}", request_id=request_id,
                                 **_wire.rest_execute(op, args, keep, encoding))
        return _wire.rest_outputs(response.content, encoding)

    def run_pipeline(self, steps: list[Step], outputs: list[str], keep: bool) -> Outputs:
        encoding = self.settings.encoding
        response = self._request("POST", "/v1/pipelines", **_wire.rest_pipeline(steps, outputs, keep, encoding))
        return _wire.rest_outputs(response.content, encoding)

    def put(self, tensor: Tensor, partitions: int, progress: Progress | None = None) -> Stored:
        request = _wire.rest_put(tensor, self.settings.encoding, streamed=True, partitions=partitions)
        if progress is not None:  # the body's pieces, counted as the socket takes them
            request["content"] = progress.pieces(request["content"])
            request["headers"]["content-length"] = str(progress.total)
        body = self._request("POST", "/v1/tensors", **request).json()
        return Stored(body["handle"], body["nbytes"])

    def get(self, handle: str, progress: Progress | None = None) -> Tensor:
        # Counted as it is read on _http's connections; through a proxy (httpx), once it is in.
        counted: dict[str, Any] = {"progress": progress} \
            if progress is not None and isinstance(self._session, _http.Connections) else {}
        response = self._request("GET", f"/v1/tensors/{handle}", **counted)
        if progress is not None:
            progress.finish(len(response.content))
        return _wire.decode_rest_tensor(response.content, response.headers.get("content-type", ""))

    def delete(self, handle: str) -> None:
        self._request("DELETE", f"/v1/tensors/{handle}")

    def put_shared(self, tensor: Tensor) -> Stored:
        raise shared_memory_refused(self.settings.target)

    def get_shared(self, handle: str) -> Tensor:
        raise shared_memory_refused(self.settings.target)

    def close(self) -> None:
        self._session.close()


class AsyncRestTransport(AsyncTransport):
    """``RestTransport``'s calls, each run in a worker thread.

    The workers are the transport's own, one per connection ``_http`` keeps alive: the loop's
    default executor (``asyncio.to_thread``'s) has min(32, CPUs + 4) threads, 6 on a 2-core
    host, shared with the program's own calls, and would cap the calls in flight at that many
    whatever the server's latency. A call cancelled while its thread waits on the server ends
    when the thread does: at the reply, at ``settings.timeout``, or when the client closes
    (which cuts the connections still carrying a request).
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        self._blocking = RestTransport(settings)
        self._workers = ThreadPoolExecutor(_http._MAX_IDLE, thread_name_prefix="sparseserve-rest")

    async def _in_thread(self, call: Callable[..., _T], *args: Any) -> _T:
        # In the caller's context, as asyncio.to_thread runs a call: its current span travels.
        return await asyncio.get_running_loop().run_in_executor(self._workers, contextvars.copy_context().run,
                                                                call, *args)

    async def list_ops(self) -> Catalogue:
        return await self._in_thread(self._blocking.list_ops)

    async def execute(self, op: str, args: dict[str, Any], keep: bool, request_id: str | None) -> Outputs:
        return await self._in_thread(self._blocking.execute, op, args, keep, request_id)

    async def run_pipeline(self, steps: list[Step], outputs: list[str], keep: bool) -> Outputs:
        return await self._in_thread(self._blocking.run_pipeline, steps, outputs, keep)

    # The thread counts a transfer; its reports run on the loop, before the call's result.
    async def put(self, tensor: Tensor, partitions: int, progress: Progress | None = None) -> Stored:
        if progress is not None:
            progress = progress.on_loop(asyncio.get_running_loop())
        return await self._in_thread(self._blocking.put, tensor, partitions, progress)

    async def get(self, handle: str, progress: Progress | None = None) -> Tensor:
        if progress is not None:
            progress = progress.on_loop(asyncio.get_running_loop())
        return await self._in_thread(self._blocking.get, handle, progress)

    async def delete(self, handle: str) -> None:
        await self._in_thread(self._blocking.delete, handle)

    async def put_shared(self, tensor: Tensor) -> Stored:
        raise shared_memory_refused(self.settings.target)

    async def get_shared(self, handle: str) -> Tensor:
        raise shared_memory_refused(self.settings.target)

    async def close(self) -> None:
        self._blocking.close()
        self._workers.shutdown(wait=False)
