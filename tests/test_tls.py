"""TLS: a real server with --tls-cert/--tls-key serves gRPC over TLS and REST over HTTPS
only; the SDK reaches it through grpcs:// and https:// targets trusting a CA file."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
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
from sparseserve.errors import UnauthenticatedError, UnavailableError

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
    srv = ServerProcess("--tls-cert", certs["cert"], "--tls-key", certs["key"], "--token", TOKEN)
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


def test_shared_memory_over_grpcs(certs):
    """RegisterSegment, PutShared and GetShared over TLS, with a token (a server of its own: shared
    memory needs --allow-shared-memory)."""
    srv = ServerProcess("--tls-cert", certs["cert"], "--tls-key", certs["key"], "--token", TOKEN,
                        "--allow-shared-memory")
    try:
        with Client(f"grpcs://127.0.0.1:{srv.grpc_port}", ca_file=certs["cert"], token=TOKEN, timeout=30) as c:
            h = c.put(np.eye(3), shared_memory=True)
            np.testing.assert_array_equal(c.get(h, shared_memory=True), np.eye(3))
    finally:
        assert srv.stop() == 0, srv.log()


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
