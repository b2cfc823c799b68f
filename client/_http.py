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
names (``Reply``), so the clients call either one the same way.
"""

from __future__ import annotations

import http.client
import select
import ssl
import threading
import urllib.parse
import urllib.request
from typing import Any, Sequence

import numpy as np

from .core.jsoncodec import loads

__all__ = ["Connections", "Reply", "TRANSPORT_ERRORS", "direct_route"]

# What a failed, refused, cut or timed-out exchange raises (socket.timeout is an OSError).
TRANSPORT_ERRORS = (OSError, http.client.HTTPException)
# Bodies from this size on are read into one 16-byte-aligned buffer, as protobuf decoding wants
# them to use arrays in place; smaller ones in one read() (fewer calls; they are copied anyway).
_BUFFER_BODY_BYTES = 64 << 10
# Idle connections kept per client (httpx keeps 20 too); more concurrent callers than that
# close theirs when done.
_MAX_IDLE = 20


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
    takes an idle one or opens one, and gives it back when the reply is read)."""

    def __init__(self, base_url: str, *, headers: dict[str, str], timeout: float | None,
                 context: ssl.SSLContext | None):
        parts = urllib.parse.urlsplit(base_url)
        self._tls, self._host, self._port = parts.scheme == "https", parts.hostname, parts.port
        self._prefix = parts.path.rstrip("/")
        self._headers, self._timeout, self._context = headers, timeout, context
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def request(self, method: str, path: str, *, content: bytes | Sequence | None = None,
                headers: dict[str, str] | None = None, params: dict[str, str] | None = None) -> Reply:
        """One exchange. ``content``: bytes, or a sequence of byte pieces sent in turn (the
        caller sets their Content-Length). Raises one of ``TRANSPORT_ERRORS`` when it fails."""
        url = request_url(self._prefix, path, params)
        headers = {**self._headers, **headers} if headers else self._headers
        conn, reused = self._take()
        try:
            try:
                response = _exchange(conn, method, url, content, headers)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if not reused:
                    raise
                # An idle connection the server closed as this request went out (uvicorn closes
                # them after 5 s): nothing of the request was answered, so it goes again, once,
                # on a new connection.
                conn.close()
                conn = self._open()
                response = _exchange(conn, method, url, content, headers)
            reply = Reply(response.status, response.headers, _read_body(response))
        except BaseException:
            conn.close()
            raise
        if response.will_close:
            conn.close()
        else:
            self._give_back(conn)
        return reply

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _open(self) -> http.client.HTTPConnection:
        if self._tls:
            return http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout,
                                               context=self._context)
        return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        """(a connection, whether it served before): an idle one still open, else a new one."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._open(), False
            if _still_open(conn):
                return conn, True
            conn.close()

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < _MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()


def _exchange(conn: http.client.HTTPConnection, method: str, url: str, content: Any,
              headers: dict[str, str]) -> http.client.HTTPResponse:
    # A bytes body leaves in the same send() as the head (no Nagle/delayed-ACK stall); pieces
    # follow it one send() each.
    conn.request(method, url, body=content, headers=headers)
    return conn.getresponse()


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


def _read_body(response: http.client.HTTPResponse) -> bytes | memoryview:
    """The whole body: one read(), or for a big one of announced length ``recv_into`` one
    aligned buffer (a cut body raises IncompleteRead)."""
    length = response.length  # None when chunked or read to the close
    if length is None or length < _BUFFER_BODY_BYTES:
        return response.read()
    body = memoryview(np.empty(length, np.uint8))
    filled = 0
    while filled < length:
        n = response.readinto(body[filled:])
        if not n:
            raise http.client.IncompleteRead(bytes(0), length - filled)
        filled += n
    return body
