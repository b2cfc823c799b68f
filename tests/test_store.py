"""The handle store: byte budget with LRU eviction, TTL, tenants, unguessable ids."""

from __future__ import annotations

import numpy as np
import pytest

from sparseserve.errors import NotFoundError, PermissionDeniedError, ResourceExhaustedError
from sparseserve.server.store import HandleStore


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
