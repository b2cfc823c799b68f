"""The generated docs (the README's op table, docs/ops.md, and the error tables of
docs/contract.md) are what the code makes now: fail when stale."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import gen_docs  # noqa: E402

from sparseserve.server.ops import REGISTRY  # noqa: E402


def test_generated_docs_are_fresh():
    assert gen_docs.stale() == [], "the op catalogue in the docs is stale: run `make docs`"


def test_readme_table_lists_every_op_with_its_layouts():
    table = gen_docs.op_table(gen_docs._catalogue())
    readme = gen_docs.README.read_text()
    assert table in readme
    graphblas = gen_docs._graphblas_names()
    grouped = next(line for line in table.splitlines() if line.startswith("| GraphBLAS: "))
    for op in REGISTRY:
        if op.name in graphblas:  # one row for them all: each named there, its tensors in the layouts it says
            assert f"`{op.name}`" in grouped.split(" | ")[0], op.name
            assert all(set(arg.layouts) <= {"coo", "csr", "csc", "dense"} for arg in op.args
                       if arg.type.is_tensor or arg.type.is_tensor_list), op.name
            continue
        row = next(line for line in table.splitlines() if line.startswith(f"| `{op.name}` |"))
        for arg in op.args:
            if arg.type.is_tensor or arg.type.is_tensor_list:
                assert f"`{arg.name}`" in row, (op.name, arg.name)
                if "csr" in arg.layouts:
                    assert "csr" in row or "any sparse" in row, (op.name, arg.name)


def test_check_mode_finds_a_stale_table(tmp_path, monkeypatch):
    stale_readme = tmp_path / "README.md"
    stale_readme.write_text("x\n<!-- ops:begin -->\n| `no_such_op` |\n<!-- ops:end -->\ny\n")
    stale_contract = tmp_path / "contract.md"
    stale_contract.write_text("<!-- errors:begin -->\n<!-- errors:end -->\n<!-- reasons:begin -->\n| `X` |\n"
                              "<!-- reasons:end -->\n")
    monkeypatch.setattr(gen_docs, "README", stale_readme)
    monkeypatch.setattr(gen_docs, "CATALOGUE", tmp_path / "ops.md")
    monkeypatch.setattr(gen_docs, "CONTRACT", stale_contract)
    assert gen_docs.main(["--check"]) == 1
    assert gen_docs.main([]) == 0
    assert gen_docs.main(["--check"]) == 0
    assert "| `to_dense` |" in stale_readme.read_text() and stale_readme.read_text().endswith("y\n")
    contract = stale_contract.read_text()
    assert "| `InvalidArgumentError` | `INVALID_ARGUMENT` |" in contract and "`X`" not in contract


def test_the_reasons_table_is_the_enumeration():
    """The reasons table is read from ``Reason``, not from the code's text: a row per member with
    its codes and meaning (tests/server/test_server_reasons.py holds the raising code to the members)."""
    from sparseserve.core.reasons import Reason

    rows = gen_docs.reasons_table().splitlines()[2:]
    assert len(rows) == len(Reason)
    for reason in Reason:
        assert f"| `{reason.value}` | {', '.join(f'`{c}`' for c in reason.codes)} | {reason.meaning} |" in rows
