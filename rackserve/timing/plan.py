"""The step cost's plan: what depends only on (hardware, model, optimizations, layout, phase), folded
once into per-layer-group maps from a batch's per-rank sums to attention and indexer times
(step_plan.py prices a batch with them; step_cost.py is the readable reference)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rackserve.timing.attention_cost import prefill_read_share
from rackserve.timing.cost_context import CostContext
from rackserve.timing.layout import Layout
from rackserve.timing.roofline import domain_bw_factor


@dataclass(frozen=True)
class GroupPlan:
    """Constants of one layer group's context-dependent part (attention + indexer over C codes).

    Columns of the maps: [attention compute x C, indexer compute x C, attention memory x C,
    indexer memory x C]; rows: general features [W, L, Kr, capped per indexer code] or, for
    single-token decode, [W, L, capped per indexer code] (Kr == L there).
    """

    gi: int
    layers: int
    window: float
    tail: int  # prefill tail group: queries = min(new, tail); 0 for the all-token group
    indexer_ratios: tuple[tuple[float, float], ...]  # (ratio, top_k) per indexer code
    decode_caps: np.ndarray  # [F_d, 1] caps of e = cached + 1
    decode_map: np.ndarray  # [F_d, 4C]
    general_map: np.ndarray  # [F_g, 4C]
    omo: np.ndarray  # [2C] 1 - overlap (attention), 0 (indexer)
    gather: np.ndarray  # [2C] exposed KV-gather latency of indexer codes (decode only)
    weights: np.ndarray  # [2C, 2] layer counts -> (attention, indexer) totals
    overhead: float
    has_indexer: bool
    d_const: np.ndarray  # [2] per-kernel overhead + gather latency of a non-idle rank, @ weights
    d_const_list: tuple[float, float]
    d_omo: np.ndarray | None  # [2C] 1 - overlap; None when every kernel overlaps fully
    d_out: np.ndarray  # [(2 or 3) x 2C, 7]: [max(tc, tm), (min(tc, tm)), tc, tm] -> 7 totals
    has_gather: bool  # gather.any()
    # _general_features' constants, its rows computed in the order [L, W, capped per indexer code,
    # Kr, W_read, L_read, capped_read per indexer code, tokens, seqs] (the sums of positions as
    # the capped sums with no knee): knee caps x divisors, divisors, caps, per indexer code its
    # ratio and top_k, and the permutation back to the feature order
    f_knee: np.ndarray  # [2 + I, 1]
    f_div: np.ndarray  # [1 + I, 1]
    f_cap: np.ndarray  # [1 + I, 1]
    f_ratio: np.ndarray  # [I, 1]
    f_top_k: np.ndarray  # [I, 1]
    f_order: np.ndarray  # [7 + 2I]
    # the f_* constants in one array, as the compiled kernels read them (timing/pricer.py, _pricer.c)
    packed: np.ndarray = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.packed is None:
            object.__setattr__(self, "packed", _packed(self.window, self.f_knee, self.f_div, self.f_cap, self.f_ratio,
                                                       self.f_top_k, self.f_order))


@dataclass(frozen=True)
class StepPlan:
    """Everything per (layout, phase) that does not depend on the batch."""

    layout: Layout
    phase: str
    groups: tuple[GroupPlan, ...]
    # decode: _decode_entry's tuple per tuple of sequences per rank; prefill: _rank_row's row per
    # (group index, new tokens, cached tokens) of a rank
    memo: dict = field(default_factory=dict, compare=False, repr=False)
    bundles: dict = field(default_factory=dict, compare=False, repr=False)  # _finish's token bundles
    row_stack: RowStack | None = field(default=None, compare=False, repr=False)  # prefill: _rank_rows'


def build_plan(ctx: CostContext, lay: Layout, phase: str) -> StepPlan:
    lg = ctx.groups[phase]
    groups = []
    for gi in (0, 1):
        if lg.layers[gi] == 0:
            continue
        if gi == 1 and (phase == "decode" or ctx.model.prefill.full_layers >= ctx.model.layers):
            continue
        groups.append(_group_plan(ctx, lay, phase, gi))
    stack = _row_stack(tuple(groups)) if phase == "prefill" and groups else None
    return StepPlan(lay, phase, tuple(groups), row_stack=stack)


def _group_plan(ctx: CostContext, lay: Layout, phase: str, gi: int) -> GroupPlan:
    hw, m, o = ctx.hw, ctx.model, ctx.opts
    att, lg = m.attention, ctx.groups[phase]
    codes = ctx.codes
    nc = len(codes)
    idx_codes = [i for i, c in enumerate(codes) if c.ratio and c.indexer]
    fg = 3 + len(idx_codes)
    gmap = np.zeros((fg, 4 * nc))
    fa = att.flops_per_entry(phase, lay.tp)
    pa = hw.peak(att.math_dtype) * hw.efficiency.attention_compute
    ba = hw.hbm_bw_bytes_per_s * hw.efficiency.attention_memory * domain_bw_factor(hw, False)
    with_indexer = bool(m.indexer and lg.indexer_layers[gi])
    if m.indexer:
        ix = m.indexer
        fi = 2.0 * (ix.heads / lay.tp) * ix.head_dim
        pi = hw.peak("fp4" if o.fp4_indexer else "fp8") * hw.efficiency.attention_compute
        bi = hw.hbm_bw_bytes_per_s * hw.efficiency.attention_memory
    # prefill: a query tile shares its window and dense entries' reads (attention_cost.prefill_read_share)
    shared = prefill_read_share(phase)
    for i, code in enumerate(codes):
        # window entries: every code attends them
        gmap[0, i] = fa / pa
        gmap[0, 2 * nc + i] = att.window_entry_bytes * shared / ba
        if code.ratio == 0:
            continue
        if code.indexer:
            row = 3 + idx_codes.index(i)  # comp = capped sum (already in entries)
            gmap[row, i] = fa / pa
            gmap[row, 2 * nc + i] = att.compressed_entry_bytes / ba
            if with_indexer:
                gmap[1, nc + i] = fi / code.ratio / pi  # scan = L / ratio
                gmap[2, 3 * nc + i] = ix.key_bytes / code.ratio / bi  # keys = Kr / ratio
                gmap[1, 3 * nc + i] = ix.score_bytes / code.ratio / bi  # top-k scores = L / ratio
        else:  # dense compressed: comp = L / ratio
            gmap[1, i] = fa / code.ratio / pa
            gmap[1, 2 * nc + i] = att.compressed_entry_bytes * shared / code.ratio / ba
    # single-token decode: Kr == L, capped sums come as sum(min(e, top_k x ratio)) (entries x ratio)
    dmap = np.vstack([gmap[0], gmap[1] + gmap[2], gmap[3:]])
    for j, i in enumerate(idx_codes):
        dmap[2 + j] /= codes[i].ratio
    if phase == "decode":  # a verify block reads each sequence's KV entries once (_read_rows)
        gmap = _reads_apart(gmap, nc, idx_codes)
    else:
        gmap = np.vstack([gmap, np.zeros((2 + len(idx_codes), 4 * nc))])
    window = float(att.window) if att.window else 0.0
    caps = [window, np.inf] + [float(codes[i].top_k * codes[i].ratio) for i in idx_codes]
    overlap = 1.0 if o.attn_overlap else hw.efficiency.attention_overlap
    omo = np.concatenate([np.full(nc, 1.0 - overlap), np.zeros(nc)])
    gather = np.zeros(2 * nc)
    if phase == "decode" and not o.kv_gather_ahead:
        gather[:nc] = hw.microarch.gather_latency_s * ctx.indexer_codes
    weights = np.zeros((2 * nc, 2))
    weights[:nc, 0] = lg.code_counts[gi]
    if with_indexer:
        weights[nc:, 1] = lg.code_counts[gi]
    # single-token decode, non-idle rank: every feature with a positive cap is >= 1, so which
    # kernels move bytes (and pay their launch) is static
    moves = (dmap[np.array(caps) > 0] > 0).any(axis=0)[2 * nc :]
    d_const = (hw.microarch.kernel_overhead_s * moves + gather) @ weights
    weights3 = np.column_stack([weights, weights.sum(axis=1)])
    wide = np.zeros((4 * nc, 4))  # blockdiag(weights, weights): compute, memory totals
    wide[: 2 * nc, :2] = weights
    wide[2 * nc :, 2:] = weights
    blocks = [np.hstack([weights3, np.zeros((2 * nc, 4))])]
    if omo.any():
        blocks.append(np.hstack([omo[:, None] * weights3, np.zeros((2 * nc, 4))]))
    blocks.append(np.hstack([np.zeros((4 * nc, 3)), wide]))
    d_out = np.vstack(blocks)
    return GroupPlan(
        gi=gi,
        layers=lg.layers[gi],
        window=window,
        tail=m.prefill.tail_tokens if gi == 1 else 0,
        indexer_ratios=tuple((float(codes[i].ratio), float(codes[i].top_k)) for i in idx_codes),
        decode_caps=np.array(caps)[:, None],
        decode_map=dmap,
        general_map=gmap,
        omo=omo,
        gather=gather,
        weights=weights,
        overhead=hw.microarch.kernel_overhead_s,
        has_indexer=with_indexer,
        d_const=d_const,
        d_const_list=tuple(d_const.tolist()),
        d_omo=None if not omo.any() else omo,
        d_out=d_out,
        has_gather=bool(gather.any()),
        **_feature_constants(window, [(float(codes[i].ratio), float(codes[i].top_k)) for i in idx_codes]),
    )


def _feature_constants(window: float, ratios: list[tuple[float, float]]) -> dict[str, np.ndarray]:
    """GroupPlan's f_* fields (see there) for a window and (ratio, top_k) per indexer code."""
    nidx = len(ratios)
    col = lambda xs: np.array(xs, dtype=np.float64).reshape(-1, 1)  # noqa: E731
    r0 = 3 + nidx
    computed = [1, 0, *range(3, 3 + nidx), 2, r0, r0 + 1, *range(r0 + 2, r0 + 2 + nidx), r0 + 2 + nidx, r0 + 3 + nidx]
    return {
        "f_knee": col([np.inf, window * 1.0] + [top_k * ratio for ratio, top_k in ratios]),
        "f_div": col([1.0] + [ratio for ratio, _ in ratios]),
        "f_cap": col([window] + [top_k for _, top_k in ratios]),
        "f_ratio": col([ratio for ratio, _ in ratios]),
        "f_top_k": col([top_k for _, top_k in ratios]),
        "f_order": np.argsort(computed),
    }


def _packed(window: float, knee, div, cap, ratio, top_k, order) -> np.ndarray:
    """nidx, window, knee, div, cap, ratio, top_k, order (as float64): GroupPlan.packed."""
    return np.concatenate([[float(ratio.shape[0]), window], knee.ravel(), div.ravel(), cap.ravel(), ratio.ravel(),
                           top_k.ravel(), order.astype(np.float64)])


def _reads_apart(gmap: np.ndarray, nc: int, idx_codes: list[int]) -> np.ndarray:
    """The general map with the KV-entry bytes (window, dense compressed, indexer-selected) moved
    from the per-query sums to per-sequence read rows [W_read, L_read, capped_read per indexer code]
    (step_plan's general features): the positions of one sequence's verify block share its window
    and compressed entries and read them once; FLOPs, key reads and scores stay per query."""
    nidx = len(idx_codes)
    out = np.vstack([gmap, np.zeros((2 + nidx, 4 * nc))])
    r0 = 3 + nidx
    mem = slice(2 * nc, 3 * nc)  # attention memory columns
    out[r0, mem], out[0, mem] = gmap[0, mem], 0.0
    out[r0 + 1, mem], out[1, mem] = gmap[1, mem], 0.0
    for j in range(nidx):
        out[r0 + 2 + j, mem], out[3 + j, mem] = gmap[3 + j, mem], 0.0
    return out


@dataclass(frozen=True)
class RowStack:
    """A prefill plan's layer groups side by side, for _rank_rows: their general maps [G, F, 4C]
    and weights [G, 2C, 2], and each group's query cap (its tail, inf for the all-token group)."""

    maps: np.ndarray
    weights: np.ndarray
    caps: np.ndarray
    tails: bool


def _row_stack(groups: tuple[GroupPlan, ...]) -> RowStack | None:
    """The RowStack of a plan's groups, or None where they differ in more than their maps, weights
    and tails (then _rank_rows takes them one by one; not so for a model of this repository:
    the groups of one phase share window, indexer codes, overlap, launch overhead and gathers)."""
    g0 = groups[0]
    for g in groups[1:]:
        if (g.window, g.indexer_ratios, g.overhead, g.has_gather) != (g0.window, g0.indexer_ratios, g0.overhead,
                                                                      g0.has_gather) \
                or g.general_map.shape != g0.general_map.shape or g.omo.tobytes() != g0.omo.tobytes() \
                or g.gather.tobytes() != g0.gather.tobytes():
            return None
    caps = np.array([float(g.tail) if g.tail else np.inf for g in groups])
    return RowStack(np.stack([g.general_map for g in groups]), np.stack([g.weights for g in groups]), caps,
                    bool(np.isfinite(caps).any()))
