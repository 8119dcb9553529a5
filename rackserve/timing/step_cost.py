"""The per-step cost of one instance: roofline per operation, summed over layers, lockstep over ranks.

Per layer, every DP rank runs its attention part (projections, indexer, attention, mHC, TP
all-reduce) on its own sequences; then the MoE part (gate, dispatch, grouped expert GEMM, combine)
waits on the dispatch barrier, so the MoE time is the busiest EP rank's. total_s = slowest attention
part + busiest MoE part + the rest; the breakdown lists the critical rank's components.
"""

from __future__ import annotations

import numpy as np

from rackserve.timing import bundle_plan
from rackserve.timing.attention_cost import (
    engram,
    host_overhead,
    kv_attention,
    lm_head,
    token_attention,
)
from rackserve.timing.batch import StepBatch, StepCost
from rackserve.timing.batch_features import step_arrays
from rackserve.timing.cost_context import MEMO_LIMIT, CostContext, LayerGroups
from rackserve.timing.layout import Layout
from rackserve.timing.moe_cost import moe_part
from rackserve.timing.parts import ATTN_PART, Bundle, Parts, label

__all__ = ["CostContext", "step_cost", "token_bundle"]


def step_cost(
    ctx: CostContext, phase: str, layout: Layout, batch: StepBatch, kv_transfer
) -> StepCost:
    if phase not in ("prefill", "decode"):
        raise ValueError(f"phase: must be 'prefill' or 'decode', got {phase!r}")
    if len(batch.ranks) != layout.dp:
        raise ValueError(
            f"ranks: layout {layout.key} has {layout.dp} DP ranks, batch has {len(batch.ranks)}"
        )
    lg = ctx.groups[phase]
    groups = step_arrays(batch.ranks, phase, ctx.model, ctx.codes)
    kv = Parts(
        layout.dp
    )  # components that depend on each sequence's context (and the rank's transfers)
    bundles = []
    for gi, ga in enumerate(groups):
        if ga is None or lg.layers[gi] == 0:
            continue
        kv_attention(ctx, layout, phase, lg, gi, ga, kv)
        bundles.append(
            token_bundle(
                ctx,
                layout,
                phase,
                lg,
                gi,
                ga.tokens,
                ga.seqs,
                groups[0].tokens,
                batch.expert_tokens,
            )
        )
    if any(rb.pool_hbm_tokens or rb.pool_dram_tokens for rb in batch.ranks):
        transfer = [
            kv_transfer(rb.pool_hbm_tokens, "pool_hbm")
            + kv_transfer(rb.pool_dram_tokens, "pool_dram")
            for rb in batch.ranks
        ]
        kv.add("kv_transfer", transfer)
    attn = sum(b.attn_total for b in bundles) + kv.total(ATTN_PART)
    moe = sum(b.moe_total for b in bundles)
    return _assemble(kv, bundles, attn, moe, layout)


def token_bundle(
    ctx,
    lay: Layout,
    phase: str,
    lg: LayerGroups,
    gi: int,
    tokens: np.ndarray,
    seqs: np.ndarray,
    tokens_full: np.ndarray,
    expert_tokens,
) -> Bundle:
    """Every component that depends only on the per-rank token counts (projections, mHC, all-reduce,
    LM head, and, with the expert-load model, the whole MoE part): memoized on those counts, since
    a simulator's steps repeat the same counts many times."""
    key = None
    if expert_tokens is None:  # the all-token counts (tokens_full) matter only with an expert load
        extra = seqs.tobytes() if (phase == "prefill" and gi == 0) else b""
        key = (phase, lay.key, gi, tokens.tobytes(), extra)
        hit = ctx.memo.get(key)
        if hit is not None:
            return hit
    if expert_tokens is None and bundle_plan.supported(lay):
        bundle = bundle_kernel(ctx, lay, phase, lg, gi, tokens, seqs)
    else:
        bundle = _bundle(ctx, lay, phase, lg, gi, tokens, seqs, tokens_full, expert_tokens)
    if key is not None:
        if len(ctx.memo) > MEMO_LIMIT:
            ctx.memo.clear()
        ctx.memo[key] = bundle
    return bundle


def _bundle(ctx, lay: Layout, phase: str, lg: LayerGroups, gi: int, tokens, seqs, tokens_full, expert_tokens) -> Bundle:
    """token_bundle's components computed (its numpy form: the reference)."""
    b_parts, b_crit = Parts(lay.dp), Parts(1)
    token_attention(ctx, lay, phase, lg, gi, tokens, b_parts)
    moe_part(ctx, lay, phase, lg, gi, tokens, tokens_full, expert_tokens, b_parts, b_crit)
    if gi == 0:
        lm_head(ctx, lay, phase, tokens, seqs, b_parts)
        host_overhead(ctx, tokens, b_parts)
    engram(ctx, lg, gi, tokens, b_parts)
    return Bundle.of(b_parts, b_crit)


def _numpy_bundle(ctx, lay: Layout, phase: str, lg: LayerGroups, gi: int, tokens, seqs) -> Bundle:
    return _bundle(ctx, lay, phase, lg, gi, tokens, seqs, None, None)


def _compiled_bundle(ctx, lay: Layout, phase: str, lg: LayerGroups, gi: int, tokens, seqs) -> Bundle:
    return bundle_plan.compiled_bundle(bundle_plan.plan_of(ctx, lay, phase, lg, gi), tokens, seqs)


# name -> (numpy twin, compiled kernel), as step_plan.KERNELS: a bundle without an expert load by
# timing/bundle_plan.py where timing/_pricer.c is built (tests swap in the twin: test_pricer.py)
KERNELS = {"bundle_kernel": (_numpy_bundle, _compiled_bundle)}
bundle_kernel = KERNELS["bundle_kernel"][1 if bundle_plan.AVAILABLE else 0]


def _assemble(
    kv: Parts, bundles: list[Bundle], attn: np.ndarray, moe: np.ndarray, lay: Layout
) -> StepCost:
    """Critical path: the slowest rank's attention part + the busiest EP rank's MoE part."""
    if attn.max() <= 0 and moe.max() <= 0:
        return StepCost(0.0, {}, (0.0,) * lay.dp, {})
    ra = int(np.argmax(attn))
    breakdown: dict[str, float] = {}
    tc: dict[str, float] = {}
    tm: dict[str, float] = {}
    for name, t in kv.t.items():
        breakdown[name] = float(t[ra])
        if name in kv.tc:
            tc[name], tm[name] = float(kv.tc[name][ra]), float(kv.tm[name][ra])
    for b in bundles:
        for acc, part in zip((breakdown, tc, tm), b.rank_view(ra), strict=True):
            for name, value in part.items():
                acc[name] = acc.get(name, 0.0) + value
    bound = {n: label(n, tc, tm) for n in breakdown}
    crit_bound: dict[str, list[str]] = {}
    for b in bundles:
        for name, value in b.crit_breakdown.items():
            breakdown[name] = breakdown.get(name, 0.0) + value
            crit_bound.setdefault(name, []).append(b.crit_bound[name])
    for name, labels in crit_bound.items():
        bound[name] = labels[0]  # the all-token layer group's label
    total = sum(breakdown.values())
    busy = np.minimum(attn + moe, total)
    return StepCost(total, breakdown, tuple(busy.tolist()), bound)
