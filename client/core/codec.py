"""Protobuf codec: tensors and argument values <-> ``sparseserve.v1`` messages.

Decoding never loops over elements: an ``Array``'s bytes become a numpy view
with ``np.frombuffer`` after its dtype, shape and byte length are checked.
The chunked framing of ``Upload``/``Download`` lives here too, so the SDK and
the server assemble streams the same way.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Iterator, NamedTuple

import numpy as np
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError

from .dtypes import DTYPE_NAMES, check_supported
from .tensor import HandleRef, OutputRef, SparseTensor, TensorInfo, coo_tensor
from .validate import ARRAY_MAX_RANK, check_array_shape, check_shape
from .errors import InvalidArgumentError, ResourceExhaustedError
from ..v1 import sparseserve_pb2 as pb
from .reasons import Reason

__all__ = ["array_to_pb", "array_from_pb", "tensor_to_pb", "tensor_from_pb", "value_to_pb",
           "value_from_pb", "array_bytes", "tensor_bytes", "value_bytes", "tensor_pieces", "tensor_to_bytes",
           "tensor_from_bytes", "iter_chunks", "parse_chunk", "ChunkAssembler", "new_buffer", "DEFAULT_CHUNK_BYTES",
           "WireField", "wire_field", "WIRE_FIELDS",
           # the pieces frames.py and shm.py build their own layouts of the same messages from
           "read_varint", "varint_field", "bytes_field", "len_prefix", "array_spec", "array_view", "wire_array",
           "sparse_fields", "sparse_from_arrays"]

# Chunks of the Upload/Download streams: each is copied twice on its way (framing, then
# into gRPC), and at 1 MiB those copies stay in cache (4 MiB measured 10-20% slower).
DEFAULT_CHUNK_BYTES = 1 << 20
_LAYOUT_TO_PB = {"coo": pb.COO, "csr": pb.CSR, "csc": pb.CSC, "bsr": pb.BSR, "bsc": pb.BSC}
_LAYOUT_FROM_PB = {v: k for k, v in _LAYOUT_TO_PB.items()} | {pb.LAYOUT_UNSPECIFIED: "coo"}
_DTYPE_TO_PB = {name: pb.DType.Value(name.upper()) for name in DTYPE_NAMES}
_WIRE_DTYPES = {code: np.dtype(name).newbyteorder("<") for name, code in _DTYPE_TO_PB.items()}


# ------------------------------------------------------------------ the wire format, by hand
# The writers and readers below that handle protobuf bytes themselves (for speed: see the
# sections that use them) name every field they touch through ``wire_field``, which reads its
# number and wire type from the generated descriptors: nothing here copies a number from the
# .proto. tests/sdk/test_sdk_wire_format.py holds their bytes to protobuf's own encoder and parser.
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5  # protobuf's wire types: the encoding's, not sparseserve.proto's
_WIRE_TYPE_OF = {
    **dict.fromkeys((FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
                     FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
                     FieldDescriptor.TYPE_BOOL, FieldDescriptor.TYPE_ENUM), _VARINT),
    **dict.fromkeys((FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64, FieldDescriptor.TYPE_DOUBLE), _I64),
    **dict.fromkeys((FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_SFIXED32, FieldDescriptor.TYPE_FLOAT), _I32),
    **dict.fromkeys((FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_MESSAGE), _LEN),
}
_UINT64 = (1 << 64) - 1
# Most varints of a small message (tags, lengths under 128, dimensions) are one byte.
_ONE_BYTE = tuple(bytes((i,)) for i in range(0x80))


def _varint(n: int) -> bytes:
    if 0 <= n < 0x80:
        return _ONE_BYTE[n]
    if n < 0x4000:
        return bytes((n & 0x7F | 0x80, n >> 7))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_varint(view: memoryview, pos: int) -> tuple[int, int] | None:
    """(value, position after it), or None when the bytes end inside it or it runs past 10 bytes."""
    value = shift = 0
    for i in range(pos, min(len(view), pos + 10)):
        value |= (view[i] & 0x7F) << shift
        if not view[i] & 0x80:
            return value, i + 1
        shift += 7
    return None


class WireField(NamedTuple):
    """A field of a ``sparseserve.v1`` message as the hand-written path writes and reads it."""

    number: int
    wire_type: int
    key: int  # number << 3 | wire_type: the varint that opens the field on the wire
    tag: bytes  # that key, encoded


# Every field the hand-written path writes or reads, by "Message.field" (``wire_field``'s path).
WIRE_FIELDS: dict[str, WireField] = {}


def wire_field(path: str) -> WireField:
    """The field ``"Message.field"`` of ``sparseserve_pb2.DESCRIPTOR`` (``"Message.map.key"``:
    a field of a map's entry), recorded in ``WIRE_FIELDS``."""
    names = path.split(".")
    message = pb.DESCRIPTOR.message_types_by_name[names[0]]
    for name in names[1:-1]:
        message = message.fields_by_name[name].message_type
    field = message.fields_by_name[names[-1]]
    # A packed repeated scalar is one length-delimited field (proto3 packs them by default).
    wire_type = _LEN if field.is_packed else _WIRE_TYPE_OF[field.type]
    key = field.number << 3 | wire_type
    WIRE_FIELDS[path] = WireField(field.number, wire_type, key, _varint(key))
    return WIRE_FIELDS[path]


_TENSOR_SPARSE = wire_field("Tensor.sparse")
_TENSOR_DENSE = wire_field("Tensor.dense")
_TENSOR_HANDLE = wire_field("Tensor.handle")
_SPARSE_LAYOUT = wire_field("SparseTensor.layout")
_SPARSE_DENSE_SHAPE = wire_field("SparseTensor.dense_shape")
_SPARSE_BLOCKSIZE = wire_field("SparseTensor.blocksize")
_SPARSE_COALESCED = wire_field("SparseTensor.coalesced")
# A SparseTensor's array fields, by the name of the attribute each holds.
_SPARSE_ARRAYS = {name: wire_field(f"SparseTensor.{name}")
                  for name in ("indices", "values", "compressed_indices", "plain_indices")}
_ARRAY_DTYPE = wire_field("Array.dtype")
_ARRAY_SHAPE = wire_field("Array.shape")
_ARRAY_DATA = wire_field("Array.data")
_ARRAY_PADDING = wire_field("Array.padding")
_VALUE_TENSOR = wire_field("Value.tensor")
_CHUNK_DATA = wire_field("TensorChunk.data")


def iter_fields(view: memoryview) -> Iterator[tuple[int, int, int, int] | None]:
    """The fields of a message, one pass: (key, start of the field, start of its value, end),
    the key being ``WireField.key``'s number << 3 | wire type. Ends early with None for what a
    fast path leaves to protobuf: groups and truncated bytes. A varint's value is left unread
    (its bytes are view[body:stop])."""
    pos, end = 0, len(view)
    while pos < end:
        tag = read_varint(view, pos)
        if tag is None:
            yield None
            return
        key, body = tag
        wire_type = key & 7
        stop: int | None = None  # where the field ends; None where it cannot be found
        if wire_type == _VARINT:
            after = read_varint(view, body)
            stop = None if after is None else after[1]
        elif wire_type == _I64:
            stop = body + 8
        elif wire_type == _I32:
            stop = body + 4
        elif wire_type == _LEN:
            length = read_varint(view, body)
            if length is not None:
                body, stop = length[1], length[1] + length[0]
        if stop is None or stop > end:
            yield None
            return
        yield key, pos, body, stop
        pos = stop


def len_prefix(field: WireField, length: int) -> bytes:
    """The tag and length of a length-delimited field (then its ``length`` bytes)."""
    return field.tag + _varint(length)


def bytes_field(field: WireField, data: bytes) -> bytes:
    """A length-delimited field, written even when empty (as a oneof member or a map entry's are)."""
    return field.tag + _varint(len(data)) + data


def varint_field(field: WireField, value: int) -> bytes:
    """A varint field; proto3 leaves a zero out."""
    return field.tag + _varint(value & _UINT64) if value else b""


# ------------------------------------------------------------------ arrays
def wire_array(a: np.ndarray) -> np.ndarray:
    """Little-endian, C-contiguous, native-named dtype: what goes on the wire."""
    a = np.asarray(a)
    dtype = check_supported(a.dtype, "array")
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and np.little_endian is False):
        a = a.astype(dtype.newbyteorder("<"))
    # Not np.ascontiguousarray: it turns a 0-d array into a 1-d one.
    return a if a.flags.c_contiguous else a.copy(order="C")


def _array_header(a: np.ndarray) -> pb.Array:
    return pb.Array(dtype=_DTYPE_TO_PB[a.dtype.newbyteorder("=").name], shape=a.shape)


def array_to_pb(a: np.ndarray, *, with_data: bool = True) -> pb.Array:
    a = wire_array(a)
    msg = _array_header(a)
    if with_data:
        msg.data = a.tobytes()
    return msg


def array_spec(msg: pb.Array, name: str) -> tuple[np.dtype, tuple[int, ...], int]:
    """(dtype, shape, byte length) that an Array header announces, after checking it."""
    dtype = _WIRE_DTYPES.get(msg.dtype)
    if dtype is None:
        raise InvalidArgumentError(f"{name}.dtype = {msg.dtype} is not a supported dtype",
                                   reason=Reason.BAD_DTYPE)
    shape = check_array_shape(msg.shape, f"{name}.shape")
    nbytes = math.prod(shape) * dtype.itemsize  # Python ints: exact, and quick for a short shape
    return dtype, shape, nbytes


def array_from_pb(msg: pb.Array, name: str) -> np.ndarray:
    # The common case first, in as few steps as can check it: a small call runs this with
    # cold caches, where each step costs several times what it does in a loop.
    dtype = _WIRE_DTYPES.get(msg.dtype)
    shape = msg.shape[:]  # a list of ints, quicker than iterating the repeated field
    data = msg.data  # each read of a bytes field is a new copy of it
    if (dtype is not None and dtype.isnative and 0 < len(shape) <= ARRAY_MAX_RANK and min(shape) > 0
            and len(data) == math.prod(shape) * dtype.itemsize):  # no empty, huge or negative shape
        array = np.frombuffer(data, dtype)
        return array if len(shape) == 1 else array.reshape(shape)
    dtype, shape, nbytes = array_spec(msg, name)
    if len(data) != nbytes:
        raise InvalidArgumentError(
            f"{name}.data has {len(data)} bytes but dtype {dtype.name} and shape {list(shape)} "
            f"imply {nbytes}", reason=Reason.BUFFER_LENGTH)
    return array_view(data, dtype, shape)


def new_buffer(nbytes: int) -> np.ndarray:
    """An uninitialised ``nbytes``-byte buffer to receive into (numpy asks for huge pages above
    4 MiB)."""
    return np.empty(nbytes, np.uint8)


def array_view(buffer, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """The array a buffer of wire bytes holds, without a copy (one, in native order, only for a
    non-native dtype)."""
    arr = np.frombuffer(buffer, dtype=dtype).reshape(shape)
    # Native order for the kernels (a no-op on little-endian machines).
    return arr if dtype.isnative else arr.astype(dtype.newbyteorder("="))


# ------------------------------------------------------------------ tensors
def tensor_to_pb(t: Any, *, with_data: bool = True) -> pb.Tensor:
    """``SparseTensor``, ``numpy.ndarray`` or ``HandleRef`` -> ``Tensor`` message."""
    if isinstance(t, HandleRef):
        return pb.Tensor(handle=t.handle, info=info_to_pb(t.info)) if t.info else pb.Tensor(handle=t.handle)
    if isinstance(t, SparseTensor):
        sp = pb.SparseTensor(layout=_LAYOUT_TO_PB[t.layout], dense_shape=t.dense_shape,
                             coalesced=t.coalesced)
        sp.values.CopyFrom(array_to_pb(t.values, with_data=with_data))
        if t.layout == "coo":
            sp.indices.CopyFrom(array_to_pb(t.indices, with_data=with_data))
        else:
            sp.compressed_indices.CopyFrom(array_to_pb(t.compressed_indices, with_data=with_data))
            sp.plain_indices.CopyFrom(array_to_pb(t.plain_indices, with_data=with_data))
            if t.blocksize is not None:
                sp.blocksize.extend(t.blocksize)
        return pb.Tensor(sparse=sp)
    return pb.Tensor(dense=array_to_pb(np.asarray(t), with_data=with_data))


def _layout_arrays(layout: str | None) -> tuple[str, ...]:
    return ("indices", "values") if layout == "coo" else ("compressed_indices", "plain_indices", "values")


def sparse_fields(sp: pb.SparseTensor) -> tuple[str, ...]:
    """The array fields a SparseTensor message of its layout carries, in wire order."""
    return _layout_arrays(_LAYOUT_FROM_PB.get(sp.layout))


def sparse_from_arrays(sp: pb.SparseTensor, arrays: dict[str, np.ndarray], name: str) -> SparseTensor:
    """A SparseTensor from a message's metadata and its arrays (read elsewhere: shared memory, say);
    not validated here."""
    layout = _LAYOUT_FROM_PB.get(sp.layout)
    if layout is None:
        raise InvalidArgumentError(f"{name}.layout = {sp.layout} is not a known layout",
                                   reason=Reason.BAD_LAYOUT)
    shape = check_shape(sp.dense_shape[:], f"{name}.dense_shape")  # [:]: a list, quicker to walk
    blocksize = sp.blocksize[:]
    blocksize = tuple(blocksize) if blocksize else None
    if layout == "coo":
        return coo_tensor(arrays["indices"], arrays["values"], shape, coalesced=sp.coalesced, blocksize=blocksize)
    return SparseTensor(layout=layout, compressed_indices=arrays["compressed_indices"],
                        plain_indices=arrays["plain_indices"], values=arrays["values"],
                        dense_shape=shape, blocksize=blocksize, coalesced=sp.coalesced)


def tensor_from_pb(msg: pb.Tensor, name: str) -> SparseTensor | np.ndarray | HandleRef:
    """Decode a ``Tensor`` message. Structural checks only; the server then runs ``check_sparse``."""
    kind = msg.WhichOneof("kind")
    if kind == "sparse":
        sp = msg.sparse
        arrays = {f: array_from_pb(getattr(sp, f), f"{name}.{f}") for f in sparse_fields(sp)}
        return sparse_from_arrays(sp, arrays, name)
    if kind == "handle":
        return HandleRef(msg.handle, info_from_pb(msg.info) if msg.HasField("info") else None)
    if kind == "dense":
        return array_from_pb(msg.dense, name)
    raise InvalidArgumentError(f"{name} is an empty Tensor message: set sparse, dense or handle",
                               reason=Reason.MISSING_TENSOR)


def info_to_pb(info: TensorInfo) -> pb.TensorInfo:
    dtype = _DTYPE_TO_PB[info.dtype.name]
    if info.layout == "dense":
        return pb.TensorInfo(dense=True, dtype=dtype, shape=info.shape, nnz=info.nnz, nbytes=info.nbytes)
    return pb.TensorInfo(layout=_LAYOUT_TO_PB[info.layout], dtype=dtype, shape=info.shape, nnz=info.nnz,
                         nbytes=info.nbytes)


def info_from_pb(msg: pb.TensorInfo) -> TensorInfo | None:
    """A server's description of a kept tensor; None for one this SDK cannot read (a newer
    dtype, say): it only describes, so the handle stays usable without it."""
    dtype = _WIRE_DTYPES.get(msg.dtype)
    layout = "dense" if msg.dense else _LAYOUT_FROM_PB.get(msg.layout)
    if dtype is None or layout is None:
        return None
    return TensorInfo(layout, dtype.newbyteorder("="), tuple(msg.shape), int(msg.nnz), int(msg.nbytes))


# ------------------------------------------------------------------ whole tensors as bytes
# A REST body holds one ``Tensor`` message; at hundreds of megabytes, protobuf's own
# encoding and decoding copy every array three times. These produce and read the same
# message with the arrays spliced in and sliced out instead. bench/codec.py: tensor_to_bytes
# 1.5x as fast as tensor_to_pb(t).SerializeToString() at 1 MB, 10x at 100 MB;
# tensor_from_bytes 17x as fast as protobuf's parse and tensor_from_pb at 1 MB, 740x at
# 100 MB (views of the body instead of copies).
#
# Array bytes start at a multiple of this from the message start, so a reader holding the
# message in an aligned buffer uses them in place. Two ``padding`` fields around the data, of
# _ALIGN - 1 zero bytes together, keep every length independent of where the data lands.
_ALIGN = 16
_PADDING_HEAD = len(_ARRAY_PADDING.tag) + 1  # a padding field's tag and one-byte length
_PADDING_BYTES = 2 * _PADDING_HEAD + _ALIGN - 1


def _padding(n: int) -> bytes:
    """A ``padding`` field of ``n`` < 128 zero bytes."""
    return _ARRAY_PADDING.tag + bytes((n,)) + bytes(n)


def _array_parts(a: np.ndarray) -> tuple[bytes, memoryview | None]:
    """An Array message's fields but the data (serialized), and its data (None when empty)."""
    a = wire_array(a)
    return _array_header(a).SerializeToString(), (a.data.cast("B") if a.size else None)


def _array_size(header: bytes, data: memoryview | None) -> int:
    if data is None:
        return len(header)
    return len(header) + len(len_prefix(_ARRAY_DATA, len(data))) + len(data) + _PADDING_BYTES


def tensor_pieces(t: Any, start: int = 0) -> list:
    """The serialized ``Tensor`` message of ``t`` as pieces to send back to back: small
    headers, and the arrays' own memory (no copy), each starting 16-byte aligned counted
    from ``start`` bytes before the message (where it sits inside an enclosing one)."""
    if isinstance(t, HandleRef):
        return [tensor_to_pb(t).SerializeToString()]
    if isinstance(t, SparseTensor):
        header = pb.SparseTensor(layout=_LAYOUT_TO_PB[t.layout], dense_shape=t.dense_shape,
                                 coalesced=t.coalesced, blocksize=t.blocksize or ())
        arrays = [(_SPARSE_ARRAYS[name], *_array_parts(getattr(t, name))) for name in _layout_arrays(t.layout)]
        head = header.SerializeToString()
        body_size = len(head) + sum(len(len_prefix(f, _array_size(h, d))) + _array_size(h, d)
                                    for f, h, d in arrays)
        pieces: list = [len_prefix(_TENSOR_SPARSE, body_size), head]
    else:
        arrays = [(_TENSOR_DENSE, *_array_parts(np.asarray(t)))]
        pieces = []
    position = start + sum(len(p) for p in pieces)
    for field, head, data in arrays:
        pieces += [len_prefix(field, _array_size(head, data)), head]
        position += len(pieces[-2]) + len(head)
        if data is None:
            continue
        data_prefix = len_prefix(_ARRAY_DATA, len(data))
        before = -(position + _PADDING_HEAD + len(data_prefix)) % _ALIGN
        pieces += [_padding(before), data_prefix, data, _padding(_ALIGN - 1 - before)]
        position += _PADDING_BYTES + len(data_prefix) + len(data)
    return pieces


def tensor_to_bytes(t: Any) -> bytes:
    """``tensor_to_pb(t).SerializeToString()`` in one copy of the arrays instead of three."""
    return b"".join(tensor_pieces(t))


def _split_fields(view: memoryview, fields: Iterable[WireField]) -> tuple[bytes, dict[int, memoryview]] | None:
    """One pass over a message: (the bytes of every field not among ``fields``, a view of the
    value of each of ``fields`` found, by number). None for what the fast path leaves to
    protobuf: one of ``fields`` twice (protobuf merges those) or with another wire type,
    groups, truncated bytes."""
    keys = {field.number: field.key for field in fields}
    rest: list[memoryview] = []
    found: dict[int, memoryview] = {}
    for field in iter_fields(view):
        if field is None:
            return None
        key, pos, body, stop = field
        number = key >> 3
        if number in keys:
            if key != keys[number] or number in found:
                return None
            found[number] = view[body:stop]
        else:
            rest.append(view[pos:stop])
    return b"".join(rest), found


def _array_from_view(view: memoryview, name: str) -> np.ndarray | None:
    split = _split_fields(view, (_ARRAY_DATA,))
    if split is None:
        return None
    rest, found = split
    msg = pb.Array.FromString(rest)
    dtype, shape, nbytes = array_spec(msg, name)
    data = found.get(_ARRAY_DATA.number, memoryview(b""))
    if len(data) != nbytes:
        raise InvalidArgumentError(
            f"{name}.data has {len(data)} bytes but dtype {dtype.name} and shape {list(shape)} "
            f"imply {nbytes}", reason=Reason.BUFFER_LENGTH)
    arr = array_view(data, dtype, shape)
    # Kernels want aligned arrays; a body gives its arrays whatever offsets it has.
    return arr if arr.ctypes.data % dtype.alignment == 0 else arr.copy()


def tensor_from_bytes(body: bytes | bytearray | memoryview, name: str) -> SparseTensor | np.ndarray | HandleRef:
    """``tensor_from_pb(pb.Tensor.FromString(body))`` with the arrays as views of ``body``;
    anything the fast path does not take apart goes through protobuf whole."""
    view = memoryview(body).cast("B")
    try:
        decoded = _tensor_from_view(view, name)
    except DecodeError:
        decoded = None
    if decoded is not None:
        return decoded
    try:
        msg = pb.Tensor.FromString(view)
    except Exception:  # DecodeError, or others on some inputs
        raise InvalidArgumentError("the body is not a sparseserve.v1.Tensor message",
                                   reason=Reason.BAD_BODY) from None
    return tensor_from_pb(msg, name)


def _tensor_from_view(view: memoryview, name: str) -> SparseTensor | np.ndarray | None:
    top = _split_fields(view, (_TENSOR_SPARSE, _TENSOR_DENSE))
    if top is None or len(top[1]) != 1 or top[0]:
        return None  # a handle, an empty message, both kinds, or unknown fields: protobuf decides
    (number, inner), = top[1].items()
    if number == _TENSOR_DENSE.number:
        return _array_from_view(inner, name)
    split = _split_fields(inner, _SPARSE_ARRAYS.values())
    if split is None:
        return None
    rest, found = split
    header = pb.SparseTensor.FromString(rest)
    arrays = {}
    for attribute in sparse_fields(header):
        arr = _array_from_view(found.get(_SPARSE_ARRAYS[attribute].number, memoryview(b"")), f"{name}.{attribute}")
        if arr is None:
            return None
        arrays[attribute] = arr
    return sparse_from_arrays(header, arrays, name)


# ------------------------------------------------------------------ small messages by hand
# A small call's request and reply are mostly headers. Built as protobuf messages (one per
# array, copied into its parent, then serialized) they were a fifth of the server's own time
# on a 100-entry reorder; these write the same bytes directly (``tensor_to_pb(t)
# .SerializeToString()`` byte for byte: fields in number order, proto3 defaults left out).
# bench/codec.py: that reorder's request written in 10 us against the generated classes' 18
# (1.7x), its reply in 8 against 17 (2.0x).
def _packed(values) -> bytes:
    """The payload of a packed repeated varint field (non-empty ``values``)."""
    if 0 <= min(values) and max(values) < 0x80:  # one byte each (shapes, mostly)
        return bytes(values)
    return b"".join([_varint(v & _UINT64) for v in map(int, values)])


def _packed_field(field: WireField, values) -> bytes:
    if not len(values):
        return b""
    packed = _packed(values)
    return len_prefix(field, len(packed)) + packed


# An Array's dtype field, serialized, by little-endian dtype: an array whose dtype is found
# here goes out as it is.
_DTYPE_FIELDS = {dtype: varint_field(_ARRAY_DTYPE, code) for code, dtype in _WIRE_DTYPES.items()}
_SHAPE_TAG, _ARRAY_DATA_TAG = _ARRAY_SHAPE.tag, _ARRAY_DATA.tag


def array_bytes(a: np.ndarray) -> bytes:
    """The serialized ``Array`` message of ``a``."""
    if type(a) is not np.ndarray:
        a = np.asarray(a)
    dtype_field = _DTYPE_FIELDS.get(a.dtype)
    if dtype_field is None:  # big-endian, or not a wire dtype (refused here)
        a = wire_array(a)
        dtype_field = _DTYPE_FIELDS[a.dtype]
    # The fields written here rather than by the helpers: a small call's messages are mostly
    # such headers, and each call of a helper counts (the section's comment above).
    parts = [dtype_field]
    if a.shape:
        packed = _packed(a.shape)
        parts += (_SHAPE_TAG, _varint(len(packed)), packed)
    data = a.tobytes()  # C order whatever the strides
    if data:
        parts += (_ARRAY_DATA_TAG, _varint(len(data)), data)
    return b"".join(parts)


# Per layout: its serialized layout field, and its arrays' (field, attribute) in number order.
_LAYOUT_FIELDS = {
    layout: (varint_field(_SPARSE_LAYOUT, code),
             tuple(sorted(((_SPARSE_ARRAYS[name], name) for name in _layout_arrays(layout)),
                          key=lambda pair: pair[0].number)))
    for layout, code in _LAYOUT_TO_PB.items()}
_COALESCED = varint_field(_SPARSE_COALESCED, 1)  # true


def tensor_bytes(t: Any) -> bytes:
    """The serialized ``Tensor`` message of ``t`` (``tensor_to_pb``'s, without the messages)."""
    if isinstance(t, HandleRef):
        if t.info is not None:  # a kept output's reply: a few bytes, protobuf writes them
            return tensor_to_pb(t).SerializeToString()
        return bytes_field(_TENSOR_HANDLE, t.handle.encode())  # a oneof member: written even when empty
    if not isinstance(t, SparseTensor):
        return bytes_field(_TENSOR_DENSE, array_bytes(np.asarray(t)))
    layout_field, array_fields = _LAYOUT_FIELDS[t.layout]
    parts = [layout_field, _packed_field(_SPARSE_DENSE_SHAPE, t.dense_shape)]
    for field, attribute in array_fields:
        array = array_bytes(getattr(t, attribute))
        parts += (field.tag, _varint(len(array)), array)
    if t.blocksize:
        parts.append(_packed_field(_SPARSE_BLOCKSIZE, t.blocksize))
    if t.coalesced:
        parts.append(_COALESCED)
    return bytes_field(_TENSOR_SPARSE, b"".join(parts))


def value_bytes(v: Any) -> bytes:
    """The serialized ``Value`` message of an argument: tensors by hand, the rest by protobuf."""
    if isinstance(v, (SparseTensor, HandleRef, np.ndarray)):
        return bytes_field(_VALUE_TENSOR, tensor_bytes(v))
    return value_to_pb(v).SerializeToString()


# ------------------------------------------------------------------ argument values
def value_to_pb(v: Any) -> pb.Value:
    """A Python argument -> ``Value``. Tensor-likes must already be converted (see ``_convert``)."""
    if v is None:
        return pb.Value(null_value=True)
    if isinstance(v, (bool, np.bool_)):
        return pb.Value(bool_value=bool(v))
    if isinstance(v, int):
        return pb.Value(int_value=v)
    if isinstance(v, float):
        return pb.Value(float_value=v)
    if isinstance(v, str):
        return pb.Value(string_value=v)
    if isinstance(v, OutputRef):
        return pb.Value(ref=v.ref)
    if isinstance(v, (SparseTensor, HandleRef, np.ndarray)):
        return pb.Value(tensor=tensor_to_pb(v))
    if isinstance(v, (np.generic, complex)):
        # Scalars whose dtype matters (np.float32(1), 1+2j) travel as 0-d arrays.
        return pb.Value(tensor=tensor_to_pb(np.asarray(v)))
    if isinstance(v, (list, tuple)):
        return pb.Value(list_value=pb.ValueList(items=[value_to_pb(x) for x in v]))
    if isinstance(v, slice):  # index arguments: [start, stop, step], None for a default
        return value_to_pb([v.start, v.stop, v.step])
    if isinstance(v, dict):  # options arguments: string keys
        return pb.Value(map_value=pb.ValueMap(entries={str(k): value_to_pb(x) for k, x in v.items()}))
    raise TypeError(f"cannot send a {type(v).__name__} as an argument")


def value_from_pb(msg: pb.Value, name: str) -> Any:
    """``Value`` -> Python: scalars, lists, or decoded tensors (``tensor_from_pb``)."""
    kind = msg.WhichOneof("kind")
    if kind == "tensor":
        return tensor_from_pb(msg.tensor, name)
    if kind is None or kind == "null_value":
        return None
    if kind == "ref":
        return OutputRef(msg.ref)
    if kind == "list_value":
        return [value_from_pb(item, f"{name}[{i}]") for i, item in enumerate(msg.list_value.items)]
    if kind == "map_value":
        return {key: value_from_pb(item, f"{name}.{key}") for key, item in msg.map_value.entries.items()}
    return getattr(msg, kind)


# ------------------------------------------------------------------ chunked streams
def iter_chunks(t: SparseTensor | np.ndarray, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[bytes]:
    """The ``TensorChunk`` stream of a tensor, serialized: a header, then the array bytes back
    to back.

    Data chunks are framed by hand — the field's tag and length in front of a slice of the
    array — so each costs one copy; building and serializing protobuf messages cost three
    (bench/codec.py: the stream written 1.1-1.2x as fast at 1 MB, 1.1-2x at 100 MB).
    """
    yield pb.TensorChunk(header=tensor_to_pb(t, with_data=False)).SerializeToString()
    arrays = t.arrays() if isinstance(t, SparseTensor) else (t,)
    for a in arrays:
        flat = wire_array(a).data.cast("B") if a.size else memoryview(b"")
        for start in range(0, len(flat), chunk_bytes):
            piece = flat[start:start + chunk_bytes]
            yield b"".join((len_prefix(_CHUNK_DATA, len(piece)), piece))


def parse_chunk(frame: bytes | memoryview) -> pb.TensorChunk | memoryview:
    """A serialized ``TensorChunk``: a data-only message as a view of its bytes (no copy),
    any other message parsed by protobuf. protobuf's parse and the read of its ``data`` copy
    the chunk twice: bench/codec.py assembled the stream 1.2x as fast at 1 MB, 1.3x at 100 MB."""
    view = memoryview(frame)
    key = read_varint(view, 0)
    if key is not None and key[0] == _CHUNK_DATA.key:
        length = read_varint(view, key[1])
        if length is not None and length[1] + length[0] == len(view):
            return view[length[1]:]
    try:
        return pb.TensorChunk.FromString(view)
    except DecodeError:
        raise InvalidArgumentError("a TensorChunk of the stream is not a valid message",
                                   reason=Reason.BAD_STREAM) from None


class ChunkAssembler:
    """Rebuilds a tensor from a ``TensorChunk`` stream into exact-size buffers.

    The header is checked and the total size compared with ``max_bytes``
    before anything is allocated; each data chunk is copied once, straight to
    its place. Every array gets its own buffer so that each stays aligned for
    its dtype (the wire packs them back to back).
    """

    def __init__(self, name: str = "tensor", max_bytes: int | None = None, *,
                 limit: str = "the limit", reason: str = Reason.TENSOR_TOO_LARGE,
                 allocate: Callable[[int], np.ndarray] = new_buffer):
        self.name = name
        self.max_bytes = max_bytes
        self._allocate = allocate  # n -> an n-byte uint8 array (the server passes its pool's)
        self._limit, self._reason = limit, reason  # how the error over max_bytes names it
        self._header: pb.Tensor | None = None
        self._specs: list[tuple[str, np.dtype, tuple[int, ...]]] = []
        self._buffers: list[np.ndarray] = []
        self._current = 0   # index of the buffer being filled
        self._offset = 0    # bytes filled in that buffer

    @property
    def total_bytes(self) -> int:
        return sum(int(b.size) for b in self._buffers)

    def add(self, chunk: pb.TensorChunk | bytes | memoryview) -> None:
        """One chunk of the stream: a message, or its serialized bytes (``parse_chunk``)."""
        if not isinstance(chunk, pb.TensorChunk):
            chunk = parse_chunk(chunk)
            if isinstance(chunk, memoryview):
                self._append(chunk)
                return
        kind = chunk.WhichOneof("kind")
        if kind == "header":
            self._start(chunk.header)
        elif kind == "data":
            self._append(memoryview(chunk.data))
        else:
            raise InvalidArgumentError(f"{self.name}: empty TensorChunk", reason=Reason.BAD_STREAM)

    def _start(self, header: pb.Tensor) -> None:
        if self._header is not None:
            raise InvalidArgumentError(f"{self.name}: a second header in one stream", reason=Reason.BAD_STREAM)
        kind = header.WhichOneof("kind")
        if kind == "sparse":
            msgs = [(f, getattr(header.sparse, f)) for f in sparse_fields(header.sparse)]
        elif kind == "dense":
            msgs = [("data", header.dense)]
        else:
            raise InvalidArgumentError(f"{self.name}: the stream header must be a sparse or dense "
                                       "tensor", reason=Reason.BAD_STREAM)
        sizes = []
        for field, msg in msgs:
            if msg.data:
                raise InvalidArgumentError(f"{self.name}.{field}: a stream header carries no data",
                                           reason=Reason.BAD_STREAM)
            dtype, shape, nbytes = array_spec(msg, f"{self.name}.{field}")
            self._specs.append((field, dtype, shape))
            sizes.append(nbytes)
        if self.max_bytes is not None and sum(sizes) > self.max_bytes:
            raise ResourceExhaustedError(
                f"{self.name} would take {sum(sizes)} bytes, over {self._limit} of {self.max_bytes} bytes",
                reason=self._reason)
        self._header = header
        self._buffers = [self._allocate(n) for n in sizes]
        self._skip_full()

    def _skip_full(self) -> None:
        while self._current < len(self._buffers) and self._offset == self._buffers[self._current].size:
            self._current += 1
            self._offset = 0

    def _append(self, data: memoryview) -> None:
        if self._header is None:
            raise InvalidArgumentError(f"{self.name}: data before the header", reason=Reason.BAD_STREAM)
        src = np.frombuffer(data, dtype=np.uint8)
        while src.size:
            if self._current == len(self._buffers):
                raise InvalidArgumentError(
                    f"{self.name}: the stream sends more than the {self.total_bytes} bytes its "
                    "header announces", reason=Reason.BUFFER_LENGTH)
            buf = self._buffers[self._current]
            n = min(src.size, buf.size - self._offset)
            buf[self._offset:self._offset + n] = src[:n]
            self._offset += n
            src = src[n:]
            self._skip_full()

    def finish(self) -> SparseTensor | np.ndarray:
        if self._header is None:
            raise InvalidArgumentError(f"{self.name}: the stream has no header", reason=Reason.BAD_STREAM)
        if self._current != len(self._buffers):
            received = sum(int(b.size) for b in self._buffers[:self._current]) + self._offset
            raise InvalidArgumentError(
                f"{self.name}: the stream ended after {received} of the {self.total_bytes} bytes "
                "its header announces", reason=Reason.BUFFER_LENGTH)
        arrays = {field: array_view(buf, dtype, shape)
                  for (field, dtype, shape), buf in zip(self._specs, self._buffers, strict=True)}
        if self._header.WhichOneof("kind") == "dense":
            return arrays["data"]
        return sparse_from_arrays(self._header.sparse, arrays, self.name)


def assemble(chunks: Iterable[pb.TensorChunk | bytes], name: str = "tensor",
             max_bytes: int | None = None) -> SparseTensor | np.ndarray:
    assembler = ChunkAssembler(name, max_bytes)
    for chunk in chunks:
        assembler.add(chunk)
    return assembler.finish()
