"""Who is calling: the tenant of a call, from its bearer token, its client certificate, or both.

- Tokens only (``--token``, ``--token-file``): the tenant the token names.
- Mutual TLS only (``--tls-client-ca``): the common name (CN) of the client certificate's
  subject, the first CN where the subject has several (as gRPC reads it). The handshake has
  verified the certificate against the CA before any request is read; a certificate with no
  CN names no tenant and is refused.
- Both: every call needs both, and the token's tenant must be the certificate's CN (a
  token-file line ``CN token``). A stolen key alone, or a stolen token alone, is not enough,
  and neither can be used as the other tenant's.
- Neither: one tenant, ``""``.

The wires find the certificate's subject each their own way (gRPC: the call's auth context;
REST: the ASGI TLS extension, ``rfc4514`` below) and hand it here, so the rules are written
once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparseserve.core.errors import UnauthenticatedError
from sparseserve.core.reasons import Reason

from .metrics import current

if TYPE_CHECKING:
    from .service import Service

__all__ = ["call_tenant", "common_name", "rfc4514"]


def call_tenant(service: Service, authorization: str | None, peer_cn: str | None) -> str:
    """The tenant of a call with this ``Authorization`` header and client certificate CN (None:
    no certificate, or one without a CN); raises UNAUTHENTICATED where they name none."""
    if not service.config.tls_client_ca:
        return service.tenant_for(authorization)
    if not peer_cn:
        # The handshake asked for a certificate and verified it: only one with no CN gets here.
        raise UnauthenticatedError("the client certificate's subject has no CN (common name), so it names no "
                                   "tenant", reason=Reason.BAD_TOKEN)
    if service.tokens:
        named = service.tenant_for(authorization)  # MISSING_TOKEN, BAD_TOKEN
        if named != peer_cn:
            # Neither name goes into the message: the caller may hold a token that is not theirs.
            raise UnauthenticatedError("the bearer token is not the client certificate's tenant: both must "
                                       "name the same one", reason=Reason.BAD_TOKEN)
    info = current.get()
    if info is not None:
        info.tenant = peer_cn
    return peer_cn


# ----------------------------------------------------------------- RFC 4514 subject names
# Short names RFC 4514 (section 3) writes; getpeercert() gives OpenSSL's long names.
_SHORT = {"commonName": "CN", "localityName": "L", "stateOrProvinceName": "ST", "organizationName": "O",
          "organizationalUnitName": "OU", "countryName": "C", "streetAddress": "STREET",
          "domainComponent": "DC", "userId": "UID"}
_SPECIAL = set('"+,;<>\\')


def rfc4514(subject: tuple) -> str:
    """The RFC 4514 string of a subject as ``ssl.SSLSocket.getpeercert()`` gives it (a tuple of
    relative distinguished names, each a tuple of (attribute, value) pairs, in certificate
    order): the last RDN first, multi-valued RDNs joined by ``+``, values escaped."""
    return ",".join("+".join(f"{_SHORT.get(name, name)}={_escape(value)}" for name, value in rdn)
                    for rdn in reversed(subject))


def _escape(value: str) -> str:
    out = []
    for i, ch in enumerate(value):
        if ch in _SPECIAL or (i == 0 and ch in "# ") or (i == len(value) - 1 and ch == " "):
            out.append("\\" + ch)
        elif ch == "\0":
            out.append("\\00")
        else:
            out.append(ch)
    return "".join(out)


def common_name(subject: str) -> str | None:
    """The CN of an RFC 4514 subject string, the first in certificate order (the string's last)
    where there are several; None where there is none. Escapes (``\\,``, ``\\2C``) are undone."""
    found = None
    for rdn in _split(subject, ","):
        for attribute in _split(rdn, "+"):
            name, sep, value = _partition(attribute)
            if sep and name.strip().upper() in ("CN", "2.5.4.3"):
                found = _unescape(value)
    return found


def _split(text: str, separator: str) -> list[str]:
    """``text`` cut at each unescaped ``separator``."""
    parts, start, i = [], 0, 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == separator:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return parts


def _partition(attribute: str) -> tuple[str, str, str]:
    """(type, "=", value) at the first unescaped ``=``."""
    head, *rest = _split(attribute, "=")
    return (head, "=", "=".join(rest)) if rest else (head, "", "")


def _unescape(value: str) -> str:
    out, i = bytearray(), 0
    while i < len(value):
        ch = value[i]
        if ch == "\\" and _is_hex(value[i + 1:i + 3]):
            out.append(int(value[i + 1:i + 3], 16))
            i += 3
        elif ch == "\\" and i + 1 < len(value):
            out += value[i + 1].encode()
            i += 2
        else:
            out += ch.encode()
            i += 1
    return out.decode("utf-8", errors="replace")


def _is_hex(pair: str) -> bool:
    return len(pair) == 2 and all(c in "0123456789abcdefABCDEF" for c in pair)
