"""What ``Client`` and ``AsyncClient`` ask of a wire: the ``Transport`` interface (and its
awaited twin, ``AsyncTransport``), and the ``Settings`` a transport is made from.

A client parses its target into ``Settings``, picks a transport once (gRPC:
``_transport_grpc``, REST: ``_transport_rest``) and from then on only calls it. A transport
sends the SDK's values (tensors already converted: ``SparseTensor``, numpy arrays, handles),
returns decoded Python values, and raises the SDK's errors (``sparseserve.errors``), each with
the request id the server logged the call under (or a fresh one where it never answered).
"""

from __future__ import annotations

import ssl
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, TypeAlias

import numpy as np

from ._progress import Progress
from .core.codec import DEFAULT_CHUNK_BYTES
from .core.errors import UnimplementedError
from .core.tensor import SparseTensor
from .core.reasons import Reason

__all__ = ["Settings", "Stored", "Transport", "AsyncTransport", "Catalogue", "Outputs", "Tensor", "Step",
           "DEFAULT_MAX_MESSAGE_BYTES", "DEFAULT_STREAM_ABOVE_BYTES", "shared_memory_refused", "OnProgress",
           "progress_refused"]

DEFAULT_MAX_MESSAGE_BYTES = 256 << 20
# Over gRPC, a call whose request passes this size goes by ExecuteStream: one 16 MB unary
# request took 2-3 times as long as the same bytes in a stream of 1 MiB frames, while a
# stream costs a small call 0.5 ms more than a unary one (so small requests stay unary,
# even where the reply may be big).
DEFAULT_STREAM_ABOVE_BYTES = 1 << 20

# (device, op entries) of the server's catalogue, as ``GET /v1/ops`` has them.
Catalogue: TypeAlias = tuple[str, list[dict[str, Any]]]
# Named outputs in declared order; a kept one is a HandleRef, a list output a list.
Outputs: TypeAlias = list[tuple[str, Any]]
Tensor: TypeAlias = SparseTensor | np.ndarray
# A pipeline step: (name, op, arguments).
Step: TypeAlias = tuple[str, str, dict[str, Any]]
# What an iterative op's progress reports go to: each a dict (op, iteration, residual_norm).
OnProgress: TypeAlias = Callable[[dict[str, Any]], Any]


class Stored(NamedTuple):
    """A tensor the server now keeps: its handle and size."""

    handle: str
    nbytes: int


@dataclass(frozen=True)
class ClientCertificate:
    """The certificate a client presents in the TLS handshake (mutual TLS): the files, which
    ``ssl`` loads (REST), and their PEM bytes, which gRPC takes."""

    cert_file: str
    key_file: str
    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def read(cls, cert_file: str, key_file: str) -> "ClientCertificate":
        """Both files read and checked to be a PEM certificate (chain) and its private key now, so a
        bad pair fails here, not at the first call."""
        try:
            ssl.create_default_context().load_cert_chain(cert_file, key_file)
            with open(cert_file, "rb") as cert, open(key_file, "rb") as key:
                return cls(cert_file, key_file, cert.read(), key.read())
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cert_file {cert_file!r} and key_file {key_file!r} must be a readable PEM "
                             f"certificate and its private key: {exc}") from None


@dataclass(frozen=True)
class Settings:
    """A client's target and options, checked: what a transport is made from."""

    target: str
    wire: str  # "grpc" or "rest"
    address: str  # host:port (gRPC) or the base URL (REST)
    tls: bool
    ca_pem: bytes | None  # None: the system's roots
    client_cert: ClientCertificate | None = None  # None: none presented (no mutual TLS)
    token: str | None = None
    timeout: float | None = None
    encoding: str = "protobuf"
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    stream_above_bytes: int = DEFAULT_STREAM_ABOVE_BYTES

    @classmethod
    def parse(cls, target: str, *, ca_file: str | None = None, cert_file: str | None = None,
              key_file: str | None = None, **options: Any) -> "Settings":
        """``host:port`` or ``grpc(s)://host:port`` speaks gRPC, ``http(s)://...`` REST; grpcs
        and https use TLS, trusting ``ca_file`` (PEM) or the system's roots, and presenting the
        client certificate ``cert_file`` with its key ``key_file`` when given (mutual TLS)."""
        if options.get("encoding", "protobuf") not in ("protobuf", "json"):
            raise ValueError("encoding must be 'protobuf' or 'json'")
        wire, address, tls = _split_target(target)
        for name, value in (("ca_file", ca_file), ("cert_file", cert_file), ("key_file", key_file)):
            if value is not None and not tls:
                raise ValueError(f"{name} is for TLS targets (grpcs://host:port or https://...); "
                                 f"{target!r} is plaintext")
        if (cert_file is None) != (key_file is None):
            raise ValueError("cert_file and key_file go together: a client certificate and its private key")
        ca_pem = _read_ca(ca_file) if ca_file is not None else None
        client_cert = ClientCertificate.read(cert_file, key_file) if cert_file and key_file else None
        return cls(target, wire, address, tls, ca_pem, client_cert, **options)


def _split_target(target: str) -> tuple[str, str, bool]:
    """(wire, address, tls) of a target."""
    if target.startswith(("http://", "https://")):
        return "rest", target.rstrip("/"), target.startswith("https://")
    for scheme in ("grpc://", "grpcs://"):
        if target.startswith(scheme):
            return "grpc", target[len(scheme):], scheme == "grpcs://"
    return "grpc", target, False


def _read_ca(ca_file: str) -> bytes:
    """The PEM bytes of ``ca_file``, checked now so a bad file fails here, not at the first call."""
    try:
        with open(ca_file, "rb") as fh:
            pem = fh.read()
        ssl.create_default_context(cadata=pem.decode("ascii"))
    except (OSError, ssl.SSLError, UnicodeDecodeError) as exc:
        raise ValueError(f"ca_file {ca_file!r} must be a readable PEM CA certificate: {exc}") from None
    return pem


def shared_memory_refused(target: str) -> UnimplementedError:
    """The error of ``shared_memory=True`` on a wire without it."""
    return UnimplementedError(
        f"shared_memory=True needs the gRPC wire (a host:port target); {target} speaks REST",
        reason=Reason.SHARED_MEMORY_NEEDS_GRPC)


def progress_refused(target: str) -> UnimplementedError:
    """The error of ``progress=`` on an op call over a wire without a progress stream."""
    return UnimplementedError(
        f"progress= on an op call needs the gRPC wire (a host:port target: its ExecuteWithProgress "
        f"stream); {target} speaks REST", reason=Reason.PROGRESS_NEEDS_GRPC)


class Transport(ABC):
    """One wire, blocking. Every method may raise a ``SparseServeError``."""

    settings: Settings

    @abstractmethod
    def list_ops(self) -> Catalogue:
        """The server's catalogue."""

    @abstractmethod
    def execute(self, op: str, args: dict[str, Any], keep: bool, request_id: str | None) -> Outputs:
        """Run one op; ``request_id``: the caller's id for the call, or None for the server's."""

    def execute_watched(self, op: str, args: dict[str, Any], keep: bool, request_id: str | None,
                        on_progress: OnProgress) -> Outputs:
        """``execute``, calling ``on_progress`` with each progress report of an iterative op as it
        arrives (a wire without a progress stream refuses: ``progress_refused``)."""
        raise progress_refused(self.settings.target)

    @abstractmethod
    def run_pipeline(self, steps: list[Step], outputs: list[str], keep: bool) -> Outputs:
        """Run the steps in one request; the outputs named (none: the last step's)."""

    @abstractmethod
    def put(self, tensor: Tensor, partitions: int, progress: Progress | None = None) -> Stored:
        """Keep a tensor on the server (``partitions``: over that many Dask workers; 0: not),
        counting the bytes sent on ``progress``."""

    @abstractmethod
    def get(self, handle: str, progress: Progress | None = None) -> Tensor:
        """A kept tensor, counting the bytes received on ``progress``."""

    @abstractmethod
    def delete(self, handle: str) -> None:
        """Free a kept tensor."""

    @abstractmethod
    def put_shared(self, tensor: Tensor) -> Stored:
        """``put`` through a shared-memory segment (or ``shared_memory_refused``)."""

    @abstractmethod
    def get_shared(self, handle: str) -> Tensor:
        """``get`` through a shared-memory segment (or ``shared_memory_refused``)."""

    @abstractmethod
    def close(self) -> None:
        """Release the connections."""


class AsyncTransport(ABC):
    """``Transport``'s methods, awaited."""

    settings: Settings

    @abstractmethod
    async def list_ops(self) -> Catalogue: ...

    @abstractmethod
    async def execute(self, op: str, args: dict[str, Any], keep: bool, request_id: str | None) -> Outputs: ...

    async def execute_watched(self, op: str, args: dict[str, Any], keep: bool, request_id: str | None,
                              on_progress: OnProgress) -> Outputs:
        """As ``Transport.execute_watched``; ``on_progress`` may also return an awaitable, awaited."""
        raise progress_refused(self.settings.target)

    @abstractmethod
    async def run_pipeline(self, steps: list[Step], outputs: list[str], keep: bool) -> Outputs: ...

    @abstractmethod
    async def put(self, tensor: Tensor, partitions: int, progress: Progress | None = None) -> Stored: ...

    @abstractmethod
    async def get(self, handle: str, progress: Progress | None = None) -> Tensor: ...

    @abstractmethod
    async def delete(self, handle: str) -> None: ...

    @abstractmethod
    async def put_shared(self, tensor: Tensor) -> Stored: ...

    @abstractmethod
    async def get_shared(self, handle: str) -> Tensor: ...

    @abstractmethod
    async def close(self) -> None: ...
