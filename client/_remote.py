"""``RemoteTensor``: the handle of a tensor a server keeps, bound to the client that made it,
used as a scipy sparse array is.

Each operator is one request (one op, or a few in one pipeline). The rule for where a result
lives: a sparse result stays on the server as a new ``RemoteTensor`` (so ``A.T @ A`` never
downloads ``A.T``); a dense one comes back as a numpy array (``A @ x``, ``A.sum(axis)``,
``A.max(axis)``, ``A.toarray()``, ``A + dense``, ``A[i, j]``). With an ``AsyncClient`` every
operator returns an awaitable of the same.

Where scipy and the ops differ in meaning, the operators follow scipy: ``max`` counts unstored
positions as zeros (``reduce_max`` does not), ``/`` by a scalar multiplies by its reciprocal in
float64 (scipy's arithmetic, and its answer for ``A / 0``: Python's ZeroDivisionError), sums
promote small integers as numpy's ``sum`` does, and duplicate entries are summed first.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from numbers import Number
from typing import Any, Callable

import numpy as np

from .core.convert import as_tensor, is_tensor_like
from .core.tensor import HandleRef, OutputRef, SparseTensor, TensorInfo

__all__ = ["RemoteTensor"]


def _then(result: Any, fn: Callable[[Any], Any]) -> Any:
    """``fn(result)``, or for an ``AsyncClient``'s awaitable an awaitable of it."""
    if inspect.isawaitable(result):
        async def finish():
            return fn(await result)
        return finish()
    return fn(result)


def _sum_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype numpy's (and scipy's) ``sum`` answers in: small integers and bool widen."""
    return np.add.reduce(np.zeros(0, dtype)).dtype if dtype.kind in "biu" else dtype


def _operand(value: Any) -> Any:
    """A local tensor-like made into what the codecs send; remote ones as they are."""
    return value if isinstance(value, RemoteTensor) else as_tensor(value)


def _layout(value: Any) -> str:
    if isinstance(value, HandleRef):
        return value.info.layout if value.info is not None else "unknown"
    return value.layout if isinstance(value, SparseTensor) else "dense"


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (Number, np.generic)) or (isinstance(value, np.ndarray) and value.ndim == 0)


@dataclass(frozen=True, eq=False)
class RemoteTensor(HandleRef):
    """A tensor kept on the server; pass it to any op in place of the tensor itself, or use it
    as a scipy sparse array (``A @ x``, ``A.T``, ``A * s``, ``A + B``, ``A.sum(axis)``, ...)."""

    client: Any = field(default=None, repr=False)

    # numpy defers to our reflected operators (x @ A, 2 * A) instead of making an object array.
    __array_ufunc__ = None

    # ------------------------------------------------------------- what it is
    def _described(self) -> TensorInfo:
        if self.info is None:
            raise AttributeError(f"the server did not describe handle {self.handle!r} (a server older than "
                                 "this SDK): fetch it with get() to see its shape and dtype")
        return self.info

    @property
    def shape(self) -> tuple[int, ...]:
        return self._described().shape

    @property
    def dtype(self) -> np.dtype:
        return self._described().dtype

    @property
    def nnz(self) -> int:
        """Stored entries (a dense tensor's element count)."""
        return self._described().nnz

    @property
    def layout(self) -> str:
        """coo, csr, csc, bsr, bsc, or dense."""
        return self._described().layout

    format = layout  # scipy's name for it

    @property
    def nbytes(self) -> int:
        """Bytes it takes in the server's store."""
        return self._described().nbytes

    @property
    def ndim(self) -> int:
        return len(self.shape)

    # ------------------------------------------------------------- the store
    def get(self):
        """Fetch the tensor (``await`` it with an ``AsyncClient``)."""
        return self.client.get(self)

    def delete(self):
        return self.client.delete(self)

    # ------------------------------------------------------------- calls
    def _call(self, op: str, keep: bool, **args: Any) -> Any:
        return self.client.call(op, keep=keep, **args)

    def _steps(self, steps: list[tuple[str, str, dict[str, Any]]], outputs: list[str], keep: bool) -> Any:
        """Several ops in one request (a pipeline); ``outputs`` name what comes back."""
        bound = [(name, op, self.client._bind(op, (), args, None)) for name, op, args in steps]
        return self.client._run_pipeline(bound, outputs, keep)

    def _sparse_result(self, other: Any) -> bool:
        """Whether the product of this and ``other`` is sparse, so kept on the server. A handle
        nobody described counts as dense: its result comes back, whichever it is."""
        return self.layout != "dense" and _layout(other) not in ("dense", "unknown")

    # ------------------------------------------------------------- products
    def __matmul__(self, other: Any) -> Any:
        other = _operand(other)
        return self._call("matmul", self._sparse_result(other), a=self, b=other)

    def __rmatmul__(self, other: Any) -> Any:
        other = _operand(other)
        return self._call("matmul", self._sparse_result(other), a=other, b=self)

    def dot(self, other: Any) -> Any:
        return self @ other

    def __mul__(self, other: Any) -> Any:
        """Element-wise, as scipy's sparse arrays: by a scalar or a dense array (broadcast to this
        shape, stored entries only) a sparse result; by a sparse tensor, their product."""
        if _is_scalar(other):
            # A Python number is weak in numpy's promotion (float32 * 2.5 stays float32), as in scipy.
            weak: Any = other if isinstance(other, (Number, np.generic)) else np.asarray(other)
            return self._call("mul", True, sp_input=self, dense=np.asarray(other, np.result_type(self.dtype, weak)))
        if not is_tensor_like(other) and not isinstance(other, (list, tuple)):
            return NotImplemented
        other = _operand(other)
        if _layout(other) == "dense":
            return self._call("mul", True, sp_input=self, dense=other)
        return self._call("multiply", True, a=self, b=other)

    __rmul__ = __mul__

    def multiply(self, other: Any) -> Any:
        return self * other

    def __truediv__(self, other: Any) -> Any:
        """By a scalar: times its reciprocal in float64, as scipy computes it (``A / 0`` is
        ZeroDivisionError). By a dense array: scipy's dense answer (0 / 0 is nan where nothing is
        stored), computed here from ``toarray()``."""
        if _is_scalar(other):
            base = np.dtype(np.float64) if np.can_cast(self.dtype, np.float64) else self.dtype
            reciprocal = 1.0 / other
            return self._call("mul", True, sp_input=self,
                              dense=np.asarray(reciprocal, dtype=np.result_type(base, reciprocal)))
        if isinstance(other, (np.ndarray, list, tuple)):
            return _then(self.toarray(), lambda dense: np.true_divide(dense, other))
        return NotImplemented

    # ------------------------------------------------------------- sums
    def __add__(self, other: Any) -> Any:
        """Sparse + sparse stays sparse (the other converted to this layout first when they
        differ); sparse + dense is dense, as in scipy; a scalar other than 0 is refused, as scipy
        refuses it."""
        if _is_scalar(other):
            if other == 0:
                return self
            raise NotImplementedError("adding a nonzero scalar to a sparse array is not supported "
                                      "(it would store every position), as in scipy")
        other = _operand(other)
        if _layout(other) == "dense" or self.layout == "dense":
            return self._call("add", False, a=self, b=other)
        if _layout(other) == self.layout:
            return self._call("add", True, a=self, b=other)
        return self._steps([("b", "convert", {"sp_input": other, "layout": self.layout}),
                            ("sum", "add", {"a": self, "b": OutputRef("b.output")})], ["sum.output"], True)

    __radd__ = __add__

    def __neg__(self) -> Any:
        return self._call("map_values", True, sp_input=self, fn="neg")

    def __sub__(self, other: Any) -> Any:
        if _is_scalar(other):
            return self + (-other)
        other = _operand(other)
        if _layout(other) == "dense":
            return self + (-np.asarray(other))
        negated = [("neg", "map_values", {"sp_input": other, "fn": "neg"})]
        if _layout(other) != self.layout:
            negated = [("b", "convert", {"sp_input": other, "layout": self.layout}),
                       ("neg", "map_values", {"sp_input": OutputRef("b.output"), "fn": "neg"})]
        return self._steps([*negated, ("diff", "add", {"a": self, "b": OutputRef("neg.output")})],
                           ["diff.output"], True)

    def __rsub__(self, other: Any) -> Any:
        if _is_scalar(other):
            return -self + other
        other = _operand(other)
        if _layout(other) == "dense":
            return self._steps([("neg", "map_values", {"sp_input": self, "fn": "neg"}),
                                ("diff", "add", {"a": OutputRef("neg.output"), "b": other})], ["diff.output"], False)
        return NotImplemented

    # ------------------------------------------------------------- shape
    @property
    def T(self) -> Any:
        return self.transpose()

    def transpose(self) -> Any:
        return self._call("transpose", True, sp_input=self)

    def conj(self) -> Any:
        if self.dtype.kind != "c":
            return self
        return self._call("map_values", True, sp_input=self, fn="conj")

    @property
    def H(self) -> Any:
        """The conjugate transpose (one request)."""
        if self.dtype.kind != "c":
            return self.transpose()
        return self._steps([("t", "transpose", {"sp_input": self}),
                            ("h", "map_values", {"sp_input": OutputRef("t.output"), "fn": "conj"})],
                           ["h.output"], True)

    def asformat(self, format: str) -> Any:
        """This tensor in another sparse layout (coo, csr, csc), kept on the server."""
        if format == self.layout:
            return self
        return self._call("convert", True, sp_input=self, layout=format)

    def tocoo(self) -> Any:
        return self.asformat("coo")

    def tocsr(self) -> Any:
        return self.asformat("csr")

    def tocsc(self) -> Any:
        return self.asformat("csc")

    def __getitem__(self, key: Any) -> Any:
        """Ints and slices, as ``select`` defines them (PyTorch's t[index]): an int per dimension
        gives a scalar back, anything else a sparse tensor kept on the server."""
        items = key if isinstance(key, tuple) else (key,)
        for item in items:
            if isinstance(item, bool) or not isinstance(item, (int, np.integer, slice)):
                raise IndexError(f"a RemoteTensor is indexed by ints and slices (the select op), not "
                                 f"{type(item).__name__}; index_select takes an array of positions")
            if isinstance(item, slice) and item.step is not None and item.step <= 0:
                raise IndexError("slice steps must be positive (the select op)")
        index = [int(i) if not isinstance(i, slice) else i for i in items]
        if len(index) == self.ndim and all(isinstance(i, int) for i in index):
            return _then(self._call("select", False, sp_input=self, index=index), lambda a: np.asarray(a)[()])
        return self._call("select", True, sp_input=self, index=index)

    # ------------------------------------------------------------- reductions and densifying
    def sum(self, axis: int | tuple[int, ...] | None = None) -> Any:
        """The sum over ``axis`` (all of them by default), dense, in numpy's sum dtype."""
        axis_arg = list(axis) if isinstance(axis, tuple) else axis
        widened = _sum_dtype(self.dtype)
        if widened == self.dtype:
            result = self._call("reduce_sum", False, sp_input=self, axis=axis_arg)
        else:  # a product by one in the wider dtype widens the values before they are summed
            result = self._steps([("w", "mul", {"sp_input": self, "dense": np.ones((), widened)}),
                                  ("s", "reduce_sum", {"sp_input": OutputRef("w.output"), "axis": axis_arg})],
                                 ["s.output"], False)
        return _then(result, lambda a: a[()] if axis is None else a)

    def max(self, axis: int | None = None) -> Any:
        """scipy's maximum over ``axis``: unstored positions count as zeros, duplicates are summed
        first. Dense (scipy answers a sparse array for an axis; its toarray() is this)."""
        # One request: the maxima of the stored values, and how many of each group's are nonzero
        # (sign squared is 1 for each; NaN for a NaN, whose maximum is NaN anyway).
        steps: list[tuple[str, str, dict[str, Any]]] = [
            ("c", "coalesce", {"sp_input": self}),
            ("m", "reduce_max", {"sp_input": OutputRef("c.output"), "axis": axis}),
            ("sign", "map_values", {"sp_input": OutputRef("c.output"), "fn": "sign"}),
            ("one", "map_values", {"sp_input": OutputRef("sign.output"), "fn": "square"}),
            ("n", "reduce_sum", {"sp_input": OutputRef("one.output"), "axis": axis})]
        group = math.prod(self.shape) if axis is None else self.shape[axis]

        def with_zeros(outputs):
            largest, stored = outputs
            full = np.asarray(stored) == group  # no unstored zero in the group
            answer = np.where(full, largest, np.maximum(largest, 0)).astype(self.dtype, copy=False)
            return answer[()] if axis is None else answer

        return _then(self._steps(steps, ["m.output", "n.output"], False), with_zeros)

    def toarray(self) -> Any:
        """The dense array (repeated entries summed, as scipy's toarray sums them)."""
        if self.layout == "dense":
            return self.get()
        return self._call("to_dense", False, sp_input=self, validate_indices=False)

    todense = toarray
