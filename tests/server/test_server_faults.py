"""Faults (issue 26): what a server, its clients and its disk do when a process dies, a peer stops
answering, or the disk fills up, against real servers. Each fault gives a clear error (or the
documented EVICTED), corrupts nothing, and a server that survives it keeps serving; the bounds
are short flags (--keepalive-seconds, --header-timeout, --body-timeout), so the file takes
seconds.

- a server killed with SIGKILL in the middle of calls on both wires (slow ops running and
  queued, uploads streaming): every SDK client, blocking and async, gets UNAVAILABLE at once,
  not at its timeout, and a restarted durable server serves every handle it acknowledged;
- a client killed mid-upload, over gRPC and REST: the server stores nothing and the upload's
  buffer goes back to the pool;
- a gRPC client that stops answering mid-upload (SIGSTOP: its TCP connection stays open) is
  dropped by the keepalive; well-behaved clients, a long call's or ones pinging themselves, are not;
- a REST head that never completes is cut at --header-timeout; a body or a gRPC stream that goes
  silent is DEADLINE_EXCEEDED (BODY_TIMEOUT) at --body-timeout, its buffer back;
- a full disk under --spill-dir (a small tmpfs): evictions that cannot be written are EVICTED,
  durable puts are RESOURCE_EXHAUSTED (DISK_FULL), every handle that answers is exact, and
  deletes make room again.

Covered elsewhere, not repeated: a durable server killed while a put's file is half written
(``test_server_spill.py::test_a_server_killed_mid_put_serves_every_acknowledged_handle_after_a_restart``)
and a Dask worker killed mid-op (``test_server_distributed.py::
test_a_worker_killed_mid_request_gives_the_answer_or_a_clear_error``: the answer or
UNAVAILABLE with WORKER_LOST or CLUSTER_UNAVAILABLE, and the service goes on serving).
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparseserve import AsyncClient
from sparseserve.core.frames import execute_request_bytes, outputs_from_bytes
from sparseserve.core.tensor import HandleRef
from sparseserve.errors import NotFoundError, ResourceExhaustedError, UnavailableError
from sparseserve.server.config import config_from_args
from sparseserve.server.spill import SpillDir

from conftest import ROOT, ServerProcess, make_client
from helpers import assert_eq, eventually
from strategies import random_coo

MiB = 1 << 20
EXACTLY = {"bitwise": True, "same_type": True}
# The short bounds of the module's server: a silent gRPC peer is dropped within about twice the
# keepalive, a REST head must come within HEAD, each part of a body within BODY.
KEEPALIVE, HEAD, BODY = 0.5, 1.0, 2.0
SLACK = 1.5  # seconds a bound may be overrun on a loaded machine


def scrape(srv: ServerProcess) -> dict[tuple, float]:
    text = httpx.get(f"{srv.http_url}/metrics", timeout=30).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def requests(srv: ServerProcess, wire: str, op: str, code: str) -> float:
    return scrape(srv).get(("sparseserve_requests_total", (("code", code), ("op", op), ("wire", wire))), 0.0)


def takes(metrics: dict) -> float:
    return sum(metrics.get(("sparseserve_buffer_pool_takes_total", (("outcome", o),)), 0.0)
               for o in ("reused", "allocated"))


def reused(srv: ServerProcess) -> float:
    return scrape(srv)[("sparseserve_buffer_pool_takes_total", (("outcome", "reused"),))]


def stored(srv: ServerProcess) -> tuple[float, float]:
    metrics = scrape(srv)
    return metrics[("sparseserve_store_handles", ())], metrics[("sparseserve_store_bytes", ())]


def closed_within(sock: socket.socket, timeout: float) -> bool:
    """Whether the server closes ``sock`` within ``timeout`` (a reply, if any, read and dropped)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def healthz(sock: socket.socket) -> bytes:
    """GET /healthz on a kept-alive connection: the whole response."""
    sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
    sock.settimeout(5)
    response = b""
    while not response.endswith(b"}"):
        part = sock.recv(65536)
        assert part, f"closed: {response!r}"
        response += part
    return response


# A client process that streams a put and stops partway, as the SDK frames it: gRPC Upload
# chunks, or a REST protobuf body of its declared Content-Length. It says "mid" once the first
# megabytes have gone, then waits to be killed or stopped.
UPLOADER = r"""
import socket, sys, time
import numpy as np
wire, target, nbytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
tensor = np.ones(nbytes // 8)
if wire == "grpc":
    import grpc
    from sparseserve.core.codec import iter_chunks
    upload = grpc.insecure_channel(target).stream_unary("/sparseserve.v1.SparseService/Upload")
    def frames():
        for i, frame in enumerate(iter_chunks(tensor, 1 << 20)):
            if i == 3:
                print("mid", flush=True)
                time.sleep(3600)
            yield frame
    upload(frames())
else:
    from sparseserve._wire import rest_put
    request = rest_put(tensor, "protobuf", streamed=True)
    head = "".join(f"{k}: {v}\r\n" for k, v in request["headers"].items())
    sock = socket.create_connection(target.split(":"))
    sock.sendall(f"POST /v1/tensors HTTP/1.1\r\nhost: {target}\r\n{head}\r\n".encode())
    sock.sendall(request["content"][0])
    print("mid", flush=True)
    time.sleep(3600)
"""


class Uploader:
    """``UPLOADER`` in a child process, once the server has taken the buffer of its upload."""

    def __init__(self, srv: ServerProcess, wire: str, nbytes: int):
        before = takes(scrape(srv))
        target = srv.grpc_target if wire == "grpc" else f"127.0.0.1:{srv.http_port}"
        self.proc = subprocess.Popen([sys.executable, "-c", UPLOADER, wire, target, str(nbytes)],
                                     stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert self.proc.stdout.readline() == "mid\n"
        eventually(lambda: takes(scrape(srv)) > before, 10, "the server taking the upload's buffer")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def edge():
    """A server with the short bounds, for the clients' faults; with a channel that pings it
    about as often as the server pings its clients, for as long as the module runs."""
    srv = ServerProcess("--keepalive-seconds", str(KEEPALIVE), "--header-timeout", str(HEAD),
                        "--body-timeout", str(BODY))
    srv.pinging = Pinging(srv)
    yield srv
    srv.pinging.channel.close()
    assert srv.stop() == 0, srv.log()


class Pinging:
    """A gRPC channel with a keepalive as short as the server's, pinging it with or without calls
    in flight. gRPC's server default allows a ping every 5 minutes, and answers the third ping
    sooner with GOAWAY "too_many_pings", which drops the connection and fails its calls."""

    def __init__(self, srv: ServerProcess):
        self.channel = grpc.insecure_channel(srv.grpc_target, options=[
            ("grpc.keepalive_time_ms", int(KEEPALIVE * 1000)), ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0)])
        self.states: list[grpc.ChannelConnectivity] = []
        self.channel.subscribe(self.states.append, try_to_connect=True)
        self.since = time.monotonic()


def assert_buffer_back(srv: ServerProcess, nbytes: int) -> None:
    """The buffer a dropped upload of an ``nbytes`` float64 tensor took is back in the pool: the
    same upload now reuses it (each fault's size is its own, so no other block fits)."""
    before = reused(srv)
    with make_client(srv, "grpc") as c:
        handle = c.put(np.ones(nbytes // 8))
        c.delete(handle)
    assert reused(srv) == before + 1, "the upload's buffer did not come back to the pool"


def assert_serves(srv: ServerProcess) -> None:
    t = np.arange(1000.0)
    for wire in ("grpc", "rest-json"):
        with make_client(srv, wire, timeout=10) as c:
            handle = c.put(t)
            assert_eq(c.get(handle), t, exact=True)
            c.delete(handle)


# ------------------------------------------------------------------ the server dies
SLOW = random_coo(np.random.default_rng(7), (40_000, 40_000), 400_000, "float64")  # SpGEMM: 1.5 s a call here


def test_a_server_killed_mid_call_fails_every_client_at_once_and_a_restart_serves_what_it_acknowledged(tmp_path):
    flags = ("--spill-dir", str(tmp_path / "spill"), "--durable")
    srv = ServerProcess(*flags)
    acknowledged = []
    outcomes: dict[str, tuple[BaseException | object, float]] = {}
    calls: list[threading.Thread] = []
    try:
        rng = np.random.default_rng(1)
        for i, wire in enumerate(("grpc", "rest-protobuf", "rest-json")):
            t = random_coo(rng, (300, 200), 500 + i, "float32")
            with make_client(srv, wire) as c:
                acknowledged.append((c.put(t).handle, t))
        with make_client(srv, "grpc") as c:
            slow = c.put(SLOW)
        acknowledged.append((slow.handle, SLOW))

        def record(name, call):
            try:
                result: BaseException | object = call()
            except BaseException as exc:  # what the SDK raised, whatever it is, is the point
                result = exc
            outcomes[name] = (result, time.monotonic())

        def blocking(wire):
            with make_client(srv, wire, timeout=60) as c:
                return c.matmul(slow, slow, keep=True)

        def awaited(target):
            async def call():
                async with AsyncClient(target, timeout=60) as c:
                    return await c.matmul(slow, slow, keep=True)
            return asyncio.run(call())

        for name, call in (("grpc", lambda: blocking("grpc")), ("rest-protobuf", lambda: blocking("rest-protobuf")),
                           ("rest-json", lambda: blocking("rest-json")),
                           ("async grpc", lambda: awaited(srv.grpc_target)),
                           ("async rest", lambda: awaited(srv.http_url))):
            calls.append(threading.Thread(target=record, args=(name, call)))

        def putting(wire):
            with make_client(srv, wire, timeout=60) as c:
                return c.put(np.ones(16 * MiB))

        for wire in ("grpc", "rest-protobuf"):  # uploads streaming when the server dies
            calls.append(threading.Thread(target=record, args=(f"put {wire}", lambda w=wire: putting(w))))
        before = takes(scrape(srv))
        for call in calls[:5]:
            call.start()
        busy = ("sparseserve_in_flight_requests", ()), ("sparseserve_queue_depth", ())
        eventually(lambda: sum(scrape(srv)[k] for k in busy) == 5, 20, "five slow calls in the server", 0.01)
        for call in calls[5:]:
            call.start()
        eventually(lambda: takes(scrape(srv)) >= before + 2, 20, "both uploads streaming", 0.005)
        assert not outcomes, f"answered before the kill: {outcomes}"
        killed = time.monotonic()
    finally:
        srv.stop(signal.SIGKILL)
    for call in calls:
        call.join(30)
    assert srv.proc.returncode == -signal.SIGKILL
    assert sorted(outcomes) == sorted(["grpc", "rest-protobuf", "rest-json", "async grpc", "async rest",
                                       "put grpc", "put rest-protobuf"])
    for name, (result, when) in outcomes.items():
        assert isinstance(result, UnavailableError), f"{name}: {result!r}"
        # Both wires say CONNECTION (gRPC's status comes with no reason of ours: the SDK gives its
        # UNAVAILABLE that reason; the message is gRPC's, "Stream removed (Socket closed)").
        assert result.reason == "CONNECTION" and result.message, result
        assert when - killed < 2, f"{name}: told {when - killed:.1f} s after the kill"  # here: 30 ms

    srv = ServerProcess(*flags)
    try:
        assert not list((tmp_path / "spill" / "v1").glob(".tmp-*"))
        assert scrape(srv)[("sparseserve_spill_handles", ())] == len(acknowledged), "only what was acknowledged"
        for wire in ("grpc", "rest-protobuf"):
            with make_client(srv, wire) as c:
                for handle, t in acknowledged:
                    assert_eq(c.get(handle), t, **EXACTLY)
        assert_serves(srv)
    finally:
        assert srv.stop() == 0, srv.log()


# ------------------------------------------------------------------ a client dies or goes silent
@pytest.mark.parametrize("wire, nbytes", [("grpc", 24 * MiB), ("rest", 28 * MiB)])
def test_a_client_killed_mid_upload_leaves_nothing_held(edge, wire, nbytes):
    held = stored(edge)
    uploader = Uploader(edge, wire, nbytes)
    op, was = ("Upload", "grpc") if wire == "grpc" else ("put", "rest")
    ended = requests(edge, was, op, "CANCELLED")
    try:
        uploader.signal(signal.SIGKILL)
        eventually(lambda: requests(edge, was, op, "CANCELLED") == ended + 1, 5, "the upload dropped")
    finally:
        uploader.close()
    assert stored(edge) == held
    assert_buffer_back(edge, nbytes)
    assert_serves(edge)


def test_a_grpc_client_that_stops_answering_is_dropped_by_the_keepalive(edge):
    nbytes = 33 * MiB
    held = stored(edge)
    uploader = Uploader(edge, "grpc", nbytes)
    dropped = requests(edge, "grpc", "Upload", "CANCELLED")
    try:
        uploader.signal(signal.SIGSTOP)  # its TCP connection stays open; its pings go unanswered
        stopped = time.monotonic()
        assert_serves(edge)  # meanwhile
        eventually(lambda: requests(edge, "grpc", "Upload", "CANCELLED") == dropped + 1, 2 * KEEPALIVE + SLACK,
                   "the stopped client dropped", 0.01)
        assert time.monotonic() - stopped < BODY, "the keepalive, not the body timeout, dropped it"
    finally:
        uploader.close()
    assert stored(edge) == held
    assert_buffer_back(edge, nbytes)


def test_a_body_or_stream_that_goes_silent_is_cut_at_the_body_timeout(edge):
    rest_bytes, grpc_bytes = 38 * MiB, 44 * MiB
    held = stored(edge)
    resume = threading.Event()
    answers: dict[str, tuple[BaseException | None, float]] = {}

    def stalled_grpc_upload():  # alive, answering pings, sending nothing more
        from sparseserve.core.codec import iter_chunks

        def frames():
            for i, frame in enumerate(iter_chunks(np.ones(grpc_bytes // 8), 1 << 20)):
                if i == 3:
                    resume.wait(30)
                yield frame
        channel = grpc.insecure_channel(edge.grpc_target)
        try:
            channel.stream_unary("/sparseserve.v1.SparseService/Upload")(frames(), timeout=60)
            answers["grpc"] = (None, time.monotonic())
        except grpc.RpcError as exc:
            answers["grpc"] = (exc, time.monotonic())
        channel.close()

    before = scrape(edge)
    sock = socket.create_connection(("127.0.0.1", edge.http_port))
    sock.sendall(b"POST /v1/tensors HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-protobuf\r\n"
                 b"content-length: %d\r\n\r\n" % rest_bytes + bytes(MiB))
    started = time.monotonic()
    thread = threading.Thread(target=stalled_grpc_upload)
    thread.start()
    try:
        eventually(lambda: takes(scrape(edge)) == takes(before) + 2, 10, "both buffers taken")
        assert_serves(edge)  # meanwhile
        sock.settimeout(BODY + SLACK)
        reply = b""
        while not reply.endswith(b"}}"):
            part = sock.recv(65536)
            assert part, f"closed without an answer: {reply!r}"
            reply += part
        waited = time.monotonic() - started
        assert BODY - 0.1 < waited < BODY + SLACK, waited
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 504 ") and b"connection: close" in head.lower(), head
        error = httpx.Response(504, content=body).json()["error"]
        assert (error["code"], error["reason"]) == ("DEADLINE_EXCEEDED", "BODY_TIMEOUT"), error
        assert "--body-timeout" in error["message"]
        assert closed_within(sock, 1), "the connection stays open"
        eventually(lambda: "grpc" in answers, BODY + SLACK, "the gRPC stream's answer")
    finally:
        resume.set()
        thread.join(30)
        sock.close()
    exc, when = answers["grpc"]
    assert isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED, exc
    assert dict(exc.trailing_metadata())["sparseserve-reason"] == "BODY_TIMEOUT"
    assert when - started < BODY + SLACK
    assert stored(edge) == held
    assert_buffer_back(edge, grpc_bytes)
    assert_buffer_back(edge, rest_bytes)


def test_a_rest_head_that_does_not_arrive_is_cut_at_the_header_timeout(edge):
    silent = socket.create_connection(("127.0.0.1", edge.http_port))
    trickled = socket.create_connection(("127.0.0.1", edge.http_port))
    kept = socket.create_connection(("127.0.0.1", edge.http_port))
    opened = time.monotonic()
    try:
        assert healthz(kept).startswith(b"HTTP/1.1 200 ")
        head = b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-padding: " + b"a" * 100
        sent = 0
        while not closed_within(trickled, 0.05):  # a byte every 50 ms: the head never done
            assert time.monotonic() - opened < HEAD + SLACK, f"{sent} bytes of a head trickled, still open"
            trickled.send(head[sent:sent + 1])
            sent += 1
        waited = time.monotonic() - opened
        assert HEAD - 0.1 < waited < HEAD + SLACK, waited
        assert closed_within(silent, 0.1), "a connection that sent nothing is still open"
        assert_serves(edge)
        # Between requests on a kept-alive connection the head timer does not run: the next
        # request after an idle pause longer than it (shorter than uvicorn's keep-alive) is answered.
        time.sleep(max(0.0, opened + HEAD + 0.5 - time.monotonic()))
        assert healthz(kept).startswith(b"HTTP/1.1 200 ")
    finally:
        for sock in (silent, trickled, kept):
            sock.close()


def test_well_behaved_grpc_clients_keep_their_connections(edge):
    """A call that runs for several keepalive periods with nothing sent either way is answered;
    a client that has pinged the server every second or so since the module began (gRPC's own
    client throttles it to that) still has its first connection, and calls on it."""
    with make_client(edge, "grpc", timeout=60) as c:
        slow = c.put(SLOW)
        started = time.monotonic()
        kept = c.matmul(slow, slow, keep=True)  # the SDK's channel: no pings of its own, and acks the server's
        assert time.monotonic() - started > 2 * KEEPALIVE
        pinging = edge.pinging
        time.sleep(max(0.0, pinging.since + 6 - time.monotonic()))  # pings enough for a GOAWAY
        execute = pinging.channel.unary_unary("/sparseserve.v1.SparseService/Execute")
        request = execute_request_bytes("transpose", {"sp_input": HandleRef(kept.handle)}, True)
        (_, transposed), = outputs_from_bytes(execute(request, timeout=60))
        ready = pinging.states.index(grpc.ChannelConnectivity.READY)
        assert pinging.states[ready:] == [grpc.ChannelConnectivity.READY], f"dropped: {pinging.states}"
        for handle in (slow, kept, transposed):
            c.delete(handle)


# ------------------------------------------------------------------ the disk fills up
@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs as the spill directory (mounted and unmounted here)."""
    path = tmp_path / "small"
    path.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(path)],
                                 capture_output=True, text=True, timeout=30)
        why = mounted.stderr.strip() if mounted.returncode else ""
    except OSError as exc:  # no mount(8)
        why = str(exc)
    if why:
        pytest.skip(f"cannot mount a tmpfs to fill (it needs root or CAP_SYS_ADMIN): {why}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def tensors(count: int, first: int = 0) -> list[np.ndarray]:
    return [np.full(64 * 1024, first + i, np.float64) for i in range(count)]  # 512 KiB each


def files_as_counted(srv: ServerProcess, disk) -> None:
    """The disk tier's gauges are the files really there, and no write left a temporary file."""
    files = list((disk / "v1").glob("h-*.tensor"))
    metrics = scrape(srv)
    assert metrics[("sparseserve_spill_handles", ())] == len(files)
    assert metrics[("sparseserve_spill_bytes", ())] == sum(f.stat().st_size for f in files)
    assert not list((disk / "v1").glob(".tmp-*"))


def test_evictions_onto_a_full_disk_are_evicted_never_damaged(small_disk):
    srv = ServerProcess("--spill-dir", str(small_disk), "--store-bytes", str(MiB))
    try:
        wanted = tensors(16)  # 8 MiB through a 1 MiB store onto 4 MiB of disk
        with make_client(srv, "grpc") as grpc_client, make_client(srv, "rest-protobuf") as rest:
            handles = [(grpc_client if i % 2 else rest).put(t) for i, t in enumerate(wanted)]
            on_disk, evicted = [], []
            for h, t in zip(handles, wanted):
                try:
                    assert_eq(rest.get(h), t, **EXACTLY)
                    on_disk.append((h, t))
                except NotFoundError as err:
                    assert err.reason == "EVICTED" and "the disk is full" in err.message, err
                    evicted.append(h)
            assert len(evicted) >= 4 and len(on_disk) >= 6, (len(evicted), len(on_disk))
            metrics = scrape(srv)
            assert metrics[("sparseserve_store_dropped_total", (("reason", "evicted"),))] == len(evicted)
            files_as_counted(srv, small_disk)
            for h, _ in on_disk[:-2]:  # room again
                grpc_client.delete(h)
            more = tensors(6, first=100)
            for t, h in [(t, grpc_client.put(t)) for t in more]:
                assert_eq(grpc_client.get(h), t, **EXACTLY)
            for h, t in on_disk[-2:]:
                assert_eq(rest.get(h), t, **EXACTLY)
            assert scrape(srv)[("sparseserve_store_dropped_total", (("reason", "evicted"),))] == len(evicted)
            files_as_counted(srv, small_disk)
        assert_serves(srv)
    finally:
        assert srv.stop() == 0, srv.log()


def test_durable_puts_onto_a_full_disk_are_refused_with_disk_full(small_disk):
    srv = ServerProcess("--spill-dir", str(small_disk), "--durable", "--store-bytes", str(MiB))
    try:
        with make_client(srv, "grpc") as grpc_client, make_client(srv, "rest-json") as rest:
            acknowledged, refused = [], 0
            for i, t in enumerate(tensors(12)):
                try:
                    acknowledged.append(((grpc_client if i % 2 else rest).put(t), t))
                except ResourceExhaustedError as err:
                    assert err.reason == "DISK_FULL" and "--spill-dir" in err.message, err
                    refused += 1
            assert refused >= 3 and len(acknowledged) >= 5, (refused, len(acknowledged))
            with pytest.raises(ResourceExhaustedError) as info:  # a kept result is written through too
                grpc_client.to_dense(SMALL, keep=True)
            assert info.value.reason == "DISK_FULL"
            reply = httpx.post(f"{srv.http_url}/v1/tensors", json=[1.0] * 70_000, timeout=30)
            assert reply.status_code == 507 and reply.json()["error"]["reason"] == "DISK_FULL", reply.text
            for handle, t in acknowledged:
                assert_eq(rest.get(handle), t, **EXACTLY)
            files_as_counted(srv, small_disk)
            for handle, _ in acknowledged[:3]:  # room again
                grpc_client.delete(handle)
            again = tensors(2, first=50)
            for t, h in [(t, grpc_client.put(t)) for t in again]:
                assert_eq(grpc_client.get(h), t, **EXACTLY)
            files_as_counted(srv, small_disk)
        assert_serves(srv)
    finally:
        assert srv.stop() == 0, srv.log()


SMALL = random_coo(np.random.default_rng(3), (300, 300), 100, "float64", duplicates=False, sort=True)  # 720 kB dense


# ------------------------------------------------------------------ in process
def test_a_disk_failure_is_an_error_of_the_model_and_leaves_no_file(tmp_path, monkeypatch):
    from sparseserve.server import spill

    directory = SpillDir(str(tmp_path), 1 << 30, durable=True)
    try:
        for code, error, reason, status in ((errno.ENOSPC, ResourceExhaustedError, "DISK_FULL", 507),
                                            (errno.EDQUOT, ResourceExhaustedError, "DISK_FULL", 507),
                                            (errno.EIO, UnavailableError, "DISK_ERROR", 503)):
            def failing(fd, data, offset=None, code=code):
                raise OSError(code, os.strerror(code))
            monkeypatch.setattr(spill, "_write_all", failing)
            with pytest.raises(error) as info:
                directory.write("h-" + "0" * 32, "alice", np.ones(10), durable=True)
            assert (info.value.reason, info.value.http_status) == (reason, status)
            assert os.strerror(code) in info.value.message and str(tmp_path) not in info.value.message
            assert os.listdir(directory.path) == ["lock"]
    finally:
        directory.close()


def test_the_timeout_flags(capsys):
    config = config_from_args([])
    assert (config.keepalive_seconds, config.header_timeout, config.body_timeout) == (20.0, 20.0, 30.0)
    for flag in ("--keepalive-seconds", "--header-timeout", "--body-timeout"):
        for value in ("0", "-1", "nan", "inf"):
            with pytest.raises(SystemExit):
                config_from_args([flag, value])
            assert flag in capsys.readouterr().err
    from sparseserve.server.grpc_wire import keepalive_options

    assert dict(keepalive_options(20)) == {
        "grpc.keepalive_time_ms": 20000, "grpc.keepalive_timeout_ms": 20000, "grpc.http2.ping_timeout_ms": 20000,
        "grpc.keepalive_permit_without_calls": 1, "grpc.http2.max_pings_without_data": 0,
        "grpc.http2.min_ping_interval_without_data_ms": 5000}
    assert dict(keepalive_options(0.5))["grpc.http2.min_ping_interval_without_data_ms"] == 250
