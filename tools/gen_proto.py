"""Regenerate the Python code for the v1 proto: ``python tools/gen_proto.py [OUT_DIR]``.

The generated modules are checked in under ``client/v1`` (import name
``sparseserve.v1``) so that the base install needs no code generator;
``tests/deploy/test_deploy_packaging.py`` regenerates into a temporary folder and fails if
the checked-in files differ.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PROTO_FILE = "sparseserve/v1/sparseserve.proto"
PACKAGE_DIR = ROOT / "client" / "v1"
GENERATED = ("sparseserve_pb2.py", "sparseserve_pb2.pyi", "sparseserve_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) and return the generated files in ``out_dir``."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        code = protoc.main([
            "protoc",
            f"-I{PROTO_ROOT}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            str(PROTO_ROOT / PROTO_FILE),
        ])
        if code != 0:
            raise RuntimeError(f"protoc failed with exit code {code}")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name in GENERATED:
            target = out_dir / name
            target.write_bytes((Path(tmp) / "sparseserve" / "v1" / name).read_bytes())
            written.append(target)
        return written


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE_DIR
    for path in generate(out):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
