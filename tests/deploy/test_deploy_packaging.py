"""Packaging: the base install is the SDK alone; generated proto code is fresh;
import names are the three of docs/codebase.md."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

from base_install import BLOCKED, run_without_server_packages

ROOT = Path(__file__).resolve().parent.parent.parent


def test_base_requirements_are_the_client_only():
    reqs = [r for r in metadata.requires("sparseserve") if "extra ==" not in r]
    names = sorted(r.split(">")[0].split("=")[0].split("<")[0].strip() for r in reqs)
    assert names == ["grpcio", "httpx", "numpy", "protobuf"]


def test_sdk_imports_and_works_without_numba_or_fastapi(server):
    result = run_without_server_packages(f"""
        import sparseserve
        from sparseserve import Client, SparseTensor, errors
        st = SparseTensor(indices=[[1, 0], [0, 1]], values=[1.0, 2.0], dense_shape=[2, 2])
        assert st.to_dense().tolist() == [[0.0, 2.0], [1.0, 0.0]]
        for target, encoding in (("{server.grpc_target}", "protobuf"), ("{server.http_url}", "protobuf"),
                                 ("{server.http_url}", "json")):
            with Client(target, encoding=encoding) as c:
                assert c.reorder(st).indices.tolist() == [[0, 1], [1, 0]]
        try:
            import numba
        except ImportError:
            print("numba-blocked")
        print("ok", sorted(m for m in sys.modules if m.split(".")[0] in {BLOCKED!r}))
    """)
    assert result.returncode == 0, result.stderr
    assert "numba-blocked" in result.stdout and "ok []" in result.stdout


def test_serve_without_server_extra_says_what_to_install():
    result = run_without_server_packages("""
        from sparseserve.cli import main
        raise SystemExit(main(["serve"]))
    """)
    assert result.returncode == 2
    assert 'pip install "sparseserve[server]"' in result.stderr


def test_top_level_import_names():
    dist = metadata.distribution("sparseserve")
    top = {p.parts[0] for p in map(Path, dist.read_text("top_level.txt").split())} \
        if dist.read_text("top_level.txt") else None
    assert top in (None, {"sparseserve"})
    import sparseserve.kernels
    import sparseserve.server

    assert Path(sparseserve.__file__).parent == ROOT / "client"
    assert Path(sparseserve.server.__file__).parent == ROOT / "server"
    assert Path(sparseserve.kernels.__file__).parent == ROOT / "kernels"
    for bare in ("server", "client", "kernels"):
        assert subprocess.run([sys.executable, "-c", f"import {bare}"], cwd="/",
                              capture_output=True).returncode != 0


def test_generated_proto_code_is_fresh(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from gen_proto import GENERATED, PACKAGE_DIR
    finally:
        sys.path.pop(0)
    # protoc runs in a process of its own: grpc_tools' compiler and TensorFlow's (imported by the
    # oracle tests in this process) each carry protobuf's C++ code, and calling the compiler
    # after TensorFlow's import crashes the process.
    subprocess.run([sys.executable, str(ROOT / "tools" / "gen_proto.py"), str(tmp_path)], check=True,
                   capture_output=True, timeout=120)
    stale = [name for name in GENERATED
             if (tmp_path / name).read_bytes() != (PACKAGE_DIR / name).read_bytes()]
    assert not stale, f"{stale} are stale: run `make proto` and commit the result"
