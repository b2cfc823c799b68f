"""``GET /v1/tensors/{handle}`` read straight into one buffer, for the SDK's REST ``get``.

httpx reads a body 64 KiB at a time through h11's receive buffer, which copies every byte in
and out again in Python: a 1 GB protobuf tensor came at 0.22-0.30 GB/s, the client's CPU the
limit. The standard library's ``http.client`` reads a Content-Length body with ``recv_into``
into the caller's buffer: 1.5-1.8 GB/s in the same run. A get is the one REST call whose reply
can be gigabytes, so it alone takes this path, on a connection of its own; every other call
stays on the client's httpx connection.

httpx honours HTTP(S)_PROXY and NO_PROXY; ``http.client`` knows nothing of proxies, so where a
proxy applies to the server the get goes through httpx as before (``direct_route``).
"""

from __future__ import annotations

import http.client
import ssl
import urllib.parse
import urllib.request
from typing import Any

import numpy as np

from ._wire import REQUEST_ID_KEY, http_error, transport_error

__all__ = ["direct_route", "get_body"]


def direct_route(base_url: str) -> bool:
    """Whether httpx would reach ``base_url`` without a proxy (so ``get_body`` may)."""
    parts = urllib.parse.urlsplit(base_url)
    proxies = urllib.request.getproxies()
    if parts.scheme not in proxies and "all" not in proxies:
        return True
    return bool(urllib.request.proxy_bypass(parts.netloc))


def _connection(parts: urllib.parse.SplitResult, timeout: float | None,
                context: ssl.SSLContext | None) -> http.client.HTTPConnection:
    if parts.scheme == "https":
        return http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout, context=context)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)


def _read_exactly(response: http.client.HTTPResponse, length: int) -> memoryview:
    """A body of the announced length, into one buffer (16-byte aligned, as ``collect_body``'s,
    so protobuf arrays are used in place)."""
    body = memoryview(np.empty(length, np.uint8))
    filled = 0
    while filled < length:
        n = response.readinto(body[filled:])
        if not n:
            raise http.client.IncompleteRead(bytes(0), length - filled)
        filled += n
    return body


def get_body(base_url: str, path: str, headers: dict[str, str], timeout: float | None,
             context: ssl.SSLContext | None, request_id: str | None = None) -> tuple[memoryview | bytes, str]:
    """(body, content type) of a GET of ``path`` under ``base_url`` (TLS with ``context`` for
    https); an error status raises its SDK error, a failed or cut connection
    ``UnavailableError``, a timeout ``DeadlineExceededError``."""
    parts = urllib.parse.urlsplit(base_url)
    conn = _connection(parts, timeout, context)
    try:
        conn.request("GET", parts.path.rstrip("/") + path, headers=headers)
        response = conn.getresponse()
        if response.status >= 400:
            raise http_error(response.status, response.read(), response.getheader(REQUEST_ID_KEY, request_id))
        length = response.getheader("content-length")
        body: Any = _read_exactly(response, int(length)) if length is not None else response.read()
        return body, response.getheader("content-type", "")
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise transport_error(exc, request_id) from None
    finally:
        conn.close()
