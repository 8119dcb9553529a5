"""The simulator's garbage-collector setting while it runs: full collections only rarely.

A long run holds millions of long-lived containers (the pool's stored blocks, the caches' entries,
the lanes' block-hash tuples), and CPython's full collection walks all of them each time the
survivors have grown by a quarter: 21 full collections took 27 s of the 482 s CPU of the
10,000-lane AgentX run (bench/simulator/agentx_speed.py, gc callbacks). Young collections, which free the
short-lived reference cycles, keep their default rate; the oldest generation waits for
`FULL_EVERY` middle-generation collections instead of 10. Nothing the run computes changes.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import TypeVar

FULL_EVERY = 1000  # middle-generation collections per full one (CPython's default: 10)

T = TypeVar("T")


def rare_full_collections(fn: Callable[..., T]) -> Callable[..., T]:
    """Run `fn` with full collections rare; the previous thresholds come back afterwards."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs) -> T:
        young, middle, full = gc.get_threshold()
        gc.set_threshold(young, middle, max(full, FULL_EVERY))
        try:
            return fn(*args, **kwargs)
        finally:
            gc.set_threshold(young, middle, full)

    return wrapper
