"""The live workers' step-cost memo: the simulator's (rackserve/sim/step_cache.py), per rank
busy times given back to the ranks that had the work.

Pricing a lockstep step with the exact cost model takes 0.1-0.4 ms of CPU on an idle core of
this machine (1.6-3 ms at load ~10) and runs on every step of every instance, between the ranks'
answer and the tokens' release: on the first token's path twice (the prefill step, the first
decode step). The simulator prices its steps through `CachedTiming`, whose key is a quantized
batch signature (5% geometric grid); the live side now does the same, so both sides charge a
batch the same representative cost (sim/live agreement: tests/integration/cluster). The memo
prices a decode batch of single-token sequences as a representative batch with the busiest rank
first; the memo maps `rank_busy_s` back, by sequence count, to the ranks that had them (the
per-rank idle-time metric would otherwise credit rank 0 with another rank's work).
"""

from __future__ import annotations

from rackserve.sim.step_cache import CachedTiming
from rackserve.timing import TimingModel
from rackserve.timing.batch import StepBatch, StepCost


class StepMemo:
    """`decode_token_time` / `step_time` of a TimingModel, memoized as the simulator does."""

    def __init__(self, timing: TimingModel) -> None:
        self.timing = timing
        self.cached = CachedTiming(timing)

    @property
    def calls(self) -> int:
        return self.cached.calls

    @property
    def misses(self) -> int:
        return self.cached.misses

    def decode_token_time(self, layout: object, batch: StepBatch) -> StepCost:
        return self.cached.decode_token_time(layout, batch)  # busy times per rank: CachedTiming._to_ranks

    def step_time(self, phase: str, layout: object, batch: StepBatch) -> StepCost:
        return self.cached.step_time(phase, layout, batch)
