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
