"""The ``sparseserve`` command.

``sparseserve serve`` runs the server (the ``[server]`` extra). The other commands speak to a
running server with the SDK alone (numpy, grpcio, protobuf, httpx): ``ops`` lists its
catalogue, ``call`` runs an op, ``put``, ``get`` and ``delete`` move tensors and free them.
Tensors come from and go to ``.npz`` files (``tensor_files``). Exit status: 0 done, 1 the
server (or the way to it) answered with an error, 2 the command line or a file it names is
wrong; errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

_FILES_HELP = """\
Files: `put FILE` and `--arg name=@FILE` read an .npz file written by scipy.sparse.save_npz
(a csr, csc, bsr or coo matrix), by numpy.savez with one array (a dense tensor), or by
`sparseserve get` / `call -o`. `get -o FILE` and `call -o FILE` write a 2-D sparse matrix in
scipy.sparse.save_npz's format (csr, csc and bsr as they are, coo with scalar values;
scipy.sparse.load_npz reads it), any other sparse tensor under its own keys (layout,
dense_shape, values, indices or compressed_indices and plain_indices, blocksize), and a dense
one as numpy.savez's single array (arr_0).
"""


class UsageError(Exception):
    """The command line, or a file it names, is wrong: exit status 2."""


# ------------------------------------------------------------------ argument values
# What --arg name=VALUE takes for each catalogue type (the words of server/argtypes.py).
_TENSOR_TYPES = {"sparse", "dense", "tensor", "tensors", "scalar"}
_EXPECTED = {
    "int": "an integer, e.g. 2",
    "int?": "an integer or null",
    "float": "a number, e.g. 0.5",
    "bool": "true or false",
    "int_list": "a list of integers, e.g. [0,1]",
    "int_list?": "an integer, a list of integers, or null (every axis)",
    "index": "a list of integers and [start,stop,step] slices, e.g. [0,[1,null,2]]",
    "sparse": "@FILE.npz or a handle h-...",
    "dense": "@FILE.npz, a handle h-..., or a JSON array, e.g. [[1,2],[3,4]]",
    "tensor": "@FILE.npz, a handle h-..., or a JSON array",
    "tensors": "@FILE.npz or a handle h-... (repeat --arg for each tensor of the list)",
    "scalar": "a number, or @FILE.npz or a handle of a 0-d tensor",
    "options": 'a JSON object of named options, e.g. {"cycle":"W"}',
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int_list(v: Any) -> bool:
    return isinstance(v, list) and all(_is_int(x) for x in v)


def _is_index(v: Any) -> bool:
    return isinstance(v, list) and all(
        _is_int(x) or (isinstance(x, list) and len(x) == 3 and all(y is None or _is_int(y) for y in x)) for x in v)


# A parsed JSON value is taken for a type when its check passes (types not here take any).
_CHECKS: dict[str, Callable[[Any], bool]] = {
    "int": _is_int,
    "int?": lambda v: v is None or _is_int(v),
    "float": _is_number,
    "int_list": _is_int_list,
    "int_list?": lambda v: v is None or _is_int(v) or _is_int_list(v),
    "index": _is_index,
    "dense": lambda v: _is_number(v) or isinstance(v, (list, bool)),
    "tensor": lambda v: _is_number(v) or isinstance(v, (list, bool)),
    "scalar": lambda v: _is_number(v) or isinstance(v, bool),
    "options": lambda v: v is None or isinstance(v, dict),
}
_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def argument_value(name: str, text: str, kind: str) -> Any:
    """``--arg name=text`` as the value the op's argument of catalogue type ``kind`` takes."""
    from sparseserve import HandleRef

    def wrong(why: str = "") -> UsageError:
        expected = _EXPECTED.get(kind, kind)
        return UsageError(f"--arg {name}={text}: {name} takes {expected}{why}")

    if text.startswith("@"):
        if kind not in _TENSOR_TYPES:
            raise wrong(", not a file (@FILE is for tensor arguments)")
        return read_tensor(text[1:], f"--arg {name}")
    if kind in _TENSOR_TYPES and text.startswith("h-"):
        return HandleRef(text)
    if kind == "string":
        return text
    if kind == "bool":
        if text.lower() not in _BOOLS:
            raise wrong()
        return _BOOLS[text.lower()]
    try:
        value = json.loads(text)
    except ValueError:
        if kind in _CHECKS or kind in _TENSOR_TYPES:
            raise wrong() from None
        return text  # a type this command does not know (a newer server's): the text as it is
    if kind in ("sparse", "tensors") or not _CHECKS.get(kind, lambda v: True)(value):
        raise wrong()
    if kind in ("dense", "tensor") and isinstance(value, list):
        try:
            return np.asarray(value)
        except ValueError as exc:
            raise wrong(f" ({exc})") from None
    return value


def bind_arguments(op: dict, pairs: list[str]) -> dict[str, Any]:
    """The ``--arg name=value`` pairs of a call of the catalogue entry ``op``, parsed by the
    types it declares; a ``tensors`` argument collects one tensor from each of its pairs."""
    declared = {a["name"]: a for a in op["args"]}
    values: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep:
            raise UsageError(f"--arg {pair}: write it as name=value")
        if name not in declared:
            raise UsageError(f"--arg {pair}: {op['name']} has no argument {name!r}; "
                             f"its arguments: {', '.join(declared) or 'none'}")
        kind = declared[name]["type"]
        value = argument_value(name, text, kind)
        if kind == "tensors":
            values.setdefault(name, []).append(value)
        elif name in values:
            raise UsageError(f"--arg {name} is given twice")
        else:
            values[name] = value
    missing = [a["name"] for a in op["args"] if a["required"] and a["name"] not in values]
    if missing:
        raise UsageError(f"{op['name']} needs --arg for {', '.join(missing)} "
                         f"({', '.join(declared[m]['type'] for m in missing)})")
    return values


# ------------------------------------------------------------------ tensor files
def read_tensor(path: str, what: str) -> Any:
    """The tensor in an .npz (or .npy) file: scipy.sparse.save_npz's, a SparseTensor's own
    keys, or one numpy array."""
    from sparseserve import SparseTensor

    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{what}: cannot read {path} as .npz: {exc}") from None
    if isinstance(loaded, np.ndarray):  # an .npy file
        return loaded
    with loaded:
        keys = set(loaded.files)
        arrays = {k: loaded[k] for k in keys}
    if {"format", "shape", "data"} <= keys:
        return _from_scipy_arrays(arrays, path, what)
    if {"dense_shape", "values"} <= keys:
        layout = str(arrays["layout"]) if "layout" in arrays else "coo"
        try:
            return SparseTensor(indices=arrays.get("indices"), values=arrays["values"],
                                dense_shape=arrays["dense_shape"], layout=layout,
                                compressed_indices=arrays.get("compressed_indices"),
                                plain_indices=arrays.get("plain_indices"), blocksize=arrays.get("blocksize"))
        except ValueError as exc:
            raise UsageError(f"{what}: {path} is not a SparseTensor: {exc}") from None
    if len(keys) == 1:
        return arrays[keys.pop()]
    raise UsageError(f"{what}: {path} holds {sorted(keys)}: not scipy.sparse.save_npz's arrays (format, shape, "
                     "data, ...), a SparseTensor's (indices, values, dense_shape) or one numpy array")


def _from_scipy_arrays(arrays: dict[str, np.ndarray], path: str, what: str) -> Any:
    from sparseserve import SparseTensor

    fmt = arrays["format"].item()
    fmt = fmt.decode("ascii") if isinstance(fmt, bytes) else str(fmt)
    shape = tuple(int(d) for d in arrays["shape"])
    data = arrays["data"]
    if fmt in ("csr", "csc", "bsr"):
        return SparseTensor(layout=fmt, compressed_indices=arrays["indptr"], plain_indices=arrays["indices"],
                            values=data, dense_shape=shape, blocksize=data.shape[1:] if fmt == "bsr" else None)
    if fmt == "coo":
        coords = list(arrays["coords"]) if "coords" in arrays else [arrays["row"], arrays["col"]]
        return SparseTensor(indices=np.stack(coords, axis=1).astype(np.int64), values=data, dense_shape=shape)
    raise UsageError(f"{what}: {path} is a scipy {fmt!r} matrix; save it as csr, csc, bsr or coo "
                     "(m.tocsr()) for sparseserve")


def _scipy_arrays(t: Any) -> dict[str, Any] | None:
    """``t`` as scipy.sparse.save_npz writes it, where scipy has its layout (2-D, scalar values)."""
    if len(t.dense_shape) != 2:
        return None
    common = {"shape": np.asarray(t.dense_shape, dtype=np.int64), "data": t.values}
    if t.layout == "coo" and t.values.ndim == 1:
        return {"format": b"coo", "row": t.indices[:, 0], "col": t.indices[:, 1], **common}
    if (t.layout in ("csr", "csc") and t.values.ndim == 1) or (t.layout == "bsr" and t.values.ndim == 3):
        return {"format": t.layout.encode(), "indices": t.plain_indices, "indptr": t.compressed_indices, **common}
    return None


def write_tensor(path: str, value: Any) -> None:
    """``value`` into an .npz file at exactly ``path`` (``tensor_files`` in the help)."""
    from sparseserve import SparseTensor

    if isinstance(value, SparseTensor):
        arrays = _scipy_arrays(value)
        if arrays is None:
            arrays = {"layout": value.layout, "dense_shape": np.asarray(value.dense_shape, dtype=np.int64),
                      "values": value.values}
            names = ("indices",) if value.layout == "coo" else ("compressed_indices", "plain_indices")
            arrays |= {n: getattr(value, n) for n in names}
            if value.blocksize is not None:
                arrays["blocksize"] = np.asarray(value.blocksize, dtype=np.int64)
    else:
        arrays = {"arr_0": np.asarray(value)}  # numpy.savez's name for one array
    try:
        with open(path, "wb") as fh:  # a file object: numpy.savez would add .npz to a name without it
            np.savez(fh, **arrays)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


# ------------------------------------------------------------------ printing results
def _show(label: str | None, value: Any) -> None:
    from sparseserve import HandleRef, SparseTensor

    head = f"{label}: " if label else ""
    if isinstance(value, HandleRef):
        print(f"{head}{value.handle}")
    elif isinstance(value, SparseTensor):
        extra = f", blocksize={list(value.blocksize)}" if value.blocksize is not None else ""
        print(f"{head}SparseTensor(layout={value.layout!r}, dense_shape={list(value.dense_shape)}, "
              f"dtype={value.dtype}, nnz={value.nnz}{extra})")
        for name in ("indices",) if value.layout == "coo" else ("compressed_indices", "plain_indices"):
            print(f"{name}:\n{getattr(value, name)}")
        print(f"values:\n{value.values}")
    elif isinstance(value, np.ndarray) and value.ndim:
        print(f"{head}\n{value}" if head else value)
    else:  # a number, or a 0-d array
        print(f"{head}{value}")


def _results(op: dict, result: Any) -> list[tuple[str, Any]]:
    """(name, value) of each output, a list output's tensors as ``name[i]``."""
    names = [o["name"] for o in op["outputs"]]
    values = [result] if len(names) == 1 else list(result)
    flat: list[tuple[str, Any]] = []
    for name, value in zip(names, values):
        flat += [(f"{name}[{i}]", v) for i, v in enumerate(value)] if isinstance(value, list) else [(name, value)]
    return flat


def _output_path(base: str, name: str, several: bool) -> str:
    """``base`` itself for one output; ``<stem>.<name>.npz`` beside it for each of several."""
    if not several:
        return base
    p = Path(base)
    stem = p.name[:-4] if p.name.endswith(".npz") else p.name
    return str(p.with_name(f"{stem}.{name.replace('[', '.').replace(']', '')}.npz"))


# ------------------------------------------------------------------ commands
def _client(args: argparse.Namespace):
    from sparseserve import Client

    if not args.target:
        raise UsageError("no server: give --target (host:port or grpc://host:port for gRPC, "
                         "http(s)://host:port for REST, grpcs:// for gRPC over TLS) or set SPARSESERVE_TARGET")
    try:
        return Client(args.target, token=args.token or None, timeout=args.timeout, ca_file=args.ca_file or None,
                      cert_file=args.cert_file or None, key_file=args.key_file or None)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _jsonable(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else repr(value)


def cmd_ops(args: argparse.Namespace) -> int:
    with _client(args) as c:
        catalogue = c.list_ops()
        if args.json:
            print(json.dumps({"device": c.device, "ops": list(catalogue.values())}, indent=2, default=_jsonable))
            return 0
        width = max((len(name) for name in catalogue), default=0)
        for name in sorted(catalogue):
            doc = catalogue[name]["doc"].strip().splitlines()
            print(f"{name:<{width}}  {doc[0] if doc else ''}")
    return 0


def cmd_call(args: argparse.Namespace) -> int:
    if args.keep and args.output:
        raise UsageError("--keep leaves the results on the server (their handles are printed): drop -o")
    with _client(args) as c:
        catalogue = c.list_ops()
        if args.op not in catalogue:
            raise UsageError(f"unknown op {args.op!r}: `sparseserve ops` lists the {len(catalogue)} ops of "
                             f"{args.target}")
        op = catalogue[args.op]
        result = c.call(args.op, keep=args.keep, **bind_arguments(op, args.arg))
    outputs = _results(op, result)
    several = len(outputs) > 1
    for name, value in outputs:
        if args.output:
            path = _output_path(args.output, name, several)
            write_tensor(path, value)
            if several:
                print(f"{name}: {path}")
        else:
            _show(name if several else None, value)
    return 0


def cmd_put(args: argparse.Namespace) -> int:
    tensor = read_tensor(args.file, "put")
    with _client(args) as c:
        print(c.put(tensor, partitions=args.partitions, progress=True if args.progress else None).handle)
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    with _client(args) as c:
        value = c.get(args.handle, progress=True if args.progress else None)
    if args.output:
        write_tensor(args.output, value)
    else:
        _show(None, value)
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with _client(args) as c:
        c.delete(args.handle)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparseserve", description="Run the sparseserve server, or speak to one.", epilog=_FILES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    env = os.environ.get
    server = argparse.ArgumentParser(add_help=False)
    talk = server.add_argument_group("the server")
    talk.add_argument("--target", default=env("SPARSESERVE_TARGET"),
                      help="host:port or grpc://host:port (gRPC), http://host:port (REST), grpcs:// or "
                           "https:// (TLS) [SPARSESERVE_TARGET]")
    talk.add_argument("--token", default=env("SPARSESERVE_TOKEN"), help="bearer token [SPARSESERVE_TOKEN]")
    talk.add_argument("--ca-file", default=env("SPARSESERVE_CA_FILE"),
                      help="PEM CA the server's certificate is signed by (default: the system's) [SPARSESERVE_CA_FILE]")
    talk.add_argument("--cert-file", default=env("SPARSESERVE_CERT_FILE"),
                      help="PEM client certificate, for a server with --tls-client-ca [SPARSESERVE_CERT_FILE]")
    talk.add_argument("--key-file", default=env("SPARSESERVE_KEY_FILE"),
                      help="the client certificate's PEM private key [SPARSESERVE_KEY_FILE]")
    talk.add_argument("--timeout", type=float, default=None, help="seconds each call may take")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("serve", add_help=False,
                        help="run the server (the [server] extra; `sparseserve serve --help` lists its flags)")

    def command(name: str, run: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[server], help=help, description=help, epilog=_FILES_HELP,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.set_defaults(run=run)
        return sub

    ops = command("ops", cmd_ops, "list the server's ops, one line each")
    ops.add_argument("--json", action="store_true", help="the whole catalogue (arguments, types, defaults) as JSON")
    call = command("call", cmd_call, "run an op and print its outputs, or save them with -o")
    call.add_argument("op", help="the op's name (`sparseserve ops` lists them)")
    call.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE",
                      help="an argument: a value as its type in the catalogue reads it (2, 0.5, true, [0,1], text), "
                           "@FILE.npz for a tensor, or h-... for a handle; repeat for each argument")
    call.add_argument("-o", "--output", metavar="FILE",
                      help="write the output to FILE (several outputs: FILE's stem.<output>.npz each)")
    call.add_argument("--keep", action="store_true", help="leave the outputs on the server and print their handles")
    put = command("put", cmd_put, "keep the tensor of an .npz file on the server; prints its handle")
    put.add_argument("file", metavar="FILE")
    put.add_argument("--partitions", type=int, default=0,
                     help="cut it into N row blocks on the Dask workers (a server with --dask-scheduler)")
    put.add_argument("--progress", action="store_true", help="draw a progress bar (the [progress] extra: tqdm)")
    get = command("get", cmd_get, "fetch a kept tensor into an .npz file (-o), or print it")
    get.add_argument("handle", metavar="HANDLE")
    get.add_argument("-o", "--output", metavar="FILE", help="the .npz file to write (see Files below)")
    get.add_argument("--progress", action="store_true", help="draw a progress bar (the [progress] extra: tqdm)")
    delete = command("delete", cmd_delete, "free a kept tensor")
    delete.add_argument("handle", metavar="HANDLE")
    return parser


def serve(argv: list[str]) -> int:
    try:
        from sparseserve.server import main as serve_main
        import numba, fastapi, uvicorn  # noqa: F401,E401
    except ImportError as exc:
        print(f"sparseserve serve needs the server extra ({exc.name} is missing): "
              'pip install "sparseserve[server]"', file=sys.stderr)
        return 2
    return serve_main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "serve":  # the server parses its own flags (server/config.py)
        return serve(argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return int(exc.code or 0)
    if args.command is None:
        parser.print_usage(sys.stderr)
        return 2
    from sparseserve.errors import SparseServeError

    prefix = f"sparseserve {args.command}"
    try:
        return args.run(args)
    except UsageError as exc:
        print(f"{prefix}: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:  # --progress without tqdm
        print(f"{prefix}: {exc}", file=sys.stderr)
        return 2
    except SparseServeError as exc:
        print(f"{prefix}: {exc.code} ({exc.reason}): {exc.message} [request id {exc.request_id}]", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # stdout closed early (`| head`): quiet, as a killed pipe writer is
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return 141


if __name__ == "__main__":
    sys.exit(main())
