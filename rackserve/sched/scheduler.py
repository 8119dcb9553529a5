"""Per-rank batch scheduler: bounded admission, prefill chunks under a token budget, decode batch cap.

`schedule_prefill()` / `schedule_decode()` return a RankPlan whose RankBatch feeds the cost model;
`commit_*()` advances the counters once the step (or a leap of identical decode steps) is done.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from rackserve.sched.decode_batch import DecodeBatch
from rackserve.sched.seq_state import SeqState
from rackserve.timing.batch import RankBatch


@dataclass(frozen=True)
class SchedulerLimits:
    chunk_tokens: int = 8192  # prefill tokens per step per rank
    max_batch_seqs: int = 256  # sequences per step per rank
    max_queue: int = 10_000  # waiting + running; beyond this a request is rejected
    kv_tokens_capacity: int | None = None  # decode: KV tokens the rank's HBM holds

    def __post_init__(self) -> None:
        assert self.chunk_tokens > 0 and self.max_batch_seqs > 0 and self.max_queue > 0


@dataclass(frozen=True)
class RankPlan:
    """One step's work on one rank: sequences, tokens each computes, and the cost-model batch."""

    seqs: tuple[SeqState, ...]
    new_tokens: tuple[int, ...]
    batch: RankBatch

    @property
    def empty(self) -> bool:
        return not self.seqs


EMPTY_PLAN = RankPlan((), (), RankBatch.of([]))


class RankScheduler:
    """FCFS scheduler of one DP rank. `on_start(seq)` runs when a waiting sequence is first scheduled
    (the prefill rank looks up its prefix there, so blocks stored meanwhile are found)."""

    def __init__(self, limits: SchedulerLimits, on_start: Callable[[SeqState], None] | None = None) -> None:
        self.limits = limits
        self.on_start = on_start
        self.waiting: deque[SeqState] = deque()
        self.running: list[SeqState] = []  # prefill sequences started on this rank
        self.decoding = DecodeBatch()
        self._reserved = 0  # decode: final context (prompt + all outputs) of running sequences

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.decoding)

    def admit(self, seq: SeqState) -> bool:
        """Queue a sequence; False (rejected) when the rank's queue is full."""
        if len(self) >= self.limits.max_queue:
            return False
        self.waiting.append(seq)
        return True

    def queued_prefill_tokens(self) -> int:
        return sum(s.prefill_left for s in self.running) + sum(s.prefill_left for s in self.waiting)

    def schedule_prefill(self) -> RankPlan:
        budget = self.limits.chunk_tokens
        seqs: list[SeqState] = []
        news: list[int] = []
        for seq in self.running:
            if budget <= 0 or len(seqs) >= self.limits.max_batch_seqs:
                break
            take = min(seq.prefill_left, budget)
            seqs.append(seq)
            news.append(take)
            budget -= take
        while self.waiting and budget > 0 and len(seqs) < self.limits.max_batch_seqs:
            seq = self._start(self.waiting.popleft())
            self.running.append(seq)
            take = min(seq.prefill_left, budget)
            if take == 0:
                continue  # fully cached; finishes at commit without compute
            seqs.append(seq)
            news.append(take)
            budget -= take
        return self._plan(seqs, news)

    def schedule_decode(self) -> RankPlan:
        """Admit waiting sequences into the batch and plan one step over all of them."""
        self.promote_decode()
        seqs = self.decoding.sync()
        return self._plan(seqs, [1] * len(seqs)) if seqs else EMPTY_PLAN

    def decode_load(self) -> tuple[int, int]:
        """(sequences, context tokens) of the decode batch, without walking it."""
        return len(self.decoding), self.decoding.context_tokens

    def decode_steps_to_next_finish(self) -> int:
        return self.decoding.steps_to_next_finish()

    def commit_prefill(self, plan: RankPlan) -> list[SeqState]:
        """Apply a prefill step; return sequences whose prompt is now fully computed."""
        for seq, new in zip(plan.seqs, plan.new_tokens, strict=True):
            seq.computed_tokens += new
        done = [s for s in self.running if s.prefill_left == 0]
        if done:
            self.running = [s for s in self.running if s.prefill_left > 0]
        return done

    def commit_decode(self, steps: int) -> list[SeqState]:
        """Apply `steps` identical decode steps of the whole batch (at most up to its next finish);
        return sequences that produced their last token."""
        done = self.decoding.advance(steps)
        self._reserved -= sum(s.computed_tokens for s in done)
        return done

    def _start(self, seq: SeqState) -> SeqState:
        if self.on_start is not None:
            self.on_start(seq)
        return seq

    def promote_decode(self) -> list[SeqState]:
        """Move waiting sequences into the batch while slots and KV (reserved for the whole output,
        so a running sequence never needs preempting) allow; FCFS, no overtaking. Returns them."""
        cap = self.limits.kv_tokens_capacity
        joined = []
        while self.waiting and len(self.decoding) < self.limits.max_batch_seqs:
            seq = self.waiting[0]
            need = seq.computed_tokens + seq.decode_left
            if cap is not None and self.decoding and self._reserved + need > cap:
                break
            self.decoding.join(self._start(self.waiting.popleft()))
            self._reserved += need
            joined.append(seq)
        return joined

    def _plan(self, seqs: list[SeqState], news: list[int]) -> RankPlan:
        if not seqs:
            return EMPTY_PLAN
        cached = [s.computed_tokens for s in seqs]
        pool_hbm = sum(s.pool_hbm_tokens for s in seqs)
        pool_dram = sum(s.pool_dram_tokens for s in seqs)
        for s in seqs:  # pool fetches are charged once, on the first step that includes them
            s.pool_hbm_tokens = s.pool_dram_tokens = 0
        batch = RankBatch.of(news, cached, pool_hbm_tokens=pool_hbm, pool_dram_tokens=pool_dram)
        return RankPlan(tuple(seqs), tuple(news), batch)
