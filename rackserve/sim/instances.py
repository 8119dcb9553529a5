"""Simulated engine instances: a group of DP ranks stepping in lockstep, each with its own scheduler.

The step of an instance lasts as long as its slowest rank (the MoE dispatch is a barrier); the
other ranks idle for the difference, which is accounted per rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rackserve.sched.output import SchedulerOutput
from rackserve.sched.scheduler import RankScheduler
from rackserve.timing.batch import StepCost


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
    rank_busy_s: list[float] = field(default_factory=list)
    rank_idle_s: list[float] = field(default_factory=list)
    steps: int = 0

    def __post_init__(self) -> None:
        self.rank_busy_s = [0.0] * len(self.ranks)
        self.rank_idle_s = [0.0] * len(self.ranks)

    def start_window(self) -> None:
        """Forget what happened before the measured window (its figures start now)."""
        self.stepping_s, self.steps = 0.0, 0
        self.rank_busy_s = [0.0] * len(self.ranks)
        self.rank_idle_s = [0.0] * len(self.ranks)

    def account(self, cost: StepCost, steps: int) -> None:
        """Charge `steps` identical steps of `cost` to the instance and each rank."""
        total = cost.total_s
        self.stepping_s += total * steps
        self.steps += steps
        busy_s, idle_s, priced = self.rank_busy_s, self.rank_idle_s, cost.rank_busy_s
        for r in range(len(busy_s)):
            if r < len(priced):
                busy = priced[r]
                busy_s[r] += busy * steps
                idle_s[r] += max(0.0, total - busy) * steps  # StepCost.rank_idle_s(r)
            else:  # a rank the cost does not list is idle the whole step
                idle_s[r] += total * steps


@dataclass(eq=False)
class Leap:
    """A decode instance's run of identical steps: started at `start`, `steps` of `step_s` each."""

    start: float
    steps: int
    step_s: float
    cost: StepCost
    version: int
    joined: list = field(default_factory=list)  # sequences whose first token this leap's first step makes
