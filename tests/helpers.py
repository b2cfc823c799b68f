"""The one comparison of results (``assert_eq``) and the documentation's examples (``example``).

Imported as ``from helpers import ...`` from every folder of ``tests/`` alike (pytest puts
``tests/`` on the path for ``conftest.py``, which also has pytest rewrite the asserts here).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from sparseserve import SparseTensor

__all__ = ["assert_eq", "as_ours", "example", "examples"]

ROOT = Path(__file__).resolve().parent.parent

Tolerance = float | Mapping[str, float]


# ------------------------------------------------------------------ comparison
def as_ours(x):
    """``x`` in our types: a torch tensor or a TensorFlow (sparse) tensor becomes a
    ``SparseTensor`` (in the library's layout, index dtypes and coalesced flag) or a numpy
    array; anything else comes back as it is. Neither library is imported here."""
    library = type(x).__module__.partition(".")[0]
    if library == "torch":
        from sparseserve.core.convert import torch_to_tensor

        return torch_to_tensor(x)
    if library == "tensorflow":
        if hasattr(x, "dense_shape"):  # tf.SparseTensor: its entries as they are, order and repeats kept
            return SparseTensor(indices=x.indices.numpy(), values=x.values.numpy(), dense_shape=x.dense_shape.numpy())
        return x.numpy()
    return x


def assert_eq(got, want, *, rtol: Tolerance = 1e-6, atol: Tolerance = 1e-6, exact: bool = False,
              bitwise: bool = False, index_dtype: bool = True, coalesced: bool = False, same_type: bool = False,
              layout: str | None = None, values: bool = True, what: str = "output") -> None:
    """``got`` is ``want``: sparse tensors, dense arrays, or torch/TensorFlow results (``as_ours``).

    Structure exactly: a sparse ``want`` needs a ``SparseTensor`` of the same layout (and
    ``layout`` when given), dense shape and blocksize, with the same index arrays (shape,
    every entry in order, and dtype unless ``index_dtype=False``) and, when ``coalesced``, the
    same coalesced flag; a dense ``numpy.ndarray`` ``want`` needs an ndarray. ``same_type``:
    ``type(got) is type(want)`` too (any two numpy arrays count as one type).

    Values (a sparse tensor's, or the dense arrays): dtype and shape exactly; integers, bools
    and everything when ``exact`` compared with ``==`` (NaN equal to NaN); ``bitwise``: the
    bytes equal (-0.0 differs from 0.0, NaN payloads count); floats and complex ``allclose``
    with ``rtol``/``atol`` (NaN equal to NaN), each a number or a mapping from dtype name to
    one (a dtype it lacks is an error). ``values=False`` compares the structure alone.
    ``what`` names the result in failure messages."""
    got, want = as_ours(got), as_ours(want)
    if same_type and not (isinstance(got, np.ndarray) and isinstance(want, np.ndarray)):
        assert type(got) is type(want), f"{what}: a {type(got).__name__}, not a {type(want).__name__}"
    if isinstance(want, SparseTensor):
        _assert_sparse_eq(got, want, rtol=rtol, atol=atol, exact=exact, bitwise=bitwise, index_dtype=index_dtype,
                          coalesced=coalesced, layout=layout, values=values, what=what)
        return
    assert not isinstance(got, SparseTensor), f"{what}: a sparse tensor, not a dense array"
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), f"{what}: a {type(got).__name__}, not a numpy array"
    _assert_values_eq(np.asarray(got), np.asarray(want), rtol=rtol, atol=atol, exact=exact, bitwise=bitwise,
                      what=what)


def _assert_sparse_eq(got, want: SparseTensor, *, rtol, atol, exact, bitwise, index_dtype, coalesced, layout,
                      values, what) -> None:
    assert isinstance(got, SparseTensor), f"{what}: a {type(got).__name__}, not a sparse tensor"
    assert got.layout == want.layout, f"{what}: layout {got.layout} != {want.layout}"
    assert layout is None or want.layout == layout, f"{what}: layout {want.layout}, not {layout}"
    assert tuple(got.dense_shape) == tuple(want.dense_shape), \
        f"{what}: dense_shape {list(got.dense_shape)} != {list(want.dense_shape)}"
    blocks = [None if t.blocksize is None else tuple(t.blocksize) for t in (got, want)]
    assert blocks[0] == blocks[1], f"{what}: blocksize {blocks[0]} != {blocks[1]}"
    if coalesced:
        assert got.coalesced == want.coalesced, f"{what}: coalesced flag {got.coalesced} != {want.coalesced}"
    for name in ("indices",) if want.layout == "coo" else ("compressed_indices", "plain_indices"):
        g, w = np.asarray(getattr(got, name)), np.asarray(getattr(want, name))
        if index_dtype:
            assert g.dtype == w.dtype, f"{what}.{name}: dtype {g.dtype} != {w.dtype}"
        assert g.shape == w.shape, f"{what}.{name}: shape {g.shape} != {w.shape}"
        np.testing.assert_array_equal(g, w, err_msg=f"{what}.{name}")
    if values:
        _assert_values_eq(np.asarray(got.values), np.asarray(want.values), rtol=rtol, atol=atol, exact=exact,
                          bitwise=bitwise, what=f"{what}.values")


def _tolerance(tol: Tolerance, dtype: np.dtype, what: str) -> float:
    if not isinstance(tol, Mapping):
        return tol
    assert dtype.name in tol, f"{what}: no tolerance given for {dtype.name}"
    return tol[dtype.name]


def _assert_values_eq(got: np.ndarray, want: np.ndarray, *, rtol, atol, exact, bitwise, what) -> None:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if bitwise:
        differ = np.ascontiguousarray(got).view(np.uint8).reshape(-1) != \
            np.ascontiguousarray(want).view(np.uint8).reshape(-1)
        assert not differ.any(), \
            f"{what}: the bytes differ from byte {int(np.argmax(differ))}: {got!r} != {want!r}"
    elif exact or want.dtype.kind not in "fc":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=_tolerance(rtol, want.dtype, what),
                                   atol=_tolerance(atol, want.dtype, what), equal_nan=True, err_msg=what)


# ------------------------------------------------------------------ documentation examples
_MARKER = re.compile(r"<!-- example: (\S+) -->")


def eventually(check, timeout: float = 20.0, what: str = "the condition", step: float = 0.02) -> float:
    """Seconds until ``check()`` holds, polled every ``step``; it must within ``timeout``."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, f"{what}: not within {timeout} s"
        time.sleep(step)
    return time.monotonic() - start


def examples(path) -> dict[str, str]:
    """Every tagged code block of a Markdown file (relative paths from the repository root), by
    tag: the text between the fences of the block on the line after ``<!-- example: TAG -->``.
    Fails on a tag used twice and on a marker without a code block after it."""
    path = ROOT / path
    lines = path.read_text().splitlines(keepends=True)
    found: dict[str, str] = {}
    for i, line in enumerate(lines):
        marker = _MARKER.fullmatch(line.strip())
        if not marker:
            continue
        tag = marker[1]
        assert tag not in found, f"{path.name}:{i + 1}: the example tag {tag!r} marks a second block"
        assert i + 1 < len(lines) and lines[i + 1].startswith("```"), \
            f"{path.name}:{i + 1}: no ``` code block on the line after the example tag {tag!r}"
        end = next((j for j in range(i + 2, len(lines)) if lines[j].rstrip() == "```"), None)
        assert end is not None, f"{path.name}:{i + 2}: the code block tagged {tag!r} is never closed"
        found[tag] = "".join(lines[i + 2:end])
    return found


def example(path, tag: str) -> str:
    """The code block tagged ``<!-- example: TAG -->`` in a Markdown file (see ``examples``);
    fails, naming the tags there are, when none is."""
    found = examples(path)
    assert tag in found, (f"{Path(path).name}: no code block is tagged <!-- example: {tag} --> "
                          f"(tagged: {', '.join(sorted(found)) or 'none'})")
    return found[tag]
