"""The handle store's disk tier against real servers (issue 26): with ``--spill-dir`` an evicted
handle stays valid and reads back byte for byte; without it, its next use is NOT_FOUND with
reason EVICTED, counted and logged; with ``--durable`` a server killed mid-put (SIGKILL) and
started again on the same directory serves every handle it acknowledged, exactly, to the same
tenant only, and nothing of the put it died in."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparseserve.core.tensor import HandleRef
from sparseserve.errors import NotFoundError, PermissionDeniedError, SparseServeError
from sparseserve.server.config import config_from_args

from conftest import ServerProcess, make_client
from helpers import assert_eq
from strategies import random_compressed, random_coo, random_values

KiB, MiB = 1 << 10, 1 << 20
EXACTLY = {"bitwise": True, "coalesced": True, "same_type": True}
TOKENS = {"alice": "alice-token", "bob": "bob-token"}


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("".join(f"{tenant} {token}\n" for tenant, token in TOKENS.items()))
    return str(path)


def tensors(seed: int) -> list:
    """About 1.9 MB in 12 tensors of every kind a file carries: dense (several dtypes, 0-d,
    empty), COO (hybrid, empty, coalesced), CSR with int32 indices, batched CSC, BSR."""
    rng = np.random.default_rng(seed)
    return [
        random_values(rng, (300, 200), "float64"),
        random_coo(rng, (3000, 2000), 8000, "float32"),
        random_compressed(rng, "csr", (2000, 1500), 9000, "float64", index_dtype="int32"),
        random_values(rng, (60, 50, 30), "int16"),
        random_coo(rng, (400, 300, 4), 6000, "complex64", sparse_ndim=2),
        random_values(rng, (), "complex128"),
        random_compressed(rng, "csc", (2, 800, 900), 5000, "uint8", batch_ndim=1),
        random_values(rng, (0, 9), "float32"),
        random_compressed(rng, "bsr", (600, 900), 2000, "float16", blocksize=(2, 3)),
        random_coo(rng, (50, 50), 0, "int64"),
        random_values(rng, (90000,), "bool"),
        random_coo(rng, (5000, 5000), 10000, "float64", coalesced=True, duplicates=False, sort=True),
    ]


def scrape(srv: ServerProcess) -> dict[tuple, float]:
    text = httpx.get(f"{srv.http_url}/metrics", timeout=30).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def log_lines(srv: ServerProcess, message: str) -> list[dict]:
    lines = [json.loads(line) for line in srv.stderr_path.read_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("message") == message]


def test_durable_needs_a_spill_dir(capsys, monkeypatch):
    for argv, env in ((["--durable"], {}), ([], {"SPARSESERVE_DURABLE": "1"})):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        with pytest.raises(SystemExit) as info:
            config_from_args(argv)
        assert info.value.code == 2
        error = capsys.readouterr().err
        assert "--durable" in error and "--spill-dir" in error, error
    monkeypatch.delenv("SPARSESERVE_DURABLE")
    config = config_from_args(["--durable", "--spill-dir", "/somewhere", "--spill-bytes", "1000"])
    assert (config.durable, config.spill_dir, config.spill_bytes) == (True, "/somewhere", 1000)


def test_past_the_budget_every_handle_reads_back_exactly(tmp_path, token_file):
    srv = ServerProcess("--store-bytes", str(MiB), "--spill-dir", str(tmp_path / "spill"),
                        "--token-file", token_file)
    try:
        wanted = tensors(seed=1)
        assert sum(t.nbytes for t in wanted) > MiB * 3 // 2
        with make_client(srv, "grpc", token=TOKENS["alice"]) as grpc, \
                make_client(srv, "rest-protobuf", token=TOKENS["alice"]) as rest:
            handles = [(grpc if i % 2 else rest).put(t) for i, t in enumerate(wanted)]
            metrics = scrape(srv)
            in_memory = metrics[("sparseserve_store_handles", ())]
            assert metrics[("sparseserve_store_bytes", ())] <= MiB
            assert metrics[("sparseserve_store_spilled_total", ())] + in_memory == len(wanted)
            assert metrics[("sparseserve_spill_handles", ())] + in_memory == len(wanted)
            for client in (grpc, rest):
                for h, t in zip(handles, wanted):
                    assert_eq(client.get(h.handle), t, **EXACTLY)
            # An op reads a spilled handle (the first ones put are on disk by now).
            assert_eq(grpc.to_dense(handles[1], validate_indices=False), wanted[1].to_dense(), exact=True)
        with make_client(srv, "grpc", token=TOKENS["bob"]) as bob, pytest.raises(PermissionDeniedError):
            bob.get(handles[0].handle)
        metrics = scrape(srv)
        assert metrics[("sparseserve_store_dropped_total", (("reason", "evicted"),))] == 0
        assert metrics[("sparseserve_spill_bytes", ())] > MiB // 2
        assert log_lines(srv, "handle spilled") == []  # INFO, and the server logs at warning
    finally:
        assert srv.stop() == 0, srv.log()
    assert not list((tmp_path / "spill" / "v1").glob("h-*")), "not durable: the files go with the server"


def test_without_a_spill_dir_an_evicted_handle_says_so(token_file):
    srv = ServerProcess("--store-bytes", str(256 * KiB), "--token-file", token_file)
    try:
        tensor = np.arange(100 * KiB // 8, dtype=np.float64)
        with make_client(srv, "grpc", token=TOKENS["alice"]) as alice, \
                make_client(srv, "rest-json", token=TOKENS["bob"]) as bob:
            handles = [alice.put(tensor) for _ in range(4)]  # two fit: the first two are evicted
            for wire in ("grpc", "rest-protobuf", "rest-json"):
                with make_client(srv, wire, token=TOKENS["alice"]) as c:
                    for h in handles[:2]:
                        with pytest.raises(NotFoundError) as info:
                            c.get(h.handle)
                        assert info.value.reason == "EVICTED", info.value
                        assert "was evicted" in info.value.message and "--store-bytes" in info.value.message
                    assert_eq(c.get(handles[3].handle), tensor, exact=True)
            with pytest.raises(NotFoundError) as info:  # not bob's handle: he is told nothing of it
                bob.get(handles[0].handle)
            assert info.value.reason == "UNKNOWN_HANDLE"
        metrics = scrape(srv)
        assert metrics[("sparseserve_store_dropped_total", (("reason", "evicted"),))] == 2
        assert metrics[("sparseserve_store_spilled_total", ())] == 0
        lines = log_lines(srv, "handle evicted")
        assert [(line["handle"], line["tenant"], line["level"]) for line in lines] == \
            [(h.handle, "alice", "WARNING") for h in handles[:2]]
    finally:
        assert srv.stop() == 0, srv.log()


def test_a_server_killed_mid_put_serves_every_acknowledged_handle_after_a_restart(tmp_path, token_file):
    spill = tmp_path / "spill"
    flags = ("--spill-dir", str(spill), "--durable", "--store-bytes", str(256 * MiB), "--spill-bytes",
             str(1 << 30), "--token-file", token_file)
    acknowledged = []  # (handle, tenant, tensor)
    srv = ServerProcess(*flags)
    try:
        for i, t in enumerate(tensors(seed=2)):
            tenant = "bob" if i % 3 == 0 else "alice"
            with make_client(srv, "grpc" if i % 2 else "rest-protobuf", token=TOKENS[tenant]) as c:
                acknowledged.append((c.put(t).handle, tenant, t))
        big = np.arange(24_000_000, dtype=np.float64)  # 192 MB: its file takes a while to write
        failed: list[BaseException] = []

        def put_big():
            try:
                with make_client(srv, "grpc", token=TOKENS["alice"], timeout=60) as c:
                    c.put(big)
            except SparseServeError as exc:  # the connection dies with the server
                failed.append(exc)

        putter = threading.Thread(target=put_big)
        putter.start()
        deadline = time.monotonic() + 60
        while not any(p.stat().st_size > 0 for p in (spill / "v1").glob(".tmp-*")):
            assert time.monotonic() < deadline and putter.is_alive(), "the big put's file never showed"
            time.sleep(0.001)
    finally:
        srv.stop(signal.SIGKILL)
    putter.join(60)
    assert srv.proc.returncode == -signal.SIGKILL and failed, "killed before the big put was answered"
    assert list((spill / "v1").glob(".tmp-*")), "the torn write is there to be cleaned up"

    srv = ServerProcess(*flags)
    try:
        assert not list((spill / "v1").glob(".tmp-*"))
        metrics = scrape(srv)
        assert metrics[("sparseserve_spill_handles", ())] == len(acknowledged), "the interrupted put is absent"
        assert metrics[("sparseserve_store_handles", ())] == 0, "restored handles wait on disk"
        for wire in ("grpc", "rest-protobuf"):
            for handle, tenant, t in acknowledged:
                with make_client(srv, wire, token=TOKENS[tenant]) as owner, \
                        make_client(srv, wire, token=TOKENS["bob" if tenant == "alice" else "alice"]) as other:
                    assert_eq(owner.get(handle), t, **EXACTLY)
                    with pytest.raises(PermissionDeniedError) as info:
                        other.get(handle)
                    assert info.value.reason == "OTHER_TENANT"
        handle, tenant, t = acknowledged[1]
        with make_client(srv, "grpc", token=TOKENS[tenant]) as c:
            assert_eq(c.to_dense(HandleRef(handle), validate_indices=False), t.to_dense(), exact=True)
            c.delete(handle)
        assert not (spill / "v1" / f"{handle}.tensor").exists()
    finally:
        assert srv.stop() == 0, srv.log()
