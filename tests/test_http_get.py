"""The SDK's REST ``get`` read straight into one buffer (``sparseserve._http_get``).

Against the real server: tensors of several sizes and both encodings come back intact. Against
small hand-written HTTP servers: a body cut short, a body that stalls past the client's timeout,
a base URL with a path prefix, and a configured proxy (which the get must go through, as every
other httpx call does)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import numpy as np
import pytest

from sparseserve import AsyncClient, Client, DeadlineExceededError, NotFoundError, SparseTensor, UnavailableError
from sparseserve import _http_get

from conftest import make_client

PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture
def no_proxy_env(monkeypatch):
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


def big_coo(nbytes: int) -> SparseTensor:
    nnz = nbytes // 24
    rng = np.random.default_rng(5)
    return SparseTensor(indices=np.stack([np.arange(nnz) // 100, rng.integers(0, 1000, nnz)], axis=1),
                        values=rng.standard_normal(nnz), dense_shape=[nnz // 100 + 1, 1000])


@pytest.mark.parametrize("wire, nbytes", [("rest-protobuf", 0), ("rest-protobuf", 24),
                                           ("rest-protobuf", 30 << 20), ("rest-json", 1 << 16)])
def test_rest_get_round_trips(server, no_proxy_env, wire, nbytes):
    tensor = big_coo(nbytes)
    with make_client(server, wire) as c:
        h = c.put(tensor)
        back = c.get(h)
        c.delete(h)
    np.testing.assert_array_equal(back.indices, tensor.indices)
    np.testing.assert_array_equal(back.values, tensor.values)
    assert back.dense_shape == tensor.dense_shape


def test_async_rest_get_round_trips(server, no_proxy_env):
    tensor = big_coo(8 << 20)

    async def main():
        async with AsyncClient(server.http_url) as c:
            h = await c.put(tensor)
            back, missing = await asyncio.gather(c.get(h), c.get("h-" + "0" * 32), return_exceptions=True)
            await c.delete(h)
            return back, missing

    back, missing = asyncio.run(main())
    np.testing.assert_array_equal(back.values, tensor.values)
    assert isinstance(missing, NotFoundError) and missing.reason == "UNKNOWN_HANDLE"


# ------------------------------------------------------------------ hand-written servers
class OneShotServer:
    """Answers each connection with ``reply(request_head, connection)``; records the heads."""

    def __init__(self, reply):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.heads: list[str] = []
        self.reply = reply
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    data = conn.recv(65536)
                    if not data:
                        break
                    head += data
                self.heads.append(head.decode("latin-1"))
                try:
                    self.reply(conn)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def fake_server():
    servers = []

    def start(reply):
        servers.append(OneShotServer(reply))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def cut_short(conn):
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 1000\r\n\r\n"
                 + b"\0" * 10)


def stalls(conn):
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 1000\r\n\r\n")
    time.sleep(5)


def not_found(conn):
    body = b'{"error": {"code": "NOT_FOUND", "message": "no such tensor", "reason": "UNKNOWN_HANDLE"}}'
    conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: "
                 + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)


def test_body_cut_short_is_unavailable(fake_server, no_proxy_env):
    srv = fake_server(cut_short)
    with Client(srv.url) as c:
        with pytest.raises(UnavailableError) as info:
            c.get("h-" + "0" * 32)
    assert info.value.reason == "CONNECTION"


def test_stalled_body_is_a_deadline(fake_server, no_proxy_env):
    srv = fake_server(stalls)
    with Client(srv.url, timeout=0.5) as c:
        start = time.monotonic()
        with pytest.raises(DeadlineExceededError) as info:
            c.get("h-" + "0" * 32)
    assert info.value.reason == "TIMEOUT" and time.monotonic() - start < 4


def test_base_url_path_prefix_is_kept(fake_server, no_proxy_env):
    srv = fake_server(not_found)
    with Client(srv.url + "/sparse/") as c:
        with pytest.raises(NotFoundError) as info:
            c.get("h-" + "1" * 32)
    assert info.value.reason == "UNKNOWN_HANDLE"
    assert srv.heads[0].startswith(f"GET /sparse/v1/tensors/h-{'1' * 32} HTTP/1.1\r\n")
    assert "\r\naccept: application/x-protobuf\r\n" in srv.heads[0].lower()


def test_a_configured_proxy_is_used(fake_server, no_proxy_env):
    """With HTTP_PROXY set, the get goes to the proxy (an absolute URL in the request line), as
    httpx sends every other call; it must not go straight to the server."""
    proxy = fake_server(not_found)
    no_proxy_env.setenv("HTTP_PROXY", proxy.url)
    target = "http://sparse.invalid:8000"
    assert not _http_get.direct_route(target)
    with Client(target) as c:
        with pytest.raises(NotFoundError):
            c.get("h-" + "2" * 32)
    assert proxy.heads[0].startswith(f"GET {target}/v1/tensors/h-{'2' * 32} HTTP/1.1\r\n")


def test_direct_route(no_proxy_env):
    assert _http_get.direct_route("http://10.0.0.1:8000")
    no_proxy_env.setenv("HTTPS_PROXY", "http://proxy:3128")
    assert _http_get.direct_route("http://10.0.0.1:8000")  # a proxy for https only
    assert not _http_get.direct_route("https://10.0.0.1:8000")
    no_proxy_env.setenv("NO_PROXY", "10.0.0.1")
    assert _http_get.direct_route("https://10.0.0.1:8000")
