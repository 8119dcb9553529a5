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

WIDE = 8  # instances with this many ranks or more charge their ranks lazily (see Instance.account)
MAX_PENDING = 4096  # distinct step costs held before charging them


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
    _busy: list[float] = field(default_factory=list, repr=False)  # per rank: busy / idle seconds
    _idle: list[float] = field(default_factory=list, repr=False)
    _pending: dict[int, list] = field(default_factory=dict, repr=False)  # id(cost) -> [cost, steps] not yet charged

    def __post_init__(self) -> None:
        self.start_window()

    def start_window(self) -> None:
        """Forget what happened before the measured window (its figures start now)."""
        self.stepping_s, self.steps = 0.0, 0
        self._busy = [0.0] * len(self.ranks)
        self._idle = [0.0] * len(self.ranks)
        self._pending = {}

    def account(self, cost: StepCost, steps: int) -> None:
        """Charge `steps` identical steps of `cost` to the instance and each rank. A wide instance
        adds up steps per cost object and charges its ranks when asked (`_flush`): the step memo
        hands out the same few objects again and again, so that is O(1) a leap instead of O(ranks)
        (the per-rank sums are regrouped: equal to about 1e-15 relative)."""
        total = cost.total_s
        self.stepping_s += total * steps
        self.steps += steps
        if len(self.ranks) >= WIDE:
            entry = self._pending.get(id(cost))  # the entry holds the cost, so its id stays unique
            if entry is None:
                if len(self._pending) >= MAX_PENDING:
                    self._flush()
                self._pending[id(cost)] = [cost, steps]
            else:
                entry[1] += steps
            return
        self._charge(cost, steps)

    def _charge(self, cost: StepCost, steps: int) -> None:
        total = cost.total_s
        busy_s, idle_s, priced = self._busy, self._idle, cost.rank_busy_s
        for r in range(len(busy_s)):
            if r < len(priced):
                busy = priced[r]
                busy_s[r] += busy * steps
                idle_s[r] += max(0.0, total - busy) * steps  # StepCost.rank_idle_s(r)
            else:  # a rank the cost does not list is idle the whole step
                idle_s[r] += total * steps

    def _flush(self) -> None:
        """Charge the pending costs in the order they came, as `_charge` would one by one: with
        every cost listing every rank, as arrays (the same products and maxima per element, and
        each rank's sum taken in the same order, so the same bits)."""
        pending, self._pending = self._pending, {}
        if not pending:
            return
        n = len(self._busy)
        entries = list(pending.values())
        priced = [cost.rank_busy_s for cost, _ in entries]
        if n < WIDE or any(len(p) != n for p in priced):
            for cost, steps in entries:
                self._charge(cost, steps)
            return
        p = np.array(priced, dtype=np.float64)
        steps = np.array([float(s) for _, s in entries])[:, None]  # int * float in Python: the float of the int
        totals = np.array([cost.total_s for cost, _ in entries])[:, None]
        add_busy = p * steps
        add_idle = np.maximum(0.0, totals - p) * steps
        busy, idle = np.array(self._busy), np.array(self._idle)
        for b, i in zip(add_busy, add_idle, strict=True):  # row by row: each rank's sum in charge order
            busy += b
            idle += i
        self._busy, self._idle = busy.tolist(), idle.tolist()

    @property
    def rank_busy_s(self) -> list[float]:
        self._flush()
        return self._busy

    @property
    def rank_idle_s(self) -> list[float]:
        self._flush()
        return self._idle


@dataclass(eq=False)
class Leap:
    """A decode instance's run of identical steps: started at `start`, `steps` of `step_s` each,
    perhaps led by the newcomers' tail step (`head`, from `head_start` to `start`)."""

    start: float
    steps: int
    step_s: float
    cost: StepCost
    version: int
    joined: list = field(default_factory=list)  # sequences whose first token this leap's first step makes
    head: StepCost | None = None  # a tail step of its own before `start` (decode_side._start_headed)
    head_start: float = 0.0  # when that tail step began
