"""The hand-written protobuf path against protobuf's generated classes, in one process.

What each hand writer and reader of ``sparseserve.core.codec`` and ``.frames`` buys over
the generated classes doing the same work (``SerializeToString``, ``FromString`` and
``np.frombuffer`` of the ``bytes`` fields, as ``tensor_to_pb``/``tensor_from_pb`` do): a
small Execute call (a 100-entry reorder, request and reply) and tensors of 1 MB and 100 MB
(an Execute request and reply holding one, a REST body, an Upload/Download stream of
TensorChunks, an ExecuteStream of MessageFrames). Contenders take turns within every round
(``bench/_timing.py``); a ratio is the generated path's time over the hand path's.
``python -m bench.codec --repeat 3 --no-huge`` for a quicker run (no 100 MB case).
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import numpy as np

from sparseserve import SparseTensor
from sparseserve.core import frames
from sparseserve.core.codec import (DEFAULT_CHUNK_BYTES, assemble, iter_chunks, tensor_from_bytes, tensor_from_pb,
                                    tensor_to_bytes, tensor_to_pb, value_from_pb, value_to_pb)
from sparseserve.core.frames import (MessageAssembler, execute_request_bytes, execute_request_from_bytes,
                                     execute_request_pieces, message_frames, outputs_from_bytes, outputs_to_bytes)
from sparseserve.v1 import sparseserve_pb2 as pb

from ._results import figure, record
from ._timing import best_of_each

SMALL_NNZ = 100
ENTRY_BYTES = 24  # a 2-D COO entry: two int64 indices and a float64 value


def coo(nnz: int, seed: int = 0) -> SparseTensor:
    rng = np.random.default_rng(seed)
    side = max(1000, int(nnz ** 0.5) * 4)
    indices = rng.integers(0, side, size=(nnz, 2), dtype=np.int64)
    return SparseTensor(indices=indices, values=rng.standard_normal(nnz), dense_shape=[side, side])


# ------------------------------------------------------------------ the generated-class contenders
def pb_request(op: str, args: dict[str, Any], keep: bool) -> bytes:
    return pb.ExecuteRequest(op=op, args={k: value_to_pb(v) for k, v in args.items()}, keep=keep).SerializeToString()


def pb_request_read(body: bytes) -> tuple[str, dict[str, Any], bool]:
    msg = pb.ExecuteRequest.FromString(body)
    return msg.op, {k: value_from_pb(v, k) for k, v in msg.args.items()}, msg.keep


def pb_reply(outputs: list[tuple[str, Any]]) -> bytes:
    return pb.ExecuteResponse(outputs=[pb.NamedTensor(name=n, tensor=tensor_to_pb(t))
                                       for n, t in outputs]).SerializeToString()


def pb_reply_read(body: bytes) -> list[tuple[str, Any]]:
    return [(o.name, tensor_from_pb(o.tensor, o.name)) for o in pb.ExecuteResponse.FromString(body).outputs]


def pb_chunks(t: SparseTensor, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[bytes]:
    out = [pb.TensorChunk(header=tensor_to_pb(t, with_data=False)).SerializeToString()]
    for a in t.arrays():
        raw = np.ascontiguousarray(a).data.cast("B")
        out += [pb.TensorChunk(data=bytes(raw[i:i + chunk_bytes])).SerializeToString()
                for i in range(0, len(raw), chunk_bytes)]
    return out


def pb_frames(message: bytes, frame_bytes: int = DEFAULT_CHUNK_BYTES) -> list[bytes]:
    view = memoryview(message)
    return [pb.MessageFrame(total_bytes=len(message) if i == 0 else 0,
                            data=bytes(view[i:i + frame_bytes])).SerializeToString()
            for i in range(0, max(len(view), 1), frame_bytes)]


def pb_frames_read(stream: list[bytes]) -> np.ndarray:
    """A MessageAssembler's work with protobuf parsing each frame: one buffer, each frame's data
    copied to its place."""
    first = pb.MessageFrame.FromString(stream[0])
    buffer = np.empty(first.total_bytes, np.uint8)
    filled = 0
    for frame in [first, *map(pb.MessageFrame.FromString, stream[1:])]:
        data = frame.data
        buffer[filled:filled + len(data)] = np.frombuffer(data, np.uint8)
        filled += len(data)
    return buffer


def hand_frames_read(stream: list[bytes]) -> memoryview:
    assembler = MessageAssembler("request")
    for frame in stream:
        assembler.add(frame)
    return assembler.finish()


# ------------------------------------------------------------------ the cases
# Per case, the hand path's and the generated classes' way of doing the same work.
Cases = dict[str, dict[str, Callable[[], object]]]


def small_cases() -> Cases:
    """Per case, the hand path and the generated path on one 100-entry reorder call."""
    st = coo(SMALL_NNZ)
    args, outputs = {"sp_input": st}, [("output", st)]
    request, reply = execute_request_bytes("reorder", args, False), outputs_to_bytes(outputs)
    view_request, view_reply = memoryview(request), memoryview(reply)
    return {
        "request write": {"hand": lambda: execute_request_bytes("reorder", args, False),
                          "generated": lambda: pb_request("reorder", args, False)},
        "request read (hand reader forced)": {"hand": lambda: frames._request_from_view(view_request),
                                              "generated": lambda: pb_request_read(request)},
        "reply write": {"hand": lambda: outputs_to_bytes(outputs), "generated": lambda: pb_reply(outputs)},
        "reply read (hand reader forced)": {"hand": lambda: frames._outputs_from_view(view_reply),
                                            "generated": lambda: pb_reply_read(reply)},
    }


def large_cases(nbytes: int) -> Cases:
    st = coo(nbytes // ENTRY_BYTES)
    args, outputs = {"sp_input": st}, [("output", st)]
    request, reply, body = execute_request_bytes("reorder", args, False), outputs_to_bytes(outputs), tensor_to_bytes(st)
    chunks = list(iter_chunks(st))
    pieces = execute_request_pieces("reorder", args, False)
    stream = list(message_frames(pieces))
    return {
        "request write": {"hand": lambda: execute_request_bytes("reorder", args, False),
                          "generated": lambda: pb_request("reorder", args, False)},
        "request read": {"hand": lambda: execute_request_from_bytes(request),
                         "generated": lambda: pb_request_read(request)},
        "reply write": {"hand": lambda: outputs_to_bytes(outputs), "generated": lambda: pb_reply(outputs)},
        "reply read": {"hand": lambda: outputs_from_bytes(reply), "generated": lambda: pb_reply_read(reply)},
        "REST body write": {"hand": lambda: tensor_to_bytes(st),
                            "generated": lambda: tensor_to_pb(st).SerializeToString()},
        "REST body read": {"hand": lambda: tensor_from_bytes(body, "t"),
                           "generated": lambda: tensor_from_pb(pb.Tensor.FromString(body), "t")},
        "TensorChunk stream write": {"hand": lambda: list(iter_chunks(st)), "generated": lambda: pb_chunks(st)},
        "TensorChunk stream read": {"hand": lambda: assemble(chunks),
                                    "generated": lambda: assemble(map(pb.TensorChunk.FromString, chunks))},
        "MessageFrame stream write": {"hand": lambda: list(message_frames(pieces)),
                                      "generated": lambda: pb_frames(b"".join(pieces))},
        "MessageFrame stream read": {"hand": lambda: hand_frames_read(stream),
                                     "generated": lambda: pb_frames_read(stream)},
    }


def measure(cases: Cases, repeat: int, calls: int) -> dict[str, dict[str, float]]:
    """Best seconds per call of each contender, both contenders of a case in every round."""
    def loop(fn: Callable[[], object]) -> Callable[[], object]:
        return fn if calls == 1 else lambda: [fn() for _ in range(calls)]

    return {case: {name: t / calls for name, t in best_of_each({k: loop(f) for k, f in fns.items()}, repeat).items()}
            for case, fns in cases.items()}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.codec")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--huge", action=argparse.BooleanOptionalAction, default=True, help="the 100 MB case")
    args = parser.parse_args()
    # Per size: what it holds, its cases, and calls per timed run (a small call takes microseconds).
    sizes: list[tuple[str, dict[str, int], Callable[[], Cases], int]] = [
        ("100-entry reorder", {"entries": SMALL_NNZ}, small_cases, 2000),
        ("1 MB", {"bytes": 1 << 20}, lambda: large_cases(1 << 20), 20)]
    if args.huge:
        sizes.append(("100 MB", {"bytes": 100 << 20}, lambda: large_cases(100 << 20), 1))
    rows = []
    print("| size | case | hand | generated classes | generated / hand |")
    print("|---|---|---|---|---|")
    for label, counts, cases, calls in sizes:
        for case, best in measure(cases(), args.repeat, calls).items():
            hand, generated = best["hand"], best["generated"]
            print(f"| {label} | {case} | {hand * 1e6:,.1f} us | {generated * 1e6:,.1f} us | "
                  f"{generated / hand:.2f}x |", flush=True)
            rows.append(figure(f"{case}, {label}", hand, "protobuf's generated classes", generated, sizes=counts))
    path = record("codec", rows, about=__doc__.split("\n\n")[0], repeat=args.repeat, huge=args.huge)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
