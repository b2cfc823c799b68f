"""Pipelines in the SDK: ops queued locally, then run on the server in one request.

::

    p = client.pipeline()
    summed = p.coalesce(sp)                    # a step; summed.output names its output
    dense = p.to_dense(summed, default_value=0)
    result = p.run()                           # the last step's output, as a plain call returns it
    both = p.run(summed.output, dense.output)  # or chosen outputs, in that order

A step passed where a tensor goes stands for its first output. A list output (split's) is
named whole, for a list argument, or one tensor at a time::

    parts = p.split(sp, num_split=3, axis=1)
    p.concat(axis=1, sp_inputs=parts.output)    # the whole list
    p.reorder(parts.output[2])                  # its third tensor
"""

from __future__ import annotations

from typing import Any

from .core.tensor import OutputRef

__all__ = ["Pipeline", "PipelineStep", "ListOutputRef"]


class ListOutputRef(OutputRef):
    """A list output of a step: the whole list, or ``[i]`` for its tensor i."""

    def __getitem__(self, index: int) -> OutputRef:
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise IndexError(f"{self.ref}: an element is named by a non-negative int, not {index!r}")
        return OutputRef(f"{self.ref}[{index}]")


class PipelineStep:
    """A queued op. Attribute ``<output>`` (or ``[i]``) is an ``OutputRef`` to later steps."""

    def __init__(self, name: str, op: dict):
        self.name = name
        self.op = op["name"]
        self._outputs = [o["name"] for o in op["outputs"]]
        self._lists = {o["name"] for o in op["outputs"] if str(o.get("type", "")).endswith("_list")}

    def _ref(self, output: str) -> OutputRef:
        ref = f"{self.name}.{output}"
        return ListOutputRef(ref) if output in self._lists else OutputRef(ref)

    def __getattr__(self, output: str) -> OutputRef:
        if output.startswith("_") or output not in self._outputs:
            raise AttributeError(f"step {self.name!r} ({self.op}) has no output {output!r}; its outputs are "
                                 f"{', '.join(self._outputs)}")
        return self._ref(output)

    def __getitem__(self, index: int) -> OutputRef:
        return self._ref(self._outputs[index])

    def __repr__(self) -> str:
        return f"PipelineStep({self.name!r}, op={self.op!r})"


def _refs(value: Any) -> Any:
    """Steps given as arguments stand for their first output."""
    if isinstance(value, PipelineStep):
        return value[0]
    if isinstance(value, (list, tuple)) and any(isinstance(v, PipelineStep) for v in value):
        return [_refs(v) for v in value]
    return value


class Pipeline:
    """Build with op methods (``p.coalesce(...)``) or ``add``; ``run`` sends it (await it with an
    ``AsyncClient``)."""

    def __init__(self, client, catalogue: dict[str, dict]):
        self._client = client
        self._catalogue = catalogue
        self._steps: list[tuple[str, str, dict[str, Any]]] = []

    def add(self, op: str, *args: Any, name: str | None = None, **kwargs: Any) -> PipelineStep:
        if op not in self._catalogue:
            raise AttributeError(f"the server has no op {op!r}")
        name = name or f"s{len(self._steps)}"
        named = self._client._bind(op, tuple(_refs(a) for a in args),
                                   {k: _refs(v) for k, v in kwargs.items()}, self._catalogue)
        self._steps.append((name, op, named))
        return PipelineStep(name, self._catalogue[op])

    def __getattr__(self, op: str):
        if op.startswith("_") or op not in self._catalogue:
            raise AttributeError(f"Pipeline has no attribute or op {op!r}")
        return lambda *args, name=None, **kwargs: self.add(op, *args, name=name, **kwargs)

    def run(self, *outputs: OutputRef, keep: bool = False) -> Any:
        """Run every step on the server; the chosen outputs (default: the last step's) come back
        as a plain call returns them — one value, or a tuple in order."""
        return self._client._run_pipeline(self._steps, [o.ref for o in outputs], keep)

    def __len__(self) -> int:
        return len(self._steps)
