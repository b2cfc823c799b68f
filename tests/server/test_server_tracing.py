"""Tracing (docs/tracing.md): a SERVER span per request on both wires with its phases as
children, continuing the SDK caller's trace; exported over OTLP with --otlp-endpoint, and nothing
of OpenTelemetry's SDK loaded without it.

The span checks run a real server in this process (the gRPC server and uvicorn of
``sparseserve serve``, on a loop in a thread) whose spans go to OpenTelemetry's in-memory
exporter; the SDK reaches it over the network like any client, so its trace context travels on
the wire. Two ``sparseserve serve`` processes check the rest: one without the flag (which
modules it imported, with PYTHONPROFILEIMPORTTIME), one exporting to an OTLP receiver here.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc
import numpy as np
import pytest
import uvicorn
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from conftest import WIRES, ServerProcess, make_client
from sparseserve import AsyncClient, Client, SparseTensor
from sparseserve.errors import InvalidArgumentError
from sparseserve.server import tracing
from sparseserve.server.config import ServerConfig, config_from_args
from sparseserve.server.grpc_wire import create_grpc_server
from sparseserve.server.ops import REGISTRY
from sparseserve.server.rest_wire import create_app
from sparseserve.server.service import Service
from sparseserve.server.sizes import INLINE_BYTES

TOKEN = "s3cret"
PHASES = {"decode", "validation", "kernel", "encode"}
# The caller's spans: a provider of the test's own, as an application would have.
CALLER = TracerProvider().get_tracer("test_tracing")


class InProcessServer:
    """Both wires of ``sparseserve serve`` on a loop in a thread of this process."""

    def __init__(self, config: ServerConfig):
        self.service = Service(config, REGISTRY)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        grpc_port, http_port = self.run(self._start())
        self.grpc_target = f"127.0.0.1:{grpc_port}"
        self.http_url = f"http://127.0.0.1:{http_port}"

    def run(self, coroutine, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    async def _start(self) -> tuple[int, int]:
        self.grpc, grpc_port, _ = create_grpc_server(self.service)
        await self.grpc.start()
        self.http = uvicorn.Server(uvicorn.Config(create_app(self.service), host="127.0.0.1", port=0,
                                                  log_level="warning", lifespan="off", log_config=None))
        self.http_task = asyncio.ensure_future(self.http.serve())
        while not self.http.started:
            await asyncio.sleep(0.01)
        return grpc_port, self.http.servers[0].sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        self.http.should_exit = True
        await asyncio.gather(self.grpc.stop(0), self.http_task)

    def stop(self) -> None:
        self.run(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.service.close()


@pytest.fixture(scope="module")
def exporter():
    memory = InMemorySpanExporter()
    tracing.enable(SimpleSpanProcessor(memory))
    yield memory
    tracing.disable()


@pytest.fixture(scope="module")
def srv(exporter):
    # A token (so calls have a tenant), and batching of reorder and coalesce: a window long
    # enough for two calls from two threads to meet, cut short once two are in.
    server = InProcessServer(ServerConfig(grpc_port=0, http_port=0, token=[TOKEN], batch_window_ms=2000,
                                          max_batch=2))
    yield server
    server.stop()


def client_of(srv, wire: str) -> Client:
    if wire == "grpc":
        return Client(srv.grpc_target, token=TOKEN)
    return Client(srv.http_url, token=TOKEN, encoding="protobuf" if wire == "rest-protobuf" else "json")


def wait_for_spans(exporter, trace_id: int, count: int = 1, timeout: float = 5.0, op: str | None = None) -> list:
    """The finished spans of a trace, once ``count`` SERVER spans have ended (a REST reply can
    reach the client just before the server's span ends), ``op``'s among them when given (a
    client's first call may list the ops first, and that span can end before the op's)."""
    deadline = time.monotonic() + timeout
    while True:
        spans = [s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id]
        server = [s for s in spans if s.kind == SpanKind.SERVER]
        if len(server) >= count and (op is None or any(s.attributes.get("sparseserve.op") == op for s in server)):
            return spans
        if time.monotonic() > deadline:
            return spans
        time.sleep(0.01)


def only(spans, **match):
    found = [s for s in spans if all(getattr(s, k) == v for k, v in match.items())]
    assert len(found) == 1, (match, [(s.name, s.kind) for s in spans])
    return found[0]


def request_of(spans, op: str):
    """The SERVER span of the call to ``op`` (an op method's first call lists the ops too)."""
    found = [s for s in spans if s.kind == SpanKind.SERVER and s.attributes["sparseserve.op"] == op]
    assert len(found) == 1, (op, [(s.name, s.kind) for s in spans])
    return found[0]


def children(spans, parent) -> dict[str, object]:
    return {s.name: s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id}


def sample() -> SparseTensor:
    return SparseTensor(indices=[[1, 2], [0, 0], [1, 2]], values=[2.0, 1.0, 4.0], dense_shape=[3, 4])


# ------------------------------------------------------------------------------- request spans
@pytest.mark.parametrize("wire", WIRES)
def test_a_call_is_one_server_span_in_the_callers_trace_with_its_phases_nested(srv, exporter, wire):
    with client_of(srv, wire) as c, CALLER.start_as_current_span("caller") as caller:
        dense = c.to_dense(sample(), validate_indices=False)
    assert dense[1, 2] == 6.0
    spans = wait_for_spans(exporter, caller.get_span_context().trace_id, 2)
    request = request_of(spans, "to_dense")
    assert request.parent.span_id == caller.get_span_context().span_id  # traceparent crossed the wire
    assert request.parent.is_remote
    attributes = request.attributes
    assert attributes["sparseserve.op"] == "to_dense"
    assert attributes["sparseserve.tenant"] == "tenant-0"
    assert attributes["sparseserve.code"] == "OK"
    assert attributes["sparseserve.bytes_in"] > 0 and attributes["sparseserve.bytes_out"] > 0
    assert "error.type" not in attributes and request.status.status_code == StatusCode.UNSET
    if wire == "grpc":
        assert request.name == "sparseserve.v1.SparseService/Execute"
        assert attributes["rpc.system.name"] == attributes["rpc.system"] == "grpc"
        assert attributes["rpc.method"] == "sparseserve.v1.SparseService/Execute"
        assert attributes["rpc.grpc.status_code"] == 0
    else:
        assert request.name == "POST /v1/ops/to_dense"
        assert attributes["http.request.method"] == "POST"
        assert attributes["http.route"] == "/v1/ops/to_dense"
        assert attributes["http.response.status_code"] == 200
    assert request.resource.attributes["service.name"] == "sparseserve"
    phases = children(spans, request)
    assert set(phases) == PHASES
    assert phases["kernel"].attributes["sparseserve.op"] == "to_dense"
    for phase in phases.values():  # inside the request's time
        assert request.start_time <= phase.start_time <= phase.end_time <= request.end_time


@pytest.mark.parametrize("wire", WIRES)
def test_a_bad_argument_is_the_spans_outcome(srv, exporter, wire):
    bad = SparseTensor(indices=[[0, 0], [1, 7]], values=[1.0, 2.0], dense_shape=[3, 4])
    with client_of(srv, wire) as c, CALLER.start_as_current_span("caller") as caller:
        with pytest.raises(InvalidArgumentError) as raised:
            c.to_dense(bad)
    spans = wait_for_spans(exporter, caller.get_span_context().trace_id, 2)
    request = request_of(spans, "to_dense")
    attributes = request.attributes
    assert attributes["sparseserve.code"] == attributes["error.type"] == "INVALID_ARGUMENT"
    assert attributes["sparseserve.reason"] == raised.value.reason == "INDEX_OUT_OF_RANGE"
    assert attributes["sparseserve.request_id"] == raised.value.request_id
    if wire == "grpc":
        assert attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert attributes["rpc.response.status_code"] == "INVALID_ARGUMENT"
    else:
        assert attributes["http.response.status_code"] == 400
    # The caller's mistake, not the server's: no ERROR status (OpenTelemetry's server-span rule).
    assert request.status.status_code == StatusCode.UNSET
    failed = [s for s in spans if s.status.status_code == StatusCode.ERROR]
    assert failed and all(s.parent.span_id == request.context.span_id for s in failed)
    assert any(e.name == "exception" and "out of range" in e.attributes["exception.message"]
               for s in failed for e in s.events)


@pytest.mark.parametrize("wire", ["grpc", "rest-json"])
def test_an_async_callers_span_is_the_parent_too(srv, exporter, wire):
    """AsyncClient: over REST its calls run in worker threads, which must get the caller's context."""
    target = srv.grpc_target if wire == "grpc" else srv.http_url

    async def main():
        async with AsyncClient(target, token=TOKEN) as c:
            with CALLER.start_as_current_span("async caller") as caller:
                await c.call("to_dense", sample(), validate_indices=False)
        return caller.get_span_context()

    caller = asyncio.run(main())
    spans = wait_for_spans(exporter, caller.trace_id, op="to_dense")
    assert request_of(spans, "to_dense").parent.span_id == caller.span_id


@pytest.mark.parametrize("wire", WIRES)
def test_without_a_current_span_no_trace_context_is_sent(srv, exporter, wire):
    exporter.clear()  # the calls before have ended: this one's spans are all there will be
    with client_of(srv, wire) as c:
        c.to_dense(sample(), validate_indices=False)
    deadline = time.monotonic() + 5
    while not (mine := [s for s in exporter.get_finished_spans()
                        if s.kind == SpanKind.SERVER and s.attributes["sparseserve.op"] == "to_dense"]):
        assert time.monotonic() < deadline, "no server span"
        time.sleep(0.01)
    assert mine[0].parent is None  # a trace of its own: the server found no traceparent
    assert "sparseserve.request_id" not in mine[0].attributes  # only an error reply's id is recorded


@pytest.mark.parametrize("wire", ["grpc", "rest-json"])
def test_a_pipeline_has_a_span_per_step(srv, exporter, wire):
    with client_of(srv, wire) as c, CALLER.start_as_current_span("caller") as caller:
        p = c.pipeline()
        dense = p.to_dense(sample(), validate_indices=False, name="d")
        p.reduce_sum(p.from_dense(dense.output, name="s").output, axis=1, name="r")
        p.run()
    spans = wait_for_spans(exporter, caller.get_span_context().trace_id, 2)
    request = request_of(spans, "pipeline")
    steps = [s for s in spans if s.name == "pipeline step"]
    assert [s.attributes["sparseserve.step"] for s in sorted(steps, key=lambda s: s.start_time)] == ["d", "s", "r"]
    assert all(s.parent.span_id == request.context.span_id for s in steps)
    for step in steps:
        assert set(children(spans, step)) == {"validation", "kernel"}
    assert {"decode", "validation", "encode"} <= set(children(spans, request))  # validation: the plan


def test_a_call_waiting_for_a_worker_has_a_queue_wait_span(srv, exporter):
    service = srv.service
    big = SparseTensor(indices=np.zeros((INLINE_BYTES // 8, 2), np.int64), values=np.ones(INLINE_BYTES // 8),
                       dense_shape=[4, 4])  # past INLINE_BYTES: the call goes to the kernel pool
    for _ in range(service.concurrency):  # every slot busy
        srv.run(service._slots.acquire())
    try:
        with client_of(srv, "grpc") as c, CALLER.start_as_current_span("caller") as caller, \
                futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(contextvars.copy_context().run, c.to_dense, big, validate_indices=False)
            deadline = time.monotonic() + 10
            while service.queued == 0:
                assert time.monotonic() < deadline and not answer.done(), "the call never queued"
                time.sleep(0.005)
            time.sleep(0.05)  # a wait the span can show
            for _ in range(service.concurrency):
                srv.loop.call_soon_threadsafe(service._slots.release)
            assert answer.result(30)[0, 0] == len(big.values)
    finally:
        while service._slots.locked():  # a failed run leaves no slot taken
            srv.loop.call_soon_threadsafe(service._slots.release)
            time.sleep(0.01)
    spans = wait_for_spans(exporter, caller.get_span_context().trace_id, 2)
    request = request_of(spans, "to_dense")
    wait = children(spans, request)["queue wait"]
    assert wait.end_time - wait.start_time >= 40_000_000  # ns
    assert wait.attributes["sparseserve.queue.position"] == 1  # first in line


def test_a_merged_batch_is_a_span_linked_to_each_caller(srv, exporter):
    tensors = [SparseTensor(indices=[[1, 0], [0, i]], values=[1.0, 2.0], dense_shape=[2, 4]) for i in range(2)]
    def call(wire: str, tensor: SparseTensor) -> int:
        with client_of(srv, wire) as c, CALLER.start_as_current_span("caller") as caller:
            assert c.reorder(tensor).nnz == 2
        return caller.get_span_context().trace_id

    before = srv.service.batcher.merged_batches
    with futures.ThreadPoolExecutor(2) as pool:
        ids = list(pool.map(call, ["grpc", "rest-json"], tensors))
    assert srv.service.batcher.merged_batches == before + 1
    requests = []
    for trace_id in ids:
        spans = wait_for_spans(exporter, trace_id, 2)
        request = request_of(spans, "reorder")
        assert "batch wait" in children(spans, request)
        requests.append(request)
    batch = only(exporter.get_finished_spans(), name="batch", parent=None)
    assert batch.attributes["sparseserve.batch.calls"] == 2
    linked = {link.context.span_id for link in batch.links}
    assert linked == {r.context.span_id for r in requests}
    assert "kernel" in children(exporter.get_finished_spans(), batch)


# -------------------------------------------------------------------- the real server processes
class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC endpoint (opentelemetry-proto's service) that keeps what it is sent."""

    def __init__(self):
        self.spans: list = []
        self.resources: list = []
        self.server = grpc.server(futures.ThreadPoolExecutor(2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def Export(self, request, context):
        for resource_spans in request.resource_spans:
            self.resources.append({a.key: a.value.string_value for a in resource_spans.resource.attributes})
            self.spans.extend(s for scope in resource_spans.scope_spans for s in scope.spans)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture(scope="module")
def processes():
    """(without tracing, with --otlp-endpoint, receiver): both started at once, each noting
    every module it imports (PYTHONPROFILEIMPORTTIME writes them to its stderr)."""
    receiver = OtlpReceiver()
    env = {"PYTHONPROFILEIMPORTTIME": "1", "OTEL_BSP_SCHEDULE_DELAY": "50"}  # batches every 50 ms
    plain = ServerProcess(env=env, wait_ready=False)
    traced = ServerProcess("--otlp-endpoint", f"http://127.0.0.1:{receiver.port}", env=env, wait_ready=False)
    for server in (plain, traced):
        server.wait_for("ready", 120)
    yield plain, traced, receiver
    for server in (plain, traced):
        assert server.stop() == 0, server.log()
    receiver.server.stop(0)


def imported(server: ServerProcess, prefix: str) -> bool:
    """Whether the server imported a module ``prefix...`` ("import time: 98 | 98 |   name" lines)."""
    return re.search(rf"^import time:.*\|\s+{re.escape(prefix)}", server.stderr_path.read_text(errors="replace"),
                     flags=re.M) is not None


def test_a_server_without_an_endpoint_loads_no_tracing_and_the_sdk_loads_no_opentelemetry(processes):
    plain, traced, _ = processes
    code = ("import sys\nfrom sparseserve import Client, SparseTensor\n"
            "st = SparseTensor(indices=[[0, 0]], values=[1.0], dense_shape=[2, 2])\n"
            f"for target in ({plain.grpc_target!r}, {plain.http_url!r}):\n"
            "    with Client(target) as c:\n"
            "        assert c.to_dense(st)[0, 0] == 1.0\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n")
    sdk = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert sdk.returncode == 0, sdk.stderr
    assert sdk.stdout.strip() == "[]"  # the SDK never imports OpenTelemetry itself
    # Calls with a caller's span too: a traceparent arrives, and is ignored.
    with CALLER.start_as_current_span("caller"):
        for wire in WIRES:
            with make_client(plain, wire) as c:
                assert c.to_dense(sample(), validate_indices=False)[1, 2] == 6.0
    for prefix in ("opentelemetry.sdk", "opentelemetry.exporter"):
        assert not imported(plain, prefix), prefix
        assert imported(traced, prefix), prefix  # the check can fail: with the flag they are loaded


def test_otlp_export_reaches_a_receiver_with_the_callers_trace(processes):
    _, traced, receiver = processes
    callers = {}
    for wire in ("grpc", "rest-json"):
        with make_client(traced, wire) as c, CALLER.start_as_current_span(f"caller {wire}") as caller:
            c.to_dense(sample(), validate_indices=False)
        callers[wire] = caller.get_span_context()
    want = {"grpc": "sparseserve.v1.SparseService/Execute", "rest-json": "POST /v1/ops/to_dense"}
    deadline = time.monotonic() + 20
    while True:
        got = {wire: [s for s in receiver.spans if s.trace_id == callers[wire].trace_id.to_bytes(16, "big")]
               for wire in callers}
        names = {wire: {s.name for s in spans} for wire, spans in got.items()}
        if all(want[w] in names[w] and PHASES <= names[w] for w in want) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for wire, spans in got.items():
        assert want[wire] in names[wire] and PHASES <= names[wire], (wire, names[wire])
        request = next(s for s in spans if s.name == want[wire])
        assert request.parent_span_id == callers[wire].span_id.to_bytes(8, "big")
        assert request.kind == trace_pb2.Span.SPAN_KIND_SERVER
    assert {"sparseserve"} == {r["service.name"] for r in receiver.resources}


def test_the_endpoint_must_be_a_url(capsys):
    with pytest.raises(SystemExit):
        config_from_args(["--otlp-endpoint", "localhost:4317"])
    assert "--otlp-endpoint 'localhost:4317' must be a URL starting http://" in capsys.readouterr().err
    assert config_from_args(["--otlp-endpoint", "http://localhost:4317"]).otlp_endpoint == "http://localhost:4317"
