"""How loaded the decode ranks are, honestly: sequences per rank sampled over the measured window
(mean, P90, max), the decode output rate per GPU against what the cost model says the same ranks
deliver at that batch and context, and what bounds each role.

"Stepping share" (time a decode instance spends in steps / the window) is not load: a lockstep
instance steps back to back at batch 8 as at batch 800, so it reads 100% either way (issue 31).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rackserve.timing.batch import RankBatch, StepBatch

SAMPLE_EVERY_S = 0.05  # simulated seconds between snapshots of the decode ranks' batches
NEAR_CAP = 0.95  # a P90 batch this close to max_num_seqs counts as capped
SATURATED = 0.9  # a prefill stepping share above this counts as saturated


@dataclass
class DecodeLoad:
    """Snapshots of every decode rank's running sequences and their mean context (the lazy clock's
    totals, or the bounded schedulers' running lists), at most one per SAMPLE_EVERY_S."""

    next_s: float = 0.0
    admission_waits: int = 0  # decode batch starts at which some rank still had sequences waiting (KV or cap)
    seqs: list[np.ndarray] = field(default_factory=list)  # per snapshot: sequences per rank, all instances
    held: list[np.ndarray] = field(default_factory=list)  # per snapshot: KV tokens held per rank
    context: list[float] = field(default_factory=list)  # per snapshot: mean context tokens per sequence

    def due(self, now: float) -> bool:
        return now >= self.next_s

    def record(self, now: float, counts: list[int], held_tokens: list[int]) -> None:
        self.next_s = now + SAMPLE_EVERY_S
        self.seqs.append(np.asarray(counts, dtype=np.int64))
        self.held.append(np.asarray(held_tokens, dtype=np.int64))
        total = sum(counts)
        self.context.append(sum(held_tokens) / total if total else 0.0)


def decode_load_report(load: DecodeLoad, timing: Any, decode: list, max_num_seqs: int, output_tokens: int,
                       span_s: float, prefill_share: float, kept_tokens: int | None = None) -> dict:
    """The decode load figures of a run (`decode`: the simulator's decode instances; `kept_tokens`:
    the KV budget a decode rank admits against, sizing's decode_kv_tokens)."""
    gpus = sum(inst.gpus for inst in decode)
    counts = np.concatenate(load.seqs) if load.seqs else np.zeros(1, dtype=np.int64)
    mean, p90, top = float(counts.mean()), float(np.percentile(counts, 90)), int(counts.max())
    ctx = float(np.mean([c for c in load.context if c > 0])) if any(load.context) else 0.0
    rate = output_tokens / span_s / gpus if span_s > 0 and gpus else 0.0
    lo = max(1, int(mean))
    at = [_capacity_per_gpu(timing, decode, n, int(ctx), gpus) for n in (lo, lo + 1)]
    capacity = at[0] + (at[1] - at[0]) * max(0.0, mean - lo)  # between the two whole batches around the mean
    use = rate / capacity if capacity > 0 else 0.0
    held = np.concatenate(load.held) if load.held else np.zeros(1, dtype=np.int64)
    return {
        "kv_held_tokens_per_rank_p99": float(np.percentile(held, 99)), "kv_held_tokens_per_rank_max": int(held.max()),
        "kv_kept_tokens_per_rank": kept_tokens, "admission_waits": load.admission_waits,
        "seqs_per_rank_mean": mean, "seqs_per_rank_p90": p90, "seqs_per_rank_max": top,
        "max_num_seqs": max_num_seqs, "context_mean_tokens": ctx,
        "tok_s_per_gpu": rate, "capacity_tok_s_per_gpu_at_batch": capacity, "capacity_use": use,
        "bound": {"prefill": _prefill_bound(prefill_share), "decode": _decode_bound(mean, p90, max_num_seqs, use)},
    }


def _capacity_per_gpu(timing: Any, decode: list, per_rank: int, ctx: int, gpus: int) -> float:
    """Output tokens/s/GPU the decode instances give with `per_rank` sequences of `ctx` tokens on
    every rank, stepping back to back (the cost model's per-token time, MTP included)."""
    if not gpus or ctx <= 0:
        return 0.0
    tokens_s = 0.0
    for inst in decode:
        rb = RankBatch(np.ones(per_rank, dtype=np.int64), np.full(per_rank, ctx, dtype=np.int64))
        cost = timing.decode_token_time(inst.layout, StepBatch((rb,) * len(inst.ranks)))
        tokens_s += per_rank * len(inst.ranks) / cost.total_s
    return tokens_s / gpus


def _prefill_bound(share: float) -> str:
    if share >= SATURATED:
        return f"compute: prefill ranks step {share:.0%} of the window (saturated)"
    return f"arrivals: prefill ranks step {share:.0%} of the window"


def _decode_bound(mean: float, p90: float, cap: int, use: float) -> str:
    if p90 >= NEAR_CAP * cap:
        return f"max_num_seqs: P90 batch {p90:.0f} of {cap} per rank"
    return (f"load: {mean:.1f} sequences per rank on average (cap {cap}), the lanes' share in decode; "
            f"{use:.0%} of what the ranks deliver at that batch")
