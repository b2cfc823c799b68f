"""Where kernels run: the CPU (numba) or a CUDA GPU (CuPy), chosen once per server by ``--device``.

The GPU backend is array code over a namespace pair: ``xp`` (numpy's API) and ``sparse``
(scipy.sparse's API). On a GPU host they are CuPy and ``cupyx.scipy.sparse`` (cuSPARSE);
the tests give the very same functions numpy and scipy.sparse, so every GPU code path has
its logic checked on a machine without a GPU.

An op runs on the GPU when its declaration has a ``cuda`` kernel (``Registry.gpu``) whose
declared layouts, dtypes and limits take the checked call (CuPy's sparse matrices hold only
bool, float32/64 and complex64/128, and no BSR); otherwise the call falls back to the CPU
kernel, which is logged and counted in ``sparseserve_device_fallbacks_total``. A call the op
refuses never gets here: its ``check`` ran first, the same on every device. Either way the
answer is the CPU kernel's answer: the tests hold every GPU kernel to it.

GPU kernels receive their inputs' arrays without a copy (a kept handle's arrays, or the read-only
arrays a request was decoded into), so they never write an input.

Tensors the GPU backend keeps (handles) live in device memory as ``DeviceTensor`` (sparse) or
device arrays (dense) until a client fetches them; the store counts their device bytes.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from sparseserve.core.tensor import SparseTensor

__all__ = ["DeviceTensor", "GpuKernel", "Fallback", "ArrayBackend", "GpuUnavailable", "resolve_backend",
           "is_device_array"]

log = logging.getLogger("sparseserve.device")


class Fallback(Exception):
    """Raised by a GPU kernel, before it has changed anything, for a call it cannot do: the
    CPU kernel answers instead. The message is the reason (a metric label: keep it a short word)."""


class GpuUnavailable(RuntimeError):
    """CuPy is not installed or finds no GPU."""


@dataclass(frozen=True)
class GpuKernel:
    """An op's GPU kernel and what it takes (``Registry.gpu``). Which calls run on it is read
    from these declarations and the call's plan, never by repeating the op's refusals: the op's
    ``check`` has refused what the op refuses before dispatch."""

    # fn(backend, **plan.args): every tensor argument already on the device; returns what the
    # CPU kernel returns (one output or a tuple), with device tensors in place of host ones.
    fn: Callable[..., Any]
    # Per tensor argument, the layouts it takes ("dense" for an array); an argument not named
    # is taken in any layout the op declares.
    layouts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # The plan's result dtypes it computes (None: any dtype CuPy holds).
    dtypes: tuple[str, ...] | None = None
    # Sparse arguments it takes only as plain matrices (2-D, no batch or dense dimensions).
    matrices: tuple[str, ...] = ()
    # declines(plan) -> a reason word for checked calls it leaves to the CPU, else None.
    declines: Callable[[Any], str | None] | None = None

    def declined(self, plan) -> str | None:
        """None when ``fn`` takes this checked call, else why not (a metric label). Reads only
        metadata, so it is cheap and moves nothing."""
        args = plan.args
        if not all(np.dtype(t.dtype).isnative for t in _tensors(args.values())):
            return "dtype"  # CuPy holds native byte order only
        for name, layouts in self.layouts.items():
            value = args.get(name)
            if value is not None and _layout(value) not in layouts:
                return "layout"
        for name in self.matrices:
            value = args.get(name)
            if isinstance(value, SparseTensor):
                why = not_a_matrix(value)
                if why is not None:
                    return why
        if self.dtypes is not None and plan.dtype is not None and plan.dtype.name not in self.dtypes:
            return "dtype"
        return self.declines(plan) if self.declines is not None else None


def _tensors(values) -> list[Any]:
    out = []
    for v in values:
        if isinstance(v, list):
            out += _tensors(v)
        elif isinstance(v, (SparseTensor, np.ndarray)) or is_device_array(v):
            out.append(v)
    return out


def _layout(value: Any) -> str:
    return value.layout if isinstance(value, SparseTensor) else "dense"


def not_a_matrix(t: SparseTensor) -> str | None:
    """None for a 2-D COO, CSR or CSC matrix without batch or dense dimensions, else why not."""
    if t.layout in ("bsr", "bsc"):
        return "layout"
    if t.batch_ndim:
        return "batched"
    if t.dense_ndim:
        return "hybrid"
    if t.ndim != 2:
        return "batched" if t.ndim > 2 else "rank"
    return None


def is_device_array(value: Any) -> bool:
    """A CuPy array (numpy arrays are host arrays, also under the numpy stand-in)."""
    return type(value).__module__.startswith("cupy")


class DeviceTensor(SparseTensor):
    """A sparse tensor whose arrays live on the GPU backend's device. It has SparseTensor's
    metadata (shape, dtype, nnz, layout, nbytes), so argument checks and result-size
    estimates read it as they read a host tensor; its arrays are the backend's."""

    __slots__ = ()

    @classmethod
    def of(cls, layout: str, dense_shape, *, values, indices=None, compressed_indices=None,
           plain_indices=None, blocksize=None, coalesced: bool = False) -> "DeviceTensor":
        from .validated import mark_validated

        t = object.__new__(cls)  # no __init__: it would copy the arrays to the host
        t.layout = layout
        t.dense_shape = tuple(int(d) for d in dense_shape)
        t.values = values
        t.indices = indices
        t.compressed_indices = compressed_indices
        t.plain_indices = plain_indices
        t.blocksize = None if blocksize is None else tuple(int(b) for b in blocksize)
        t.coalesced = bool(coalesced)
        return mark_validated(t)  # made by the server from checked data: not validated again on use


class ArrayBackend:
    """The GPU backend: ``xp`` and ``sparse`` are CuPy and cupyx.scipy.sparse on a GPU host, or
    numpy and scipy.sparse standing in for them (``numpy_stand_in``, the tests' backend)."""

    def __init__(self, xp, sparse, *, name: str = "cuda", on_fallback: Callable[[str, str], None] | None = None):
        self.name = name
        self.xp = xp
        self.sparse = sparse
        self.on_fallback = on_fallback or (lambda op, reason: None)

    @classmethod
    def cupy(cls) -> "ArrayBackend":
        try:
            import cupy
            import cupyx.scipy.sparse as cusparse
        except ImportError as exc:
            raise GpuUnavailable(f"CuPy is not installed ({exc}); pip install \"sparseserve[gpu]\"") from None
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # CUDARuntimeError without a driver
            raise GpuUnavailable(f"CuPy finds no CUDA driver ({exc})") from None
        if count < 1:
            raise GpuUnavailable("CuPy finds no GPU")
        return cls(cupy, cusparse)

    @classmethod
    def numpy_stand_in(cls) -> "ArrayBackend":
        """numpy and scipy.sparse in CuPy's place: the GPU code paths, run on the CPU."""
        import scipy.sparse

        return cls(np, scipy.sparse)

    @property
    def on_gpu(self) -> bool:
        return self.xp is not np

    @property
    def special(self):
        """scipy.special's functions over ``xp``: cupyx.scipy.special on a GPU, scipy.special
        for the stand-in."""
        if self.on_gpu:
            import cupyx.scipy.special as special
        else:
            import scipy.special as special
        return special

    # ------------------------------------------------------------ arrays
    def scatter_add(self, out, index, values) -> None:
        """out[index] += values with repeated indices summed (numpy's add.at, cupyx's scatter_add).
        cupyx.scatter_add takes int32, uint32, uint64, float32 and float64 only: callers sum other
        dtypes in one of those (``kernels/arrays.py`` says how)."""
        if self.on_gpu:
            import cupyx

            cupyx.scatter_add(out, index, values)
        else:
            np.add.at(out, index, values)

    def to_device(self, value: Any) -> Any:
        """Host tensors (and lists of them) copied to the device; anything else as it is."""
        if isinstance(value, DeviceTensor) or is_device_array(value):
            return value
        if isinstance(value, SparseTensor):
            asarray = self.xp.asarray
            if value.layout == "coo":
                return DeviceTensor.of("coo", value.dense_shape, values=asarray(value.values),
                                       indices=asarray(value.indices), coalesced=value.coalesced)
            return DeviceTensor.of(value.layout, value.dense_shape, values=asarray(value.values),
                                   compressed_indices=asarray(value.compressed_indices),
                                   plain_indices=asarray(value.plain_indices), blocksize=value.blocksize,
                                   coalesced=value.coalesced)
        if isinstance(value, np.ndarray):
            return self.xp.asarray(value)
        if isinstance(value, list):
            return [self.to_device(v) for v in value]
        return value

    def to_host(self, value: Any) -> Any:
        """Device tensors (and lists of them) copied to host memory as the wires and the CPU
        kernels take them; anything else as it is."""
        from .validated import mark_validated

        if isinstance(value, DeviceTensor):
            host = self._host_array
            if value.layout == "coo":
                t = SparseTensor(indices=host(value.indices), values=host(value.values),
                                 dense_shape=value.dense_shape, coalesced=value.coalesced)
            else:
                t = SparseTensor(layout=value.layout, compressed_indices=host(value.compressed_indices),
                                 plain_indices=host(value.plain_indices), values=host(value.values),
                                 dense_shape=value.dense_shape, blocksize=value.blocksize,
                                 coalesced=value.coalesced)
            return mark_validated(t)
        if is_device_array(value):
            return mark_validated(self._host_array(value))
        if isinstance(value, list):
            return [self.to_host(v) for v in value]
        return value

    def _host_array(self, a) -> np.ndarray:
        return a.get() if is_device_array(a) else np.asarray(a)

    # ------------------------------------------------------------ warm-up
    def warm_up(self, registry) -> None:
        """The common GPU calls once per float dtype on a tiny matrix, so that CuPy compiles its
        kernels (or loads them from CUPY_CACHE_DIR) before the first request rather than in it."""
        for dtype in (np.float32, np.float64):
            coo = SparseTensor(indices=[[1, 0], [0, 1], [1, 0]], values=np.arange(1, 4, dtype=dtype),
                               dense_shape=[2, 2])
            call = functools.partial(self._warm_call, registry)
            coalesced = call("coalesce", sp_input=coo)
            csr = call("convert", sp_input=coalesced, layout="csr")
            call("reorder", sp_input=coo)
            call("to_dense", sp_input=coalesced)
            call("transpose", sp_input=coo)
            call("reduce_sum", sp_input=coo, axis=1)
            call("matmul", a=csr, b=np.ones(2, dtype))
            call("matmul", a=csr, b=np.ones((2, 2), dtype))
            call("matmul", a=csr, b=csr)

    def _warm_call(self, registry, name: str, **args) -> Any:
        op = registry.get(name)
        return self.to_host(self.run(op, op.plan(op.bind(args)))[0])

    # ------------------------------------------------------------ dispatch
    def run(self, op, plan) -> tuple[Any, ...]:
        """One checked call: on the device when the op's GPU kernel takes it, else on the CPU
        kernel with the arguments brought to the host (logged and counted)."""
        kernel: GpuKernel | None = op.kernels.get("cuda")
        reason = "no_gpu_kernel" if kernel is None else kernel.declined(plan)
        if kernel is not None and reason is None:
            try:
                result = kernel.fn(self, **{k: self.to_device(v) for k, v in plan.args.items()})
                return result if isinstance(result, tuple) else (result,)
            except Fallback as why:
                reason = str(why) or "gpu_kernel"
            except Exception as exc:
                # CuPy's OutOfMemoryError: the device is full (of handles, say); host memory may
                # not be, and the answer is the same.
                if type(exc).__name__ != "OutOfMemoryError":
                    raise
                reason = "device_memory"
        log.info("op %s runs on the CPU: %s", op.name, reason, extra={"fields": {"op": op.name,
                                                                               "fallback": reason}})
        self.on_fallback(op.name, reason or "gpu_kernel")
        return op.run_plan("cpu", plan.with_args(**{k: self.to_host(v) for k, v in plan.args.items()}))


def resolve_backend(requested: str) -> ArrayBackend | None:
    """The GPU backend for ``--device cuda`` (an error without one) or ``auto`` (the CPU then);
    None means the CPU kernels alone."""
    if requested == "cpu":
        return None
    try:
        return ArrayBackend.cupy()
    except GpuUnavailable as exc:
        if requested == "auto":
            log.info("--device auto: no usable GPU (%s); kernels run on the CPU", exc)
            return None
        raise SystemExit(f"--device cuda: {exc}. Use --device cpu, or auto to take a GPU only when "
                         "there is one") from None
