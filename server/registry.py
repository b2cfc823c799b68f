"""The op registry: each op declared once.

A declaration gives the name, typed arguments with defaults, named outputs, docs, the op's
``check`` and a kernel per device. ``Execute``, ``POST /v1/ops/{op}``, ``GET /v1/ops``, the
OpenAPI schema and the SDK's methods are all derived from it, so adding an op touches one place
(a module under ``server/ops``).

A call goes through three steps, in this order and each once:

1. ``bind``: the argument types coerce the raw values (tensors validated against
   docs/contract.md, choices and axes normalised), defaults filled in.
2. ``check(**bound) -> Plan``: the op's rules. It reads shapes, dtypes, layouts and argument
   values, never a tensor's entries; it makes every refusal the op has and decides the result's
   dtype, layout and shape and the arguments the kernels take. The service runs it once before
   dispatch; the partitioned path runs it on the tensor's description (an entry-less stand-in
   of the whole shape) before any block works.
3. A kernel (the CPU function, the GPU kernel, or the partition plan's blocks) takes the plan's
   arguments. It may raise only what depends on the entries (a division by zero at a stored
   entry, a singular factor, a breakdown) or, on the GPU, ``Fallback``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from sparseserve.core.errors import InvalidArgumentError, NotFoundError
from sparseserve.core.reasons import Reason

from .argtypes import ArgType

__all__ = ["REQUIRED", "Arg", "Output", "Plan", "OpDef", "Registry", "REGISTRY"]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Arg:
    name: str
    type: ArgType
    doc: str
    default: Any = REQUIRED
    # For tensor arguments: the layouts the op is declared for ("dense" for a dense tensor).
    layouts: tuple[str, ...] = ("coo",)

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass(frozen=True)
class Output:
    name: str
    # "sparse" or "dense"; "sparse_list" (or "dense_list") for a list of such tensors, whose
    # length the call decides (split's num_split): the kernel returns a Python list for it.
    # On the wires a list output ``out`` of n tensors travels as the entry ``out[]`` holding n
    # (an int64 scalar), then ``out[0]`` ... ``out[n-1]`` (protobuf), or as a JSON array under
    # ``out`` (REST JSON); the SDK hands back a Python list, and with keep a list of handles.
    type: str
    doc: str

    @property
    def is_list(self) -> bool:
        return self.type.endswith("_list")


@dataclass(frozen=True)
class Plan:
    """What an op's ``check`` decided about one call, from metadata alone.

    ``args`` are what the check changes or adds to the bound arguments for the kernels (an
    axis made non-negative, a default resolved, a dtype derived); ``OpDef.plan`` merges them
    over the bound arguments, so a kernel receives every argument. ``dtype``, ``layout``
    ("dense" or a sparse layout) and ``shape`` describe the first output where the call's
    metadata decides them (None where the entries do: a split's parts, a factor's sizes)."""

    args: Mapping[str, Any] = field(default_factory=dict)
    dtype: np.dtype | None = None
    layout: str | None = None
    shape: Sequence[int] | None = None  # kept as a tuple of ints
    # The bound arguments the check was given (``OpDef.plan`` fills it in): what to check
    # again when a tensor argument is replaced by another of another shape (a merged batch).
    bound: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.dtype is not None:
            object.__setattr__(self, "dtype", np.dtype(self.dtype))
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    def with_args(self, **changes: Any) -> Plan:
        """The same plan, some arguments replaced (a device's copies of the tensors)."""
        return replace(self, args={**self.args, **changes})


@dataclass(frozen=True)
class OpDef:
    name: str
    doc: str
    args: tuple[Arg, ...]
    outputs: tuple[Output, ...]
    # check(**bound) -> Plan: every refusal of the op, from metadata (the module docstring).
    check: Callable[..., Plan]
    # "cpu" -> function(**plan.args) returning one output or a tuple in declared order;
    # "cuda" -> a GpuKernel (Registry.gpu), when the op has one;
    # "dask" -> its plan for partitioned tensors (Registry.partitioned), when it has one.
    kernels: dict[str, Any]
    # Optional: bytes of the result computed from the plan's arguments, checked against
    # --max-result-bytes before the kernel allocates anything.
    result_bytes: Callable[..., int] | None = None
    # Concurrent calls may be merged into one kernel call (server/batching.py says how).
    batchable: bool = False
    # Its cost is not bounded by its input's size (an iterative solver: a small matrix and
    # 20,000 iterations), so it always runs in the kernel pool, never on the event loop; it calls
    # ``limits.between_iterations`` as it goes (the caller's deadline, and progress reports).
    iterative: bool = False

    def bind(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Named raw values -> the arguments ``check`` takes, defaults filled in.

        Unknown or missing arguments and values of the wrong type raise
        ``InvalidArgumentError`` naming the argument. Types that depend on another argument
        (an axis of a tensor) resolve once every argument is coerced."""
        unknown = sorted(raw.keys() - self.args_by_name)
        if unknown:
            raise InvalidArgumentError(
                f"{self.name} has no argument {unknown[0]!r}; its arguments are "
                f"{', '.join(a.name for a in self.args)}", reason=Reason.UNKNOWN_ARGUMENT)
        bound = {}
        for arg in self.args:
            if arg.name in raw and raw[arg.name] is not None:
                bound[arg.name] = arg.type.coerce(raw[arg.name], arg, self.name)
            elif arg.required:
                raise InvalidArgumentError(f"{self.name} needs argument {arg.name!r}",
                                           reason=Reason.MISSING_ARGUMENT)
            else:
                bound[arg.name] = arg.default
        for arg in self.args:
            if arg.type.resolve is not None:
                bound[arg.name] = arg.type.resolve(bound[arg.name], bound, arg.name)
        return bound

    @cached_property
    def args_by_name(self) -> dict[str, Arg]:
        return {a.name: a for a in self.args}

    def plan(self, bound: Mapping[str, Any]) -> Plan:
        """The op's ``check`` on bound arguments: its refusals raised, and its plan, whose
        ``args`` are every argument the kernels take."""
        result = self.check(**bound)
        if not isinstance(result, Plan):
            raise TypeError(f"the check of {self.name} returned {type(result).__name__}, not a Plan")
        return replace(result, args={**bound, **result.args}, bound=dict(bound))

    def run_plan(self, device: str, plan: Plan) -> tuple[Any, ...]:
        """The outputs of ``device``'s kernel on a checked call (the GPU backend dispatches
        ``cuda`` kernels itself)."""
        result = self.kernels[device](**plan.args)
        return result if isinstance(result, tuple) else (result,)

    def run(self, device: str, bound: Mapping[str, Any]) -> tuple[Any, ...]:
        """Check, then run: the outputs of bound arguments, as the server computes them."""
        return self.run_plan(device, self.plan(bound))

    def describe(self) -> dict[str, Any]:
        """The catalogue entry: what ``GET /v1/ops`` and ``ListOps`` say about this op."""
        return {
            "name": self.name,
            "doc": self.doc,
            "args": [_describe_arg(a) for a in self.args],
            "outputs": [{"name": o.name, "type": o.type, "doc": o.doc} for o in self.outputs],
            # Iterative ops report progress (ExecuteWithProgress, the SDK's ``progress=``).
            "iterative": self.iterative,
        }


def _describe_arg(a: Arg) -> dict[str, Any]:
    entry = {"name": a.name, "type": a.type.name, "required": a.required,
             "default": None if a.required else a.default, "doc": a.doc,
             "layouts": list(a.layouts) if a.type.is_tensor or a.type.is_tensor_list else []}
    if a.type.choices:
        entry["choices"] = list(a.type.choices)
    return entry


@dataclass
class Registry:
    ops: dict[str, OpDef] = field(default_factory=dict)

    def op(self, name: str, *, doc: str, args: list[Arg], outputs: list[Output], check: Callable[..., Plan],
           result_bytes: Callable[..., int] | None = None, batchable: bool = False,
           iterative: bool = False) -> Callable:
        """Decorator declaring an op whose CPU kernel is the decorated function; ``check`` is
        the op's rules (the module docstring)."""

        def register(fn: Callable) -> Callable:
            if name in self.ops:
                raise ValueError(f"op {name!r} is declared twice")
            self.ops[name] = OpDef(name, doc.strip(), tuple(args), tuple(outputs), check, {"cpu": fn},
                                   result_bytes, batchable, iterative)
            return fn

        return register

    def gpu(self, name: str, *, layouts: Mapping[str, tuple[str, ...]] | None = None,
            dtypes: tuple[str, ...] | None = None, matrices: tuple[str, ...] = (),
            declines: Callable[[Plan], str | None] | None = None) -> Callable:
        """Decorator giving the declared op ``name`` its GPU kernel: ``fn(backend, **plan.args)``,
        array code over ``backend.xp``/``backend.sparse`` (``server/device.py``), and what it
        can take: per tensor argument the ``layouts`` it handles, the ``dtypes`` of the plan's
        result it computes, the sparse arguments that must be ``matrices`` (2-D, no batch or
        dense dimensions), and ``declines(plan)``, a reason word for checked calls it leaves to
        the CPU (sizes past int32 indices, say). Never a refusal: ``check`` has made those."""
        from .device import GpuKernel

        def register(fn: Callable) -> Callable:
            op = self.ops[name]  # declared above it, in the same module
            if "cuda" in op.kernels:
                raise ValueError(f"op {name!r} has two GPU kernels")
            op.kernels["cuda"] = GpuKernel(fn, dict(layouts or {}), dtypes, matrices, declines)
            return fn

        return register

    def partitioned(self, name: str, plan: Any) -> None:
        """How the declared op ``name`` runs on a tensor cut into row blocks across Dask workers
        (a plan of ``server/partition.py``). Ops without one gather such tensors first."""
        op = self.ops[name]
        if "dask" in op.kernels:
            raise ValueError(f"op {name!r} has two partitioned plans")
        op.kernels["dask"] = plan

    def get(self, name: str) -> OpDef:
        try:
            return self.ops[name]
        except KeyError:
            raise NotFoundError(f"no op named {name!r}; GET /v1/ops lists them",
                                reason=Reason.UNKNOWN_OP) from None

    def __iter__(self):
        return iter(self.ops.values())


REGISTRY = Registry()
