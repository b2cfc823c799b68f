"""The hand-written protobuf path held byte for byte to protobuf's own encoder and parser.

``sparseserve.core.codec`` and ``.frames`` write and read ``Tensor``, ``Value``,
``ExecuteRequest``, ``ExecuteResponse``, ``TensorChunk`` and ``MessageFrame`` bytes
themselves, with field numbers and wire types from the generated descriptors
(``codec.WIRE_FIELDS``). Here, for drawn tensors, values, requests, replies and streams:

- every message the hand path writes is the bytes ``SerializeToString()`` gives for the same
  message built with the generated classes, and protobuf parses it back to that message.
  Two writes differ on purpose and are compared after a defined transformation: the
  ``args`` map goes out in the caller's order, where protobuf picks an order of its own
  (compared with protobuf's bytes of each field and each map entry, joined in number order
  and the caller's order), and the large-message writer pads arrays for alignment (protobuf
  parses the bytes; with the ``padding`` fields, all zero bytes, cleared, the message
  re-serializes to protobuf's own bytes);
- every message it reads, ``SerializeToString()`` output of generated messages, decodes to
  what protobuf's parser and the generated-class decoders (``tensor_from_pb``,
  ``value_from_pb``) give, and the hand reader did the work (it hands nothing to protobuf);
- raw messages with arbitrary headers, unknown and repeated fields decode to the same values
  or the same error either way;
- the tests bite: with any one field renumbered in a copy of the descriptor that the hand path
  is built from, the field table differs from protobuf's and the byte comparisons fail; and
  with every field renumbered in a copy of the .proto, the hand path built from it agrees
  with the generated classes built from it, so no number is written into the code.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import sys
import types
from typing import Any, Callable, NamedTuple
from unittest import mock

import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal import encoder, enum_type_wrapper, type_checkers, wire_format
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import sparseserve.v1
from sparseserve.core import codec, frames
from sparseserve.core.dtypes import DTYPE_NAMES
from sparseserve.core.tensor import HandleRef, OutputRef, SparseTensor, TensorInfo
from sparseserve.errors import SparseServeError
from sparseserve.v1 import sparseserve_pb2

from helpers import assert_eq
from strategies import sparse_tensors

EXAMPLES = 300
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LAYOUT_ARRAYS = {"coo": ("indices", "values")} | dict.fromkeys(
    ("csr", "csc", "bsr", "bsc"), ("compressed_indices", "plain_indices", "values"))


class HandPath(NamedTuple):
    """The hand-written modules and the generated module they were built from."""

    codec: types.ModuleType
    frames: types.ModuleType
    pb: types.ModuleType


REAL = HandPath(codec, frames, sparseserve_pb2)


# ------------------------------------------------------------------ the generated-class equivalents
def pb_array(pb: types.ModuleType, a: np.ndarray, *, with_data: bool = True) -> Message:
    a = np.asarray(a)
    little_endian = a.astype(a.dtype.newbyteorder("<"))
    return pb.Array(dtype=pb.DType.Value(a.dtype.name.upper()), shape=a.shape,
                    data=little_endian.tobytes() if with_data else b"")


def pb_tensor(pb: types.ModuleType, t: Any, *, with_data: bool = True) -> Message:
    if isinstance(t, HandleRef):
        if t.info is None:
            return pb.Tensor(handle=t.handle)
        i = t.info
        layout = {"layout": pb.Layout.Value(i.layout.upper())} if i.layout != "dense" else {"dense": True}
        return pb.Tensor(handle=t.handle, info=pb.TensorInfo(dtype=pb.DType.Value(i.dtype.name.upper()),
                                                             shape=i.shape, nnz=i.nnz, nbytes=i.nbytes, **layout))
    if not isinstance(t, SparseTensor):
        return pb.Tensor(dense=pb_array(pb, t, with_data=with_data))
    sparse = pb.SparseTensor(layout=pb.Layout.Value(t.layout.upper()), dense_shape=t.dense_shape,
                             blocksize=t.blocksize or (), coalesced=t.coalesced)
    for name in LAYOUT_ARRAYS[t.layout]:
        getattr(sparse, name).CopyFrom(pb_array(pb, getattr(t, name), with_data=with_data))
    return pb.Tensor(sparse=sparse)


def pb_value(pb: types.ModuleType, v: Any) -> Message:
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
    if isinstance(v, (list, tuple)):
        return pb.Value(list_value=pb.ValueList(items=[pb_value(pb, x) for x in v]))
    if isinstance(v, slice):
        return pb_value(pb, [v.start, v.stop, v.step])
    return pb.Value(tensor=pb_tensor(pb, np.asarray(v) if isinstance(v, (np.generic, complex)) else v))


def pb_request(pb: types.ModuleType, op: str, args: dict[str, Any], keep: bool) -> Message:
    return pb.ExecuteRequest(op=op, args={name: pb_value(pb, v) for name, v in args.items()}, keep=keep)


def pb_request_bytes(pb: types.ModuleType, op: str, args: dict[str, Any], keep: bool) -> bytes:
    """protobuf's bytes of the request with the map's entries in ``args``' order: a message's
    bytes are its fields' in number order (op, args, keep), and a one-entry map's are its entry's."""
    return b"".join([pb.ExecuteRequest(op=op).SerializeToString(),
                     *[pb.ExecuteRequest(args={name: pb_value(pb, v)}).SerializeToString() for name, v in args.items()],
                     pb.ExecuteRequest(keep=keep).SerializeToString()])


def pb_reply(pb: types.ModuleType, outputs: list[tuple[str, Any]]) -> Message:
    """A list output ``name`` of n tensors as the reply lays it out: ``name[]`` holding n as an
    int64 scalar, then ``name[0]`` ... ``name[n-1]``."""
    named = []
    for name, value in outputs:
        if isinstance(value, list):
            named.append((f"{name}[]", np.array(len(value), np.int64)))
            named += [(f"{name}[{i}]", item) for i, item in enumerate(value)]
        else:
            named.append((name, value))
    return pb.ExecuteResponse(outputs=[pb.NamedTensor(name=n, tensor=pb_tensor(pb, v)) for n, v in named])


def pb_chunks(pb: types.ModuleType, t: Any, chunk_bytes: int) -> list[bytes]:
    chunks = [pb.TensorChunk(header=pb_tensor(pb, t, with_data=False)).SerializeToString()]
    for array in (t.arrays() if isinstance(t, SparseTensor) else (t,)):
        data = pb_array(pb, array).data
        chunks += [pb.TensorChunk(data=data[i:i + chunk_bytes]).SerializeToString()
                   for i in range(0, len(data), chunk_bytes)]
    return chunks


def pb_frames(pb: types.ModuleType, message: bytes, frame_bytes: int) -> list[bytes]:
    if not message:
        return [pb.MessageFrame().SerializeToString()]
    return [pb.MessageFrame(total_bytes=0 if i else len(message), data=message[i:i + frame_bytes]).SerializeToString()
            for i in range(0, len(message), frame_bytes)]


def without_padding(msg: Message) -> Message:
    """``msg`` with every ``Array.padding`` cleared, after checking it holds zero bytes only."""
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        items = value.values() if field.message_type.GetOptions().map_entry else (
            value if field.is_repeated else [value])
        for item in items:
            if isinstance(item, Message):
                without_padding(item)
    if msg.DESCRIPTOR.name == "Array":
        assert not msg.padding.strip(b"\0"), "padding holds more than zero bytes"
        msg.ClearField("padding")
    return msg


def assert_same_message(pb_class: type[Message], hand: bytes, want: Message, *, padded: bool = False) -> None:
    """The transformation for the writes that differ on purpose: protobuf parses ``hand``
    to a message that (its padding cleared) re-serializes to ``want``'s bytes."""
    parsed = pb_class.FromString(hand)
    if padded:
        without_padding(parsed)
    assert parsed.SerializeToString(deterministic=True) == want.SerializeToString(deterministic=True)


# ------------------------------------------------------------------ comparing decoded values
def assert_same(got: Any, want: Any) -> None:
    """Equal decoded values: the same types; tensors with the same structure, flags, dtypes and
    bytes; containers of such values."""
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, (SparseTensor, np.ndarray)):
        assert_eq(got, want, bitwise=True, coalesced=True)
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    elif isinstance(want, dict):
        assert sorted(got) == sorted(want)  # protobuf's map iterates in an order of its own
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, float):
        assert got == want or (math.isnan(got) and math.isnan(want))
    else:
        assert got == want
        if isinstance(want, HandleRef):  # its equality leaves the description out
            assert got.info == want.info


def outcome(decode: Callable[[], Any]) -> Any:
    """What ``decode`` gives, or the class and reason of the error it raises."""
    try:
        return decode()
    except SparseServeError as error:
        return type(error), error.reason


def assert_same_outcome(got: Callable[[], Any], want: Callable[[], Any]) -> None:
    assert_same(outcome(got), outcome(want))


def decoded_arrays(t: Any) -> list[np.ndarray]:
    if isinstance(t, np.ndarray):
        return [t] if t.size else []
    if isinstance(t, SparseTensor):
        return [a for a in t.arrays() if a.size]
    return []


# ------------------------------------------------------------------ the checks, per message type
def check_tensor_written(hp: HandPath, t: Any) -> None:
    """``Tensor`` and ``Value``: the small-message writer (protobuf's bytes) and the large one
    (protobuf's message once padding is cleared; arrays 16-byte aligned)."""
    want = pb_tensor(hp.pb, t)
    assert hp.codec.tensor_bytes(t) == want.SerializeToString()
    assert hp.codec.value_bytes(t) == hp.pb.Value(tensor=want).SerializeToString()
    padded = hp.codec.tensor_to_bytes(t)
    assert_same_message(hp.pb.Tensor, padded, want, padded=True)
    for array in decoded_arrays(outcome(lambda: hp.codec.tensor_from_bytes(padded, "t"))):
        assert array.ctypes.data % 16 == 0 and array.base is not None, "copied or unaligned"


def check_tensor_read(hp: HandPath, body: bytes) -> None:
    """``Tensor``: the hand reader takes protobuf's bytes apart and decodes what protobuf does
    (or refuses them as the generated-class decoder does)."""
    want = outcome(lambda: hp.codec.tensor_from_pb(hp.pb.Tensor.FromString(body), "t"))
    if isinstance(want, (SparseTensor, np.ndarray)):  # handles are left to protobuf
        assert hp.codec._tensor_from_view(memoryview(body), "t") is not None, "handed to protobuf"
    assert_same(outcome(lambda: hp.codec.tensor_from_bytes(body, "t")), want)


def check_value_written(hp: HandPath, v: Any) -> None:
    assert hp.codec.value_bytes(v) == pb_value(hp.pb, v).SerializeToString()


def check_request_written(hp: HandPath, op: str, args: dict[str, Any], keep: bool) -> None:
    """``ExecuteRequest``, small (every tensor written unpadded) and large (every tensor padded)."""
    want = pb_request(hp.pb, op, args, keep)
    hand = hp.frames.execute_request_bytes(op, args, keep)
    assert hand == pb_request_bytes(hp.pb, op, args, keep)
    assert_same_message(hp.pb.ExecuteRequest, hand, want)
    with mock.patch.object(hp.frames, "FRAME_BYTES", 0):
        assert_same_message(hp.pb.ExecuteRequest, hp.frames.execute_request_bytes(op, args, keep), want, padded=True)


def protobuf_request(hp: HandPath, body: bytes) -> tuple[str, dict[str, Any], bool]:
    msg = hp.pb.ExecuteRequest.FromString(body)
    return msg.op, {name: hp.codec.value_from_pb(v, name) for name, v in msg.args.items()}, msg.keep


def check_request_read(hp: HandPath, body: bytes) -> None:
    want = outcome(lambda: protobuf_request(hp, body))
    # A DecodeError out of the hand reader means it would have handed the message to protobuf.
    got = [outcome(lambda: hp.frames._request_from_view(memoryview(body)))]
    with mock.patch.object(hp.frames, "FRAME_BYTES", 0):
        got.append(outcome(lambda: hp.frames.execute_request_from_bytes(body)))
    refusals = argument_refusals(hp, body)
    for result in got:
        if len(refusals) > 1 and result in refusals:
            continue  # several bad arguments: which is named first is not specified (the hand reader
            # reads them in wire order, protobuf's map in an order of its own)
        assert_same(result, want)


def argument_refusals(hp: HandPath, body: bytes) -> list[tuple[type, str]]:
    """The error of each argument protobuf's path refuses, decoded alone."""
    try:
        args = hp.pb.ExecuteRequest.FromString(body).args
    except Exception:  # not a message protobuf reads: no argument to name
        return []
    found = []
    for name, value in args.items():
        refused = outcome(functools.partial(hp.codec.value_from_pb, value, name))
        if isinstance(refused, tuple) and len(refused) == 2 and isinstance(refused[0], type):
            found.append(refused)
    return found


def check_reply_written(hp: HandPath, outputs: list[tuple[str, Any]]) -> None:
    want = pb_reply(hp.pb, outputs)
    assert hp.frames.outputs_to_bytes(outputs) == want.SerializeToString()
    with mock.patch.object(hp.frames, "FRAME_BYTES", 0):
        assert_same_message(hp.pb.ExecuteResponse, hp.frames.outputs_to_bytes(outputs), want, padded=True)


def check_progress_result_written(hp: HandPath, outputs: list[tuple[str, Any]]) -> None:
    want = hp.pb.ExecuteProgress(result=pb_reply(hp.pb, outputs))
    assert hp.frames.progress_result_bytes(outputs) == want.SerializeToString()


def check_progress_read(hp: HandPath, outputs: list[tuple[str, Any]]) -> None:
    """Both kinds of ExecuteProgress, as protobuf writes them, read back."""
    result = hp.pb.ExecuteProgress(result=pb_reply(hp.pb, outputs)).SerializeToString()
    assert_same(hp.frames.progress_message_from_bytes(result), hp.frames.grouped_outputs(
        [(o.name, hp.codec.tensor_from_pb(o.tensor, o.name)) for o in pb_reply(hp.pb, outputs).outputs]))
    for residual in (0.25, None):
        report = hp.pb.Progress(op="cg", iteration=7, residual_norm=residual)
        body = hp.pb.ExecuteProgress(progress=report).SerializeToString()
        assert hp.frames.progress_message_from_bytes(body) == {"op": "cg", "iteration": 7, "residual_norm": residual}


def check_reply_read(hp: HandPath, body: bytes) -> None:
    msg = hp.pb.ExecuteResponse.FromString(body)
    want = outcome(lambda: [(o.name, hp.codec.tensor_from_pb(o.tensor, o.name)) for o in msg.outputs])
    hand = outcome(lambda: hp.frames._outputs_from_view(memoryview(body)))
    assert hand is not None, "handed to protobuf"
    assert_same(hand, want)
    with mock.patch.object(hp.frames, "FRAME_BYTES", 0):
        assert_same(outcome(lambda: hp.frames.outputs_from_bytes(body)),
                    outcome(lambda: hp.frames.grouped_outputs(want)) if isinstance(want, list) else want)


def check_chunks_written(hp: HandPath, t: Any, chunk_bytes: int) -> None:
    assert list(hp.codec.iter_chunks(t, chunk_bytes)) == pb_chunks(hp.pb, t, chunk_bytes)


def check_chunks_read(hp: HandPath, t: Any, chunk_bytes: int) -> None:
    chunks = pb_chunks(hp.pb, t, chunk_bytes)
    for chunk in chunks:
        parsed = hp.codec.parse_chunk(chunk)
        want = hp.pb.TensorChunk.FromString(chunk)
        if want.WhichOneof("kind") == "data":
            assert isinstance(parsed, memoryview), "handed to protobuf"
            assert bytes(parsed) == want.data
        else:
            assert parsed == want
    assert_same(outcome(lambda: hp.codec.assemble(chunks, "t")),
                outcome(lambda: hp.codec.assemble(map(hp.pb.TensorChunk.FromString, chunks), "t")))


def check_frames_written(hp: HandPath, pieces: list[bytes], frame_bytes: int) -> None:
    assert list(hp.frames.message_frames(pieces, frame_bytes)) == pb_frames(hp.pb, b"".join(pieces), frame_bytes)


def check_frames_read(hp: HandPath, message: bytes, frame_bytes: int) -> None:
    stream = pb_frames(hp.pb, message, frame_bytes)
    assert bytes(hp.frames.assemble_message(stream, "m")) == message == \
        b"".join(hp.pb.MessageFrame.FromString(f).data for f in stream)


# ------------------------------------------------------------------ strategies
def as_handed_over(a: np.ndarray) -> st.SearchStrategy[np.ndarray]:
    """``a`` as a caller may hand it over: C order or not, either byte order."""
    def lay_out(memory: str) -> np.ndarray:
        if memory == "big-endian":
            return a.astype(a.dtype.newbyteorder(">"))
        if memory == "Fortran":
            return np.asfortranarray(a)
        if memory == "strided" and a.ndim:
            return np.repeat(a, 2, axis=-1)[..., ::2]
        return a

    return st.sampled_from(["C", "big-endian", "Fortran", "strided"]).map(lay_out)


# Any bits (NaN payloads, -0.0): the arrays must arrive byte for byte.
dense_arrays = st.sampled_from(DTYPE_NAMES).flatmap(
    lambda dtype: hnp.arrays(np.dtype(dtype), hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=3))
).flatmap(as_handed_over)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)


@st.composite
def wire_sparse_tensors(draw: st.DrawFn) -> SparseTensor:
    """The shared ``sparse_tensors`` (every layout and dtype, ranks, batches, hybrid, empty) as
    callers may hand them over: arrays in any memory layout, either coalesced flag, and one
    time in four a dense_shape of any int64s (negative, overflowing: refused by the decoders,
    written all the same)."""
    t = draw(sparse_tensors())
    arrays = {name: draw(as_handed_over(getattr(t, name))) for name in LAYOUT_ARRAYS[t.layout]}
    wild = draw(st.sampled_from([False, False, False, True]))
    dense_shape = draw(st.lists(INT64, min_size=t.ndim, max_size=t.ndim)) if wild else t.dense_shape
    return SparseTensor(layout=t.layout, dense_shape=dense_shape, blocksize=t.blocksize,
                        coalesced=draw(st.booleans()), **arrays)


# A kept output's handle carries what it holds (TensorInfo); an argument's need not.
tensor_infos = st.builds(TensorInfo, st.sampled_from([*LAYOUT_ARRAYS, "dense"]),
                         st.sampled_from(DTYPE_NAMES).map(np.dtype), st.lists(INT64, max_size=4).map(tuple),
                         INT64, INT64)
handles = st.builds(HandleRef, st.text(), st.none() | tensor_infos)
tensors = st.one_of(wire_sparse_tensors(), dense_arrays, handles)
scalars = st.one_of(st.none(), st.booleans(), INT64, st.floats(), st.text(), st.complex_numbers(),
                    st.builds(OutputRef, st.text()), st.builds(np.float32, st.floats(width=32)),
                    st.builds(slice, st.none() | INT64, st.none() | INT64, st.none() | INT64))
values = st.recursive(st.one_of(scalars, tensors), lambda inner: st.lists(inner, max_size=3), max_leaves=6)
outputs = st.lists(st.tuples(st.text(), tensors | st.lists(tensors, max_size=3)), max_size=4)


@st.composite
def split_message(draw: st.DrawFn) -> list[bytes]:
    """A message as the pieces a writer hands ``message_frames``."""
    message = draw(st.binary(max_size=64))
    cuts = sorted(draw(st.lists(st.integers(0, len(message)), max_size=3)))
    return [message[a:b] for a, b in zip([0, *cuts], [*cuts, len(message)], strict=True)]


# ------------------------------------------------------------------ the drawn comparisons
@SETTINGS
@given(tensors)
def test_tensor_writers_write_protobufs_bytes(t):
    check_tensor_written(REAL, t)


@SETTINGS
@given(tensors)
def test_tensor_reader_decodes_what_protobuf_does(t):
    check_tensor_read(REAL, pb_tensor(sparseserve_pb2, t).SerializeToString())
    check_tensor_read(REAL, codec.tensor_to_bytes(t))  # the padded writer's bytes too


@SETTINGS
@given(values)
def test_value_writer_writes_protobufs_bytes(v):
    check_value_written(REAL, v)


@SETTINGS
@given(st.text(), st.dictionaries(st.text(), values, max_size=4), st.booleans())
def test_request_writer_writes_protobufs_message(op, args, keep):
    check_request_written(REAL, op, args, keep)


@SETTINGS
@given(st.text(), st.dictionaries(st.text(), values, max_size=4), st.booleans())
def test_request_reader_decodes_what_protobuf_does(op, args, keep):
    check_request_read(REAL, pb_request(sparseserve_pb2, op, args, keep).SerializeToString())


@SETTINGS
@given(outputs)
def test_reply_writer_writes_protobufs_bytes(named):
    check_reply_written(REAL, named)


@SETTINGS
@given(outputs)
def test_reply_reader_decodes_what_protobuf_does(named):
    check_reply_read(REAL, pb_reply(sparseserve_pb2, named).SerializeToString())


@SETTINGS
@given(tensors.filter(lambda t: not isinstance(t, HandleRef)), st.integers(1, 40))
def test_chunk_streams_are_protobufs_both_ways(t, chunk_bytes):
    check_chunks_written(REAL, t, chunk_bytes)
    check_chunks_read(REAL, t, chunk_bytes)


@SETTINGS
@given(split_message(), st.integers(1, 20))
def test_message_frames_are_protobufs_both_ways(pieces, frame_bytes):
    check_frames_written(REAL, pieces, frame_bytes)
    check_frames_read(REAL, b"".join(pieces), frame_bytes)


# ------------------------------------------------------------------ untrusted messages
@st.composite
def raw_arrays(draw: st.DrawFn) -> Message:
    """An ``Array`` header of any dtype code and shape, with its byte count right, or one off."""
    pb = sparseserve_pb2
    dtype = draw(st.integers(0, 16))  # 0 and past 14: no dtype
    shape = draw(st.lists(st.integers(-1, 3), max_size=3))
    itemsize = np.dtype(pb.DType.Name(dtype).lower()).itemsize if 0 < dtype <= 14 else 1
    expected = math.prod(shape) * itemsize if min(shape, default=0) >= 0 else 0
    return pb.Array(dtype=dtype, shape=shape, data=bytes(max(0, expected + draw(st.sampled_from([0, 0, -1, 1])))))


@st.composite
def raw_tensors(draw: st.DrawFn) -> Message:
    pb = sparseserve_pb2
    kind = draw(st.sampled_from(["sparse", "dense", "handle", "empty"]))
    if kind == "dense":
        return pb.Tensor(dense=draw(raw_arrays()))
    if kind == "handle":
        return pb.Tensor(handle=draw(st.text()))
    if kind == "empty":
        return pb.Tensor()
    sparse = pb.SparseTensor(layout=draw(st.integers(0, 6)), dense_shape=draw(st.lists(st.integers(-1, 4), max_size=4)),
                             blocksize=draw(st.lists(st.integers(0, 2), max_size=2)), coalesced=draw(st.booleans()))
    for name in draw(st.sets(st.sampled_from(["indices", "values", "compressed_indices", "plain_indices"]))):
        getattr(sparse, name).CopyFrom(draw(raw_arrays()))
    return pb.Tensor(sparse=sparse)


# Field 9 as a varint and field 14 as empty bytes: numbers no message here uses.
UNKNOWN_FIELDS = [b"", b"\x48\x01", b"\x72\x00"]


@SETTINGS
@given(raw_tensors(), st.sampled_from(UNKNOWN_FIELDS), st.integers(1, 2))
def test_untrusted_tensor_bodies_decode_as_protobuf_decodes_them(msg, unknown, times):
    """Unknown fields, repeated (merged) messages, bad headers: the same value or error either way."""
    body = (msg.SerializeToString() + unknown) * times
    assert_same_outcome(lambda: codec.tensor_from_bytes(body, "t"),
                        lambda: codec.tensor_from_pb(sparseserve_pb2.Tensor.FromString(body), "t"))


@SETTINGS
@given(st.text(), st.text(), raw_tensors(), st.dictionaries(st.text(), INT64, max_size=2), st.booleans(),
       st.sampled_from(UNKNOWN_FIELDS))
def test_untrusted_requests_decode_as_protobuf_decodes_them(op, name, tensor, scalars, keep, unknown):
    """One tensor argument: of two bad ones, each decoder may name either (protobuf iterates a
    map in an order of its own)."""
    pb = sparseserve_pb2
    args = {k: pb.Value(int_value=v) for k, v in scalars.items()} | {name: pb.Value(tensor=tensor)}
    body = pb.ExecuteRequest(op=op, args=args, keep=keep).SerializeToString() + unknown
    with mock.patch.object(frames, "FRAME_BYTES", 0):
        assert_same_outcome(lambda: frames.execute_request_from_bytes(body), lambda: protobuf_request(REAL, body))


# ------------------------------------------------------------------ the field table and the proof the tests bite
def descriptor_errors(fields: dict[str, codec.WireField]) -> list[str]:
    """The paths whose number, wire type or tag differs from protobuf's own reading of the
    descriptors (its internal encoder's, independent of ``codec.wire_field``)."""
    errors = []
    for path, field in fields.items():
        message, *names = path.split(".")
        descriptor = sparseserve_pb2.DESCRIPTOR.message_types_by_name[message]
        for name in names[:-1]:
            descriptor = descriptor.fields_by_name[name].message_type
        want = descriptor.fields_by_name[names[-1]]
        wire_type = (wire_format.WIRETYPE_LENGTH_DELIMITED if want.is_packed
                     else type_checkers.FIELD_TYPE_TO_WIRE_TYPE[want.type])
        if field != (want.number, wire_type, want.number << 3 | wire_type, encoder.TagBytes(want.number, wire_type)):
            errors.append(path)
    return errors


def test_the_hand_paths_field_table_is_the_descriptors():
    assert descriptor_errors(codec.WIRE_FIELDS) == []
    messages = {path.split(".")[0] for path in codec.WIRE_FIELDS}
    assert messages == {"Tensor", "SparseTensor", "Array", "Value", "TensorChunk", "ExecuteRequest",
                        "ExecuteResponse", "NamedTensor", "MessageFrame", "ExecuteProgress"}


COO = SparseTensor(indices=np.array([[0, 1], [2, 0]]), values=np.arange(4.0).reshape(2, 2), dense_shape=[3, 2, 2],
                   coalesced=True)
BSR = SparseTensor(layout="bsr", compressed_indices=np.array([[0, 1, 1], [0, 0, 1]], np.int32),
                   plain_indices=np.array([[1], [0]], np.int32), values=np.ones((2, 1, 2, 2), np.complex64),
                   dense_shape=[2, 4, 4], blocksize=[2, 2])
SAMPLES = [COO, BSR, np.arange(6, dtype=np.int16).reshape(2, 3), np.float32(2.5), HandleRef("h-1"),
           HandleRef("h-4", TensorInfo("csr", np.dtype(np.complex64), (3, 4), 5, 120)),
           HandleRef("h-5", TensorInfo("dense", np.dtype(np.uint16), (2, 0), 0, 0))]


def failed_checks(hp: HandPath) -> list[str]:
    """The fixed examples that reach every field of the table, through every check above:
    the names of those that fail."""
    request = {"a": 2.5, "handle": HandleRef("h-2"), "sp_input": COO, "x": BSR}
    reply = [("output", COO), ("", SAMPLES[2]), ("parts", [BSR, HandleRef("h-3")])]
    checks: list[tuple[str, Callable[..., None], tuple]] = [
        ("request written", check_request_written, (hp, "mul", request, True)),
        ("request read", check_request_read, (hp, pb_request(hp.pb, "mul", request, True).SerializeToString())),
        ("reply written", check_reply_written, (hp, reply)),
        ("reply read", check_reply_read, (hp, pb_reply(hp.pb, reply).SerializeToString())),
        ("progress result written", check_progress_result_written, (hp, reply)),
        ("progress read", check_progress_read, (hp, reply)),
        ("frames written", check_frames_written, (hp, [b"abc", b"defgh"], 3)),
        ("frames read", check_frames_read, (hp, b"abcdefgh", 3)),
    ]
    for i, t in enumerate(SAMPLES):
        checks += [(f"tensor {i} written", check_tensor_written, (hp, t)),
                   (f"tensor {i} read", check_tensor_read, (hp, pb_tensor(hp.pb, t).SerializeToString()))]
        if not isinstance(t, HandleRef):
            checks += [(f"tensor {i} chunks written", check_chunks_written, (hp, t, 8)),
                       (f"tensor {i} chunks read", check_chunks_read, (hp, t, 8))]
    failed = []
    for name, check, args in checks:
        try:
            check(*args)
        except Exception:  # an assertion, or whatever a mismatched hand path raises
            failed.append(name)
    return failed


def test_the_fixed_examples_pass():
    assert failed_checks(REAL) == []


def _module_copy(name: str) -> types.ModuleType:
    """A fresh copy of the module ``name``, run from its source now."""
    found = importlib.util.find_spec(name)
    assert found is not None and found.origin is not None
    spec = importlib.util.spec_from_file_location(name, found.origin)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hand_path_built_from(pb: types.ModuleType) -> HandPath:
    """Copies of codec and frames that import ``pb`` as their generated module."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sparseserve.v1, "sparseserve_pb2", pb)
        codec_copy = _module_copy("sparseserve.core.codec")
        patch.setitem(sys.modules, "sparseserve.core.codec", codec_copy)  # what the copy of frames imports
        return HandPath(codec_copy, _module_copy("sparseserve.core.frames"), pb)


def renumbered_proto(renumber: Callable[[str, int], int]) -> descriptor_pb2.FileDescriptorProto:
    """sparseserve.proto's descriptor with each field ``path`` (as ``WIRE_FIELDS`` names it)
    numbered ``renumber(path, number)``."""
    proto = descriptor_pb2.FileDescriptorProto()
    sparseserve_pb2.DESCRIPTOR.CopyToProto(proto)

    def walk(message: descriptor_pb2.DescriptorProto, path: str, nested: dict[str, str]) -> None:
        for field in message.field:
            field.number = renumber(f"{path}.{field.name}", field.number)
            entry = nested.get(field.type_name.rsplit(".", 1)[-1])
            if entry is not None:  # a map's entry type, named by the map field in WIRE_FIELDS
                walk(next(m for m in message.nested_type if m.name == entry), f"{path}.{field.name}", {})

    for message in proto.message_type:
        walk(message, message.name, {m.name: m.name for m in message.nested_type})
    return proto


def pb_module(proto: descriptor_pb2.FileDescriptorProto, classes_too: bool) -> types.ModuleType:
    """A stand-in for sparseserve_pb2 whose DESCRIPTOR is ``proto``'s; its message classes and
    enums built from it too (``classes_too``) or the real ones."""
    pool = descriptor_pool.DescriptorPool()
    file = pool.AddSerializedFile(proto.SerializeToString())
    module = types.ModuleType("sparseserve_pb2_copy")
    module.__dict__.update({k: v for k, v in vars(sparseserve_pb2).items() if not k.startswith("__")}
                           | {"DESCRIPTOR": file})
    if classes_too:
        for full_name, cls in message_factory.GetMessageClassesForFiles([file.name], pool).items():
            setattr(module, full_name.rsplit(".", 1)[-1], cls)
        for enum in file.enum_types_by_name.values():
            setattr(module, enum.name, enum_type_wrapper.EnumTypeWrapper(enum))
            module.__dict__.update({value.name: value.number for value in enum.values})
    return module


@pytest.mark.parametrize("path", sorted(codec.WIRE_FIELDS))
def test_a_field_renumbered_in_the_descriptor_fails_the_comparisons(path):
    """The hand path built from a descriptor where ``path`` has another number (14: free in
    every message here) no longer matches protobuf: its field table says so, and the byte
    comparisons fail on the examples."""
    copy = hand_path_built_from(pb_module(renumbered_proto(lambda p, n: 14 if p == path else n), classes_too=False))
    copy = copy._replace(pb=sparseserve_pb2)  # compared with the real generated classes
    assert descriptor_errors(copy.codec.WIRE_FIELDS) == [path]
    assert failed_checks(copy) != []


def test_a_proto_with_every_field_renumbered_gives_a_hand_path_that_agrees_with_its_classes():
    """Every number plus 100 (two-byte tags): nothing in the hand path stays at the old numbers.
    Not a map entry's key and value: protobuf's wire format numbers them 1 and 2 whatever the
    descriptor says (upb writes them so)."""
    def renumber(path: str, number: int) -> int:
        return number if path.count(".") == 2 else number + 100

    renumbered = hand_path_built_from(pb_module(renumbered_proto(renumber), classes_too=True))
    assert renumbered.pb.Tensor.DESCRIPTOR.fields_by_name["sparse"].number == 101
    assert failed_checks(renumbered) == []
    assert failed_checks(renumbered._replace(pb=sparseserve_pb2)) != []
