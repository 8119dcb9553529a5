"""What a planner policy is (decide: observations -> targets) and the bounds every decision is
clamped to (instances per role, GPUs). The policies themselves: rackserve/planner/policies.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from rackserve.planner.observation import Targets, TickObs


@dataclass(frozen=True)
class Bounds:
    min_prefill: int
    max_prefill: int
    min_decode: int
    max_decode: int
    prefill_gpus: int  # per instance
    decode_gpus: int
    gpu_budget: int

    def gpus(self, t: Targets) -> int:
        return t.prefill * self.prefill_gpus + t.decode * self.decode_gpus

    def fits(self, t: Targets) -> bool:
        return (self.min_prefill <= t.prefill <= self.max_prefill and self.min_decode <= t.decode <= self.max_decode
                and self.gpus(t) <= self.gpu_budget)

    def clamp(self, t: Targets, current: Targets) -> Targets:
        """`t` within the instance bounds; over the GPU budget the change that broke it is undone
        (the current counts are kept where they fit)."""
        p = min(max(t.prefill, self.min_prefill), self.max_prefill)
        d = min(max(t.decode, self.min_decode), self.max_decode)
        out = Targets(p, d)
        if self.fits(out):
            return out
        for trial in (Targets(current.prefill, d), Targets(p, current.decode), current):
            if self.fits(trial):
                return trial
        return Targets(self.min_prefill, self.min_decode)


class Planner(Protocol):
    def decide(self, obs: TickObs, current: Targets) -> Targets: ...
