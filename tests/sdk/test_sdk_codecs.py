"""Protobuf and JSON codecs and the chunked stream framing: round trips for
every dtype and layout, and malformed input refused with the argument named."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sparseserve import SparseTensor
from sparseserve.core.codec import (ChunkAssembler, array_from_pb, assemble, iter_chunks, parse_chunk, tensor_bytes,
                                tensor_from_bytes, tensor_from_pb, tensor_to_bytes, tensor_to_pb, value_bytes,
                                value_from_pb, value_to_pb)
from sparseserve.core.dtypes import DTYPE_NAMES
from sparseserve.core.frames import (MessageAssembler, assemble_message, execute_request_bytes,
                                     execute_request_from_bytes, execute_request_pieces, message_frames,
                                     outputs_from_bytes, outputs_to_bytes)
from sparseserve.core import jsoncodec
from sparseserve.core.jsoncodec import tensor_from_json, tensor_to_json
from sparseserve.core.tensor import HandleRef
from sparseserve.errors import InvalidArgumentError, ResourceExhaustedError
from sparseserve.v1 import sparseserve_pb2 as pb


def sample_values(dtype: str, shape) -> np.ndarray:
    rng = np.random.default_rng(0)
    raw = rng.integers(-3, 4, size=shape)
    if dtype == "bool":
        return raw > 0
    if dtype.startswith("uint"):
        return np.abs(raw).astype(dtype)
    if dtype.startswith("complex"):
        return (raw + 1j * rng.integers(-3, 4, size=shape)).astype(dtype)
    return raw.astype(dtype)


def coo_sample(dtype: str, dense_dims=()) -> SparseTensor:
    return SparseTensor(indices=[[2, 1], [0, 3], [2, 1]], values=sample_values(dtype, (3, *dense_dims)),
                        dense_shape=[4, 5, *dense_dims])


def csr_sample(dtype: str, index_dtype="int32") -> SparseTensor:
    return SparseTensor(layout="csr", compressed_indices=np.array([0, 1, 1, 3], index_dtype),
                        plain_indices=np.array([2, 0, 1], index_dtype), values=sample_values(dtype, (3,)),
                        dense_shape=[3, 4])


def bsr_sample(dtype: str) -> SparseTensor:
    # batch of 2, 4x4 blocks of 2x2, 1 block per batch, dense dim 3
    return SparseTensor(layout="bsr", compressed_indices=np.array([[0, 1, 1], [0, 0, 1]]),
                        plain_indices=np.array([[1], [0]]), values=sample_values(dtype, (2, 1, 2, 2, 3)),
                        dense_shape=[2, 4, 4, 3], blocksize=[2, 2])


def assert_same(a, b):
    if isinstance(a, SparseTensor):
        assert isinstance(b, SparseTensor)
        assert (a.layout, a.dense_shape, a.blocksize) == (b.layout, b.dense_shape, b.blocksize)
        for x, y in zip(a.arrays(), b.arrays(), strict=True):
            assert x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_array_equal(x, y)
    else:
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


SAMPLES = {"coo": coo_sample, "coo-hybrid": lambda d: coo_sample(d, (2,)), "csr": csr_sample,
           "bsr-batched": bsr_sample, "dense": lambda d: sample_values(d, (2, 3))}


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("kind", SAMPLES)
def test_protobuf_round_trip(dtype, kind):
    t = SAMPLES[kind](dtype)
    wire = pb.Tensor.FromString(tensor_to_pb(t).SerializeToString())
    assert_same(t, tensor_from_pb(wire, "t"))


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("kind", SAMPLES)
def test_json_round_trip(dtype, kind):
    t = SAMPLES[kind](dtype)
    assert_same(t, tensor_from_json(json.loads(json.dumps(tensor_to_json(t))), "t"))


@pytest.mark.parametrize("kind", SAMPLES)
@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_chunked_round_trip(kind, chunk):
    t = SAMPLES[kind]("complex128")
    assert_same(t, assemble(iter_chunks(t, chunk)))


ODD_TENSORS = {
    "empty-coo-huge-dim": SparseTensor(indices=np.zeros((0, 3), np.int64), values=np.zeros(0, np.float32),
                                       dense_shape=[0, 5, 2**40], coalesced=True),
    "negative-dim": SparseTensor(indices=[[0]], values=[[1 + 2j, 3]], dense_shape=[-3, 2]),
    "0-d": np.float32(3), "empty-dense": np.zeros((0, 4), bool), "big-endian": np.arange(4, dtype=">i4"),
    "strided": np.arange(6.0)[::2], "handle": HandleRef("h-123"), "empty-handle": HandleRef(""),
}


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("kind", SAMPLES)
def test_hand_encoder_writes_protobufs_bytes(dtype, kind):
    """Small tensors are written without protobuf messages; the bytes are protobuf's own."""
    t = SAMPLES[kind](dtype)
    assert tensor_bytes(t) == tensor_to_pb(t).SerializeToString()
    assert value_bytes(t) == value_to_pb(t).SerializeToString()


@pytest.mark.parametrize("name", ODD_TENSORS)
def test_hand_encoder_on_edge_cases(name):
    t = ODD_TENSORS[name]
    assert tensor_bytes(t) == tensor_to_pb(t).SerializeToString()


@pytest.mark.parametrize("value", [None, True, 3, -2**63, 2.5, "x", [1, [2.0, None]], slice(1, None, 2), 1 + 2j])
def test_value_bytes_of_scalars_and_lists(value):
    assert value_bytes(value) == value_to_pb(value).SerializeToString()


def test_decoded_arrays_are_views_of_the_message_bytes():
    values = np.arange(1000, dtype=np.float64)
    msg = pb.Tensor.FromString(tensor_to_pb(values).SerializeToString())
    decoded = tensor_from_pb(msg, "t")
    assert not decoded.flags.owndata  # np.frombuffer, no per-element decode


def test_big_endian_input_is_sent_little_endian():
    a = np.arange(4, dtype=">i4")
    msg = tensor_to_pb(a)
    assert msg.dense.data == np.arange(4, dtype="<i4").tobytes()
    np.testing.assert_array_equal(tensor_from_pb(msg, "t"), a)


def test_json_non_finite_and_complex_conventions():
    t = SparseTensor(indices=[[0], [1], [2]], values=np.array([np.nan, np.inf, -np.inf]), dense_shape=[3])
    body = tensor_to_json(t)
    assert body["values"] == ["NaN", "Infinity", "-Infinity"]
    back = tensor_from_json(body, "t")
    assert np.isnan(back.values[0]) and back.values[1] == np.inf and back.values[2] == -np.inf
    c = tensor_to_json(np.array([1 + 2j], dtype=np.complex64))
    assert c == {"dtype": "complex64", "shape": [1], "data": [[1.0, 2.0]]}


@pytest.mark.parametrize("with_orjson", [True, False], ids=["orjson", "standard-library"])
def test_json_text_is_the_same_with_or_without_orjson(monkeypatch, with_orjson):
    """The server writes and reads JSON with orjson; the SDK with it where installed, else the
    standard library. Either way the same values, and what orjson refuses (integers past 64
    bits, NaN literals, deep nesting) read and written as the standard library does."""
    if not with_orjson:
        monkeypatch.setattr(jsoncodec, "orjson", None)
    st = SparseTensor(indices=[[0, 1], [2, 3]], values=[np.nan, -np.inf], dense_shape=[3, 4])
    value = {"sp_input": tensor_to_json(st), "axis": [1, None, -2], "name": "é", "big": 2 ** 70}
    text = jsoncodec.dumps(value)
    assert isinstance(text, bytes) and json.loads(text) == value
    assert jsoncodec.loads(text) == jsoncodec.loads(memoryview(text)) == value
    back = tensor_from_json(jsoncodec.loads(text)["sp_input"], "sp_input")
    assert np.isnan(back.values[0]) and back.values[1] == -np.inf
    assert jsoncodec.loads(b'[NaN, 1e400, 123456789012345678901234567890]')[2] == 123456789012345678901234567890
    with pytest.raises(RecursionError):
        jsoncodec.loads(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(ValueError, match="Expecting"):  # the standard library's message
        jsoncodec.loads(b'{"a": }')


def test_json_dtype_inferred_and_empty_forms():
    t = tensor_from_json({"indices": [[0, 0], [1, 2]], "values": [1, 2], "dense_shape": [3, 4]}, "sp")
    assert t.values.dtype == np.int64 and t.indices.shape == (2, 2)
    empty = tensor_from_json({"indices": [], "values": [], "dense_shape": [3, 4], "dtype": "float32"}, "sp")
    assert empty.indices.shape == (0, 2) and empty.values.shape == (0,) and empty.dtype == np.float32
    assert_same(tensor_from_json([[1, 2], [3, 4]], "d"), np.array([[1, 2], [3, 4]]))
    assert tensor_from_json({"handle": "h-1"}, "x") == HandleRef("h-1")


@pytest.mark.parametrize("body, reason, words", [
    ({"indices": [[0]], "values": [1.5], "dense_shape": [3], "dtype": "int32"}, "BAD_JSON_TENSOR", "sp.values"),
    ({"indices": [[0]], "values": [300], "dense_shape": [3], "dtype": "int8"}, "BAD_JSON_TENSOR", "int8"),
    ({"indices": [[0]], "values": [1], "dense_shape": [3], "dtype": "str"}, "BAD_DTYPE", "sp.dtype"),
    ({"indices": [[0.5]], "values": [1], "dense_shape": [3]}, "INDEX_DTYPE", "sp.indices"),
    ({"indices": [[0]], "values": [1], "dense_shape": "3"}, "BAD_JSON_TENSOR", "sp.dense_shape"),
    ({"indices": [[0]], "values": [[1], [2, 3]], "dense_shape": [3]}, "BAD_JSON_TENSOR", "sp.values"),
    ({"dtype": "float64", "shape": [2, 2], "data": [1, 2, 3]}, "BUFFER_LENGTH", "sp.data"),
    ({"indices": [[0]], "values": [1], "dense_shape": [3], "layout": "dia"}, "BAD_LAYOUT", "sp.layout"),
    ({"shape": [1]}, "BAD_JSON_TENSOR", "sp is not a tensor"),
])
def test_json_malformed(body, reason, words):
    with pytest.raises(InvalidArgumentError) as info:
        tensor_from_json(body, "sp")
    assert info.value.reason == reason
    assert words in info.value.message


def test_protobuf_buffer_length_checked():
    msg = pb.Array(dtype=pb.FLOAT64, shape=[3], data=b"\0" * 23)
    message = r"x.data has 23 bytes but dtype float64 and shape \[3\] imply 24"
    with pytest.raises(InvalidArgumentError, match=message) as info:
        array_from_pb(msg, "x")
    assert info.value.reason == "BUFFER_LENGTH"


@pytest.mark.parametrize("msg, reason", [
    (pb.Array(dtype=pb.DTYPE_UNSPECIFIED, shape=[1], data=b"\0"), "BAD_DTYPE"),
    (pb.Array(dtype=pb.INT8, shape=[-1], data=b""), "NEGATIVE_DIMENSION"),
    (pb.Array(dtype=pb.INT8, shape=[1 << 40, 1 << 40], data=b""), "SHAPE_OVERFLOW"),
    (pb.Array(dtype=99, shape=[1], data=b"\0"), "BAD_DTYPE"),
])
def test_protobuf_array_header_checked(msg, reason):
    with pytest.raises(InvalidArgumentError) as info:
        array_from_pb(msg, "x")
    assert info.value.reason == reason


def test_more_dimensions_than_an_array_can_have_refused_by_every_decoder():
    # 65 dimensions of 1 (a fuzzer's find): the sizes agree, but numpy cannot make the array.
    too_many = pb.Array(dtype=pb.INT8, shape=[1] * 65, data=b"\0")
    body = pb.Tensor(dense=too_many).SerializeToString()
    chunks = [pb.TensorChunk(header=pb.Tensor(dense=pb.Array(dtype=pb.INT8, shape=[1] * 65))), b"\x12\x01\0"]
    for decode in (lambda: array_from_pb(too_many, "x"), lambda: tensor_from_bytes(body, "x"),
                   lambda: assemble(chunks, "x"),
                   lambda: tensor_from_json({"dtype": "int8", "shape": [1] * 65, "data": [0]}, "x")):
        with pytest.raises(InvalidArgumentError, match="has 65 dimensions, more than the 64 an array can have") as info:
            decode()
        assert info.value.reason == "TOO_MANY_DIMENSIONS"
    assert array_from_pb(pb.Array(dtype=pb.INT8, shape=[1] * 64, data=b"\0"), "x").ndim == 64


def test_empty_tensor_message_refused():
    with pytest.raises(InvalidArgumentError, match="arg is an empty Tensor message"):
        tensor_from_pb(pb.Tensor(), "arg")


def test_values_round_trip():
    args = [None, True, 3, 2.5, "x", [1, [2, 3]], np.float32(1.5), 1 + 2j,
            {"cycle": "W", "strength": ["symmetric", {"theta": 0.25}], "max_levels": 4, "smooth": None}]
    for v in args:
        back = value_from_pb(pb.Value.FromString(value_to_pb(v).SerializeToString()), "v")
        if isinstance(v, (np.generic, complex)):
            assert back.shape == () and back == v and back.dtype == np.asarray(v).dtype
        else:
            assert back == v


class TestChunkAssembler:
    def chunks(self):
        return list(iter_chunks(coo_sample("float64"), 8))

    def test_refuses_a_tensor_over_the_limit_before_allocating(self):
        header = pb.TensorChunk(header=tensor_to_pb(np.zeros(0), with_data=False))
        header.header.dense.shape[:] = [1 << 30, 1 << 10]
        with pytest.raises(ResourceExhaustedError, match="over the limit of 1000 bytes"):
            ChunkAssembler("t", max_bytes=1000).add(header)

    def test_too_many_bytes(self):
        a = ChunkAssembler("t")
        for c in self.chunks():
            a.add(c)
        with pytest.raises(InvalidArgumentError) as info:
            a.add(pb.TensorChunk(data=b"x"))
        assert info.value.reason == "BUFFER_LENGTH"

    def test_too_few_bytes(self):
        a = ChunkAssembler("t")
        for c in self.chunks()[:-1]:
            a.add(c)
        with pytest.raises(InvalidArgumentError, match="the stream ended after"):
            a.finish()

    @pytest.mark.parametrize("stream", ["data-first", "two-headers", "no-header", "data-in-header"])
    def test_bad_framing(self, stream):
        chunks = self.chunks()
        if stream == "data-first":
            chunks = chunks[1:]
        elif stream == "two-headers":
            chunks = [chunks[0], chunks[0]]
        elif stream == "no-header":
            chunks = []
        else:
            chunks = [pb.TensorChunk(header=tensor_to_pb(np.zeros(3)))]
        with pytest.raises(InvalidArgumentError) as info:
            assemble(chunks)
        assert info.value.reason == "BAD_STREAM"


class TestTensorBytes:
    """The hand-spliced Tensor encoding and the in-place decoding of REST bodies."""

    SAMPLES = [coo_sample("float64"), coo_sample("complex128", (2,)), coo_sample("bool"),
               csr_sample("float32", "int64"), np.arange(12.0).reshape(3, 4), np.array(5, np.int8),
               SparseTensor(indices=np.zeros((0, 2), np.int64), values=np.zeros(0), dense_shape=[3, 4]),
               SparseTensor(layout="bsr", compressed_indices=[0, 1], plain_indices=[0],
                            values=np.ones((1, 2, 2)), dense_shape=[2, 2], blocksize=[2, 2]),
               HandleRef("h-1")]

    @pytest.mark.parametrize("t", SAMPLES, ids=lambda t: type(t).__name__)
    def test_same_message_as_protobuf_and_arrays_used_in_place(self, t):
        body = tensor_to_bytes(t)
        msg = pb.Tensor.FromString(body)
        for array in _arrays_of(msg):
            array.ClearField("padding")
        assert msg == tensor_to_pb(t)
        back = tensor_from_bytes(body, "t")
        assert_same(t, back) if not isinstance(t, HandleRef) else back == t
        for a in _decoded_arrays(back):
            assert a.ctypes.data % 16 == 0 and a.base is not None, "copied or unaligned"

    def test_protobuf_written_bytes_decode_too(self):
        t = coo_sample("int16", (3,))
        assert_same(t, tensor_from_bytes(tensor_to_pb(t).SerializeToString(), "t"))

    def test_odd_messages_get_protobufs_meaning(self):
        t = coo_sample("float32")
        unknown_field = tensor_to_bytes(t) + b"\x48\x01"  # field 9 = 1: ignored by protobuf
        assert_same(t, tensor_from_bytes(unknown_field, "t"))
        # A repeated message field merges: shapes concatenate, and then the data is too short.
        twice = tensor_to_pb(t).SerializeToString() * 2
        with pytest.raises(InvalidArgumentError) as info:
            tensor_from_bytes(twice, "t")
        assert info.value.reason == "BUFFER_LENGTH"

    @pytest.mark.parametrize("body", [b"\x0a\xff\xff", b"\x0a\x05\x1a\x03\x0a", b"\xff"])
    def test_malformed_bodies_are_invalid_argument(self, body):
        with pytest.raises(InvalidArgumentError) as info:
            tensor_from_bytes(body, "t")
        assert info.value.reason == "BAD_BODY"

    def test_chunk_frames_parse_without_protobuf_and_with_it(self):
        frames = list(iter_chunks(coo_sample("float64"), 16))
        assert isinstance(parse_chunk(frames[0]), pb.TensorChunk)
        assert all(isinstance(parse_chunk(f), memoryview) for f in frames[1:])
        assert bytes(parse_chunk(frames[1])) == pb.TensorChunk.FromString(frames[1]).data
        with pytest.raises(InvalidArgumentError) as info:
            parse_chunk(b"\x12\x09abc")
        assert info.value.reason == "BAD_STREAM"


def _arrays_of(msg: pb.Tensor) -> list:
    if msg.HasField("dense"):
        return [msg.dense]
    if msg.HasField("sparse"):
        return [getattr(msg.sparse, f) for f in ("indices", "values", "compressed_indices", "plain_indices")
                if msg.sparse.HasField(f)]
    return []


def _decoded_arrays(t) -> list:
    if isinstance(t, np.ndarray):
        return [t] if t.size else []
    if isinstance(t, SparseTensor):
        return [a for a in (t.indices, t.values, t.compressed_indices, t.plain_indices) if a is not None and a.size]
    return []


class TestExecuteFrames:
    """ExecuteRequest/ExecuteResponse framed by hand: the same messages protobuf writes, big
    arrays read in place, anything else handed to protobuf."""

    BIG = SparseTensor(indices=np.arange(20_000).reshape(-1, 1), values=np.arange(20_000.0), dense_shape=[20_000])
    ARGS = {"sp_input": BIG, "dense": np.arange(20_000.0).reshape(100, 200)[:, ::2], "axis": [0, -1], "keep": None,
            "small": coo_sample("complex64"), "handle": HandleRef("h-1"), "name": "x", "scale": 2.5}

    def test_request_is_protobufs_message_and_reads_back_in_place(self):
        body = execute_request_bytes("mul", self.ARGS, True)
        msg = pb.ExecuteRequest.FromString(body)
        for value in msg.args.values():
            for array in _arrays_of(value.tensor):
                array.ClearField("padding")
        want = pb.ExecuteRequest(op="mul", keep=True, args={k: value_to_pb(v) for k, v in self.ARGS.items()})
        assert msg == want
        op, args, keep = execute_request_from_bytes(body)
        assert (op, keep, set(args)) == ("mul", True, set(self.ARGS))
        for name in ("sp_input", "dense", "small"):
            assert_same(self.ARGS[name], args[name])
        assert (args["axis"], args["keep"], args["handle"], args["name"], args["scale"]) == \
            ([0, -1], None, HandleRef("h-1"), "x", 2.5)
        for a in _decoded_arrays(args["sp_input"]) + _decoded_arrays(args["dense"]):
            assert a.ctypes.data % 16 == 0 and a.base is not None, "copied or unaligned"

    def test_protobuf_written_request_reads_the_same(self):
        want = pb.ExecuteRequest(op="mul", args={k: value_to_pb(v) for k, v in self.ARGS.items()})
        op, args, keep = execute_request_from_bytes(want.SerializeToString())
        assert (op, keep) == ("mul", False)
        assert_same(self.ARGS["sp_input"], args["sp_input"])
        assert_same(self.ARGS["dense"], args["dense"])

    def test_response_round_trip_keeps_arrays_aligned(self):
        outputs = [("output", self.BIG), ("empty_row_indicator", np.array([True, False])),
                   ("dense", np.arange(40_000, dtype=np.int16))]
        body = outputs_to_bytes(outputs)
        msg = pb.ExecuteResponse.FromString(body)
        assert [o.name for o in msg.outputs] == ["output", "empty_row_indicator", "dense"]
        back = outputs_from_bytes(body)
        for (name, value), (got_name, got) in zip(outputs, back, strict=True):
            assert name == got_name
            assert_same(value, got)
        for a in _decoded_arrays(back[0][1]) + _decoded_arrays(back[2][1]):
            assert a.ctypes.data % 16 == 0 and a.base is not None, "copied or unaligned"

    @pytest.mark.parametrize("keep", [False, True])
    def test_small_request_and_response_are_protobufs_messages(self, keep):
        """Under FRAME_BYTES nothing is padded or spliced: every value is written by hand."""
        small = {k: v for k, v in self.ARGS.items() if k not in ("sp_input", "dense")}
        msg = pb.ExecuteRequest.FromString(execute_request_bytes("mul", small, keep))
        assert msg == pb.ExecuteRequest(op="mul", keep=keep, args={k: value_to_pb(v) for k, v in small.items()})
        outputs = [("output", small["small"]), ("", np.array([True, False])), ("h", HandleRef("h-2"))]
        want = pb.ExecuteResponse(outputs=[pb.NamedTensor(name=n, tensor=tensor_to_pb(v)) for n, v in outputs])
        assert pb.ExecuteResponse.FromString(outputs_to_bytes(outputs)) == want

    @pytest.mark.parametrize("body", [b"\x12\xff\xff", b"\x0a\x02\xff\xfe", b"\xff"])
    def test_malformed_requests_are_invalid_argument(self, body):
        with pytest.raises(InvalidArgumentError) as info:
            execute_request_from_bytes(body)
        assert info.value.reason == "BAD_BODY"


class TestMessageFrames:
    """ExecuteStream's framing: a message split across MessageFrames, rebuilt in one buffer."""

    PIECES = execute_request_pieces("mul", TestExecuteFrames.ARGS, False)

    @pytest.mark.parametrize("frame_bytes", [7, 1000, 65536, 1 << 20])
    def test_frames_are_protobuf_messages_that_join_to_the_message(self, frame_bytes):
        frames = list(message_frames(self.PIECES, frame_bytes))
        msgs = [pb.MessageFrame.FromString(f) for f in frames]
        whole = b"".join(self.PIECES)
        assert msgs[0].total_bytes == len(whole) and all(m.total_bytes == 0 for m in msgs[1:])
        assert all(len(m.data) == frame_bytes for m in msgs[:-1]) and 0 < len(msgs[-1].data) <= frame_bytes
        assert b"".join(m.data for m in msgs) == whole
        body = assemble_message(frames, "request")
        assert bytes(body) == whole and body.readonly
        op, args, _ = execute_request_from_bytes(body)
        assert op == "mul"
        assert_same(TestExecuteFrames.ARGS["sp_input"], args["sp_input"])
        for a in _decoded_arrays(args["sp_input"]):
            assert a.ctypes.data % 16 == 0 and not a.flags.writeable, "unaligned, or writable into the buffer"

    def test_frames_written_by_protobuf_assemble(self):
        whole = b"".join(self.PIECES)
        frames = [pb.MessageFrame(total_bytes=len(whole), data=whole[:100]).SerializeToString(),
                  pb.MessageFrame(data=whole[100:]).SerializeToString()]
        assert bytes(assemble_message(frames, "request")) == whole

    def test_empty_message(self):
        frames = list(message_frames([b""]))
        assert len(frames) == 1 and bytes(assemble_message(frames, "reply")) == b""
        assert bytes(assemble_message([b""], "reply")) == b""  # protobuf leaves out zeros

    @pytest.mark.parametrize("frames, error, reason, words", [
        ([], InvalidArgumentError, "BAD_STREAM", "no frames"),
        ([b"\xff"], InvalidArgumentError, "BAD_STREAM", "not a valid message"),
        ([pb.MessageFrame(total_bytes=3, data=b"abcd").SerializeToString()],
         InvalidArgumentError, "BUFFER_LENGTH", "more than the 3 bytes"),
        ([pb.MessageFrame(total_bytes=5, data=b"abc").SerializeToString()],
         InvalidArgumentError, "BUFFER_LENGTH", "after 3 of the 5 bytes"),
        ([pb.MessageFrame(total_bytes=5, data=b"abc").SerializeToString(),
          pb.MessageFrame(total_bytes=5, data=b"de").SerializeToString()],
         InvalidArgumentError, "BAD_STREAM", "only the first"),
        ([pb.MessageFrame(total_bytes=-1).SerializeToString()], InvalidArgumentError, "BAD_STREAM", "negative"),
        ([pb.MessageFrame(total_bytes=1 << 40).SerializeToString()],
         ResourceExhaustedError, "REQUEST_TOO_LARGE", "over the limit of 1000 bytes"),
        ([b"\x1a\x01x"], InvalidArgumentError, "BAD_STREAM", "not field 3"),
    ])
    def test_bad_streams_are_refused_before_allocating(self, frames, error, reason, words):
        with pytest.raises(error) as info:
            assembler = MessageAssembler("request", max_bytes=1000)
            for frame in frames:
                assembler.add(frame)
            assembler.finish()
        assert info.value.reason == reason and words in info.value.message and "request" in info.value.message


def _attributes(t: SparseTensor) -> list:
    return [getattr(t, name) for name in SparseTensor.__slots__ if name != "__weakref__"]


@pytest.mark.parametrize("indices, values, shape, skips_init", [
    (np.array([[2, 1], [0, 3]]), np.array([1.0, 2.0]), (4, 5), True),
    (np.zeros((0, 2), np.int64), np.zeros((0, 3)), (4, 5, 3), True),  # empty, hybrid
    (np.array([[1]]), np.ones((1, 2), np.float32), (4, 2), True),
    (np.array([[2, 1]], np.int32), np.array([1.0]), (4, 5), False),  # int32 indices: __init__ widens them
    (np.zeros(0, np.int64), np.array([1.0]), (4, 5), False),  # 1-D empty indices: __init__ reshapes them
    (np.zeros((0, 2), np.int64), np.zeros(0), (4, 5), False),  # an empty values vector: __init__ reshapes it
    ([[2, 1]], np.array([1.0]), (4, 5), False),  # not arrays
])
def test_coo_tensor_builds_what_the_constructor_would(indices, values, shape, skips_init):
    """The decoders and the ops' outputs skip ``__init__`` when it would convert nothing: the same
    tensor, attribute for attribute, either way."""
    from sparseserve.core.tensor import coo_tensor

    built = SparseTensor(indices=indices, values=values, dense_shape=shape, coalesced=True)
    fast = coo_tensor(indices, values, shape, coalesced=True)
    for a, b in zip(_attributes(built), _attributes(fast), strict=True):
        if isinstance(a, np.ndarray):
            assert (a.shape, a.dtype) == (b.shape, b.dtype) and np.array_equal(a, b)
        else:
            assert a == b
    assert (fast.indices is indices and fast.values is values) == skips_init


@pytest.mark.parametrize("indices_shape, values_shape", [((2,), (0,)), ((0,), (0,)), ((0, 2), (0,)), ((1, 2), (1,))])
def test_decoded_coo_equals_the_constructors_for_any_declared_shapes(indices_shape, values_shape):
    """Whatever shapes the wire declares for the arrays, decoding gives ``SparseTensor(...)`` of them."""
    indices = np.zeros(indices_shape, np.int64)
    values = np.zeros(values_shape)
    msg = pb.Tensor(sparse=pb.SparseTensor(layout=pb.COO, dense_shape=[3, 4],
                                           indices=pb.Array(dtype=pb.INT64, shape=indices_shape,
                                                            data=indices.tobytes()),
                                           values=pb.Array(dtype=pb.FLOAT64, shape=values_shape,
                                                           data=values.tobytes())))
    decoded = tensor_from_pb(msg, "t")
    built = SparseTensor(indices=indices, values=values, dense_shape=[3, 4])
    assert decoded.indices.shape == built.indices.shape and decoded.values.shape == built.values.shape
    assert decoded.dense_shape == built.dense_shape and decoded.coalesced == built.coalesced
