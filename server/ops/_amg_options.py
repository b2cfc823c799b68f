"""``amg_options``: pyamg's names for smoothed aggregation's options, each checked by its own rule
(``normalize_amg_options``), and the argument type the solver ops declare (``AMG_OPTIONS_ARG``).
Its own module so that ``solvers.py`` and ``multigrid.py`` both read it."""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np

from sparseserve.core.errors import InvalidArgumentError
from sparseserve.core.reasons import Reason

from ..argtypes import options

__all__ = ["AMG_OPTIONS", "AMG_OPTIONS_ARG", "normalize_amg_options"]


# ------------------------------------------------------------------ options, as pyamg names them
def _bad(name: str, rule: str, value: Any) -> InvalidArgumentError:
    return InvalidArgumentError(f"{name} must be {rule}, not {value!r}", reason=Reason.BAD_AMG_OPTION)


def _number(low: float, high: float = math.inf, *, low_open: bool = False) -> Callable[[Any, str], float]:
    rule = (f"a number {'>' if low_open else '>='} {low:g}" + (f" and <= {high:g}" if high < math.inf else ""))

    def coerce(value: Any, name: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                or not math.isfinite(value) or value < low or (low_open and value == low) or value > high:
            raise _bad(name, rule, value)
        return float(value)
    return coerce


def _count(low: int, high: int = 1000) -> Callable[[Any, str], int]:
    def coerce(value: Any, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
            raise _bad(name, f"an integer from {low} to {high}", value)
        return int(value)
    return coerce


def _word(*words: str) -> Callable[[Any, str], str]:
    def coerce(value: Any, name: str) -> str:
        if not isinstance(value, str) or value not in words:
            raise _bad(name, "one of " + ", ".join(repr(w) for w in words), value)
        return value
    return coerce


_Rules = Mapping[str, Callable[[Any, str], Any]]  # a method's parameters and each one's rule
_THETA = _number(0.0, 1.0)
_ITERATIONS = _count(1, 100)
_SWEEP = _word("forward", "backward", "symmetric")
_GS: _Rules = {"sweep": _SWEEP, "iterations": _ITERATIONS}
# Each method's parameters and their rules (pyamg's keyword names); a method with no entry here
# is not accepted. None (JSON null) is pyamg's None where pyamg accepts it.
_STRENGTH: dict[str | None, _Rules] = {
    "symmetric": {"theta": _THETA}, "classical": {"theta": _THETA, "norm": _word("abs", "min")},
    "evolution": {"epsilon": _number(1.0, low_open=True), "k": _count(1, 20)}, None: {}}
_AGGREGATE: dict[str | None, _Rules] = {"standard": {}, "naive": {}}
_SMOOTH: dict[str | None, _Rules] = {
    "jacobi": {"omega": _number(0.0, 2.0, low_open=True), "degree": _count(1, 10)},
    "richardson": {"omega": _number(0.0, 2.0, low_open=True), "degree": _count(1, 10)},
    "energy": {"degree": _count(1, 10), "maxiter": _count(1, 100)}, None: {}}
_SMOOTHER: dict[str | None, _Rules] = {
    "gauss_seidel": _GS, "block_gauss_seidel": _GS,
    "jacobi": {"omega": _number(0.0, 2.0, low_open=True), "iterations": _ITERATIONS}, None: {}}


def _method(table: Mapping[str | None, _Rules]) -> Callable[[Any, str], Any]:
    """A pyamg method option: a name, or [name, {parameter: value}] (pyamg's (name, kwargs)); its
    normal form (name, ((parameter, value), ...)) is taken as well."""
    names = ", ".join("null" if k is None else repr(k) for k in table)

    def coerce(value: Any, name: str) -> tuple[Any, tuple[tuple[str, Any], ...]]:
        params: Any = {}
        if isinstance(value, (list, tuple)):
            if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], tuple):
                value = (value[0], dict(value[1]))
            if len(value) != 2 or not isinstance(value[1], dict):
                raise _bad(name, f"a method name ({names}) or [name, {{parameter: value}}]", value)
            value, params = value
        if isinstance(value, list) or value not in table:
            raise _bad(name, f"one of {names} (or [name, {{parameter: value}}])", value)
        rules = table[value]
        out = {}
        for key, given in params.items():
            if key not in rules:
                raise InvalidArgumentError(f"{name}: {value!r} takes no parameter {key!r} (its parameters: "
                                           f"{', '.join(rules) or 'none'})", reason=Reason.BAD_AMG_OPTION)
            out[key] = rules[key](given, f"{name}.{key}")
        return value, tuple(sorted(out.items()))
    return coerce


# option -> (rule, pyamg's default). 'smoother' sets both presmoother and postsmoother.
AMG_OPTIONS: dict[str, tuple[Callable[[Any, str], Any], Any]] = {
    "symmetry": (_word("hermitian", "symmetric", "nonsymmetric"), "hermitian"),
    "strength": (_method(_STRENGTH), ("symmetric", ())),
    "aggregate": (_method(_AGGREGATE), ("standard", ())),
    "smooth": (_method(_SMOOTH), ("jacobi", (("omega", 4.0 / 3.0),))),
    "presmoother": (_method(_SMOOTHER), ("block_gauss_seidel", (("sweep", "symmetric"),))),
    "postsmoother": (_method(_SMOOTHER), ("block_gauss_seidel", (("sweep", "symmetric"),))),
    "smoother": (_method(_SMOOTHER), None),
    "cycle": (_word("V", "W", "F"), "V"),
    "max_levels": (_count(1, 100), 10),
    "max_coarse": (_count(1, 100_000), 10),
    "coarse_solver": (_word("pinv", "lu", "cholesky", "splu"), "pinv"),
}


def normalize_amg_options(value: Any, name: str = "amg_options") -> dict[str, Any]:
    """``value`` (a dict of pyamg's option names, or None) checked and completed with pyamg's
    defaults: each method as (name, ((parameter, value), ...)). Unknown options, methods and
    parameters, and values out of range, are INVALID_ARGUMENT (BAD_AMG_OPTION) naming them.
    A normalized dict comes back unchanged."""
    given = {} if value is None else value
    if not isinstance(given, dict):
        raise _bad(name, "an object of pyamg's option names", value)
    for key in given:
        if key not in AMG_OPTIONS:
            raise InvalidArgumentError(f"{name} has the unknown option {key!r}; the options are "
                                       f"{', '.join(AMG_OPTIONS)}", reason=Reason.BAD_AMG_OPTION)
    if "smoother" in given and ("presmoother" in given or "postsmoother" in given):
        raise InvalidArgumentError(f"{name}: give 'smoother' (both) or 'presmoother'/'postsmoother', not both",
                                   reason=Reason.BAD_AMG_OPTION)
    out = {key: (rule(given[key], f"{name}.{key}") if key in given else default)
           for key, (rule, default) in AMG_OPTIONS.items()}
    smoother = out.pop("smoother")
    if smoother is not None:
        out["presmoother"] = out["postsmoother"] = smoother
    return out


# What the ops declare: null stays null (pyamg's defaults, and the check can tell that no option
# was given), anything else is normalized as the call binds.
AMG_OPTIONS_ARG = options(tuple(AMG_OPTIONS), lambda value, name: None if value is None
                          else normalize_amg_options(value, name))
