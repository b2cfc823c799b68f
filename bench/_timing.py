"""Timing for every benchmark: best of several runs, contenders interleaved.

This machine's speed moves by half from minute to minute, so each figure is the best of
``repeat`` runs after a warm-up run (kernels loaded, memory touched), and contenders compared in
one table take turns within every round: a burst of load from elsewhere then slows all of that
round's contenders, not one of them.
"""

from __future__ import annotations

import time
from typing import Callable


def best_of_each(fns: dict[str, Callable[[], object]], repeat: int, warm_up: bool = True) -> dict[str, float]:
    """Best time of each named contender, their runs interleaved round by round (after a warm-up
    run of each, unless the caller has just run them, as for checking their answers)."""
    if warm_up:
        for fn in fns.values():
            fn()
    best = {name: float("inf") for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def paired(fns: list[Callable[[], object]], repeat: int) -> list[float]:
    """``best_of_each`` for an unnamed list, in its order."""
    best = best_of_each(dict(enumerate(fns)), repeat)
    return [best[i] for i in range(len(fns))]


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """Best time of one function (after a warm-up run)."""
    return paired([fn], repeat)[0]
