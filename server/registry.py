"""The op registry: each op declared once.

A declaration gives the name, typed arguments with defaults, named outputs,
docs and a kernel per device. ``Execute``, ``POST /v1/ops/{op}``,
``GET /v1/ops``, the OpenAPI schema and the SDK's methods are all derived from
it, so adding an op touches one place (a module under ``server/ops``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Mapping

from sparseserve.core.errors import InvalidArgumentError, NotFoundError

from .argtypes import ArgType

__all__ = ["REQUIRED", "Arg", "Output", "OpDef", "Registry", "REGISTRY"]


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
class OpDef:
    name: str
    doc: str
    args: tuple[Arg, ...]
    outputs: tuple[Output, ...]
    # "cpu" -> function(**bound_args) returning one output or a tuple in declared order;
    # "cuda" -> a GpuKernel (Registry.gpu), when the op has one;
    # "dask" -> its plan for partitioned tensors (Registry.partitioned), when it has one.
    kernels: dict[str, Any]
    # Optional: bytes of the result computed from the bound arguments, checked
    # against --max-result-bytes before the kernel allocates anything.
    result_bytes: Callable[..., int] | None = None
    # Concurrent calls may be merged into one kernel call (server/batching.py says how).
    batchable: bool = False
    # Its cost is not bounded by its input's size (an iterative solver: a small matrix and
    # 20,000 iterations), so it always runs in the kernel pool, never on the event loop; it calls
    # ``limits.between_iterations`` as it goes (the caller's deadline, and progress reports).
    iterative: bool = False

    def bind(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Named raw values -> validated kernel arguments, defaults filled in.

        Unknown or missing arguments and values of the wrong type raise
        ``InvalidArgumentError`` naming the argument.
        """
        unknown = sorted(raw.keys() - self.args_by_name)
        if unknown:
            raise InvalidArgumentError(
                f"{self.name} has no argument {unknown[0]!r}; its arguments are "
                f"{', '.join(a.name for a in self.args)}", reason="UNKNOWN_ARGUMENT")
        bound = {}
        for arg in self.args:
            if arg.name in raw and raw[arg.name] is not None:
                bound[arg.name] = arg.type.coerce(raw[arg.name], arg, self.name)
            elif arg.required:
                raise InvalidArgumentError(f"{self.name} needs argument {arg.name!r}",
                                           reason="MISSING_ARGUMENT")
            else:
                bound[arg.name] = arg.default
        return bound

    @cached_property
    def args_by_name(self) -> dict[str, Arg]:
        return {a.name: a for a in self.args}

    def run(self, device: str, bound: Mapping[str, Any]) -> tuple[Any, ...]:
        """The CPU kernel's outputs (the GPU backend dispatches ``cuda`` kernels itself)."""
        result = self.kernels[device](**bound)
        return result if isinstance(result, tuple) else (result,)

    def describe(self) -> dict[str, Any]:
        """The catalogue entry: what ``GET /v1/ops`` and ``ListOps`` say about this op."""
        return {
            "name": self.name,
            "doc": self.doc,
            "args": [{"name": a.name, "type": a.type.name, "required": a.required,
                      "default": None if a.required else a.default, "doc": a.doc,
                      "layouts": list(a.layouts) if a.type.is_tensor or a.type.is_tensor_list else []}
                     for a in self.args],
            "outputs": [{"name": o.name, "type": o.type, "doc": o.doc} for o in self.outputs],
            # Iterative ops report progress (ExecuteWithProgress, the SDK's ``progress=``).
            "iterative": self.iterative,
        }


@dataclass
class Registry:
    ops: dict[str, OpDef] = field(default_factory=dict)

    def op(self, name: str, *, doc: str, args: list[Arg], outputs: list[Output],
           result_bytes: Callable[..., int] | None = None, batchable: bool = False,
           iterative: bool = False) -> Callable:
        """Decorator declaring an op whose CPU kernel is the decorated function."""

        def register(fn: Callable) -> Callable:
            if name in self.ops:
                raise ValueError(f"op {name!r} is declared twice")
            self.ops[name] = OpDef(name, doc.strip(), tuple(args), tuple(outputs), {"cpu": fn},
                                   result_bytes, batchable, iterative)
            return fn

        return register

    def gpu(self, name: str, *, supports: Callable[..., str | None]) -> Callable:
        """Decorator giving the declared op ``name`` its GPU kernel: ``fn(backend, **bound)``,
        array code over ``backend.xp``/``backend.sparse`` (``server/device.py``). ``supports``
        says, from the arguments' metadata, which calls it can take; the rest run on the CPU."""
        from .device import GpuKernel

        def register(fn: Callable) -> Callable:
            op = self.ops[name]  # declared above it, in the same module
            if "cuda" in op.kernels:
                raise ValueError(f"op {name!r} has two GPU kernels")
            op.kernels["cuda"] = GpuKernel(fn, supports)
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
                                reason="UNKNOWN_OP") from None

    def __iter__(self):
        return iter(self.ops.values())


REGISTRY = Registry()
