"""The handle store: byte budget with LRU eviction, TTL, tenants, unguessable ids; evicted and
expired handles told so; the disk tier (spilled, mapped back, checked, durable across a restart)."""

from __future__ import annotations

import numpy as np
import pytest

from sparseserve.core.tensor import SparseTensor
from sparseserve.errors import NotFoundError, PermissionDeniedError, ResourceExhaustedError
from sparseserve.server import store as store_module
from sparseserve.server.spill import Abandoned, SpillDir, SpillDirError, Staging, file_bytes
from sparseserve.server.store import HandleStore

from helpers import assert_eq
from strategies import random_coo, random_compressed, random_values


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def kb(n):
    return np.zeros(n * 128)  # n KiB of float64


def test_put_get_delete():
    store = HandleStore(1 << 20, 60)
    h, nbytes = store.put(kb(1))
    assert nbytes == 1024 and store.stats() == (1, 1024)
    assert store.get(h).shape == (128,)
    store.delete(h)
    with pytest.raises(NotFoundError):
        store.get(h)
    assert store.stats() == (0, 0)


def test_least_recently_used_goes_first():
    store = HandleStore(3 * 1024, 60)
    a, _ = store.put(kb(1))
    b, _ = store.put(kb(1))
    c, _ = store.put(kb(1))
    store.get(a)  # a is now the most recently used; b is the oldest
    d, _ = store.put(kb(1))
    with pytest.raises(NotFoundError):
        store.get(b)
    for h in (a, c, d):
        store.get(h)
    assert store.evictions == 1 and store.stats() == (3, 3 * 1024)


def test_ttl_expires_unused_handles_and_use_renews():
    clock = Clock()
    store = HandleStore(1 << 20, 10, clock=clock)
    a, _ = store.put(kb(1))
    b, _ = store.put(kb(1))
    clock.now = 8
    store.get(a)
    clock.now = 12
    store.get(a)
    with pytest.raises(NotFoundError, match="expired"):
        store.get(b)


def test_tensor_bigger_than_budget_refused():
    with pytest.raises(ResourceExhaustedError, match="--store-bytes"):
        HandleStore(1000, 60).put(kb(1))


def test_a_tenant_over_its_budget_makes_room_from_its_own_handles():
    store = HandleStore(10 * 1024, 60, tenant_budget_bytes=3 * 1024)
    bob = [store.put(kb(1), tenant="bob")[0] for _ in range(3)]
    alice = [store.put(kb(1), tenant="alice")[0] for _ in range(3)]
    store.get(alice[0], tenant="alice")  # alice[1] is now her least recently used
    newest, _ = store.put(kb(1), tenant="alice")
    assert all(store.get(h, tenant="bob") is not None for h in bob)  # untouched by alice's puts
    with pytest.raises(NotFoundError):
        store.get(alice[1], tenant="alice")
    assert {h for h in (alice[0], alice[2], newest) if store.get(h, tenant="alice") is not None} == \
        {alice[0], alice[2], newest}
    assert store.stats() == (6, 6 * 1024)
    with pytest.raises(ResourceExhaustedError) as info:
        store.put(kb(4), tenant="alice")
    assert info.value.reason == "TENANT_QUOTA" and info.value.http_status == 429
    assert "--tenant-store-bytes" in info.value.message and "4096 bytes" in info.value.message
    for h in bob:
        store.delete(h, tenant="bob")
    assert store.stats() == (3, 3 * 1024)


def test_tenants_cannot_reach_each_other():
    store = HandleStore(1 << 20, 60)
    h, _ = store.put(kb(1), tenant="alice")
    with pytest.raises(PermissionDeniedError):
        store.get(h, tenant="bob")
    with pytest.raises(PermissionDeniedError):
        store.delete(h, tenant="bob")
    assert store.get(h, tenant="alice") is not None


def test_handles_are_unguessable():
    store = HandleStore(1 << 20, 60)
    handles = {store.put(np.zeros(1))[0] for _ in range(100)}
    assert len(handles) == 100
    assert all(len(h) >= 32 for h in handles)


# ------------------------------------------------------------------ evicted, expired, spilled
EXACTLY = {"bitwise": True, "coalesced": True, "same_type": True}


def kinds(rng) -> list:
    """One tensor of each kind a file must carry: dense of several dtypes and ranks (0-d and
    empty too), COO (hybrid, empty), CSR with int32 indices, batched CSC, BSR, complex and bool."""
    return [
        random_values(rng, (40, 30), "float64"),
        random_values(rng, (3, 4, 5), "int8"),
        random_values(rng, (), "complex128"),
        random_values(rng, (0, 7), "float32"),
        random_values(rng, (50,), "bool"),
        random_coo(rng, (30, 20, 3), 40, "float16", sparse_ndim=2),
        random_coo(rng, (10, 10), 0, "int64"),
        random_coo(rng, (60, 60), 100, "complex64", coalesced=True, duplicates=False, sort=True),
        random_compressed(rng, "csr", (50, 40), 90, "float64", index_dtype="int32"),
        random_compressed(rng, "csc", (2, 20, 30), 25, "uint16", batch_ndim=1),
        random_compressed(rng, "bsr", (20, 30), 6, "float32", blocksize=(2, 3)),
    ]


def spilling_store(tmp_path, budget=1024, spill_bytes=1 << 30, durable=False, **kwargs) -> HandleStore:
    return HandleStore(budget, 60, spill=SpillDir(str(tmp_path / "spill"), spill_bytes, durable), **kwargs)


def spilled(store: HandleStore) -> HandleStore:
    store.flush().result(timeout=30)
    return store


def test_without_a_disk_tier_an_evicted_handle_is_told_so(caplog):
    store = HandleStore(2 * 1024, 60)
    a, _ = store.put(kb(1), tenant="alice")
    store.put(kb(1), tenant="alice")
    with caplog.at_level("WARNING", logger="sparseserve.store"):
        store.put(kb(1), tenant="bob")
    with pytest.raises(NotFoundError) as info:
        store.get(a, tenant="alice")
    assert info.value.reason == "EVICTED"
    assert "was evicted" in info.value.message and "--store-bytes" in info.value.message
    assert "--spill-dir" in info.value.message
    with pytest.raises(NotFoundError) as info:  # another tenant learns nothing of it
        store.get(a, tenant="bob")
    assert info.value.reason == "UNKNOWN_HANDLE"
    assert store.dropped == {"evicted": 1, "expired": 0, "damaged": 0} and store.evictions == 1
    (record,) = [r for r in caplog.records if r.getMessage() == "handle evicted"]
    assert record.levelname == "WARNING"
    assert record.fields["handle"] == a and record.fields["tenant"] == "alice" and record.fields["bytes"] == 1024


def test_an_expired_handle_is_told_so():
    clock = Clock()
    store = HandleStore(1 << 20, 10, clock=clock)
    a, _ = store.put(kb(1))
    clock.now = 11
    with pytest.raises(NotFoundError) as info:
        store.get(a)
    assert info.value.reason == "EXPIRED" and "--store-ttl" in info.value.message
    assert store.dropped["expired"] == 1


def test_a_deleted_handle_is_unknown_and_gone_handles_are_remembered_within_a_bound(monkeypatch):
    monkeypatch.setattr(store_module, "GONE_MAX", 3)
    store = HandleStore(1024, 60)
    handles = [store.put(kb(1))[0] for _ in range(6)]  # each pushes out the one before
    reasons = []
    for h in handles[:-1]:
        with pytest.raises(NotFoundError) as info:
            store.get(h)
        reasons.append(info.value.reason)
    assert reasons == ["UNKNOWN_HANDLE"] * 2 + ["EVICTED"] * 3  # the oldest are forgotten
    store.delete(handles[-1])
    with pytest.raises(NotFoundError) as info:
        store.get(handles[-1])
    assert info.value.reason == "UNKNOWN_HANDLE"


def test_a_disk_tier_keeps_every_evicted_handle_exactly(tmp_path):
    rng = np.random.default_rng(7)
    tensors = kinds(rng)
    budget = max(t.nbytes for t in tensors)
    store = spilling_store(tmp_path, budget=budget)
    handles = [store.put(t, tenant="alice")[0] for t in tensors]
    store.put(np.zeros(budget, np.uint8), tenant="bob")  # pushes every one of them out
    spilled(store)
    assert store.spilled == len(tensors) and store.dropped["evicted"] == 0
    assert store.stats() == (1, budget)
    folder = tmp_path / "spill" / "v1"
    assert folder.stat().st_mode & 0o777 == 0o700
    files = sorted(folder.glob("h-*.tensor"))
    assert len(files) == len(tensors) and all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    assert store.spill_stats() == (len(files), sum(f.stat().st_size for f in files))
    for h, t in zip(handles, tensors):
        got = store.get(h, tenant="alice")
        assert_eq(got, t, **EXACTLY)
        arrays = got.arrays() if isinstance(got, SparseTensor) else (got,)
        assert not any(a.flags.writeable for a in arrays)
    assert store.stats() == (1, budget), "served from the mapping, not back in memory"
    with pytest.raises(PermissionDeniedError):
        store.get(handles[0], tenant="bob")
    store.delete(handles[0], tenant="alice")
    assert len(list(folder.glob("h-*.tensor"))) == len(tensors) - 1
    store.close()
    assert not list(folder.glob("h-*.tensor")), "not durable: the files go with the server"


def test_the_disk_tier_budget_drops_its_least_recently_used_for_good(tmp_path):
    one = file_bytes("h-" + "0" * 32, "", kb(1))
    store = spilling_store(tmp_path, spill_bytes=2 * one)
    handles = [store.put(kb(1))[0] for _ in range(3)]  # two evicted: the disk tier is full
    spilled(store)
    store.get(handles[0])  # handles[0] is now the disk tier's most recently used
    handles.append(store.put(kb(1))[0])  # handles[2] to disk: handles[1] makes room
    spilled(store)
    reasons = []
    for h in handles:
        try:
            store.get(h)
            reasons.append("kept")
        except NotFoundError as err:
            reasons.append(err.reason)
            assert "--spill-bytes" in err.message
    assert reasons == ["kept", "EVICTED", "kept", "kept"]
    assert store.dropped["evicted"] == 1 and store.spilled == 3 and store.spill_stats() == (2, 2 * one)


def test_a_tensor_bigger_than_the_disk_tier_is_dropped_when_evicted(tmp_path):
    store = spilling_store(tmp_path, budget=4096, spill_bytes=2000)
    a, _ = store.put(kb(3))
    store.put(kb(3))
    with pytest.raises(NotFoundError) as info:
        store.get(a)
    assert info.value.reason == "EVICTED" and "--spill-bytes" in info.value.message


def test_mapped_files_are_kept_within_a_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "MAPPED_MAX", 2)
    store = spilled(spilling_store(tmp_path))
    handles = [store.put(kb(1))[0] for _ in range(5)]
    spilled(store)
    for h in handles[:4]:
        store.get(h)
    assert len(store._mapped) == 2
    assert_eq(store.get(handles[0]), kb(1), **EXACTLY)  # mapped and checked again


@pytest.mark.parametrize("damage", ["flip a value byte", "truncate", "bad index"])
def test_a_damaged_file_is_never_served(tmp_path, damage, caplog):
    store = spilling_store(tmp_path)
    bad_index = damage == "bad index"
    tensor = SparseTensor(indices=[[0, 9 if bad_index else 1]], values=[1.0], dense_shape=[2, 3])
    keep, _ = store.put(random_values(np.random.default_rng(1), (10,), "float64"))
    h, _ = store.put(tensor, tenant="alice")  # (put unchecked: the service validates before a put)
    store.put(kb(1))
    spilled(store)
    path = tmp_path / "spill" / "v1" / f"{h}.tensor"
    raw = bytearray(path.read_bytes())
    if damage == "flip a value byte":
        raw[-1] ^= 0x40
    elif damage == "truncate":
        raw = raw[:-3]
    path.write_bytes(bytes(raw))
    with caplog.at_level("ERROR", logger="sparseserve.store"), pytest.raises(NotFoundError) as info:
        store.get(h, tenant="alice")
    assert info.value.reason == "DAMAGED"
    why = {"flip a value byte": "CRC-32", "truncate": "bytes", "bad index": "out of range"}[damage]
    assert why in info.value.message, info.value.message
    assert not path.exists() and store.dropped["damaged"] == 1
    assert [r.fields["handle"] for r in caplog.records if r.getMessage() == "handle damaged"] == [h]
    with pytest.raises(NotFoundError) as info:
        store.get(h, tenant="alice")
    assert info.value.reason == "DAMAGED"
    store.get(keep)


def test_a_durable_store_serves_the_same_handles_after_a_restart(tmp_path):
    rng = np.random.default_rng(3)
    tensors = kinds(rng)
    store = spilling_store(tmp_path, budget=1 << 20, durable=True)
    owners = ["alice" if i % 2 else "bob" for i in range(len(tensors))]
    handles = [store.put(t, tenant=o)[0] for t, o in zip(tensors, owners)]
    assert store.spill_stats()[0] == len(tensors), "every put written through"
    store.delete(handles[0], tenant=owners[0])
    store.close()
    again = spilling_store(tmp_path, budget=1 << 20, durable=True)
    assert again.spill_stats()[0] == len(tensors) - 1 and again.stats() == (0, 0)
    with pytest.raises(NotFoundError):
        again.get(handles[0], tenant=owners[0])
    for h, t, owner in zip(handles[1:], tensors[1:], owners[1:]):
        assert_eq(again.get(h, tenant=owner), t, **EXACTLY)
        with pytest.raises(PermissionDeniedError):
            again.get(h, tenant="bob" if owner == "alice" else "alice")
    again.close()


def test_a_torn_write_is_never_restored(tmp_path):
    store = spilling_store(tmp_path, budget=1 << 20, durable=True)
    good, _ = store.put(kb(2), tenant="alice")
    torn, _ = store.put(kb(2), tenant="alice")
    store.close()
    folder = tmp_path / "spill" / "v1"
    (folder / f".tmp-h-{'a' * 32}-0badf00d").write_bytes(b"half a file")  # a write the process died in
    path = folder / f"{torn}.tensor"
    path.write_bytes(path.read_bytes()[:1000])  # renamed but cut short (a disk that lied)
    again = spilling_store(tmp_path, budget=1 << 20, durable=True)
    assert sorted(p.name for p in folder.iterdir()) == sorted(["lock", f"{good}.tensor"])
    assert_eq(again.get(good, tenant="alice"), kb(2), **EXACTLY)
    with pytest.raises(NotFoundError):
        again.get(torn, tenant="alice")
    again.close()


def test_a_durable_store_restores_no_file_of_a_server_that_was_not(tmp_path):
    store = spilling_store(tmp_path)  # not durable: evicted tensors spill, and die with it
    store.put(kb(1))
    store.put(kb(1))
    spilled(store)
    store._writer.shutdown()
    store.spill.close()  # as if killed: close() would have removed the file
    assert len(list((tmp_path / "spill" / "v1").glob("h-*"))) == 1
    again = spilling_store(tmp_path, durable=True)
    assert again.spill_stats() == (0, 0) and not list((tmp_path / "spill" / "v1").glob("h-*"))
    again.close()


def test_one_directory_one_server(tmp_path):
    first = SpillDir(str(tmp_path), 1 << 20, durable=True)
    with pytest.raises(SpillDirError, match="another sparseserve server uses it"):
        SpillDir(str(tmp_path), 1 << 20, durable=True)
    first.close()
    SpillDir(str(tmp_path), 1 << 20, durable=True).close()


def test_an_abandoned_durable_put_leaves_no_file(tmp_path):
    spill = SpillDir(str(tmp_path), 1 << 20, durable=True)
    handle = "h-" + "1" * 32
    staging = Staging()
    spill.write(handle, "alice", kb(1), True, staging)
    assert (tmp_path / "v1" / f"{handle}.tensor").exists()
    staging.abandon()  # the put was refused, or its deadline passed, after the file was made
    assert not (tmp_path / "v1" / f"{handle}.tensor").exists()
    staging = Staging()
    staging.abandon()  # before the file was begun
    with pytest.raises(Abandoned):
        spill.write(handle, "alice", kb(1), True, staging)
    assert sorted(p.name for p in (tmp_path / "v1").iterdir()) == ["lock"]
    spill.close()


def test_a_durable_put_over_the_disk_tier_is_refused(tmp_path):
    store = spilling_store(tmp_path, budget=1 << 20, spill_bytes=1000, durable=True)
    with pytest.raises(ResourceExhaustedError, match="--spill-bytes") as info:
        store.put(kb(1))
    assert info.value.reason == "STORE_BUDGET" and store.spill_stats() == (0, 0)
    store.close()


def test_a_server_that_is_not_durable_leaves_a_durable_directory_alone(tmp_path):
    store = spilling_store(tmp_path, durable=True)
    h, _ = store.put(kb(1))
    store.close()
    with pytest.raises(SpillDirError, match="start with --durable"):
        spilling_store(tmp_path)  # not durable: it would have removed them as left-overs
    again = spilling_store(tmp_path, durable=True)
    assert_eq(again.get(h), kb(1), **EXACTLY)
    again.close()
