"""One process, two wires: grpc.aio and uvicorn share an event loop, the
registry, the handle store and the kernel pool."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import signal
import ssl
import sys

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .config import ServerConfig
from .grpc_wire import create_grpc_server, set_serving
from .metrics import JsonFormatter
from .rest_wire import create_app
from .service import Service
from .tenants import rfc4514

__all__ = ["serve", "run"]

log = logging.getLogger("sparseserve.server")


class _Uvicorn(uvicorn.Server):
    # The process handles SIGINT/SIGTERM itself and stops both wires together.
    def capture_signals(self):
        return contextlib.nullcontext()


class _HttpProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol (``http=``: the one place that sees a connection's bytes, its
    transport and the requests on it) with two things uvicorn 0.54 does not do.

    A time limit on the request head (``header_timeout``, --header-timeout): uvicorn arms no
    timer while a request's line and headers arrive, so a connection that opens and sends
    nothing, or trickles its headers a byte at a time, is kept for ever. Here the head must be
    complete within the limit, counted from when the connection opens (the first request) or
    from its first byte (the next ones: between requests uvicorn's keep-alive timeout counts);
    past it the connection is closed without an answer (there is no request to answer yet).
    The body is the app's to time (``rest_wire``'s reads, --body-timeout).

    The verified client certificate in each request's scope, as the ASGI TLS extension has it
    (``scope["extensions"]["tls"]``: ``client_cert_chain``, PEM, and ``client_cert_name``, the
    subject in RFC 4514), which uvicorn does not fill in, nor show the app its transport. Per
    connection: the certificate is read once, after the handshake verified it."""

    header_timeout = 20.0
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)
        ssl_object = transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            return  # not TLS, or no certificate: nothing for the app to read (it refuses the calls)
        tls = {"server_cert": None, "client_cert_chain": [ssl.DER_cert_to_PEM_cert(der)],
               "client_cert_name": rfc4514(ssl_object.getpeercert().get("subject", ())),
               "client_cert_error": None, "tls_version": _TLS_VERSIONS.get(ssl_object.version()),
               "cipher_suite": None}
        app = self.app

        async def app_with_tls(scope, receive, send):
            scope.setdefault("extensions", {}).setdefault("tls", tls)  # a uvicorn that fills it in wins
            return await app(scope, receive, send)

        self.app = app_with_tls

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:  # a later request on the connection: from its first byte
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def on_headers_complete(self) -> None:
        self._head_arrived()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_arrived()
        super().connection_lost(exc)

    def _head_arrived(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            log.info("connection closed: no request head within --header-timeout",
                     extra={"fields": {"client": "%s:%d" % self.client if self.client else None,
                                       "seconds": self.header_timeout}})
            self.transport.close()


# The ASGI TLS extension's tls_version: the protocol's number on the wire.
_TLS_VERSIONS = {"TLSv1.2": 0x0303, "TLSv1.3": 0x0304}


def _http_protocol(config: ServerConfig) -> type[_HttpProtocol]:
    """The protocol class of this server's REST connections, with its --header-timeout."""
    return type("HttpProtocol", (_HttpProtocol,), {"header_timeout": config.header_timeout})


def _client_certificates(config: ServerConfig) -> dict:
    """uvicorn's settings for mutual TLS (--tls-client-ca): a client certificate signed by the CA
    is required in the handshake (the protocol shows it to the app)."""
    if not config.tls_client_ca:
        return {}
    return {"ssl_ca_certs": config.tls_client_ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}


def _announce(event: str, **fields) -> None:
    """One JSON line on stdout: how tests and operators learn the bound ports."""
    print(json.dumps({"event": event, **fields}), flush=True)


async def serve(config: ServerConfig, stop: asyncio.Event | None = None) -> None:
    from .ops import REGISTRY

    service = Service(config, REGISTRY)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)

    grpc_server, grpc_port, health = create_grpc_server(service)
    await set_serving(health, False)
    await grpc_server.start()

    http = _Uvicorn(uvicorn.Config(create_app(service), host=config.host, port=config.http_port,
                                   log_level=config.log_level, access_log=False, lifespan="off",
                                   log_config=None,  # uvicorn's lines go through our JSON handler
                                   # uvicorn annotates an int, and uses it as a timeout: seconds as a float work
                                   timeout_graceful_shutdown=config.shutdown_grace,  # type: ignore[arg-type]
                                   ssl_certfile=config.tls_cert, ssl_keyfile=config.tls_key,
                                   http=_http_protocol(config), **_client_certificates(config)))
    http_task = asyncio.create_task(http.serve())
    while not http.started:
        if http_task.done():  # failed to bind, say
            await http_task
            raise SystemExit(f"the REST server did not start on {config.host}:{config.http_port}")
        await asyncio.sleep(0.01)
    http_port = http.servers[0].sockets[0].getsockname()[1]
    _announce("listening", host=config.host, grpc_port=grpc_port, http_port=http_port,
              device=service.device, tls=bool(config.tls_cert), mtls=bool(config.tls_client_ca))

    # Kernels compile (or load from numba's cache) off the loop; both wires answer meanwhile.
    warm = loop.run_in_executor(service.executor, service.warm_up)
    warm.add_done_callback(lambda f: _warmed_up(f, stop, health, service))
    trimmer = asyncio.create_task(_trim_idle_buffers(service))

    await stop.wait()
    trimmer.cancel()
    # Stop taking requests on both wires; those in flight get --shutdown-grace seconds to finish.
    log.info("shutting down: finishing in-flight requests for up to %g s", config.shutdown_grace)
    _announce("stopping", grace_seconds=config.shutdown_grace)
    service.ready = False
    await set_serving(health, False)
    http.should_exit = True
    await asyncio.gather(grpc_server.stop(config.shutdown_grace), http_task, return_exceptions=True)
    service.close()
    _announce("stopped")
    if warm.done() and not warm.cancelled() and warm.exception() is not None:
        raise SystemExit(1)  # a server that could not warm up would never have been ready


async def _trim_idle_buffers(service: Service) -> None:
    # Taking and giving back buffers trims the pool too; this lets a quiet server's go.
    while True:
        await asyncio.sleep(service.buffers.idle_seconds / 2)
        service.buffers.trim()


def _warmed_up(done: asyncio.Future, stop: asyncio.Event, health, service: Service) -> None:
    """Ready once the kernels are in; a failed warm-up is logged and stops the server (which
    then exits 1) rather than leaving /readyz at 503 with nothing said."""
    error = None if done.cancelled() else done.exception()
    if error is not None:
        log.error("warm-up failed; stopping", exc_info=(type(error), error, error.__traceback__))
        _announce("warm_up_failed", error=f"{type(error).__name__}: {error}")
        stop.set()
    elif not stop.is_set():
        _mark_ready(health, service)


def _mark_ready(health, service: Service) -> None:
    # What exists now (modules, numba's compiled kernels: ~150,000 objects) lives as long as
    # the process. Frozen, it leaves the cyclic collector's scans: a full collection, which
    # paused every call in flight for ~65 ms, takes well under 1 ms.
    gc.freeze()
    asyncio.ensure_future(set_serving(health, True))
    _announce("ready", device=service.device)


def run(config: ServerConfig) -> int:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=config.log_level.upper(), handlers=[handler])
    asyncio.run(serve(config))
    return 0
