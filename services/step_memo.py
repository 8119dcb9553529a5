"""The live workers' step-cost memo: the simulator's (rackserve/sim/step_cache.py), per rank
busy times given back to the ranks that had the work.

Pricing a lockstep step with the exact cost model takes 0.1-0.4 ms of CPU on an idle core of
this machine (1.6-3 ms at load ~10) and runs on every step of every instance, between the ranks'
answer and the tokens' release: on the first token's path twice (the prefill step, the first
decode step). The simulator prices its steps through `CachedTiming`, whose key is a quantized
batch signature (5% geometric grid); the live side now does the same, so both sides charge a
batch the same representative cost (sim/live agreement: tests/integration/cluster). The memo
prices a decode batch of single-token sequences as a representative batch with the busiest rank
first; `rank_busy_s` is mapped back here, by sequence count, to the ranks that had them (the
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
        return self._to_ranks(self.cached.decode_token_time(layout, batch), batch)

    def step_time(self, phase: str, layout: object, batch: StepBatch) -> StepCost:
        cost = self.cached.step_time(phase, layout, batch)
        return self._to_ranks(cost, batch) if phase == "decode" else cost  # prefill: keyed rank by rank

    def _to_ranks(self, cost: StepCost, batch: StepBatch) -> StepCost:
        """A decode batch of single-token sequences is priced as a representative batch listing
        its busiest rank first, then the others by falling sequence count: its busy times go back
        to the batch's ranks in that order (the memo's own remap, as for prefill steps). Other
        decode batches (longer chunks) are keyed rank by rank and come back in rank order."""
        if not _single_token_decode(batch) or len(cost.rank_busy_s) != len(batch.ranks):
            return cost
        counts = [rb.num_seqs for rb in batch.ranks]
        order = sorted(range(len(counts)), key=lambda r: -counts[r])  # stable: ties keep rank order
        if order == list(range(len(order))):
            return cost
        return self.cached._remap(cost, order)


def _single_token_decode(batch: StepBatch) -> bool:
    """The memo's representative-batch case: every sequence of every rank computes one token."""
    return all(bool((rb.new_tokens == 1).all()) for rb in batch.ranks)
