"""TLS: a real server with --tls-cert/--tls-key serves gRPC over TLS and REST over HTTPS
only; the SDK reaches it through grpcs:// and https:// targets trusting a CA file. With
--tls-client-ca (mutual TLS) both wires require a client certificate of that CA, whose subject's
CN is the tenant, alone or together with a bearer token; --metrics-token guards /metrics."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import ssl
import subprocess
import sys
import time

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from sparseserve import AsyncClient, Client, SparseTensor
from sparseserve.errors import PermissionDeniedError, UnauthenticatedError, UnavailableError

from certificates import Authority
from conftest import ROOT, ServerProcess

TOKEN = "tls-test-token"
ST = SparseTensor(indices=[[1, 0], [0, 1], [1, 0]], values=[1.0, 2.0, 3.0], dense_shape=[2, 2])
DENSE = [[0.0, 2.0], [4.0, 0.0]]


def self_signed(directory, name: str) -> tuple[str, str]:
    """(cert path, key path): a self-signed certificate for 127.0.0.1 and localhost."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"sparseserve test {name}")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        # Its own trust anchor: clients load it as the CA file.
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False),
                       critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tls")
    cert, key = self_signed(directory, "server")
    other_ca, _ = self_signed(directory, "other")
    return {"cert": cert, "key": key, "other_ca": other_ca}


@pytest.fixture(scope="module")
def tls_server(certs):
    srv = ServerProcess("--tls-cert", certs["cert"], "--tls-key", certs["key"], "--token", TOKEN,
                        "--allow-shared-memory")
    srv.grpcs_target = f"grpcs://127.0.0.1:{srv.grpc_port}"
    srv.https_url = f"https://127.0.0.1:{srv.http_port}"
    yield srv
    code = srv.stop()
    assert code == 0, f"server exited with {code}: {srv.log()}"


def secure_targets(srv) -> list[tuple[str, str]]:
    return [(srv.grpcs_target, "protobuf"), (srv.https_url, "protobuf"), (srv.https_url, "json")]


def test_listening_line_says_tls(tls_server):
    assert tls_server.wait_for("listening", 1)["tls"] is True


def test_sync_client_over_grpcs_and_https_with_token(tls_server, certs):
    for target, encoding in secure_targets(tls_server):
        with Client(target, ca_file=certs["cert"], token=TOKEN, encoding=encoding, timeout=30) as c:
            assert c.to_dense(ST, validate_indices=False).tolist() == DENSE, target
            h = c.put(ST)
            back = c.get(h)
            assert back.indices.tolist() == ST.indices.tolist() and back.values.tolist() == [1, 2, 3]
            c.delete(h)
        # The token is still checked over TLS.
        with Client(target, ca_file=certs["cert"], encoding=encoding, timeout=30) as c:
            with pytest.raises(UnauthenticatedError):
                c.call("to_dense", sp_input=ST)


def test_shared_memory_over_grpcs(tls_server, certs):
    """RegisterSegment, PutShared and GetShared over TLS, with a token (the module's server has
    --allow-shared-memory for this)."""
    with Client(tls_server.grpcs_target, ca_file=certs["cert"], token=TOKEN, timeout=30) as c:
        h = c.put(np.eye(3), shared_memory=True)
        np.testing.assert_array_equal(c.get(h, shared_memory=True), np.eye(3))
        c.delete(h)


def test_async_client_over_grpcs_and_https_with_token(tls_server, certs):
    async def main():
        results = []
        for target, encoding in secure_targets(tls_server):
            async with AsyncClient(target, ca_file=certs["cert"], token=TOKEN, encoding=encoding,
                                   timeout=30) as c:
                dense = await c.call("to_dense", sp_input=ST, validate_indices=False)
                h = await c.put(ST)
                back = await c.get(h)
                await c.delete(h)
                results.append((dense.tolist(), back.values.tolist()))
        return results

    assert asyncio.run(main()) == [(DENSE, [1.0, 2.0, 3.0])] * 3


@pytest.mark.parametrize("wire", ["grpc", "http"])
def test_plaintext_client_against_tls_port_fails_fast(tls_server, certs, wire):
    target = tls_server.grpc_target if wire == "grpc" else tls_server.http_url
    start = time.monotonic()
    with Client(target, token=TOKEN, timeout=5) as c:
        with pytest.raises(UnavailableError):
            c.call("to_dense", sp_input=ST)
    assert time.monotonic() - start < 4.5, "refused by the timeout, not by the server"
    # The server shrugs it off and keeps serving TLS clients.
    secure = tls_server.grpcs_target if wire == "grpc" else tls_server.https_url
    with Client(secure, ca_file=certs["cert"], token=TOKEN, timeout=30) as c:
        assert c.to_dense(ST, validate_indices=False).tolist() == DENSE


@pytest.mark.parametrize("wire", ["grpcs", "https"])
def test_client_trusting_another_ca_is_refused(tls_server, certs, wire):
    target = tls_server.grpcs_target if wire == "grpcs" else tls_server.https_url
    with Client(target, ca_file=certs["other_ca"], token=TOKEN, timeout=5) as c:
        with pytest.raises(UnavailableError) as info:
            c.call("to_dense", sp_input=ST)
    assert "certificate" in str(info.value).lower() or "handshake" in str(info.value).lower(), info.value


@pytest.mark.parametrize("target", ["127.0.0.1:50051", "grpc://127.0.0.1:50051", "http://127.0.0.1:8000"])
def test_ca_file_on_a_plaintext_target_is_a_value_error(certs, target):
    for cls in (Client, AsyncClient):
        with pytest.raises(ValueError, match="ca_file"):
            cls(target, ca_file=certs["cert"])


def test_unreadable_ca_file_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="ca_file"):
        Client("grpcs://127.0.0.1:1", ca_file=str(tmp_path / "missing.pem"))


@pytest.mark.parametrize("case", ["cert-only", "key-only", "env-cert-only", "missing-file", "wrong-key"])
def test_half_or_bad_tls_configuration_exits_at_once(certs, tmp_path, case):
    flags, env, words = {
        "cert-only": (["--tls-cert", certs["cert"]], {}, "--tls-cert needs --tls-key"),
        "key-only": (["--tls-key", certs["key"]], {}, "--tls-key needs --tls-cert"),
        "env-cert-only": ([], {"SPARSESERVE_TLS_CERT": certs["cert"]}, "--tls-cert needs --tls-key"),
        "missing-file": (["--tls-cert", str(tmp_path / "nope.crt"), "--tls-key", certs["key"]], {},
                         "--tls-cert"),
        "wrong-key": (["--tls-cert", certs["other_ca"], "--tls-key", certs["key"]], {},
                      "must be a PEM certificate and its private key"),
    }[case]
    result = subprocess.run([sys.executable, "-m", "sparseserve.cli", "serve", "--grpc-port", "0",
                             "--http-port", "0", *flags], capture_output=True, text=True, timeout=60,
                            cwd=ROOT, env={**os.environ, **env})
    assert result.returncode != 0
    assert words in result.stderr, result.stderr
    assert "listening" not in result.stdout


# ------------------------------------------------------------------ mutual TLS, tenants by certificate
# A CN with the characters RFC 4514 escapes, and one beyond ASCII: the same tenant on both wires.
ODD_CN = "#eve+admin=1, \"Inc\"; <x> \\ é "
METRICS_TOKEN = "metrics-scrape-token"


@pytest.fixture(scope="module")
def mtls(tmp_path_factory):
    """A server CA and a server certificate; a client CA and certificates of alice, bob, a CN with
    odd characters, and one with no CN; a client certificate from another CA."""
    directory = tmp_path_factory.mktemp("mtls")
    servers, clients, stranger = (Authority(directory, n) for n in ("servers", "clients", "stranger"))
    cert, key = servers.issue("server", [x509.NameAttribute(NameOID.COMMON_NAME, "localhost")], server=True)
    return {"ca": str(servers.path), "cert": cert, "key": key, "client_ca": str(clients.path),
            "alice": clients.client("alice", "alice"), "bob": clients.client("bob", "bob"),
            "odd": clients.client("odd", ODD_CN), "no_cn": clients.client("no-cn"),
            "stranger": stranger.client("stranger", "alice"), "clients": clients}


@pytest.fixture(scope="module")
def mtls_server(mtls):
    srv = ServerProcess("--tls-cert", mtls["cert"], "--tls-key", mtls["key"], "--tls-client-ca", mtls["client_ca"],
                        env={"SPARSESERVE_METRICS_TOKEN": METRICS_TOKEN})
    https = f"https://127.0.0.1:{srv.http_port}"
    srv.targets = [(f"grpcs://127.0.0.1:{srv.grpc_port}", "protobuf"), (https, "protobuf"), (https, "json")]
    yield srv
    code = srv.stop()
    assert code == 0, f"server exited with {code}: {srv.log()}"


def as_client(mtls, who: str, target: str, encoding: str = "protobuf", **kwargs) -> Client:
    cert, key = mtls[who]
    return Client(target, ca_file=mtls["ca"], cert_file=cert, key_file=key, encoding=encoding, timeout=30, **kwargs)


def test_listening_line_says_mutual_tls(mtls_server):
    line = mtls_server.wait_for("listening", 1)
    assert line["tls"] is True and line["mtls"] is True


def test_the_certificates_cn_is_the_tenant_on_both_wires(mtls_server, mtls):
    """alice's handles are alice's whichever wire made them and whichever reads them; bob's
    certificate gets OTHER_TENANT for them, with nothing of the tensor in the message."""
    for made_on, _ in mtls_server.targets[:2]:
        with as_client(mtls, "alice", made_on) as alice:
            h = alice.put(ST)
        for target, encoding in mtls_server.targets:
            with as_client(mtls, "alice", target, encoding) as alice:
                assert alice.to_dense(h, validate_indices=False).tolist() == DENSE, (made_on, target)
            with as_client(mtls, "bob", target, encoding) as bob:
                for call, arg in ((bob.get, h), (bob.to_dense, h), (bob.delete, h)):
                    with pytest.raises(PermissionDeniedError) as info:
                        call(arg)
                    assert info.value.reason == "OTHER_TENANT", (made_on, target)
                    assert "3.0" not in info.value.message and "alice" not in info.value.message
        with as_client(mtls, "alice", made_on) as alice:
            alice.delete(h)


def test_a_cn_with_escaped_characters_is_one_tenant_on_both_wires(mtls_server, mtls):
    """REST reads the subject as an RFC 4514 string, gRPC the CN itself: the same name."""
    (grpcs, _), (https, _), _ = mtls_server.targets
    with as_client(mtls, "odd", https) as rest, as_client(mtls, "odd", grpcs) as grpc_client:
        h = rest.put(ST)
        assert grpc_client.get(h).values.tolist() == [1.0, 2.0, 3.0]
        h2 = grpc_client.put(ST)
        assert rest.get(h2).values.tolist() == [1.0, 2.0, 3.0]
    with as_client(mtls, "alice", grpcs) as alice:
        with pytest.raises(PermissionDeniedError):
            alice.get(h)


def test_async_clients_present_their_certificate(mtls_server, mtls):
    async def main():
        results = []
        for target, encoding in mtls_server.targets:
            cert, key = mtls["alice"]
            async with AsyncClient(target, ca_file=mtls["ca"], cert_file=cert, key_file=key, encoding=encoding,
                                   timeout=30) as c:
                h = await c.put(ST)
                results.append((await c.call("to_dense", sp_input=h, validate_indices=False)).tolist())
                await c.delete(h)
        return results

    assert asyncio.run(main()) == [DENSE] * 3


@pytest.mark.parametrize("who", [None, "stranger"], ids=["no-certificate", "another-ca"])
def test_a_client_without_a_certificate_of_the_ca_is_refused_in_the_handshake(mtls_server, mtls, who):
    for target, encoding in mtls_server.targets[:2]:
        start = time.monotonic()
        client = (Client(target, ca_file=mtls["ca"], timeout=5) if who is None
                  else as_client(mtls, who, target, encoding))
        with client as c:
            with pytest.raises(UnavailableError):
                c.call("to_dense", sp_input=ST)
        assert time.monotonic() - start < 4.5, f"{target}: refused by the timeout, not by the server"
    with as_client(mtls, "alice", mtls_server.targets[0][0]) as c:  # and it keeps serving
        assert c.to_dense(ST, validate_indices=False).tolist() == DENSE


def test_a_certificate_without_a_cn_names_no_tenant(mtls_server, mtls):
    for target, encoding in mtls_server.targets:
        with as_client(mtls, "no_cn", target, encoding) as c:
            with pytest.raises(UnauthenticatedError) as info:
                c.put(ST)
        assert info.value.reason == "BAD_TOKEN" and "no CN" in info.value.message, target


def test_metrics_need_the_metrics_token(mtls_server, mtls):
    """/metrics is the operator's: with --metrics-token, that token as a bearer token (and, under
    mutual TLS, a client certificate of the CA, as for every connection)."""
    import httpx

    url = f"https://127.0.0.1:{mtls_server.http_port}/metrics"
    context = ssl.create_default_context(cafile=mtls["ca"])
    context.load_cert_chain(*mtls["alice"])
    with httpx.Client(verify=context, timeout=30) as http:
        for headers, reason in (({}, "MISSING_TOKEN"), ({"authorization": "Bearer nope"}, "BAD_TOKEN"),
                                ({"authorization": METRICS_TOKEN}, "BAD_TOKEN")):
            reply = http.get(url, headers=headers)
            assert reply.status_code == 401 and reply.json()["error"]["reason"] == reason
            assert "sparseserve_requests_total" not in reply.text
        reply = http.get(url, headers={"authorization": f"Bearer {METRICS_TOKEN}"})
        assert reply.status_code == 200 and "sparseserve_requests_total" in reply.text
        assert http.get(url.replace("/metrics", "/healthz")).json() == {"status": "ok"}


def test_mutual_tls_and_tokens_must_name_the_same_tenant(mtls, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("alice alice-token\nbob bob-token\n")
    srv = ServerProcess("--tls-cert", mtls["cert"], "--tls-key", mtls["key"], "--tls-client-ca", mtls["client_ca"],
                        "--token-file", str(tokens))
    try:
        for target in (f"grpcs://127.0.0.1:{srv.grpc_port}", f"https://127.0.0.1:{srv.http_port}"):
            with as_client(mtls, "alice", target, token="alice-token") as alice:
                h = alice.put(ST)
            for token, error, reason in ((None, UnauthenticatedError, "MISSING_TOKEN"),
                                         ("bob-token", UnauthenticatedError, "BAD_TOKEN"),
                                         ("made-up", UnauthenticatedError, "BAD_TOKEN")):
                with as_client(mtls, "alice", target, token=token) as c:
                    with pytest.raises(error) as info:
                        c.get(h)
                    assert info.value.reason == reason, (target, token)
                    assert "bob" not in info.value.message and "alice" not in info.value.message
            # bob's token with bob's certificate is bob: another tenant's handle.
            with as_client(mtls, "bob", target, token="bob-token") as bob:
                with pytest.raises(PermissionDeniedError):
                    bob.get(h)
            with as_client(mtls, "alice", target, token="alice-token") as alice:
                assert alice.get(h).values.tolist() == [1.0, 2.0, 3.0]
                alice.delete(h)
    finally:
        assert srv.stop() == 0, srv.log()


def test_metrics_token_on_a_plaintext_server_and_none_without_it(server):
    import httpx

    assert httpx.get(f"{server.http_url}/metrics").status_code == 200  # no --metrics-token: open, as before
    srv = ServerProcess("--metrics-token", METRICS_TOKEN, "--token", TOKEN)
    try:
        assert httpx.get(f"{srv.http_url}/metrics").json()["error"]["reason"] == "MISSING_TOKEN"
        # A tenant's token is not the operator's.
        reply = httpx.get(f"{srv.http_url}/metrics", headers={"authorization": f"Bearer {TOKEN}"})
        assert reply.status_code == 401 and reply.json()["error"]["reason"] == "BAD_TOKEN"
        reply = httpx.get(f"{srv.http_url}/metrics", headers={"authorization": f"bearer {METRICS_TOKEN}"})
        assert reply.status_code == 200 and "sparseserve_requests_total" in reply.text
    finally:
        assert srv.stop() == 0, srv.log()


@pytest.mark.parametrize("target", ["127.0.0.1:50051", "http://127.0.0.1:8000"])
def test_a_client_certificate_on_a_plaintext_target_is_a_value_error(mtls, target):
    cert, key = mtls["alice"]
    for cls in (Client, AsyncClient):
        with pytest.raises(ValueError, match="cert_file"):
            cls(target, cert_file=cert, key_file=key)


def test_client_certificate_files_are_checked_at_once(mtls, tmp_path):
    cert, key = mtls["alice"]
    _, other_key = mtls["bob"]
    for kwargs, words in (({"cert_file": cert}, "go together"), ({"key_file": key}, "go together"),
                          ({"cert_file": cert, "key_file": other_key}, "private key"),
                          ({"cert_file": str(tmp_path / "missing.crt"), "key_file": key}, "readable")):
        with pytest.raises(ValueError, match=words):
            Client("grpcs://127.0.0.1:1", ca_file=mtls["ca"], **kwargs)


@pytest.mark.parametrize("case", ["no-server-cert", "unreadable", "not-a-ca"])
def test_a_client_ca_without_tls_or_unreadable_exits_at_once(mtls, tmp_path, case):
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    flags, words = {
        "no-server-cert": (["--tls-client-ca", mtls["client_ca"]], "--tls-client-ca needs --tls-cert"),
        "unreadable": (["--tls-cert", mtls["cert"], "--tls-key", mtls["key"], "--tls-client-ca",
                        str(tmp_path / "nope.pem")], "--tls-client-ca"),
        "not-a-ca": (["--tls-cert", mtls["cert"], "--tls-key", mtls["key"], "--tls-client-ca", str(junk)],
                     "must be a readable PEM CA certificate"),
    }[case]
    result = subprocess.run([sys.executable, "-m", "sparseserve.cli", "serve", "--grpc-port", "0",
                             "--http-port", "0", *flags], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode != 0
    assert words in result.stderr, result.stderr
    assert "listening" not in result.stdout
