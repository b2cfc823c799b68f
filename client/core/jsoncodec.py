"""JSON codec of the REST wire (docs/contract.md ("REST")).

Sparse: ``{"indices", "values", "dense_shape", "dtype"?, "layout"?}`` or, for
compressed layouts, ``{"compressed_indices", "plain_indices", "values",
"dense_shape", "layout", "blocksize"?}``. Dense: a nested list, or
``{"dtype", "shape", "data": [flat]}``. Handle: ``{"handle": "..."}``; a kept output's adds
``"info": {"layout", "dtype", "shape", "nnz", "nbytes"}`` (layout "dense" for a dense array).

JSON has no complex numbers and no NaN or infinity: complex values travel as
``[re, im]`` pairs (one extra trailing dimension of 2), and non-finite floats
as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (protobuf's JSON
mapping does the same). Lists become arrays with one ``np.asarray`` each; no
per-element Python loop.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from .reasons import Reason

try:
    import orjson
except ImportError:  # the SDK's base install: the standard library's JSON (below)
    orjson = None  # type: ignore[assignment]

from .dtypes import check_supported, dtype_from_name
from .tensor import LAYOUTS, HandleRef, OutputRef, SparseTensor, TensorInfo
from .validate import check_array_shape
from .errors import InvalidArgumentError

__all__ = ["tensor_to_json", "tensor_from_json", "array_to_json", "array_from_json",
           "is_tensor_json", "value_to_json", "dumps", "loads"]

_SPARSE_KEYS = ("indices", "compressed_indices")


def _bad(message: str, reason: str = Reason.BAD_JSON_TENSOR) -> InvalidArgumentError:
    return InvalidArgumentError(message, reason=reason)


# ------------------------------------------------------------------ text
# orjson writes and reads JSON 5-6 times as fast as the standard library (a 100-entry tensor:
# 150 -> 25 us written, 65 -> 10 read), most of a small REST call's codec. The server requires
# it; the SDK uses it where installed and the standard library otherwise, to the same text.
def dumps(obj: Any) -> bytes:
    """``obj`` as compact JSON bytes (no NaN or infinity ever reaches here: see above). What
    orjson cannot write (integers past 64 bits) the standard library writes: the server's
    checks then answer for it."""
    if orjson is not None:
        try:
            return orjson.dumps(obj)
        except orjson.JSONEncodeError:
            pass
    return json.dumps(obj, separators=(",", ":")).encode()


def loads(data: bytes | memoryview | str) -> Any:
    """The JSON value of ``data``. orjson refuses some text the standard library reads
    (integers past 64 bits, NaN and Infinity literals, nesting past 1,024 levels): that text
    gets the standard library's reading, so it meets the same checks and messages."""
    if orjson is not None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(bytes(data) if isinstance(data, memoryview) else data)


# ------------------------------------------------------------------ encode
def array_to_json(a: np.ndarray) -> list | Any:
    """Nested lists of a numpy array, with the complex and non-finite conventions above."""
    a = np.asarray(a)
    if a.dtype.kind == "c":
        a = np.stack([a.real, a.imag], axis=-1)
    if a.dtype.kind == "f":
        if a.dtype == np.float16:
            a = a.astype(np.float32)
        if not np.all(np.isfinite(a)):
            obj = a.astype(object)
            obj[np.isnan(a)] = "NaN"
            obj[np.isposinf(a)] = "Infinity"
            obj[np.isneginf(a)] = "-Infinity"
            return obj.tolist()
    return a.tolist()


def tensor_to_json(t: Any) -> dict:
    if isinstance(t, HandleRef):
        if t.info is None:
            return {"handle": t.handle}
        info = t.info
        return {"handle": t.handle, "info": {"layout": info.layout, "dtype": info.dtype.name,
                                             "shape": list(info.shape), "nnz": info.nnz,
                                             "nbytes": info.nbytes}}
    if isinstance(t, SparseTensor):
        out: dict[str, Any] = {"layout": t.layout, "dtype": t.dtype.name,
                               "dense_shape": list(t.dense_shape)}
        if t.layout == "coo":
            out["indices"] = t.indices.tolist()
        else:
            out["index_dtype"] = t.compressed_indices.dtype.name
            out["compressed_indices"] = t.compressed_indices.tolist()
            out["plain_indices"] = t.plain_indices.tolist()
            if t.blocksize is not None:
                out["blocksize"] = list(t.blocksize)
        out["values"] = array_to_json(t.values)
        return out
    a = np.asarray(t)
    return {"dtype": a.dtype.name, "shape": list(a.shape), "data": array_to_json(a.reshape(-1))}


def value_to_json(v: Any) -> Any:
    """A Python argument -> JSON (tensor-likes must already be converted)."""
    if isinstance(v, OutputRef):
        return {"ref": v.ref}
    if isinstance(v, (SparseTensor, HandleRef, np.ndarray)):
        return tensor_to_json(v)
    if isinstance(v, (np.generic, complex)) or (isinstance(v, float) and not math.isfinite(v)):
        # A non-finite float as a 0-d tensor, whose "Infinity" text the readers know (orjson
        # would write null, which an argument reads as its default).
        return tensor_to_json(np.asarray(v))
    if isinstance(v, (list, tuple)):
        return [value_to_json(x) for x in v]
    if isinstance(v, dict):  # options arguments
        return {str(k): value_to_json(x) for k, x in v.items()}
    if isinstance(v, slice):  # index arguments: [start, stop, step], None for a default
        return [v.start, v.stop, v.step]
    return v


# ------------------------------------------------------------------ decode
def is_tensor_json(obj: Any) -> bool:
    return isinstance(obj, dict) and (
        "handle" in obj or any(k in obj for k in _SPARSE_KEYS) or ("data" in obj and "shape" in obj))


def array_from_json(data: Any, dtype: np.dtype | None, name: str) -> np.ndarray:
    """A (nested) JSON list -> numpy array of ``dtype`` (inferred when None)."""
    complex_target = dtype is not None and dtype.kind == "c"
    try:
        if dtype is None:
            arr = np.asarray(data)
            if arr.dtype.kind in "UO":
                # Non-finite floats arrive as strings: read the list as float64.
                arr = np.asarray(data, dtype=np.float64)
        elif complex_target:
            arr = np.asarray(data, dtype=np.float64 if dtype == np.complex128 else np.float32)
        elif dtype.kind in "iub":
            # Exact: integers must be integers in range, never silently wrapped or truncated.
            arr = np.asarray(data)
            if arr.size and not _fits(arr, dtype):
                raise ValueError(f"values are not all {dtype.name} (got {arr.dtype.name} data)")
            arr = arr.astype(dtype, copy=False)
        else:
            arr = np.asarray(data, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise _bad(f"{name} is not a regular array of {dtype.name if dtype is not None else 'numbers'}: "
                   f"{exc}") from None
    if complex_target:
        if arr.ndim == 0 or arr.shape[-1] != 2:
            raise _bad(f"{name}: complex values are [re, im] pairs; got shape {list(arr.shape)}")
        arr = arr[..., 0] + 1j * arr[..., 1]
        arr = arr.astype(dtype)
    check_supported(arr.dtype, name)
    return arr


def _fits(arr: np.ndarray, dtype: np.dtype) -> bool:
    if arr.dtype.kind == "b":
        return True
    if arr.dtype.kind not in "iu":
        return False
    lo, hi = (0, 1) if dtype.kind == "b" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
    return bool(int(arr.min()) >= lo and int(arr.max()) <= hi)


def _dtype_of(obj: dict, name: str) -> np.dtype | None:
    if obj.get("dtype") is None:
        return None
    return dtype_from_name(obj["dtype"], argument=f"{name}.dtype")


def _int_list(obj: dict, key: str, name: str) -> list[int]:
    value = obj.get(key)
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        raise _bad(f"{name}.{key} must be a list of integers")
    for axis, d in enumerate(value):
        if not -(1 << 63) <= d < (1 << 63):
            raise _bad(f"{name}.{key}[{axis}] = {d} does not fit in int64", reason=Reason.SHAPE_OVERFLOW)
    return value


def _index_array(data: Any, dtype: np.dtype, name: str) -> np.ndarray:
    try:
        arr = np.asarray(data) if not (isinstance(data, list) and len(data) == 0) else np.zeros(0, dtype)
    except (ValueError, TypeError, OverflowError):  # ragged lists, say
        raise _bad(f"{name} must be a rectangular list of integers", reason=Reason.INDEX_DTYPE) from None
    if arr.dtype.kind not in "iu" and arr.size:
        raise _bad(f"{name} must hold integers", reason=Reason.INDEX_DTYPE)
    if arr.size and arr.dtype.kind == "u" and int(arr.max()) > np.iinfo(np.int64).max:
        raise _bad(f"{name} holds an index beyond int64", reason=Reason.INDEX_OUT_OF_RANGE)
    try:
        return arr.astype(dtype, copy=False)
    except (ValueError, OverflowError) as exc:
        raise _bad(f"{name}: {exc}", reason=Reason.INDEX_DTYPE) from None


def tensor_from_json(obj: Any, name: str) -> SparseTensor | np.ndarray | HandleRef:
    """JSON -> tensor. Structural checks only; the server then runs ``check_sparse``."""
    if isinstance(obj, dict):
        if "handle" in obj:
            if not isinstance(obj["handle"], str):
                raise _bad(f"{name}.handle must be a string")
            return HandleRef(obj["handle"], _info_from_json(obj.get("info")))
        if any(k in obj for k in _SPARSE_KEYS):
            return _sparse_from_json(obj, name)
        if "data" in obj and "shape" in obj:
            shape = check_array_shape(_int_list(obj, "shape", name), f"{name}.shape")
            arr = array_from_json(obj["data"], _dtype_of(obj, name), f"{name}.data")
            if arr.ndim != 1 or arr.size != int(np.prod(shape, dtype=object)):
                raise _bad(f"{name}.data has {arr.size} elements but shape {shape} implies "
                           f"{int(np.prod(shape, dtype=object))}", reason=Reason.BUFFER_LENGTH)
            return arr.reshape(shape)
        raise _bad(f"{name} is not a tensor: expected indices/values/dense_shape, "
                   "compressed_indices/plain_indices/values/dense_shape, shape/data, or handle")
    if isinstance(obj, (list, int, float, bool)):
        return array_from_json(obj, None, name)
    raise _bad(f"{name} is not a tensor")


def _info_from_json(obj: Any) -> TensorInfo | None:
    """A server's description of a kept tensor (``tensor_to_json``'s ``info``); None when absent
    or unreadable: it only describes, and readers of arguments ignore it."""
    try:
        layout, dtype = str(obj["layout"]), dtype_from_name(str(obj["dtype"]))
        shape, nnz, nbytes = tuple(int(d) for d in obj["shape"]), int(obj["nnz"]), int(obj["nbytes"])
    except (TypeError, KeyError, ValueError, InvalidArgumentError):
        return None
    return TensorInfo(layout, dtype, shape, nnz, nbytes) if layout in (*LAYOUTS, "dense") else None


def _sparse_from_json(obj: dict, name: str) -> SparseTensor:
    layout = str(obj.get("layout") or ("coo" if "indices" in obj else "csr")).lower()
    if layout not in LAYOUTS:
        raise _bad(f"{name}.layout = {layout!r} is not one of {', '.join(LAYOUTS)}", reason=Reason.BAD_LAYOUT)
    dense_shape = _int_list(obj, "dense_shape", name)
    if "values" not in obj:
        raise _bad(f"{name}.values is missing")
    values = array_from_json(obj["values"], _dtype_of(obj, name), f"{name}.values")
    blocksize = obj.get("blocksize")
    if blocksize is not None:
        blocksize = _int_list(obj, "blocksize", name)
    if layout == "coo":
        indices = _index_array(obj["indices"], np.dtype(np.int64), f"{name}.indices")
        if indices.size == 0:
            indices = indices.reshape(0, indices.shape[1] if indices.ndim == 2 else len(dense_shape))
        if values.size == 0 and values.ndim == 1 and indices.ndim == 2:
            values = values.reshape((0, *[max(d, 0) for d in dense_shape[indices.shape[1]:]]))
        return SparseTensor(indices=indices, values=values, dense_shape=dense_shape, blocksize=blocksize)
    for key in ("compressed_indices", "plain_indices"):
        if key not in obj:
            raise _bad(f"{name}.{key} is missing for layout {layout}")
    index_dtype = np.dtype(obj.get("index_dtype") or "int64")
    if index_dtype not in (np.int32, np.int64):
        raise _bad(f"{name}.index_dtype must be int32 or int64", reason=Reason.INDEX_DTYPE)
    return SparseTensor(layout=layout,
                        compressed_indices=_index_array(obj["compressed_indices"], index_dtype,
                                                        f"{name}.compressed_indices"),
                        plain_indices=_index_array(obj["plain_indices"], index_dtype,
                                                   f"{name}.plain_indices"),
                        values=values, dense_shape=dense_shape, blocksize=blocksize)
