"""``AsyncClient``'s REST transport where no proxy stands in the way: keep-alive HTTP/1.1
connections on asyncio streams, the async twin of ``_http.Connections``.

httpx's async client cost a small call ~2.4 ms of client CPU here (a 100-entry reorder with
JSON bodies at 3.1 ms p50); these connections do the same exchange in a fraction of that.
The SDK's requests are simple (a known body, Content-Length or chunked replies, no upgrades,
no 100-continue), so a reader of exactly that is small enough to own.

Timeouts are per step, as http.client's and httpx's are: the connect, each write and each
read must make progress within ``timeout`` seconds (TimeoutError), not the whole exchange.
Failures raise ``_http.TRANSPORT_ERRORS``, the same as the blocking transport.
"""

from __future__ import annotations

import asyncio
import http.client
import re
import ssl
import urllib.parse
from typing import Any, Sequence

import numpy as np

from ._http import _BUFFER_BODY_BYTES, _MAX_IDLE, Reply, request_url

__all__ = ["AsyncConnections", "Headers"]

# The longest response head read (uvicorn's are a few hundred bytes).
_MAX_HEAD_BYTES = 64 << 10
# Request bodies are written this much at a time, each waiting for the socket to take it, so
# that the transport never holds (and copies) more than one piece of a big body.
_WRITE_BYTES = 1 << 20
# What may not appear in a header: it would end the line (or the string) early.
_LINE_BREAK = re.compile("[\r\n\0]")


class Headers(dict):
    """Response headers by lower-case name; ``get`` takes any case (as httpx's do)."""

    def get(self, name: str, default: Any = None) -> Any:
        return super().get(name.lower(), default)


class _Connection:
    __slots__ = ("reader", "writer", "loop")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.loop = asyncio.get_running_loop()

    def still_open(self) -> bool:
        """Whether an idle connection can carry a request: once the loop has fed it the
        server's close (EOF) or bytes nobody asked for, it is done; and one made on another
        loop (a client used again under a new ``asyncio.run``) cannot serve this one."""
        return not (self.loop is not asyncio.get_running_loop() or self.writer.is_closing()
                    or self.reader.at_eof() or self.reader._buffer)

    def close(self) -> None:
        try:
            self.writer.close()
        except RuntimeError:  # its loop is closed, and the socket with it
            pass


class _Deadline:
    """``timeout`` seconds for each step of an exchange: ``step()`` restarts the clock."""

    def __init__(self, timeout: float | None):
        self.timeout = timeout
        self.scope = asyncio.timeout(None)

    def step(self) -> None:
        if self.timeout is not None:
            self.scope.reschedule(asyncio.get_running_loop().time() + self.timeout)


class AsyncConnections:
    """Keep-alive connections to the server at ``base_url``, one per request in flight (an idle
    one is taken, or a new one opened, and given back when the reply is read)."""

    def __init__(self, base_url: str, *, headers: dict[str, str], timeout: float | None,
                 context: ssl.SSLContext | None):
        parts = urllib.parse.urlsplit(base_url)
        tls = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port or (443 if tls else 80)
        self._ssl = (context or ssl.create_default_context()) if tls else None
        self._prefix = parts.path.rstrip("/")
        host = self._host if ":" not in self._host else f"[{self._host}]"  # an IPv6 literal
        self._host_header = host if parts.port is None else f"{host}:{parts.port}"
        self._headers, self._timeout = headers, timeout
        self._idle: list[_Connection] = []
        self._closed = False

    async def request(self, method: str, path: str, *, content: bytes | Sequence | None = None,
                      headers: dict[str, str] | None = None, params: dict[str, str] | None = None) -> Reply:
        """One exchange, as ``_http.Connections.request``: ``content`` is bytes, or a sequence
        of pieces whose Content-Length the caller sets."""
        head = _request_head(method, request_url(self._prefix, path, params), self._host_header,
                             {**self._headers, **headers} if headers else self._headers, content)
        deadline = _Deadline(self._timeout)
        async with deadline.scope:
            conn, reused = await self._take(deadline)
            try:
                try:
                    reply, reusable = await _exchange(conn, head, content, method, deadline)
                except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                    if not reused:
                        raise
                    # The server closed this idle connection as the request went out (uvicorn
                    # closes them after 5 s): unanswered, it goes again, once, on a new one.
                    conn.close()
                    conn = await self._open(deadline)
                    reply, reusable = await _exchange(conn, head, content, method, deadline)
            except BaseException:  # cancelled too: a half-read connection is of no further use
                conn.close()
                raise
        if reusable and not self._closed and len(self._idle) < _MAX_IDLE:
            self._idle.append(conn)
        else:
            conn.close()
        return reply

    async def aclose(self) -> None:  # httpx.AsyncClient's name, so the client closes either alike
        self.close()

    def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    async def _open(self, deadline: _Deadline) -> _Connection:
        deadline.step()
        reader, writer = await asyncio.open_connection(
            self._host, self._port, ssl=self._ssl, limit=_MAX_HEAD_BYTES,
            server_hostname=self._host if self._ssl else None)
        return _Connection(reader, writer)

    async def _take(self, deadline: _Deadline) -> tuple[_Connection, bool]:
        """(a connection, whether it served before): an idle one still open, else a new one."""
        while self._idle:
            conn = self._idle.pop()
            if conn.still_open():
                return conn, True
            conn.close()
        return await self._open(deadline), False


def _request_head(method: str, url: str, host: str, headers: dict[str, str], content: Any) -> bytes:
    lines = [f"{method} {url} HTTP/1.1", f"host: {host}"]
    for name, value in headers.items():
        if _LINE_BREAK.search(name) or _LINE_BREAK.search(value):  # a header must not end early
            raise ValueError(f"invalid HTTP header {name!r}: {value!r}")
        lines.append(f"{name}: {value}")
    if isinstance(content, (bytes, bytearray, memoryview)):
        lines.append(f"content-length: {len(content)}")
    elif content is None and method in ("POST", "PUT", "PATCH"):
        lines.append("content-length: 0")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _exchange(conn: _Connection, head: bytes, content: Any, method: str,
                    deadline: _Deadline) -> tuple[Reply, bool]:
    """Send the request, read the reply: (reply, whether the connection may serve again)."""
    pieces = () if content is None else content
    if isinstance(content, (bytes, bytearray, memoryview)):
        # A small body leaves with the head, in one segment (no Nagle/delayed-ACK stall).
        head, pieces = (head + content, ()) if len(content) < _WRITE_BYTES else (head, (content,))
    await _write_all(conn.writer, (head, *pieces), deadline)
    deadline.step()
    status, headers, keep_alive = await _read_head(conn.reader)
    if method == "HEAD" or status in (204, 304):
        return Reply(status, headers, b""), keep_alive
    body, ended_by_close = await _read_body(conn.reader, headers, deadline)
    return Reply(status, headers, body), keep_alive and not ended_by_close


async def _write_all(writer: asyncio.StreamWriter, pieces: Sequence, deadline: _Deadline) -> None:
    for piece in pieces:
        view = memoryview(piece).cast("B")
        for start in range(0, len(view), _WRITE_BYTES):
            writer.write(view[start:start + _WRITE_BYTES])
            deadline.step()
            await writer.drain()


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, Headers, bool]:
    """(status, headers, whether the server keeps the connection open)."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise http.client.RemoteDisconnected("the server closed the connection without answering") from None
        raise http.client.BadStatusLine(exc.partial[:100].decode("latin-1")) from None
    except asyncio.LimitOverrunError:
        raise http.client.LineTooLong(f"response head over {_MAX_HEAD_BYTES} bytes") from None
    status_line, *lines = raw[:-4].decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    code = rest[:3]
    if version not in ("HTTP/1.1", "HTTP/1.0") or not _is_number(code):
        raise http.client.BadStatusLine(status_line[:100])
    headers = Headers()
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep:
            raise http.client.HTTPException(f"malformed response header line {line[:100]!r}")
        name, value = name.strip().lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
    return int(code), headers, keep_alive


async def _read_body(reader: asyncio.StreamReader, headers: Headers,
                     deadline: _Deadline) -> tuple[bytes | memoryview, bool]:
    """(the whole body, whether it ended with the connection): by Content-Length, chunked, or
    to the close. A big body of known length goes into one 16-byte-aligned buffer, as the
    protobuf decoders use arrays in place there."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return await _read_chunked(reader, deadline), False
    length = headers.get("content-length")
    if length is None:
        pieces = []
        while chunk := await reader.read(_WRITE_BYTES):
            pieces.append(chunk)
            deadline.step()
        return b"".join(pieces), True
    if not _is_number(length):
        raise http.client.HTTPException(f"invalid Content-Length {length[:40]!r}")
    length = int(length)
    if length < _BUFFER_BODY_BYTES:
        return await _read_exactly(reader, length), False
    body = memoryview(np.empty(length, np.uint8))
    filled = 0
    while filled < length:
        chunk = await reader.read(min(length - filled, _WRITE_BYTES))
        if not chunk:
            raise http.client.IncompleteRead(bytes(0), length - filled)
        body[filled:filled + len(chunk)] = chunk
        filled += len(chunk)
        deadline.step()
    return body, False


def _is_number(text: str) -> bool:
    """Only ASCII digits: str.isdigit() takes "²" too, which int() refuses."""
    return text.isascii() and text.isdigit()


async def _read_exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError as exc:
        raise http.client.IncompleteRead(exc.partial, n - len(exc.partial)) from None


async def _read_chunked(reader: asyncio.StreamReader, deadline: _Deadline) -> bytes:
    pieces = []
    while True:
        try:
            line = await reader.readuntil(b"\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            raise http.client.IncompleteRead(b"".join(pieces)) from None
        size = line.split(b";", 1)[0].strip()
        try:
            size = int(size, 16)
        except ValueError:
            size = -1
        if size < 0:
            raise http.client.HTTPException(f"invalid chunk size in {line[:20]!r}")
        if size == 0:  # then trailers, if any, up to an empty line
            while (await _read_line(reader)) != b"\r\n":
                pass
            return b"".join(pieces)
        pieces.append(await _read_exactly(reader, size))
        if await _read_exactly(reader, 2) != b"\r\n":
            raise http.client.HTTPException("a chunk does not end in CRLF")
        deadline.step()


async def _read_line(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.readuntil(b"\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        raise http.client.IncompleteRead(b"") from None
