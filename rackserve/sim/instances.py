"""Simulated engine instances: a group of DP ranks stepping in lockstep, each with its own scheduler.

The step of an instance lasts as long as its slowest rank (the MoE dispatch is a barrier); the
other ranks idle for the difference, which is accounted per rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rackserve.sched.output import SchedulerOutput
from rackserve.sched.scheduler import RankScheduler
from rackserve.timing.batch import StepCost

WIDE = 8  # instances with this many ranks or more keep per-rank times in numpy arrays


@dataclass(eq=False)
class Instance:
    name: str
    layout_name: str  # "dep2" | "wide-ep" | "tp8"
    layout: Any  # the timing model's layout object
    gpus: int
    ranks: list[RankScheduler]
    cache_tokens: int = 0  # prefill: each rank's HBM prefix cache (rackserve.sim.sizing)
    busy: bool = False
    plans: list[SchedulerOutput] = field(default_factory=list)
    stepping_s: float = 0.0  # time the instance spent in steps
    steps: int = 0
    _busy: Any = field(default=None, repr=False)  # per rank: busy / idle seconds (a numpy array when wide)
    _idle: Any = field(default=None, repr=False)
    _arrays: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.start_window()

    def start_window(self) -> None:
        """Forget what happened before the measured window (its figures start now)."""
        self.stepping_s, self.steps = 0.0, 0
        n = len(self.ranks)
        self._busy = np.zeros(n) if n >= WIDE else [0.0] * n
        self._idle = np.zeros(n) if n >= WIDE else [0.0] * n

    def account(self, cost: StepCost, steps: int) -> None:
        """Charge `steps` identical steps of `cost` to the instance and each rank."""
        total = cost.total_s
        self.stepping_s += total * steps
        self.steps += steps
        if len(self.ranks) >= WIDE:
            busy, idle = self._per_rank(cost)
            self._busy += busy * steps  # elementwise the same float operations as the loop below
            self._idle += idle * steps
            return
        busy_s, idle_s, priced = self.rank_busy_s, self.rank_idle_s, cost.rank_busy_s
        for r in range(len(busy_s)):
            if r < len(priced):
                busy = priced[r]
                busy_s[r] += busy * steps
                idle_s[r] += max(0.0, total - busy) * steps  # StepCost.rank_idle_s(r)
            else:  # a rank the cost does not list is idle the whole step
                idle_s[r] += total * steps

    def _per_rank(self, cost: StepCost) -> tuple[np.ndarray, np.ndarray]:
        """(busy, idle) seconds of each rank in one step of `cost`, kept per cost object (the step
        memo hands out the same objects again and again)."""
        hit = self._arrays.get(id(cost))
        if hit is not None and hit[0] is cost:
            return hit[1], hit[2]
        n, priced = len(self.ranks), cost.rank_busy_s
        busy = np.array([priced[r] if r < len(priced) else 0.0 for r in range(n)])
        idle = np.array([max(0.0, cost.total_s - priced[r]) if r < len(priced) else cost.total_s for r in range(n)])
        if len(self._arrays) > 4096:
            self._arrays.clear()
        self._arrays[id(cost)] = (cost, busy, idle)
        return busy, idle

    @property
    def rank_busy_s(self) -> list[float]:
        return self._busy.tolist() if isinstance(self._busy, np.ndarray) else self._busy

    @property
    def rank_idle_s(self) -> list[float]:
        return self._idle.tolist() if isinstance(self._idle, np.ndarray) else self._idle


@dataclass(eq=False)
class Leap:
    """A decode instance's run of identical steps: started at `start`, `steps` of `step_s` each."""

    start: float
    steps: int
    step_s: float
    cost: StepCost
    version: int
    joined: list = field(default_factory=list)  # sequences whose first token this leap's first step makes
