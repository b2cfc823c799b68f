"""Per-request limits that are not about bytes: the caller's deadline, and how many stored
values and dimensions one tensor may have (``--max-nnz``, ``--max-rank``).

A request's deadline lives on its ``RequestInfo`` (``metrics.current``), which reaches the
kernel threads too (``Service.run`` copies the context), so a pipeline can stop between steps
and an iterative op between iterations (``between_iterations``), which is also where it
reports its progress to a caller watching it (``progress_sink``).
"""

from __future__ import annotations

import math
import time
from contextvars import ContextVar
from typing import Any, Callable, Iterable

import numpy as np

from sparseserve.core.tensor import SparseTensor
from sparseserve.core.errors import DeadlineExceededError, InvalidArgumentError, ResourceExhaustedError
from sparseserve.core.reasons import Reason

from .config import ServerConfig
from .metrics import current

__all__ = ["deadline_from_timeout", "deadline_from_remaining", "seconds_left", "check_deadline", "deadline_exceeded",
           "check_tensor_limits", "check_argument_limits", "check_result_bytes", "progress_sink",
           "between_iterations"]

# A timeout longer than this is no timeout worth tracking (and keeps the arithmetic finite).
_LONGEST_TIMEOUT = 30 * 24 * 3600.0


def deadline_from_timeout(value: str, source: str) -> float:
    """The monotonic deadline of a timeout given in seconds (the REST timeout header)."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise InvalidArgumentError(f"{source} must be a positive number of seconds, not {value[:40]!r}",
                                   reason=Reason.BAD_TIMEOUT)
    return time.monotonic() + min(seconds, _LONGEST_TIMEOUT)


def deadline_from_remaining(seconds: float | None) -> float | None:
    """The monotonic deadline of gRPC's ``time_remaining()`` (None: the caller set none)."""
    if seconds is None or not seconds < _LONGEST_TIMEOUT:
        return None
    return time.monotonic() + max(seconds, 0.0)


def seconds_left() -> float | None:
    """Seconds to the current request's deadline (negative once past it); None without one."""
    info = current.get()
    if info is None or info.deadline is None:
        return None
    return info.deadline - time.monotonic()


def deadline_exceeded(stage: str) -> DeadlineExceededError:
    return DeadlineExceededError(f"the caller's deadline passed {stage}; the work was abandoned",
                                 reason=Reason.DEADLINE_PASSED)


def check_deadline(stage: str) -> None:
    """Raise DEADLINE_EXCEEDED when the current request's deadline has passed."""
    left = seconds_left()
    if left is not None and left <= 0:
        raise deadline_exceeded(stage)


# Where an iterative op's progress goes while the request runs: set by a wire whose caller asked
# to watch it (called in the kernel thread, with the op's name and the fields it reports), else
# None and nothing is reported.
progress_sink: ContextVar[Callable[[dict[str, Any]], None] | None] = ContextVar("progress_sink", default=None)


def between_iterations(op: str, **fields: Any) -> None:
    """What an iterative op calls after each iteration: past the caller's deadline the op is
    abandoned (DEADLINE_EXCEEDED, its thread freed), else its progress goes to the caller
    watching it, if any (``fields``: e.g. ``iteration`` and ``residual_norm``)."""
    check_deadline(f"while {op} iterated")
    sink = progress_sink.get()
    if sink is not None:
        sink({"op": op, **fields})


def _too_big(what: str, has: str, limit: int, flag: str, reason: str) -> ResourceExhaustedError:
    return ResourceExhaustedError(f"{what} has {has}, over the limit of {limit} ({flag})", reason=reason)


def check_tensor_limits(value: Any, name: str, limits: ServerConfig) -> None:
    """``value``'s stored values and rank against ``limits.max_nnz`` and ``limits.max_rank``.
    Safe before validation: it reads only the size of ``values`` and the length of the shape."""
    max_nnz, max_rank = limits.max_nnz, limits.max_rank
    if isinstance(value, SparseTensor):
        rank, stored = len(value.dense_shape), value.values.size
        if stored > max_nnz:
            raise _too_big(name, f"{stored} stored values", max_nnz, "--max-nnz", Reason.NNZ_TOO_LARGE)
    elif isinstance(value, np.ndarray):
        rank = value.ndim
    else:
        return
    if rank > max_rank:
        raise _too_big(name, f"rank {rank}", max_rank, "--max-rank", Reason.RANK_TOO_LARGE)


def check_argument_limits(op, args: dict[str, Any], limits: ServerConfig) -> None:
    """Every tensor argument of a call, and every per-dimension list (a shape, a permutation,
    start and size, axes), against the limits: before validation, so that no check or kernel
    walks a million-dimension shape."""
    for name, value in args.items():
        arg = op.args_by_name.get(name)
        if arg is not None and arg.type.per_dimension and isinstance(value, (list, np.ndarray)) \
                and len(value) > limits.max_rank:
            raise _too_big(name, f"{len(value)} entries, one per dimension,", limits.max_rank, "--max-rank",
                           Reason.RANK_TOO_LARGE)
        for i, tensor in _tensors(value):
            check_tensor_limits(tensor, name if i is None else f"{name}[{i}]", limits)


def _tensors(value: Any) -> Iterable[tuple[int | None, Any]]:
    if isinstance(value, list):
        return ((i, v) for i, v in enumerate(value) if isinstance(v, (SparseTensor, np.ndarray)))
    return ((None, value),)


def check_result_bytes(op, need: int, limit: int) -> None:
    """An op's declared result size against --max-result-bytes, before its kernel allocates it."""
    if need > limit:
        raise ResourceExhaustedError(f"{op.name} would produce {need} bytes, over the result limit of "
                                     f"{limit} bytes (--max-result-bytes)", reason=Reason.RESULT_TOO_LARGE)
