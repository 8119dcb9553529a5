"""Simulator test doubles: a tiny linear timing model standing in for rackserve.timing.TimingModel."""

from __future__ import annotations

import pytest

from rackserve.timing.batch import StepBatch, StepCost


class LinearTiming:
    """Prefill: per new token + attention per (new x context) token; decode: a base per step + per
    sequence + per context token; pool and P/D transfers per token. Busy per rank; lockstep max."""

    PREFILL_S_PER_TOKEN = 1e-5
    PREFILL_ATTN_S = 1e-10  # per new token per context token
    DECODE_BASE_S = 2e-3
    DECODE_S_PER_SEQ = 1e-5
    DECODE_S_PER_CTX_TOKEN = 1e-9
    TRANSFER_S_PER_TOKEN = 1e-7

    def layout(self, name: str, ranks: int | None = None) -> str:
        return name

    def _busy(self, phase: str, rb) -> float:
        if rb.num_seqs == 0:
            return 0.0
        if phase == "prefill":
            ctx = float((rb.new_tokens * (rb.cached_tokens + rb.new_tokens)).sum())
            t = self.PREFILL_S_PER_TOKEN * rb.total_new + self.PREFILL_ATTN_S * ctx
        else:
            t = self.DECODE_BASE_S + self.DECODE_S_PER_SEQ * rb.num_seqs
            t += self.DECODE_S_PER_CTX_TOKEN * float(rb.cached_tokens.sum())
        return t + self.TRANSFER_S_PER_TOKEN * (rb.pool_hbm_tokens + rb.pool_dram_tokens)

    def step_time(self, phase: str, layout: str, batch: StepBatch) -> StepCost:
        busy = tuple(self._busy(phase, rb) for rb in batch.ranks)
        total = max(busy, default=0.0)
        return StepCost(total, {"all": total}, busy)

    def decode_token_time(self, layout: str, batch: StepBatch) -> StepCost:
        return self.step_time("decode", layout, batch)  # no speculative decoding in the double

    def pd_transfer_s(self, tokens: int) -> float:
        return self.TRANSFER_S_PER_TOKEN * tokens

    def prefill_estimate_s(self, layout: str, new_tokens: int, cached_tokens: int) -> float:
        return self.PREFILL_S_PER_TOKEN * new_tokens

    def kv_transfer_s(self, tokens: int, tier: str) -> float:
        return self.TRANSFER_S_PER_TOKEN * tokens


@pytest.fixture
def timing() -> LinearTiming:
    return LinearTiming()


TINY_SCENARIO = """
name: tiny
deployment:
  prefill: [{layout: dep2, count: 2}]
  decode: [{layout: wide-ep, ranks: 4, count: 1}]
workload: {kind: uniform, concurrency: 2, requests: 6, prompt_tokens: 3000, output_tokens: 20, shared_prefix_tokens: 1024}
"""


@pytest.fixture
def tiny_yaml() -> str:
    """A scenario file's text small enough for the command line's tests: 6 uniform requests, 2 DEP2 + Wide-EP 4."""
    return TINY_SCENARIO
