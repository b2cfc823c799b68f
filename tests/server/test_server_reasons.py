"""Reasons are data: every error the code raises names a member of ``Reason``, under a code the
member lists, and every member is raised somewhere (docs/contract.md's table is made from it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sparseserve.core import errors
from sparseserve.core.reasons import Reason

ROOT = Path(__file__).resolve().parent.parent.parent
SOURCES = sorted(p for folder in ("client", "server", "kernels") for p in (ROOT / folder).rglob("*.py")
                 if "v1" not in p.parts and p.name != "reasons.py")
CODES = {cls.__name__: cls.code for cls in errors.ERROR_CLASSES}


def _members(node: ast.AST) -> list[str] | None:
    """The Reason members an expression names (``Reason.X``, or ``Reason.X if c else Reason.Y``);
    None when it names none."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Reason":
        return [node.attr]
    if isinstance(node, ast.IfExp):
        body, orelse = _members(node.body), _members(node.orelse)
        return None if body is None or orelse is None else body + orelse
    return None


def _reason_arguments():
    """(path, line, error class or None, the expression given as a reason) of every call with a
    ``reason=`` keyword, and the literal reason strings found anywhere as a keyword default."""
    for path in SOURCES:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                for keyword in node.keywords:
                    if keyword.arg == "reason":
                        yield path, node.lineno, name, keyword.value


def test_every_reason_given_is_a_member_or_passed_through():
    literal = []
    for path, line, _, value in _reason_arguments():
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            literal.append(f"{path.relative_to(ROOT)}:{line}: reason={value.value!r}")
        names = _members(value)
        for name in names or ():
            assert name in Reason.__members__, f"{path.relative_to(ROOT)}:{line}: Reason.{name} is no member"
    assert not literal, "reasons named by string instead of Reason:\n" + "\n".join(literal)


def test_each_error_is_raised_under_a_code_its_reason_lists():
    wrong = []
    for path, line, cls, value in _reason_arguments():
        if cls not in CODES:
            continue
        for name in _members(value) or ():
            if CODES[cls] not in Reason[name].codes:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {cls} with Reason.{name} ({Reason[name].codes})")
    assert not wrong, "\n".join(wrong)


def test_every_member_is_raised_somewhere_and_means_something():
    text = "\n".join(p.read_text() for p in SOURCES)
    unused = [r.value for r in Reason if f"Reason.{r.value}" not in text]
    assert not unused, f"reasons nothing raises: {unused}"
    for reason in Reason:
        assert reason.codes and all(c in CODES.values() or c == "CANCELLED" for c in reason.codes), reason
        assert reason.meaning.endswith(".") and len(reason.meaning) > 20, reason


@pytest.mark.parametrize("reason", [Reason.SHAPE_MISMATCH, "SHAPE_MISMATCH"])
def test_a_reason_is_kept_as_a_plain_string(reason):
    err = errors.InvalidArgumentError("m", reason=reason)
    assert type(err.reason) is str and err.reason == "SHAPE_MISMATCH" == Reason.SHAPE_MISMATCH
    assert err.to_json()["error"]["reason"] == "SHAPE_MISMATCH"
