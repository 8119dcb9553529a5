"""The messages into and out of the cost model: a step's batch per rank, and its cost breakdown."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

Phase = Literal["prefill", "decode"]


@dataclass(frozen=True)
class RankBatch:
    """What one DP rank computes in one step. Arrays have one entry per sequence in the batch.

    new_tokens[i]: tokens of sequence i computed this step (1 for a decode step).
    cached_tokens[i]: tokens of sequence i already in KV before this step (context = cached + new).
    pool_hbm_tokens / pool_dram_tokens: prompt tokens whose KV this rank fetches from the pool's
    spare-HBM / DRAM tier during this step (charged as KV transfer).
    """

    new_tokens: np.ndarray
    cached_tokens: np.ndarray
    pool_hbm_tokens: int = 0
    pool_dram_tokens: int = 0

    @staticmethod
    def of(new_tokens: list[int], cached_tokens: list[int] | None = None, **kw: int) -> RankBatch:
        new = np.asarray(new_tokens, dtype=np.int64)
        cached = (
            np.zeros_like(new)
            if cached_tokens is None
            else np.asarray(cached_tokens, dtype=np.int64)
        )
        return RankBatch(new, cached, **kw)

    @property
    def num_seqs(self) -> int:
        return int(self.new_tokens.shape[0])

    @property
    def total_new(self) -> int:
        return int(self.new_tokens.sum())


@dataclass(frozen=True)
class StepBatch:
    """One lockstep step of an instance: one RankBatch per DP rank (empty batches are idle ranks).

    expert_tokens: optional routed-token count per expert for the whole instance (length = routed
    experts of the target model); None means the cost model's expert-load model decides.
    """

    ranks: tuple[RankBatch, ...]
    expert_tokens: np.ndarray | None = None

    @property
    def single_token(self) -> bool:
        """Every sequence of every rank computes one token (a plain decode step). Ranks that share
        one RankBatch (a step memo's representative) are checked once."""
        return all(bool((rb.new_tokens == 1).all()) for rb in {id(rb): rb for rb in self.ranks}.values())


@dataclass(frozen=True)
class StepCost:
    """Simulated duration of a step and where it goes.

    total_s: the step's duration (the slowest rank sets it in lockstep layouts).
    breakdown: seconds per named component on the critical path (attention, indexer, moe_gemm,
      dispatch_combine, all_reduce, engram, mhc, lm_head, kv_transfer, ...).
    rank_busy_s: per DP rank, the time that rank is busy; its idle time is total_s - rank_busy_s[r].
    bound: per component, "compute" | "memory" | "comm", so a user sees what dominates.
    hidden_s: per component, time spent that the step does not wait for (communication overlapped
      with another micro-batch's compute); not in total_s.
    accepted_tokens: expected tokens each decoding sequence gains in this step (1 without
      speculative decoding; the MTP acceptance model's expectation with it).
    """

    total_s: float
    breakdown: dict[str, float]
    rank_busy_s: tuple[float, ...]
    bound: dict[str, str] = field(default_factory=dict)
    hidden_s: dict[str, float] = field(default_factory=dict)
    accepted_tokens: float = 1.0

    def rank_idle_s(self, rank: int) -> float:
        return max(0.0, self.total_s - self.rank_busy_s[rank])
