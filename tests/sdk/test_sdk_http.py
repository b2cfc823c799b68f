"""The SDK's REST transport over the standard library's keep-alive connections
(``sparseserve._http``), for ``Client`` and for ``AsyncClient``, which runs it in threads.

Against the real server: tensors of several sizes and both encodings come back intact, and one
client's calls from many threads, or many at once from one loop, share a few connections.
Against small hand-written HTTP servers: connections reused, chunked replies, an idle connection
the server closed (noticed before use), a connection dropped under a request (sent again only
when idempotent, or when the socket took none of it), broken replies, a body that stalls past
the client's timeout, a base URL with a path prefix, headers, and a configured proxy (which
every call must go through, by httpx); an async call cancelled, or abandoned until the client
closes, and a client used again under a second loop."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from sparseserve import AsyncClient, Client, DeadlineExceededError, NotFoundError, SparseTensor, UnavailableError
from sparseserve import _http

from conftest import make_client

PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture
def no_proxy_env(monkeypatch):
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


def connections(c: Client | AsyncClient) -> _http.Connections:
    """The keep-alive connections of a REST client (``AsyncClient``'s: its threads')."""
    transport = c._transport
    return getattr(transport, "_blocking", transport)._session


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


def test_threads_share_a_few_connections(server, no_proxy_env):
    """One client's calls from 8 threads: every answer right, and at most one connection each
    kept for later."""
    rng = np.random.default_rng(3)
    tensors = [SparseTensor(indices=rng.integers(0, 50, (40, 2)), values=rng.standard_normal(40),
                            dense_shape=[50, 50]) for _ in range(8)]
    with make_client(server, "rest-json") as c:
        def run(t):
            return [c.reorder(t) for _ in range(25)]

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(run, tensors))
        assert 1 <= len(connections(c)._idle) <= 8
    for t, results in zip(tensors, answers):
        order = np.lexsort(t.indices.T[::-1])
        for r in results:
            np.testing.assert_array_equal(r.indices, t.indices[order])
            np.testing.assert_array_equal(r.values, t.values[order])


# ------------------------------------------------------------------ hand-written servers
class FakeServer:
    """Answers requests with ``reply(connection)``, each connection in a thread of its own;
    records the request heads and counts connections. A connection answers ``answers``
    requests, then hangs up without saying so: at once, by a reset (``hang_up="reset"``: the
    client's next write fails), or (``hang_up="on_next_request"``) when the next request has
    arrived, unanswered."""

    def __init__(self, reply, answers: int = 1, hang_up: str = "at_once"):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.heads: list[str] = []
        self.connections = 0
        self.reply, self.answers, self.hang_up = reply, answers, hang_up
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._converse, args=(conn,), daemon=True).start()

    def _converse(self, conn: socket.socket) -> None:
        with conn:
            received = b""
            for answered in range(self.answers + (self.hang_up == "on_next_request")):
                while b"\r\n\r\n" not in received:
                    data = conn.recv(65536)
                    if not data:
                        return
                    received += data
                head, _, received = received.partition(b"\r\n\r\n")
                self.heads.append(head.decode("latin-1") + "\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(received) < length:
                    received += conn.recv(65536)
                received = received[length:]
                if answered == self.answers:  # the request to hang up on
                    return
                try:
                    self.reply(conn)
                except OSError:
                    return
            if self.hang_up == "reset":  # no FIN: a RST, which fails the peer's next send()
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def fake_server():
    servers = []

    def start(reply, **kwargs):
        servers.append(FakeServer(reply, **kwargs))
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


def not_found_kept_alive(conn):
    body = b'{"error": {"code": "NOT_FOUND", "message": "no such tensor", "reason": "UNKNOWN_HANDLE"}}'
    conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)


def missing_handles(c: Client, calls: int) -> list[str]:
    """``calls`` deletes of handles the server does not know, each answered NOT_FOUND: the
    reasons the SDK read."""
    reasons = []
    for i in range(calls):
        with pytest.raises(NotFoundError) as info:
            c.delete(f"h-{i:032d}")
        reasons.append(info.value.reason)
    return reasons


def test_calls_share_a_kept_alive_connection(fake_server, no_proxy_env):
    srv = fake_server(not_found_kept_alive, answers=100)
    with Client(srv.url) as c:
        assert missing_handles(c, 5) == ["UNKNOWN_HANDLE"] * 5
    assert srv.connections == 1 and len(srv.heads) == 5


def test_a_connection_the_server_closed_while_idle_is_not_used(fake_server, no_proxy_env):
    """Noticed before the request goes out: no request is written to a closed connection."""
    srv = fake_server(not_found_kept_alive, answers=1)
    exchanges = []
    exchange = _http._exchange
    no_proxy_env.setattr(_http, "_exchange", lambda conn, *a: exchanges.append(conn) or exchange(conn, *a))
    with Client(srv.url) as c:
        for _ in range(3):
            assert missing_handles(c, 1) == ["UNKNOWN_HANDLE"]
            deadline = time.monotonic() + 5
            while _http._still_open(connections(c)._idle[0]):  # until the server's close reaches the client
                assert time.monotonic() < deadline
                time.sleep(0.01)
    assert srv.connections == 3 and len(srv.heads) == 3 and len(set(exchanges)) == len(exchanges) == 3


# When a kept-alive connection drops under a request: sent again, once, on a new connection only
# where that is safe (the rule and why: ``_http``'s docstring).
@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_an_idempotent_request_the_server_hangs_up_on_goes_again_once(fake_server, no_proxy_env, method):
    """The server closes a kept-alive connection as the next request arrives (idle timeouts
    race requests): that request, unanswered and safe to repeat, goes again on a new one."""
    srv = fake_server(not_found_kept_alive, answers=1, hang_up="on_next_request")
    handle = "h-" + "5" * 32
    with Client(srv.url) as c:
        assert missing_handles(c, 1) == ["UNKNOWN_HANDLE"]
        no_proxy_env.setattr(_http, "_still_open", lambda conn: True)  # the close not yet seen
        with pytest.raises(NotFoundError):
            c.get(handle) if method == "GET" else c.delete(handle)
    assert srv.connections == 2
    assert [h.split("\r\n")[0] for h in srv.heads[1:]] == [f"{method} /v1/tensors/{handle} HTTP/1.1"] * 2


def test_a_post_the_server_hangs_up_on_is_not_sent_again(fake_server, no_proxy_env):
    """The server reads a POST on a kept-alive connection, then hangs up unanswered: it may have
    run it, so the SDK does not run it twice; the caller gets UNAVAILABLE."""
    srv = fake_server(not_found_kept_alive, answers=1, hang_up="on_next_request")
    with Client(srv.url) as c:
        assert missing_handles(c, 1) == ["UNKNOWN_HANDLE"]
        with pytest.raises(UnavailableError) as info:
            c.call("reorder", sp_input=big_coo(240))
    assert info.value.reason == "CONNECTION"
    assert srv.connections == 1
    assert [h.split("\r\n")[0] for h in srv.heads] == [f"DELETE /v1/tensors/h-{0:032d} HTTP/1.1",
                                                        "POST /v1/ops/reorder HTTP/1.1"]


def test_a_post_the_socket_took_none_of_goes_again(fake_server, no_proxy_env):
    """The server reset a kept-alive connection before the client looked at it again: writing
    the POST's head fails outright, so no byte of it left, and it goes again on a new one."""
    srv = fake_server(not_found_kept_alive, answers=1, hang_up="reset")
    with Client(srv.url) as c:
        assert missing_handles(c, 1) == ["UNKNOWN_HANDLE"]
        deadline = time.monotonic() + 5
        while _http._still_open(connections(c)._idle[0]):  # until the reset has arrived
            assert time.monotonic() < deadline
            time.sleep(0.01)
        no_proxy_env.setattr(_http, "_still_open", lambda conn: True)  # ... unseen by the client
        with pytest.raises(NotFoundError):  # answered, on the new connection
            c.call("reorder", sp_input=big_coo(240))
    assert srv.connections == 2
    assert [h.split("\r\n")[0] for h in srv.heads] == [f"DELETE /v1/tensors/h-{0:032d} HTTP/1.1",
                                                        "POST /v1/ops/reorder HTTP/1.1"]


def test_a_new_connection_hung_up_on_is_not_retried(fake_server, no_proxy_env):
    srv = fake_server(not_found_kept_alive, answers=0, hang_up="on_next_request")
    with Client(srv.url) as c:
        with pytest.raises(UnavailableError) as info:
            c.delete("h-" + "3" * 32)
    assert info.value.reason == "CONNECTION"
    assert srv.connections == 1 and len(srv.heads) == 1


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
    """With HTTP_PROXY set, every call goes to the proxy (an absolute URL in the request line)
    through httpx; none may go straight to the server."""
    proxy = fake_server(not_found)
    no_proxy_env.setenv("HTTP_PROXY", proxy.url)
    target = "http://sparse.invalid:8000"
    assert not _http.direct_route(target)
    with Client(target) as c:
        with pytest.raises(NotFoundError):
            c.get("h-" + "2" * 32)
        with pytest.raises(NotFoundError):
            c.delete("h-" + "2" * 32)
    assert proxy.heads[0].startswith(f"GET {target}/v1/tensors/h-{'2' * 32} HTTP/1.1\r\n")
    assert proxy.heads[1].startswith(f"DELETE {target}/v1/tensors/h-{'2' * 32} HTTP/1.1\r\n")


def test_direct_route(no_proxy_env):
    assert _http.direct_route("http://10.0.0.1:8000")
    no_proxy_env.setenv("HTTPS_PROXY", "http://proxy:3128")
    assert _http.direct_route("http://10.0.0.1:8000")  # a proxy for https only
    assert not _http.direct_route("https://10.0.0.1:8000")
    no_proxy_env.setenv("NO_PROXY", "10.0.0.1")
    assert _http.direct_route("https://10.0.0.1:8000")




def not_found_chunked(conn):
    body = b'{"error": {"code": "NOT_FOUND", "message": "no such tensor", "reason": "UNKNOWN_HANDLE"}}'
    chunks = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(body[i:i + 7]), body[i:i + 7]) for i in range(0, len(body), 7))
    conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
                 + chunks + b"0\r\nx-trailer: 1\r\n\r\n")


def test_chunked_reply_is_read_and_the_connection_kept(fake_server, no_proxy_env):
    srv = fake_server(not_found_chunked, answers=100)
    with Client(srv.url) as c:
        assert missing_handles(c, 3) == ["UNKNOWN_HANDLE"] * 3
    assert srv.connections == 1


def test_connection_close_is_honoured(fake_server, no_proxy_env):
    srv = fake_server(not_found, answers=1)  # says "connection: close", then closes
    with Client(srv.url) as c:
        assert missing_handles(c, 3) == ["UNKNOWN_HANDLE"] * 3
    assert srv.connections == 3


# ------------------------------------------------------------------ AsyncClient, through threads
def async_missing_handles(url: str, calls: int, **kwargs) -> tuple[list[str], AsyncClient]:
    async def main():
        reasons = []
        async with AsyncClient(url, **kwargs) as c:
            for i in range(calls):
                with pytest.raises(NotFoundError) as info:
                    await c.delete(f"h-{i:032d}")
                reasons.append(info.value.reason)
        return reasons, c

    return asyncio.run(main())


def test_async_calls_share_a_kept_alive_connection(fake_server, no_proxy_env):
    srv = fake_server(not_found_kept_alive, answers=100)
    reasons, c = async_missing_handles(srv.url, 5)
    assert reasons == ["UNKNOWN_HANDLE"] * 5
    assert srv.connections == 1 and len(srv.heads) == 5
    assert isinstance(connections(c), _http.Connections)  # not httpx


@pytest.mark.parametrize("reply, timeout, error, reason", [
    (cut_short, None, UnavailableError, "CONNECTION"),
    (stalls, 0.5, DeadlineExceededError, "TIMEOUT"),
    (lambda conn: conn.sendall(b"SPDY/3 200 OK\r\n\r\n"), None, UnavailableError, "CONNECTION"),
    (lambda conn: conn.sendall(b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * (100 << 10) + b"\r\n\r\n"), None,
     UnavailableError, "CONNECTION"),
    (lambda conn: conn.sendall(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"), None,
     UnavailableError, "CONNECTION"),
])
def test_async_broken_replies_are_errors(fake_server, no_proxy_env, reply, timeout, error, reason):
    srv = fake_server(reply)

    async def main():
        async with AsyncClient(srv.url, timeout=timeout) as c:
            start = time.monotonic()
            with pytest.raises(error) as info:
                await c.get("h-" + "0" * 32) if reply is stalls else await c.delete("h-" + "0" * 32)
            return info.value, time.monotonic() - start

    err, seconds = asyncio.run(main())
    assert err.reason == reason and seconds < 4


def test_async_stalled_reply_to_a_call_is_a_deadline(fake_server, no_proxy_env):
    srv = fake_server(stalls)

    async def main():
        async with AsyncClient(srv.url, timeout=0.5) as c:
            with pytest.raises(DeadlineExceededError) as info:
                await c.delete("h-" + "0" * 32)
        return info.value

    assert asyncio.run(main()).reason == "TIMEOUT"


def test_async_base_url_path_prefix_and_headers(fake_server, no_proxy_env):
    srv = fake_server(not_found)
    assert async_missing_handles(srv.url + "/sparse/", 1, token="t0k", timeout=7)[0] == ["UNKNOWN_HANDLE"]
    head = srv.heads[0].lower()
    assert head.startswith(f"delete /sparse/v1/tensors/h-{0:032d} http/1.1\r\n")
    port = srv.url.rsplit(":", 1)[1]
    for line in (f"host: 127.0.0.1:{port}", "authorization: bearer t0k", "accept: application/x-protobuf",
                 "x-request-timeout: 7.0"):
        assert f"\r\n{line}\r\n" in head


def test_async_header_injection_is_refused(fake_server, no_proxy_env):
    srv = fake_server(not_found_kept_alive, answers=10)

    async def main():
        async with AsyncClient(srv.url) as c:
            with pytest.raises(ValueError, match="[Ii]nvalid header"):
                await c.call("reorder", sp_input=None, request_id="a\r\nx-evil: 1")

    asyncio.run(main())
    assert srv.heads == []  # nothing was sent


def test_async_configured_proxy_is_used(fake_server, no_proxy_env):
    proxy = fake_server(not_found)
    no_proxy_env.setenv("HTTP_PROXY", proxy.url)
    target = "http://sparse.invalid:8000"
    reasons, c = async_missing_handles(target, 2)
    assert reasons == ["UNKNOWN_HANDLE"] * 2
    assert all(h.startswith(f"DELETE {target}/v1/tensors/h-") for h in proxy.heads)
    assert len(proxy.heads) == 2 and isinstance(c._transport._blocking._session, httpx.Client)


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_async_many_calls_in_flight_share_connections(server, no_proxy_env, encoding):
    """64 calls at once, big and small, each answered right; the connections they opened kept
    for later, up to the idle limit."""
    rng = np.random.default_rng(11)
    tensors = [big_coo(24 * int(n)) for n in rng.integers(1, 40_000, 64)]

    async def main():
        async with AsyncClient(server.http_url, encoding=encoding) as c:
            results = await asyncio.gather(*(c.call("reorder", sp_input=t) for t in tensors))
            return results, len(connections(c)._idle)

    results, idle = asyncio.run(main())
    assert 1 <= idle <= _http._MAX_IDLE
    for t, r in zip(tensors, results):
        order = np.lexsort(t.indices.T[::-1])
        np.testing.assert_array_equal(r.indices, t.indices[order])
        np.testing.assert_array_equal(r.values, t.values[order])


def test_async_cancelled_call_leaves_a_working_client(server, no_proxy_env):
    """A call cancelled while the server works on it (its thread finishes the exchange); the
    client's next calls are answered right."""
    tensor = big_coo(24 << 20)
    small = big_coo(2400)

    async def main():
        async with AsyncClient(server.http_url) as c:
            call = asyncio.ensure_future(c.call("reorder", sp_input=tensor))
            while not connections(c)._busy:  # the request is on its way; the server sorts a million entries
                await asyncio.sleep(0.001)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            h = await c.put(tensor)  # its body as pieces, not joined
            back = await c.get(h)
            again = await c.call("reorder", sp_input=small)
            await c.delete(h)
            return back, again

    back, again = asyncio.run(main())
    np.testing.assert_array_equal(back.values, tensor.values)
    order = np.lexsort(small.indices.T[::-1])
    np.testing.assert_array_equal(again.indices, small.indices[order])


def test_async_call_given_up_on_ends_when_the_client_closes(fake_server, no_proxy_env):
    """No timeout, a server that never answers, and a caller that stops waiting (wait_for):
    closing the client cuts the connection, so its thread does not wait on for ever."""
    never = threading.Event()
    srv = fake_server(lambda conn: never.wait(60))

    async def main():
        c = AsyncClient(srv.url)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(c.delete("h-" + "0" * 32), 0.3)
        await c.close()
        return c

    c = asyncio.run(main())
    start = time.monotonic()
    c._transport._workers.shutdown(wait=True)  # the thread is done
    assert time.monotonic() - start < 5
    never.set()


def test_async_client_used_again_under_a_new_loop(server, no_proxy_env):
    """A client kept across ``asyncio.run`` calls serves each of them."""
    small = big_coo(2400)
    c = AsyncClient(server.http_url)
    first = asyncio.run(c.call("reorder", sp_input=small))
    second = asyncio.run(c.call("reorder", sp_input=small))
    asyncio.run(c.close())
    np.testing.assert_array_equal(first.values, second.values)
