"""A tiny linear timing model (test double for rackserve.timing.TimingModel)."""

from __future__ import annotations

from rackserve.timing.batch import StepBatch, StepCost

PREFILL_S_PER_TOKEN = 1e-5
PREFILL_ATTN_S_PER_CTX_TOKEN = 1e-10  # per new token per context token
DECODE_BASE_S = 2e-3
DECODE_S_PER_SEQ = 1e-5
DECODE_S_PER_CTX_TOKEN = 1e-9
TRANSFER_S_PER_TOKEN = 1e-7


class LinearTiming:
    def layout(self, name: str, ranks: int | None = None) -> str:
        return name

    def step_time(self, phase: str, layout: str, batch: StepBatch) -> StepCost:
        busy = []
        for rb in batch.ranks:
            if rb.num_seqs == 0:
                busy.append(0.0)
                continue
            if phase == "prefill":
                ctx = float((rb.new_tokens * (rb.cached_tokens + rb.new_tokens)).sum())
                t = PREFILL_S_PER_TOKEN * rb.total_new + PREFILL_ATTN_S_PER_CTX_TOKEN * ctx
            else:
                t = DECODE_BASE_S + DECODE_S_PER_SEQ * rb.num_seqs + DECODE_S_PER_CTX_TOKEN * float(rb.cached_tokens.sum())
            t += TRANSFER_S_PER_TOKEN * (rb.pool_hbm_tokens + rb.pool_dram_tokens)
            busy.append(t)
        total = max(busy) if busy else 0.0
        return StepCost(total, {"all": total}, tuple(busy))

    def pd_transfer_s(self, tokens: int) -> float:
        return TRANSFER_S_PER_TOKEN * tokens

    def prefill_estimate_s(self, layout: str, new_tokens: int, cached_tokens: int) -> float:
        return PREFILL_S_PER_TOKEN * new_tokens

    def kv_transfer_s(self, tokens: int, tier: str) -> float:
        return TRANSFER_S_PER_TOKEN * tokens
