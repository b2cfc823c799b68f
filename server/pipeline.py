"""Pipelines: a short chain of ops in one request, outputs of one step feeding the next.

A step's arguments are values as for ``Execute``, or ``OutputRef("<step>.<output>")``
naming an output of an earlier step. A list output (split's) is named whole, for a
tensor-list argument (spliced in where it is one item of a list), or one element at a time
as ``"<step>.<output>[i]"`` (its range checked when the step runs, since the length is
the call's). Everything that can be checked before any
kernel runs is: step names, ops, argument names, references (earlier steps, declared
outputs, tensor arguments only), and every argument that is not a reference —
tensors included — through the op's own argument types. Then the steps run one
after another in one trip to the kernel pool, and only the chosen outputs leave.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sparseserve.core.tensor import OutputRef
from sparseserve.core.errors import InvalidArgumentError, SparseServeError
from sparseserve.core.reasons import Reason

from . import tracing
from .limits import check_deadline
from .registry import OpDef, Registry

__all__ = ["Step", "plan_pipeline", "run_steps", "MAX_STEPS"]

# A pipeline is a short chain, not a program: bounded so one request stays bounded.
MAX_STEPS = 32


@dataclass(frozen=True)
class Step:
    name: str
    op: OpDef
    args: dict[str, Any]


def _step_error(step: str, err: SparseServeError) -> SparseServeError:
    """The same error class and reason, the message saying which step."""
    return type(err)(f"step {step!r}: {err.message}", reason=err.reason)


_ELEMENT = re.compile(r"^(.+)\[(\d+)\]$")


def _element(ref: str) -> tuple[str, int] | None:
    """("<step>.<output>", i) of an element reference "<step>.<output>[i]", else None."""
    match = _ELEMENT.match(ref)
    return (match.group(1), int(match.group(2))) if match else None


def _known(ref: str, available: set[str], lists: set[str]) -> bool:
    element = _element(ref)
    return ref in available or (element is not None and element[0] in lists)


def _refs_in(value: Any) -> list[OutputRef]:
    if isinstance(value, OutputRef):
        return [value]
    if isinstance(value, list):
        return [r for v in value for r in _refs_in(v)]
    return []


def plan_pipeline(registry: Registry, raw_steps: list[tuple[str, str, dict[str, Any]]],
                  outputs: list[str]) -> tuple[list[Step], list[str]]:
    """Checked steps and the output names to return ("<step>.<output>"), or the first problem
    as INVALID_ARGUMENT (NOT_FOUND for an unknown op) naming the step and the argument."""
    if not raw_steps:
        raise InvalidArgumentError("a pipeline needs at least one step", reason=Reason.EMPTY_PIPELINE)
    if len(raw_steps) > MAX_STEPS:
        raise InvalidArgumentError(f"a pipeline has at most {MAX_STEPS} steps, not {len(raw_steps)}",
                                   reason=Reason.PIPELINE_TOO_LONG)
    available: set[str] = set()
    lists: set[str] = set()  # the list outputs among them
    steps: list[Step] = []
    for index, (name, op_name, args) in enumerate(raw_steps):
        name = name or f"step{index}"
        if "." in name or any(s.name == name for s in steps):
            raise InvalidArgumentError(f"step {index} is named {name!r}: step names must be unique and "
                                       "contain no '.'", reason=Reason.BAD_STEP_NAME)
        try:
            op = registry.get(op_name)
            _check_arguments(op, args, available, lists)
        except SparseServeError as err:
            raise _step_error(name, err) from None
        steps.append(Step(name, op, args))
        available |= {f"{name}.{out.name}" for out in op.outputs}
        lists |= {f"{name}.{out.name}" for out in op.outputs if out.is_list}
    chosen = list(outputs) or [f"{steps[-1].name}.{out.name}" for out in steps[-1].op.outputs]
    for out in chosen:
        if not _known(out, available, lists):
            raise InvalidArgumentError(f"outputs names {out!r}, which no step produces; available: "
                                       f"{', '.join(sorted(available))}", reason=Reason.UNKNOWN_OUTPUT)
    return steps, chosen


def _check_arguments(op: OpDef, args: dict[str, Any], available: set[str], lists: set[str]) -> None:
    declared = {a.name: a for a in op.args}
    for arg_name, value in args.items():
        arg = declared.get(arg_name)
        if arg is None:
            raise InvalidArgumentError(f"{op.name} has no argument {arg_name!r}; its arguments are "
                                       f"{', '.join(declared)}", reason=Reason.UNKNOWN_ARGUMENT)
        refs = _refs_in(value)
        if not refs:
            if value is not None:
                arg.type.coerce(value, arg, op.name)  # the op's own check, tensors included
            continue
        if not (arg.type.is_tensor or arg.type.is_tensor_list):
            raise InvalidArgumentError(f"{arg_name} names an earlier output, but only tensor arguments "
                                       "may", reason=Reason.BAD_REF)
        for ref in refs:
            if not _known(ref.ref, available, lists):
                raise InvalidArgumentError(
                    f"{arg_name} names {ref.ref!r}, which is not an output of an earlier step"
                    + (f"; available: {', '.join(sorted(available))}" if available else ""),
                    reason=Reason.UNKNOWN_REF)
            if ref.ref in lists and not arg.type.is_tensor_list:
                raise InvalidArgumentError(
                    f"{arg_name} takes one tensor but names {ref.ref!r}, a list output; name one of its "
                    f"tensors as {ref.ref + '[0]'!r}, ... or pass it to a list argument", reason=Reason.BAD_REF)
    for arg in op.args:
        if arg.required and args.get(arg.name) is None:
            raise InvalidArgumentError(f"{op.name} needs argument {arg.name!r}", reason=Reason.MISSING_ARGUMENT)


def _lookup(results: dict[str, Any], ref: str) -> Any:
    """The value of an output ("<step>.<output>"), or of one tensor of a list output
    ("<step>.<output>[i]"): INVALID_ARGUMENT past the list's end."""
    if ref in results:
        return results[ref]
    element = _element(ref)
    if element is None:  # planning checked every reference: only an element one is not a key
        raise KeyError(ref)
    base, index = element
    items = results[base]
    if index >= len(items):
        raise InvalidArgumentError(f"{ref!r} is past the end of {base!r}, which holds {len(items)} "
                                   f"tensor{'' if len(items) == 1 else 's'}", reason=Reason.BAD_REF)
    return items[index]


def _substitute(value: Any, results: dict[str, Any]) -> Any:
    if isinstance(value, OutputRef):
        return _lookup(results, value.ref)
    if isinstance(value, list):  # a whole list output among the items is spliced in
        out = []
        for v in value:
            got = _substitute(v, results)
            out.extend(got) if isinstance(v, OutputRef) and isinstance(got, list) else out.append(got)
        return out
    return value


def run_steps(service, steps: list[Step], chosen: list[str], to_host: bool = False) -> list[tuple[str, Any]]:
    """Run the planned steps in order (in a kernel-pool thread); the chosen outputs by name
    (with ``to_host``, a GPU worker's copied to the host here). Intermediate results live only
    here and are dropped once the request ends, or once the caller's deadline passes: it is
    checked before each step."""
    results: dict[str, Any] = {}
    for step in steps:
        check_deadline(f"before pipeline step {step.name!r}")
        try:
            with tracing.span("pipeline step", {"sparseserve.step": step.name, "sparseserve.op": step.op.name},
                              parent=True):  # its validation and kernel spans within
                args = {name: _substitute(value, results) for name, value in step.args.items()}
                outputs = service._compute(step.op, service._plan(step.op, args))
        except SparseServeError as err:
            raise _step_error(step.name, err) from None
        results.update({f"{step.name}.{name}": value for name, value in outputs})
    picked = [(name, _lookup(results, name)) for name in chosen]
    if to_host:
        return [(name, service._on_host(value)) for name, value in picked]
    return picked
