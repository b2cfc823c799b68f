"""A coverage-guided fuzz target (atheris) over everything a request's bytes meet before a
kernel: the protobuf and JSON request decoders, the tensor decoders, both chunked stream
assemblers, validation and argument binding of the op named; inputs that pass run the op
when its result is small.

Any exception but a ``SparseServeError`` is a finding (atheris prints the input and exits
non-zero), and so is a crash or an allocation past ``-rss_limit_mb``.
``python tests/fuzz/decoders.py -max_total_time=60 [corpus_dir]``; the test suite runs it for
a bounded time over a seed corpus (``tests/server/test_server_hostile.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

# Kernels stay as they are: numba compiles their bytecode, which instrumentation changes.
# (atheris excludes modules by exact name.)
KERNELS = ["sparseserve.kernels"] + [f"sparseserve.kernels.{p.stem}"
                                     for p in (Path(__file__).resolve().parents[2] / "kernels").glob("*.py")]

with atheris.instrument_imports(include=["sparseserve"], exclude=KERNELS):
    from sparseserve.core.codec import ChunkAssembler
    from sparseserve.core.frames import MessageAssembler
    from sparseserve.errors import SparseServeError
    from sparseserve.server.validated import validated
    from sparseserve.server.config import ServerConfig
    from sparseserve.server.limits import check_argument_limits
    from sparseserve.server.ops import REGISTRY
    from sparseserve.server.rest_wire import _decode_json_tensor, _decode_op_body, _decode_pb_tensor

# The first byte picks the decoder; the second, for op bodies, the op.
KINDS = ("execute-protobuf", "execute-json", "tensor-protobuf", "tensor-json", "chunks", "frames")
OPS = sorted(op.name for op in REGISTRY)
RESULT_LIMIT = 1 << 20  # bytes an op may produce here, as --max-result-bytes does in the server
JSON_DEPTH = 64  # the server's --max-json-depth
LIMITS = ServerConfig(max_nnz=1 << 20, max_rank=32)  # --max-nnz, --max-rank


def _run_op(name: str, args: dict) -> None:
    op = REGISTRY.get(name)
    check_argument_limits(op, args, LIMITS)
    plan = op.plan(op.bind(args))  # check, then run: as the server does
    if op.result_bytes is None or op.result_bytes(**plan.args) <= RESULT_LIMIT:
        op.run_plan("cpu", plan)


def _pieces(data: bytes) -> list[bytes]:
    """Split at 0xFF bytes: a stream of frames from one input."""
    return data.split(b"\xff")


def one_input(data: bytes) -> None:
    if len(data) < 2:
        return
    kind, choice, body = KINDS[data[0] % len(KINDS)], data[1], data[2:]
    try:
        if kind.startswith("execute"):
            args, _ = _decode_op_body(body, kind == "execute-protobuf", JSON_DEPTH)
            _run_op(OPS[choice % len(OPS)], args)
        elif kind.startswith("tensor"):
            decode = _decode_pb_tensor if kind == "tensor-protobuf" else _decode_json_tensor
            validated(decode(body, JSON_DEPTH), "tensor")
        elif kind == "chunks":
            assembler = ChunkAssembler("tensor", max_bytes=RESULT_LIMIT)
            for frame in _pieces(body):
                assembler.add(frame)
            validated(assembler.finish(), "tensor")
        else:
            assembler = MessageAssembler("request", max_bytes=RESULT_LIMIT)
            for frame in _pieces(body):
                assembler.add(frame)
            assembler.finish()
    except SparseServeError:
        pass


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
