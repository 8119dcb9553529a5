"""Pacing: a live step lasts max(real compute, simulated step time x time_scale) of wall time.

When the real compute already took longer than the paced budget the twin has fallen behind the
clock it emulates; that overrun is the step's pacing lag, counted so a user can see it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class PaceResult:
    sleep_s: float  # wall seconds still to wait after the compute
    lag_s: float  # wall seconds the compute ran over its budget (0 when on time)


def pace(sim_s: float, time_scale: float, compute_s: float) -> PaceResult:
    """How long to wait after `compute_s` of real work so the step lasts `sim_s` scaled."""
    budget = sim_s * time_scale
    if time_scale <= 0:
        return PaceResult(0.0, 0.0)  # unpaced: run as fast as the machine allows
    if compute_s >= budget:
        return PaceResult(0.0, compute_s - budget)
    return PaceResult(budget - compute_s, 0.0)


async def sleep_paced(sim_s: float, time_scale: float, started: float) -> PaceResult:
    """Sleep out the rest of a step begun at `started` (time.monotonic()) and return its pacing."""
    result = pace(sim_s, time_scale, time.monotonic() - started)
    if result.sleep_s > 0:
        await asyncio.sleep(result.sleep_s)
    return result
