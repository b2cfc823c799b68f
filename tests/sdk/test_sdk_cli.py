"""The command line's client commands (``ops``, ``call``, ``put``, ``get``, ``delete``) against
the session's real server: the console script in subprocesses (six runs), the rest through
``main`` in process. Files are written by scipy's ``save_npz`` and numpy's ``savez`` and read
back with scipy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from sparseserve import Client, SparseTensor
from sparseserve.cli import main, read_tensor

from helpers import assert_eq
from base_install import BLOCKED, run_without_server_packages

SCRIPT = Path(sys.executable).parent / "sparseserve"


def sparseserve(*args: str, target: str | None = None) -> subprocess.CompletedProcess:
    """The console script (``python -m sparseserve.cli`` where it is not installed beside the
    interpreter), with ``SPARSESERVE_TARGET`` set to ``target`` or unset."""
    env = {k: v for k, v in os.environ.items() if k != "SPARSESERVE_TARGET"}
    if target:
        env["SPARSESERVE_TARGET"] = target
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "sparseserve.cli"]
    return subprocess.run([*command, *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A scipy CSR matrix (int32 indices, as scipy makes them), a COO one, and a dense numpy
    array, each saved as the libraries save them."""
    folder = tmp_path_factory.mktemp("cli")
    a = sp.random(6, 5, density=0.4, format="csr", random_state=28, dtype=np.float64)
    b = np.arange(10.0).reshape(5, 2)
    sp.save_npz(folder / "a.npz", a)
    sp.save_npz(folder / "c.npz", sp.coo_matrix(np.array([[1.0, 0, 0], [0, 0, 0], [0, 2.0, 3.0]])))
    np.savez(folder / "b.npz", b)
    return folder, a, b


def test_ops_lists_every_op_of_the_server(server):
    result = sparseserve("ops", "--target", server.grpc_target)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(None, 1) for line in result.stdout.splitlines())
    with Client(server.grpc_target) as c:
        catalogue = c.list_ops()
    assert sorted(lines) == sorted(catalogue)
    assert lines["coalesce"] == catalogue["coalesce"]["doc"].splitlines()[0]


def test_ops_json_is_the_whole_catalogue(server, capsys):
    assert main(["ops", "--json", "--target", server.http_url]) == 0
    printed = json.loads(capsys.readouterr().out)
    with Client(server.http_url) as c:
        catalogue = c.list_ops()
    assert {op["name"]: op["args"] for op in printed["ops"]} == {n: op["args"] for n, op in catalogue.items()}


def test_call_with_a_scipy_file_and_a_numpy_file(server, files):
    folder, a, b = files
    out = folder / "mm.npz"
    result = sparseserve("call", "mm", "--arg", f"mat1=@{folder / 'a.npz'}", "--arg", f"mat2=@{folder / 'b.npz'}",
                         "-o", str(out), target=server.grpc_target)
    assert result.returncode == 0, result.stderr
    with np.load(out) as saved:
        assert saved.files == ["arr_0"]
        np.testing.assert_allclose(saved["arr_0"], a @ b)


def test_call_with_inline_arguments_by_their_declared_types(server, files):
    folder, a, _ = files
    out = folder / "sum.npz"
    # axis is int_list? ([1]), keepdims bool (true): read as the catalogue types them.
    result = sparseserve("call", "reduce_sum", "--arg", f"sp_input=@{folder / 'a.npz'}", "--arg", "axis=[1]",
                         "--arg", "keepdims=true", "-o", str(out), target=server.http_url)
    assert result.returncode == 0, result.stderr
    with np.load(out) as saved:
        np.testing.assert_allclose(saved["arr_0"], a.sum(axis=1))  # [6, 1], as keepdims asks


def test_call_prints_sparse_and_dense_answers(server, files, capsys):
    folder, _, _ = files
    assert main(["call", "eye", "--arg", "num_rows=2", "--arg", "dtype=float64", "--target", server.grpc_target]) == 0
    assert capsys.readouterr().out == ("SparseTensor(layout='coo', dense_shape=[2, 2], dtype=float64, nnz=2)\n"
                                       "indices:\n[[0 0]\n [1 1]]\nvalues:\n[1. 1.]\n")
    assert main(["call", "to_dense", "--arg", f"sp_input=@{folder / 'c.npz'}", "--target", server.grpc_target]) == 0
    assert capsys.readouterr().out == "[[1. 0. 0.]\n [0. 0. 0.]\n [0. 2. 3.]]\n"


def test_kept_results_print_handles_that_later_commands_take(server, files, capsys):
    folder, _, _ = files
    target = ["--target", server.http_url]
    assert main(["call", "coalesce", "--arg", f"sp_input=@{folder / 'c.npz'}", "--keep", *target]) == 0
    handle = capsys.readouterr().out.strip()
    assert handle.startswith("h-")
    assert main(["call", "to_dense", "--arg", f"sp_input={handle}", *target]) == 0
    assert capsys.readouterr().out == "[[1. 0. 0.]\n [0. 0. 0.]\n [0. 2. 3.]]\n"
    assert main(["delete", handle, *target]) == 0
    assert main(["get", handle, *target]) == 1  # gone
    assert "NOT_FOUND (UNKNOWN_HANDLE)" in capsys.readouterr().err


def test_several_outputs_go_to_one_file_each(server, files, capsys):
    folder, _, _ = files
    out = folder / "filled.npz"
    assert main(["call", "fill_empty_rows", "--arg", f"sp_input=@{folder / 'c.npz'}", "--arg", "default_value=7",
                 "-o", str(out), "--target", server.grpc_target]) == 0
    assert capsys.readouterr().out.splitlines() == [f"output: {folder / 'filled.output.npz'}",
                                                   f"empty_row_indicator: {folder / 'filled.empty_row_indicator.npz'}"]
    filled = sp.load_npz(folder / "filled.output.npz")  # 2-D COO: scipy's format
    np.testing.assert_array_equal(filled.toarray(), [[1, 0, 0], [7, 0, 0], [0, 2, 3]])
    with np.load(folder / "filled.empty_row_indicator.npz") as saved:
        np.testing.assert_array_equal(saved["arr_0"], [False, True, False])


def test_a_tensor_scipy_has_no_format_for_round_trips_under_our_keys(server, files, capsys):
    folder, _, _ = files
    out = folder / "expanded.npz"
    assert main(["call", "expand_dims", "--arg", f"sp_input=@{folder / 'c.npz'}", "--arg", "axis=0",
                 "-o", str(out), "--target", server.grpc_target]) == 0
    with np.load(out) as saved:
        assert sorted(saved.files) == ["dense_shape", "indices", "layout", "values"]
    with Client(server.grpc_target) as c:
        assert_eq(read_tensor(str(out), "test"), c.expand_dims(read_tensor(str(folder / "c.npz"), "test"), axis=0))


def test_put_and_get_round_trip_exactly_with_the_sdk_alone(server, files):
    folder, a, _ = files
    back = folder / "back.npz"
    source, url = str(folder / "a.npz"), server.http_url
    result = run_without_server_packages(f"""
        import contextlib, io
        from sparseserve.cli import main
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            assert main(["put", {source!r}, "--target", {url!r}]) == 0
        handle = printed.getvalue().strip()
        assert main(["get", handle, "-o", {str(back)!r}, "--target", {url!r}]) == 0
        assert main(["delete", handle, "--target", {url!r}]) == 0
        print("ok", handle, sorted(m for m in sys.modules if m.split(".")[0] in {BLOCKED!r}))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "ok" and result.stdout.split()[1].startswith("h-")
    assert result.stdout.rstrip().endswith("[]")  # no scipy, numba or server package was imported
    got = sp.load_npz(back)
    assert got.format == "csr" and got.dtype == a.dtype and got.shape == a.shape
    np.testing.assert_array_equal(got.indptr, a.indptr)
    np.testing.assert_array_equal(got.indices, a.indices)
    np.testing.assert_array_equal(got.data, a.data)


def test_usage_errors_exit_2_with_the_rule(server, files, capsys):
    folder, _, _ = files
    target = ["--target", server.grpc_target]
    cases = [
        (["call", "no_such_op"], "unknown op 'no_such_op': `sparseserve ops` lists"),
        (["call", "reduce_sum", "--arg", f"sp_input=@{folder / 'a.npz'}", "--arg", "axis=x"],
         "--arg axis=x: axis takes an integer, a list of integers, or null"),
        (["call", "reduce_sum", "--arg", f"sp_input=@{folder / 'a.npz'}", "--arg", "bogus=1"],
         "reduce_sum has no argument 'bogus'; its arguments: sp_input, axis"),
        (["call", "reduce_sum", "--arg", "axis=1"], "reduce_sum needs --arg for sp_input (sparse)"),
        (["call", "eye", "--arg", "num_rows=@x.npz"], "num_rows takes an integer, e.g. 2, not a file"),
        (["put", str(folder / "missing.npz")], "put: cannot read"),
    ]
    for argv, message in cases:
        assert main([*argv, *target]) == 2, argv
        err = capsys.readouterr().err
        assert message in err, (argv, err)
    result = sparseserve("ops")  # no --target, no SPARSESERVE_TARGET
    assert result.returncode == 2
    assert "no server: give --target" in result.stderr and "SPARSESERVE_TARGET" in result.stderr
    assert "Traceback" not in result.stderr


def test_server_errors_exit_1_with_code_reason_and_message(server, files, capsys):
    result = sparseserve("get", "h-" + "0" * 32, "-o", str(files[0] / "never.npz"), target=server.grpc_target)
    assert result.returncode == 1
    assert result.stderr.startswith("sparseserve get: NOT_FOUND (UNKNOWN_HANDLE): no tensor with handle")
    assert "Traceback" not in result.stderr and not (files[0] / "never.npz").exists()
    # An argument the server refuses (a shape of another size), over REST.
    assert main(["call", "reshape", "--arg", f"sp_input=@{files[0] / 'a.npz'}", "--arg", "shape=[7,7]",
                 "--target", server.http_url]) == 1
    assert capsys.readouterr().err.startswith("sparseserve call: INVALID_ARGUMENT (SHAPE_SIZE_MISMATCH): ")


def test_a_scipy_matrix_and_a_sparse_tensor_read_the_same(files):
    folder, a, _ = files
    t = read_tensor(str(folder / "a.npz"), "test")
    assert isinstance(t, SparseTensor) and t.layout == "csr"
    np.testing.assert_array_equal(t.to_dense(), a.toarray())
