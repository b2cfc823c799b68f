"""A certificate authority for the TLS tests (``Authority``): it signs server and client certificates.

Imported as ``from certificates import Authority`` by tests/server/test_server_tls.py,
test_server_tenants.py and test_server_distributed.py, and tests/deploy/test_deploy.py (pytest puts
``tests/`` on the path for ``conftest.py``).
"""

from __future__ import annotations

import datetime
import ipaddress

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


class Authority:
    """A certificate authority for tests: it signs server and client certificates."""

    def __init__(self, directory, name: str):
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"sparseserve test CA {name}")])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self.path = directory / f"{name}-ca.crt"
        self.path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, subject: list[x509.NameAttribute], *, server: bool = False,
              client: bool = False) -> tuple[str, str]:
        """(cert path, key path) of a certificate for ``subject``: for a server on 127.0.0.1 and
        localhost, for a client, or both (a Dask scheduler or worker dials the others too)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(subject)).issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage for usage, wanted in ((ExtendedKeyUsageOID.SERVER_AUTH, server),
                                                                              (ExtendedKeyUsageOID.CLIENT_AUTH, client))
                                                  if wanted]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                           critical=False)
        )
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_path, key_path = self.directory / f"{name}.crt", self.directory / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return str(cert_path), str(key_path)

    def client(self, name: str, cn: str | None = None) -> tuple[str, str]:
        """A client certificate whose subject is O=sparseserve tests and, unless None, CN ``cn``."""
        subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "sparseserve tests")]
        if cn is not None:
            subject.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
        return self.issue(name, subject, client=True)
