"""Tenants end to end: three tenants, eight SDK clients each, against one real server with
mutual TLS and tokens both (a tenant is its certificate's CN, and its token must name the same
tenant), on gRPC and REST (protobuf and JSON bodies) at once.

Each client makes a mix of valid and hostile calls: its own puts, ops on its own and its
tenant's handles, and attempts on another tenant's handles (as if one had leaked), with another
tenant's token, with no token, with bad arguments, past the limits and past its tenant's
quota, while one client of one tenant floods the store. Every valid call gets its own exact
answer; every hostile one its exact code and reason; no answer, error message or /metrics
line carries another tenant's values, name or handles; and the flood pushes out only the
flooding tenant's own handles.
"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from sparseserve import Client, SparseTensor
from sparseserve.core.tensor import HandleRef
from sparseserve.errors import (InvalidArgumentError, NotFoundError, PermissionDeniedError, ResourceExhaustedError,
                                SparseServeError, UnauthenticatedError)

from conftest import ServerProcess
from certificates import Authority

pytestmark = pytest.mark.timeout(240)

TENANTS = ("alpha", "beta", "gamma")
# Each tenant's values lie in a band of their own: any value of another band in an answer, or
# its digits in a message, is another tenant's byte.
BAND = {t: 7_100_000 * (i + 1) for i, t in enumerate(TENANTS)}
WIRES = ("grpc", "grpc", "grpc", "rest-protobuf", "rest-protobuf", "rest-protobuf", "rest-json", "rest-json")
ROUNDS = 24  # calls per client
FLOODER = "gamma"  # one of its clients fills its quota over and over
QUOTA = 1 << 20  # --tenant-store-bytes
METRICS_TOKEN = "tenants-metrics-token"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tenants")
    servers, clients = Authority(directory, "servers"), Authority(directory, "clients")
    cert, key = servers.issue("server", [x509.NameAttribute(NameOID.COMMON_NAME, "localhost")], server=True)
    tokens = directory / "tokens"
    tokens.write_text("".join(f"{t} token-of-{t}\n" for t in TENANTS))
    return {"ca": str(servers.path), "cert": cert, "key": key, "client_ca": str(clients.path),
            "tokens": str(tokens), **{t: clients.client(t, t) for t in TENANTS}}


@pytest.fixture(scope="module")
def server(pki):
    srv = ServerProcess("--tls-cert", pki["cert"], "--tls-key", pki["key"], "--tls-client-ca", pki["client_ca"],
                        "--token-file", pki["tokens"], "--tenant-store-bytes", str(QUOTA),
                        "--max-result-bytes", str(8 << 20), "--metrics-token", METRICS_TOKEN)
    yield srv
    code = srv.stop()
    assert code == 0, f"server exited with {code}: {srv.log()}"


def connect(server, pki, wire: str, cert_of: str, token_of: str | None) -> Client:
    """A client with ``cert_of``'s certificate and ``token_of``'s token (None: no token)."""
    cert, key = pki[cert_of]
    target = (f"grpcs://127.0.0.1:{server.grpc_port}" if wire == "grpc" else f"https://127.0.0.1:{server.http_port}")
    return Client(target, ca_file=pki["ca"], cert_file=cert, key_file=key, timeout=60,
                  token=None if token_of is None else f"token-of-{token_of}",
                  encoding="json" if wire == "rest-json" else "protobuf")


def tensor_of(tenant: str, rng: np.random.Generator, nnz: int, n: int = 400) -> SparseTensor:
    """A tensor of ``tenant``'s band: integer values, exact in any sum."""
    return SparseTensor(indices=rng.integers(0, n, (nnz, 1)), dense_shape=[n],
                        values=(BAND[tenant] + rng.integers(0, 1000, nnz)).astype(np.float64))


def dense_of(t: SparseTensor) -> np.ndarray:
    out = np.zeros(t.dense_shape[0])
    np.add.at(out, t.indices[:, 0], t.values)
    return out


class Ledger:
    """What every tenant holds and has seen, shared by the clients."""

    def __init__(self):
        self.lock = threading.Lock()
        self.pinned: dict[str, dict[str, SparseTensor]] = {t: {} for t in TENANTS}  # never deleted
        self.messages: dict[str, list[str]] = {t: [] for t in TENANTS}
        self.outcomes: dict[str, int] = {}
        self.values: dict[str, list[np.ndarray]] = {t: [] for t in TENANTS}

    def count(self, what: str) -> None:
        with self.lock:
            self.outcomes[what] = self.outcomes.get(what, 0) + 1

    def saw(self, tenant: str, err: SparseServeError, used: str | None = None) -> None:
        """An error a client of ``tenant`` got; ``used``: another tenant's handle it sent."""
        with self.lock:
            self.messages[tenant].append(err.message.replace(used, "<handle sent>") if used else err.message)

    def got(self, tenant: str, values) -> None:
        with self.lock:
            self.values[tenant].append(np.asarray(values).ravel())

    def any_pinned_of(self, tenant: str, rng: np.random.Generator) -> tuple[str, SparseTensor]:
        with self.lock:
            handles = sorted(self.pinned[tenant])
            h = handles[rng.integers(len(handles))]
            return h, self.pinned[tenant][h]


def expect(error: type, reason: str, call, *args, **kwargs) -> SparseServeError:
    with pytest.raises(error) as info:
        call(*args, **kwargs)
    assert info.value.reason == reason, info.value
    return info.value


def one_call(tenant: str, k: int, i: int, c: Client, hostile: dict[str, Client], ledger: Ledger,
             rng: np.random.Generator, mine: list[str]) -> None:
    """Call ``i`` of client ``k`` of ``tenant``, checked."""
    others = [t for t in TENANTS if t != tenant]
    evictable = tenant == FLOODER
    kind = i % 8
    if kind == 0:  # put, use by handle on this wire, get back, delete: exact, then gone
        t = tensor_of(tenant, rng, 1000)
        h = c.put(t)
        try:
            np.testing.assert_array_equal(c.to_dense(h, validate_indices=False), dense_of(t))
            back = c.get(h)
            assert np.array_equal(back.indices, t.indices) and np.array_equal(back.values, t.values)
            ledger.got(tenant, back.values)
            c.delete(h)  # the flood may push it out between the get and here too
        except NotFoundError as err:  # only the flooding tenant's own handles are pushed out
            assert evictable and err.reason == "EVICTED", err
            ledger.count("evicted (own)")
            return
        expect(NotFoundError, "UNKNOWN_HANDLE", c.get, h)
        ledger.count("put/use/get/delete")
    elif kind == 1:  # a handle another client of the same tenant made, maybe on another wire
        h, t = ledger.any_pinned_of(tenant, rng)
        try:
            got = c.reduce_sum(HandleRef(h), axis=[0])
        except NotFoundError as err:
            assert evictable and err.reason == "EVICTED", err
            ledger.count("evicted (own)")
            return
        assert got == t.values.sum()
        ledger.count("tenant's handle")
    elif kind == 2:  # an inline op
        t = tensor_of(tenant, rng, 300)
        out = c.coalesce(t)
        want = dense_of(t)
        nz = np.flatnonzero(np.bincount(t.indices[:, 0], minlength=t.dense_shape[0]))
        assert out.indices[:, 0].tolist() == nz.tolist() and out.values.tolist() == want[nz].tolist()
        ledger.count("inline")
    elif kind == 3:  # another tenant's handle, leaked: refused for get, use and delete
        other = others[i % 2]
        h, _ = ledger.any_pinned_of(other, rng)
        for call in (c.get, c.to_dense, c.delete):
            with pytest.raises((PermissionDeniedError, NotFoundError)) as info:
                call(HandleRef(h))
            err = info.value
            # OTHER_TENANT; a handle the flood pushed out is no one's to another tenant.
            assert (err.code, err.reason) == ("PERMISSION_DENIED", "OTHER_TENANT") or \
                (other == FLOODER and (err.code, err.reason) == ("NOT_FOUND", "UNKNOWN_HANDLE")), err
            ledger.saw(tenant, err, used=h)
        ledger.count("other tenant's handle")
    elif kind == 4:  # another tenant's token with this certificate, and no token at all
        wrong, missing = hostile["wrong-token"], hostile["no-token"]
        # (by name: an op method would first fetch the catalogue, which is refused the same way)
        ledger.saw(tenant, expect(UnauthenticatedError, "BAD_TOKEN", wrong.call, "to_dense",
                                  sp_input=tensor_of(tenant, rng, 5)))
        ledger.saw(tenant, expect(UnauthenticatedError, "MISSING_TOKEN", missing.get, mine[0]))
        ledger.count("bad credentials")
    elif kind == 5:  # bad arguments and limits: refused, nothing else said
        bad = SparseTensor(indices=[[0, 9]], values=[float(BAND[tenant])], dense_shape=[3, 4])
        ledger.saw(tenant, expect(InvalidArgumentError, "INDEX_OUT_OF_RANGE", c.to_dense, bad))
        huge = SparseTensor(indices=[[0, 0]], values=[1.0], dense_shape=[100_000, 100_000])
        ledger.saw(tenant, expect(ResourceExhaustedError, "RESULT_TOO_LARGE", c.to_dense, huge))
        ledger.saw(tenant, expect(NotFoundError, "UNKNOWN_HANDLE", c.get, "h-" + "0" * 32))
        ledger.count("bad arguments")
    elif kind == 6 and tenant == FLOODER and k == 0:  # the flood: past the quota, again and again
        for _ in range(4):
            c.put(tensor_of(tenant, rng, 20_000, n=1_000_000))  # 320 kB each: its own handles go
        ledger.saw(tenant, expect(ResourceExhaustedError, "TENANT_QUOTA", c.put,
                                  tensor_of(tenant, rng, 100_000, n=1_000_000)))  # 1.6 MB: refused
        ledger.count("flood")
    else:  # a pipeline on the tenant's own handle
        h = mine[0]
        p = c.pipeline()
        p.reduce_sum(p.coalesce(HandleRef(h)), axis=[0])
        try:
            got = p.run()
        except NotFoundError as err:
            assert evictable and err.reason == "EVICTED", err
            ledger.count("evicted (own)")
            return
        assert got == ledger.pinned[tenant][h].values.sum()
        ledger.count("pipeline")


def test_three_tenants_eight_clients_each_isolated_and_exact(server, pki):
    start = time.monotonic()
    ledger = Ledger()
    clients = {t: [connect(server, pki, wire, t, t) for wire in WIRES] for t in TENANTS}
    hostile = {t: {"wrong-token": connect(server, pki, "grpc", t, TENANTS[(i + 1) % 3]),
                   "no-token": connect(server, pki, "rest-json", t, None)} for i, t in enumerate(TENANTS)}
    mine: dict[tuple[str, int], list[str]] = {}
    for t in TENANTS:  # each client pins a handle its tenant's other clients use
        for k, c in enumerate(clients[t]):
            pinned = tensor_of(t, np.random.default_rng(100 * TENANTS.index(t) + k), 200)
            h = c.put(pinned).handle
            mine[t, k] = [h]
            ledger.pinned[t][h] = pinned
    errors: list[BaseException] = []

    def run(t: str, k: int) -> None:
        rng = np.random.default_rng(1000 * TENANTS.index(t) + k)
        try:
            for i in range(k, k + ROUNDS):
                one_call(t, k, i, clients[t][k], hostile[t], ledger, rng, mine[t, k])
        except BaseException as exc:  # reported below, with its tenant and client
            exc.add_note(f"tenant {t}, client {k} ({WIRES[k]})")
            errors.append(exc)

    with ThreadPoolExecutor(len(TENANTS) * len(WIRES)) as pool:
        for f in [pool.submit(run, t, k) for t in TENANTS for k in range(len(WIRES))]:
            f.result()
    if errors:
        raise errors[0]
    assert sum(ledger.outcomes.values()) == len(TENANTS) * len(WIRES) * ROUNDS, ledger.outcomes  # none lost
    for what in ("put/use/get/delete", "tenant's handle", "inline", "other tenant's handle", "bad credentials",
                 "bad arguments", "pipeline", "flood"):
        assert ledger.outcomes.get(what, 0) > 0, (what, ledger.outcomes)

    # No tensor fetched carried another tenant's values (entries as stored: sums leave the band), no
    # message their names, values or handles.
    for t in TENANTS:
        values = np.concatenate(ledger.values[t])
        assert ((values >= BAND[t]) & (values < BAND[t] + 1_000_000)).all(), t
        others = [o for o in TENANTS if o != t]
        words = [*others, *(h for o in others for h in ledger.pinned[o])]
        for message in ledger.messages[t]:
            assert not any(word in message for word in words), (t, message)
            numbers = [float(n) for n in re.findall(r"\d+(?:\.\d+)?", message)]
            assert not any(BAND[o] <= n < BAND[o] + 1000 for o in others for n in numbers), (t, message)
    # The flood pushed out only its own tenant's handles: every other pinned handle is there, exact,
    # for its tenant on every wire, and still refused to the others.
    evicted = set()
    for t in TENANTS:
        for h, want in ledger.pinned[t].items():
            for c in clients[t][::3]:
                try:
                    back = c.get(h)
                except NotFoundError as err:
                    assert t == FLOODER and err.reason == "EVICTED", (t, err)
                    evicted.add(h)
                    continue
                assert np.array_equal(back.indices, want.indices) and np.array_equal(back.values, want.values)
            for o in TENANTS:
                if o != t:
                    with pytest.raises((PermissionDeniedError, NotFoundError)):
                        clients[o][0].get(h)
    assert evicted, "the flood pushed out some of its own tenant's pinned handles"
    print(f"\n{len(TENANTS)} tenants x {len(WIRES)} clients: {ledger.outcomes}; {len(evicted)} of "
          f"{FLOODER}'s pinned handles evicted by its own flood")
    # /metrics: the operator's token only; no tenant names or handles in it, no INTERNAL.
    http = httpx.Client(verify=_context(pki), timeout=30)
    url = f"https://127.0.0.1:{server.http_port}/metrics"
    assert http.get(url, headers={"authorization": "Bearer token-of-alpha"}).status_code == 401
    text = http.get(url, headers={"authorization": f"Bearer {METRICS_TOKEN}"}).text
    assert re.search(r'code="PERMISSION_DENIED"', text) and not re.search(r'code="(INTERNAL|UNKNOWN)"', text)
    assert not any(t in text for t in TENANTS) and "h-" not in text
    http.close()
    for c in [*(c for cs in clients.values() for c in cs), *(c for hs in hostile.values() for c in hs.values())]:
        c.close()
    assert time.monotonic() - start < 60, "bounded: well under a minute"


def _context(pki):
    import ssl

    context = ssl.create_default_context(cafile=pki["ca"])
    context.load_cert_chain(*pki["alpha"])
    return context
