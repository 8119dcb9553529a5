"""A lanes schedule ([[t_s, lanes], ...], a step function of how many closed-loop lanes run): its check
and when a lane runs (the uniform and the AgentX-trace sources share them)."""

from __future__ import annotations


def check_lanes_schedule(sched: tuple[tuple[float, int], ...] | None) -> tuple[tuple[float, int], ...] | None:
    """A lanes schedule [[t_s, lanes], ...]: from 0, times increasing, lanes >= 0 and some > 0."""
    if sched is None:
        return sched
    if not sched or sched[0][0] != 0:
        raise ValueError("the first entry must be at t_s 0")
    if any(b[0] <= a[0] for a, b in zip(sched, sched[1:], strict=False)):
        raise ValueError("times must increase")
    if any(lanes < 0 for _, lanes in sched) or not any(lanes for _, lanes in sched):
        raise ValueError("lanes must be >= 0, some > 0")
    return sched


def lane_start(schedule: tuple[tuple[float, int], ...], lane: int, now_s: float) -> float | None:
    """The first time at or after `now_s` when `schedule` runs more than `lane` lanes (None: never)."""
    for i, (t, lanes) in enumerate(schedule):
        t_next = schedule[i + 1][0] if i + 1 < len(schedule) else float("inf")
        if t_next > now_s and lanes > lane:
            return max(t, now_s)
    return None
