"""The message from the scheduler to whoever executes a step (vLLM v1's SchedulerOutput, one rank).

The live engine runs the model on it; the simulator prices it with the cost model. Counts only:
which sequences run, how many tokens each computes (a decode step computes 1; speculative decoding
may schedule more), the blocks allocated for them, pool fetches, and which sequences were preempted.
"""

from __future__ import annotations

from dataclasses import dataclass

from rackserve.timing.batch import RankBatch


@dataclass(frozen=True)
class ScheduledSeq:
    req_id: int | str
    num_new_tokens: int  # tokens computed this step (their KV is written; the last one samples)
    num_computed_tokens: int  # KV tokens held before the step (context, prefix hits included)
    num_new_blocks: int = 0  # KV blocks allocated for this step
    pool_hbm_tokens: int = 0  # prompt tokens fetched from the pool's spare-HBM tier in this step
    pool_dram_tokens: int = 0  # ... and from its DRAM tier
    resumed: bool = False  # first step after a preemption (recomputing what it lost)


@dataclass(frozen=True)
class SchedulerOutput:
    step: int  # this rank's step counter
    seqs: tuple[ScheduledSeq, ...] = ()
    preempted: tuple[int | str, ...] = ()  # lost their KV this step (recompute), back to waiting
    num_freed_blocks: int = 0  # blocks released by those preemptions

    @property
    def empty(self) -> bool:
        return not self.seqs

    @property
    def req_ids(self) -> tuple[int | str, ...]:
        return tuple(s.req_id for s in self.seqs)

    @property
    def new_tokens(self) -> tuple[int, ...]:
        return tuple(s.num_new_tokens for s in self.seqs)

    @property
    def total_new_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.seqs)

    def totals(self) -> tuple[int, int, int, int, int]:
        """(sequences, new tokens, sum of new x cached tokens, pool HBM tokens, pool DRAM tokens):
        what a step-cost memo keys on, without building the batch's arrays."""
        n = new = dot = hbm = dram = 0
        for s in self.seqs:
            n += 1
            new += s.num_new_tokens
            dot += s.num_new_tokens * s.num_computed_tokens
            hbm += s.pool_hbm_tokens
            dram += s.pool_dram_tokens
        return n, new, dot, hbm, dram

    def rank_batch(self) -> RankBatch:
        """The step as the cost model's input: new and cached tokens per sequence, pool fetches."""
        if not self.seqs:
            return RankBatch.of([])
        return RankBatch.of(
            list(self.new_tokens),
            [s.num_computed_tokens for s in self.seqs],
            pool_hbm_tokens=sum(s.pool_hbm_tokens for s in self.seqs),
            pool_dram_tokens=sum(s.pool_dram_tokens for s in self.seqs),
        )
