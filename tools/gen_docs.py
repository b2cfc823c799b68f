"""Write the op catalogue into the docs from the registry: ``python tools/gen_docs.py [--check]``.

These places are generated, never edited by hand:

- the README's op table, between the ``<!-- ops:begin -->`` and ``<!-- ops:end -->`` markers
  (one line per op: its tensor arguments with the layouts each takes, its outputs, the first
  line of its doc);
- ``docs/ops.md``, the whole catalogue: every argument with its type, default and doc, every
  output, the op's full doc;
- in ``docs/gpu.md``, which ops have a GPU kernel and what each takes (its declaration);
- in ``docs/contract.md``, the error table (from ``sparseserve.core.errors``) and every reason
  with its codes and meaning (from ``sparseserve.core.reasons.Reason``, the enumeration the
  raising code names its reasons from).

The catalogue comes from ``GET /v1/ops``'s own source (``OpDef.describe``), so it says what the
server serves. ``--check`` writes nothing and exits 1 naming the stale file; ``tests/deploy/test_deploy_docs_fresh.py``
runs the same check, so a new op or a changed doc fails the suite until ``make docs`` is run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CATALOGUE = ROOT / "docs" / "ops.md"
CONTRACT = ROOT / "docs" / "contract.md"
GPU = ROOT / "docs" / "gpu.md"
# HTTP statuses a code takes besides its class's own.
_HTTP_NOTES = {"INVALID_ARGUMENT": "400 (422: a body the schema refuses)",
               "RESOURCE_EXHAUSTED": "413 (429: a tenant's quota; 507: the disk tier full)"}

_SUMMARY_CHARS = 110
_LAYOUT_WORDS = {("coo", "csr", "csc", "bsr", "bsc"): "any sparse"}


def _catalogue() -> list[dict]:
    from sparseserve.server.ops import REGISTRY

    return sorted((op.describe() for op in REGISTRY), key=lambda entry: entry["name"])


def _graphblas_names() -> set[str]:
    """The ops server/ops/graphblas.py declares: one row of the README's table between them."""
    from sparseserve.server.ops import REGISTRY

    return {op.name for op in REGISTRY if op.check.__module__.endswith(".graphblas")}


def _layouts(arg: dict) -> str:
    layouts = tuple(arg["layouts"])
    sparse = tuple(name for name in layouts if name != "dense")
    words = [_LAYOUT_WORDS.get(sparse, ", ".join(sparse))] if sparse else []
    if "dense" in layouts:
        words.append("dense")
    return " or ".join(words)


def _tensor_args(entry: dict) -> str:
    parts = [f"`{a['name']}` ({_layouts(a)})" for a in entry["args"] if a["layouts"]]
    return "; ".join(parts) or "none"


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def op_table(catalogue: list[dict]) -> str:
    """The README's table: one row per op."""
    rows = ["| op | tensor arguments (layouts) | outputs | what it does |", "|---|---|---|---|"]
    graphblas = _graphblas_names()
    for entry in catalogue:
        if entry["name"] in graphblas:
            continue
        outputs = ", ".join(f"{o['name']} ({o['type']})" for o in entry["outputs"])
        summary = entry["doc"].split("\n\n")[0].replace("\n", " ")
        summary = summary.split(". ")[0].rstrip(".") + "."
        if len(summary) > _SUMMARY_CHARS:  # the rest is in docs/ops.md
            summary = summary[:summary.rfind(" ", 0, _SUMMARY_CHARS)] + " …"
        rows.append(f"| `{entry['name']}` | {_tensor_args(entry)} | {outputs} | {_escape(summary)} |")
    names = ", ".join(f"`{entry['name']}`" for entry in catalogue if entry["name"] in graphblas)
    if names:
        rows.append(f"| GraphBLAS: {names} | coo, csr, csc or dense; `mask`, `out` | output (sparse, or dense for a "
                    "scalar) | python-graphblas's Matrix and Vector methods over SuiteSparse:GraphBLAS, with its "
                    "output controls ([docs/graphs.md](docs/graphs.md)). |")
    return "\n".join(rows)


def _default(arg: dict) -> str:
    if arg["required"]:
        return "required"
    return f"default `{arg['default']!r}`" if arg["default"] is not None else "default `None`"


def catalogue_page(catalogue: list[dict]) -> str:
    """docs/ops.md: the whole catalogue."""
    lines = ["# Op catalogue", "",
             "Generated from the op registry by `make docs` (`tools/gen_docs.py`); do not edit by hand.",
             "The same entries are served by `GET /v1/ops` and gRPC `ListOps`.", ""]
    for entry in catalogue:
        lines += [f"## `{entry['name']}`", "", entry["doc"], "", "Arguments:", ""]
        for arg in entry["args"]:
            layouts = f", layouts: {', '.join(arg['layouts'])}" if arg["layouts"] else ""
            choices = f", one of: {', '.join(arg['choices'])}" if arg.get("choices") else ""
            lines.append(f"- `{arg['name']}` ({arg['type']}, {_default(arg)}{layouts}{choices}): {arg['doc']}")
        lines += ["", "Outputs:", ""]
        lines += [f"- `{o['name']}` ({o['type']}): {o['doc']}" for o in entry["outputs"]]
        lines.append("")
    return "\n".join(lines)


def error_table() -> str:
    """The error classes with their code, gRPC status, HTTP status and the Python exceptions they
    also are (InvalidArgumentTypeError on a row of its own, with its reasons)."""
    from sparseserve.core import errors

    def python(cls: type) -> str:
        return ", ".join(f"`{base.__name__}`" for base in cls.__mro__
                         if base.__module__ == "builtins" and base not in (Exception, BaseException, object))

    rows = ["| SDK class (`sparseserve.errors`) | code | gRPC status | HTTP | also a | when |",
            "|---|---|---|---|---|---|"]
    for cls in errors.ERROR_CLASSES:
        when = (cls.__doc__ or "").strip().splitlines()[0]
        http = _HTTP_NOTES.get(cls.code, str(cls.http_status))
        rows.append(f"| `{cls.__name__}` | `{cls.code}` | {cls.grpc_status.name} | {http} | {python(cls)} | {when} |")
        if cls is errors.InvalidArgumentError:
            sub, reasons = errors.InvalidArgumentTypeError, ", ".join(f"`{r}`" for r in sorted(errors.TYPE_REASONS))
            rows.append(f"| `{sub.__name__}` | `{sub.code}` | {sub.grpc_status.name} | {http} | {python(sub)} | "
                        f"An `{cls.__name__}` whose reason is {reasons}. |")
    return "\n".join(rows)


def reasons_table() -> str:
    """Every reason, under the first code it is raised with: its codes and what it means."""
    from sparseserve.core import errors
    from sparseserve.core.reasons import Reason

    order = [cls.code for cls in errors.ERROR_CLASSES]
    rank = {code: i for i, code in enumerate(order)}
    rows = ["| reason | code | meaning |", "|---|---|---|"]
    for reason in sorted(Reason, key=lambda r: (rank.get(r.codes[0], len(order)), r.value)):
        codes = ", ".join(f"`{c}`" for c in reason.codes)
        rows.append(f"| `{reason.value}` | {codes} | {reason.meaning} |")
    return "\n".join(rows)


def _between(text: str, marker: str, body: str, where: str) -> str:
    """``text`` with ``body`` between the ``<!-- marker:begin -->`` and ``<!-- marker:end -->`` lines."""
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    head, found_begin, rest = text.partition(begin)
    _, found_end, tail = rest.partition(end)
    if not (found_begin and found_end):
        raise SystemExit(f"{where} lacks the {begin} ... {end} markers")
    return f"{head}{begin}\n{body}\n{end}{tail}"


def gpu_table() -> str:
    """The ops with a GPU kernel, from their declarations (``Registry.gpu``): the layouts each
    takes per argument, the result dtypes, and what else it leaves to the CPU kernel."""
    from sparseserve.server.ops import REGISTRY

    rows = ["| op | takes | dtypes | leaves to the CPU |", "|---|---|---|---|"]
    for op in sorted(REGISTRY, key=lambda o: o.name):
        kernel = op.kernels.get("cuda")
        if kernel is None:
            continue
        takes = "; ".join(f"`{name}` {', '.join(layouts)}" for name, layouts in kernel.layouts.items())
        if kernel.matrices:
            takes += ("; " if takes else "") + f"{', '.join(f'`{m}`' for m in kernel.matrices)} as 2-D matrices"
        dtypes = ", ".join(kernel.dtypes) if kernel.dtypes else "every dtype the op takes"
        leaves = " ".join((kernel.declines.__doc__ or "").split()) if kernel.declines else ""
        rows.append(f"| `{op.name}` | {takes or 'every layout it declares'} | {dtypes} | {leaves or '—'} |")
    return "\n".join(rows)


def expected() -> dict[Path, str]:
    """Each generated file's content as it should be now."""
    catalogue = _catalogue()
    contract = _between(CONTRACT.read_text(), "errors", error_table(), "docs/contract.md")
    return {README: _between(README.read_text(), "ops", op_table(catalogue), "README.md"),
            CATALOGUE: catalogue_page(catalogue),
            GPU: _between(GPU.read_text(), "gpu", gpu_table(), "docs/gpu.md"),
            CONTRACT: _between(contract, "reasons", reasons_table(), "docs/contract.md")}


def stale() -> list[Path]:
    return [path for path, text in expected().items()
            if not path.exists() or path.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    args = parser.parse_args(argv)
    if args.check:
        old = stale()
        for path in old:
            print(f"{path} is stale: run `make docs`", file=sys.stderr)
        return 1 if old else 0
    for path, text in expected().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
