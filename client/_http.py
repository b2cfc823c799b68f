"""The SDK's REST transport where no proxy stands between it and the server: keep-alive
HTTP/1.1 connections from the standard library's ``http.client``.

httpx costs a small call about a millisecond of client CPU on a 2-core machine (its request
and response models, h11's state machine, the pool's bookkeeping), ``http.client`` about a
quarter of that: a 100-entry reorder with JSON bodies went from 2.7-2.9 ms p50 to 1.55-1.65.
And httpx reads a body 64 KiB at a time through h11's receive buffer, copying every byte in
and out again in Python (a 1 GB get at 0.22-0.30 GB/s, the client's CPU the limit), where a
Content-Length body here is read with ``recv_into`` straight into one buffer (1.5-1.8 GB/s).

httpx honours HTTP(S)_PROXY and NO_PROXY; ``http.client`` knows nothing of proxies, so where a
proxy applies to the server the SDK stays on httpx (``direct_route``). ``Connections.request``
takes the subset of ``httpx.Client.request``'s arguments the SDK uses and answers with the same
names (``Reply``), so the REST transport calls either one the same way.

A request goes again, once, on a new connection, when a kept-alive connection turns out
dropped (the server hung up or reset it: uvicorn closes idle ones after 5 s, and that close can
cross a request on the way), and only where sending it twice is safe: its method is idempotent
(GET, DELETE: RFC 9110's list), or it provably never reached the server because the socket
took none of its bytes (the write of its head failed outright, as it does on a connection the
server has already reset). A POST whose bytes left may have been read and run before the
connection dropped, so it is not sent again: the caller gets UNAVAILABLE and decides. An idle
connection already closed is noticed before use and never written to; a new connection that
fails is a failure, not a reason to try again.
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
import urllib.parse
import urllib.request
from typing import Any, Sequence

import numpy as np

from ._progress import Progress
from .core.jsoncodec import loads

__all__ = ["Connections", "Reply", "TRANSPORT_ERRORS", "IDEMPOTENT_METHODS", "direct_route"]

# What a failed, refused, cut or timed-out exchange raises (socket.timeout is an OSError).
TRANSPORT_ERRORS = (OSError, http.client.HTTPException)
# Bodies from this size on are read into one 16-byte-aligned buffer, as protobuf decoding wants
# them to use arrays in place; smaller ones in one read() (fewer calls; they are copied anyway).
_BUFFER_BODY_BYTES = 64 << 10
# How much of a body one read takes when its progress is counted.
_PROGRESS_READ_BYTES = 1 << 20
# Idle connections kept per client (httpx keeps 20 too); more concurrent callers than that
# close theirs when done.
_MAX_IDLE = 20
# Methods that change nothing more when sent twice than once (RFC 9110, 9.2.2).
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"})
# How a kept-alive connection the server dropped fails a request.
_DROPPED = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


def request_url(prefix: str, path: str, params: dict[str, str] | None) -> str:
    """The request line's target: the base URL's path, the call's, and its query."""
    return prefix + path + (f"?{urllib.parse.urlencode(params)}" if params else "")


def direct_route(base_url: str) -> bool:
    """Whether httpx would reach ``base_url`` without a proxy (so ``Connections`` may)."""
    parts = urllib.parse.urlsplit(base_url)
    proxies = urllib.request.getproxies()
    if parts.scheme not in proxies and "all" not in proxies:
        return True
    return bool(urllib.request.proxy_bypass(parts.netloc))


class Reply:
    """A response read whole: status, headers and body, under httpx.Response's names."""

    __slots__ = ("status_code", "headers", "content")

    def __init__(self, status_code: int, headers: http.client.HTTPMessage, content: bytes | memoryview):
        self.status_code, self.headers, self.content = status_code, headers, content

    def json(self) -> Any:
        return loads(self.content)


class Connections:
    """Keep-alive connections to the server at ``base_url``, one per caller at a time (a thread
    takes an idle one or opens one, and gives it back when the reply is read). Thread-safe."""

    def __init__(self, base_url: str, *, headers: dict[str, str], timeout: float | None,
                 context: ssl.SSLContext | None):
        parts = urllib.parse.urlsplit(base_url)
        if not parts.hostname:
            raise ValueError(f"no host in the server's URL {base_url!r}")
        self._tls, self._host, self._port = parts.scheme == "https", parts.hostname, parts.port
        self._prefix = parts.path.rstrip("/")
        self._headers, self._timeout, self._context = headers, timeout, context
        self._idle: list[_Connection] = []
        self._busy: set[_Connection] = set()  # carrying a request now
        self._lock = threading.Lock()
        self._closed = False

    def request(self, method: str, path: str, *, content: bytes | Sequence | None = None,
                headers: dict[str, str] | None = None, params: dict[str, str] | None = None,
                progress: Progress | None = None) -> Reply:
        """One exchange. ``content``: bytes, or a sequence of byte pieces sent in turn (the
        caller sets their Content-Length); ``progress`` counts the body of a successful reply as
        it is read. Raises one of ``TRANSPORT_ERRORS`` when it fails."""
        url = request_url(self._prefix, path, params)
        headers = {**self._headers, **headers} if headers else self._headers
        conn, reused = self._take()
        try:
            try:
                response = _exchange(conn, method, url, content, headers)
            except _DROPPED:
                if self._closed or not (reused and (method in IDEMPOTENT_METHODS or conn.nothing_sent)):
                    raise
                self._done(conn, keep=False)
                conn = self._opened()
                response = _exchange(conn, method, url, content, headers)
            reply = Reply(response.status, response.headers,
                          _read_body(response, progress if response.status < 400 else None))
        except BaseException:
            self._done(conn, keep=False)
            raise
        self._done(conn, keep=not response.will_close)
        return reply

    def close(self) -> None:
        """Close the idle connections, and cut those carrying a request: a call still waiting
        on the server (a thread ``AsyncClient`` gave up on) ends at once, UNAVAILABLE."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            busy = list(self._busy)
        for conn in idle:
            conn.close()
        for conn in busy:
            _cut(conn)

    def _open(self) -> _Connection:
        if self._tls:
            return _TLSConnection(self._host, self._port, timeout=self._timeout, context=self._context)
        return _Connection(self._host, self._port, timeout=self._timeout)

    def _opened(self) -> _Connection:
        conn = self._open()
        with self._lock:
            self._busy.add(conn)
        return conn

    def _take(self) -> tuple[_Connection, bool]:
        """(a connection, whether it served before): an idle one still open, else a new one."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
                if conn is not None:
                    self._busy.add(conn)
            if conn is None:
                return self._opened(), False
            if _still_open(conn):
                return conn, True
            self._done(conn, keep=False)

    def _done(self, conn: _Connection, keep: bool) -> None:
        """A connection back from a request: kept for the next (``keep``, and room), or closed."""
        with self._lock:
            self._busy.discard(conn)
            if keep and not self._closed and len(self._idle) < _MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()


class _Connection(http.client.HTTPConnection):
    """``http.client``'s connection, knowing whether any byte of the current request has left:
    ``nothing_sent`` holds until the socket takes the first bytes of the request's head."""

    nothing_sent = True

    def putrequest(self, *args: Any, **kwargs: Any) -> None:  # where every request starts
        self.nothing_sent = True
        super().putrequest(*args, **kwargs)

    def send(self, data: Any) -> None:
        if self.nothing_sent and self.sock is not None and isinstance(data, bytes):
            # One send(): it raises having taken nothing, or says how much it took (sendall
            # cannot tell a failure after some bytes from one before any).
            data = memoryview(data)[self.sock.send(data):]
            self.nothing_sent = False
            if not data:
                return
        super().send(data)


class _TLSConnection(_Connection, http.client.HTTPSConnection):
    pass


def _exchange(conn: http.client.HTTPConnection, method: str, url: str, content: Any,
              headers: dict[str, str]) -> http.client.HTTPResponse:
    # A bytes body leaves in the same send() as the head (no Nagle/delayed-ACK stall); pieces
    # follow it one send() each.
    conn.request(method, url, body=content, headers=headers)
    return conn.getresponse()


def _cut(conn: http.client.HTTPConnection) -> None:
    """Shut a connection down under the thread using it (its blocked read returns at once);
    that thread closes it."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # closed meanwhile
            pass


def _still_open(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle connection can carry a request: readable while idle means the server
    closed it (or sent what nobody asked for); either way it is done."""
    if conn.sock is None:
        return False
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(conn.sock, select.POLLIN)
        return not poller.poll(0)
    return not select.select([conn.sock], [], [], 0)[0]


def _read_body(response: http.client.HTTPResponse, progress: Progress | None = None) -> bytes | memoryview:
    """The whole body: one read(), or for a big one of announced length ``recv_into`` one
    aligned buffer (a cut body raises IncompleteRead); counted on ``progress`` as it comes."""
    length = response.length  # None when chunked or read to the close
    if length is None or length < _BUFFER_BODY_BYTES:
        return response.read()
    # One readinto() fills the whole buffer; with progress, 1 MiB a call, so it can be counted.
    step = length
    if progress is not None:
        progress.expect(length)
        step = _PROGRESS_READ_BYTES
    body = np.empty(length, np.uint8).data
    filled = 0
    while filled < length:
        n = response.readinto(body[filled:filled + step])
        if not n:
            raise http.client.IncompleteRead(bytes(0), length - filled)
        filled += n
        if progress is not None:
            progress.to(filled)
    return body
