"""The fast path of the step cost: what depends only on (hardware, model, optimizations, layout,
phase) is folded once into a plan; a call is then a few numpy reductions over the batch's sequences.

step_cost.step_cost stays the readable reference (TimingModel.step_time_reference); the two agree
to rounding (tests/unit/timing/test_step_plan.py). Same contract: total_s == sum(breakdown), the
critical path is the slowest rank's attention part + the busiest EP rank's MoE part.

Attention and indexer times are linear in four per-rank sums (window entries W, sum of positions L,
indexer key reads Kr, selected entries per indexer code) until the roofline max, so one matrix maps
the sums to (compute, memory) times of every (kernel, attention code) at once. The token-count-only
components (projections, mHC, all-reduce, LM head, engram, MoE) come from step_cost's memoized
bundles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate
from operator import attrgetter

import numpy as np

from rackserve.timing.attention_cost import prefill_read_share
from rackserve.timing.batch import StepBatch, StepCost
from rackserve.timing.cost_context import MEMO_LIMIT, CostContext
from rackserve.timing.layout import Layout
from rackserve.timing.parts import Bundle, label
from rackserve.timing.roofline import domain_bw_factor
from rackserve.timing.step_cost import token_bundle

_NEW = attrgetter("new_tokens")
_CACHED = attrgetter("cached_tokens")
_HBM = attrgetter("pool_hbm_tokens")
_DRAM = attrgetter("pool_dram_tokens")
_ONES = b""  # int64 ones, grown on demand (see _grow_ones)
_INT64 = np.dtype(np.int64)


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


def _linear(lo2: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """sum of p for p in (lo, hi], given lo2 = lo (lo + 1)."""
    return (hi * (hi + 1.0) - lo2) * 0.5


def _capped(lo: np.ndarray, lo2: np.ndarray, hi: np.ndarray, div: float, cap: float) -> np.ndarray:
    """sum of min(p / div, cap) for p in (lo, hi] (the knee clipped into [lo, hi])."""
    knee = np.minimum(np.maximum(lo, cap * div), hi)
    return _linear(lo2, knee) / div + (hi - knee) * cap


def _general_features(gp: GroupPlan, q: np.ndarray, end: np.ndarray, starts, nonempty, zeros=None):
    """Per-rank sums [W, L, Kr, capped per indexer code, W_read, L_read, capped_read per indexer
    code, tokens, seqs] for queries q ending at end; the read rows count each sequence's entries
    once (the union of its queries' windows, everything up to its last position, its last
    position's selection: batch_features.group_sums). _general_features_by_row's operations, element
    by element, on blocks of rows (GroupPlan's f_* constants). `zeros`: positions whose columns are
    set to zero before the sums (features_together's separators)."""
    n = q.size
    nidx = gp.f_ratio.shape[0]
    lo = end - q
    lo2 = lo * (lo + 1.0)
    rows = np.zeros((7 + 2 * nidx, n + 1))
    c = 2 + nidx  # L, W and the capped rows: _linear up to their knees, then _capped's terms
    knee = np.minimum(np.maximum(lo, gp.f_knee), end)
    lin = rows[:c, :n]
    np.multiply(knee * (knee + 1.0) - lo2, 0.5, out=lin)
    np.add(lin[1:] / gp.f_div, (end - knee[1:]) * gp.f_cap, out=lin[1:])
    np.multiply(end, np.ceil(q / 128.0), out=rows[c, :n])
    some = q > 0
    if gp.window:
        np.minimum(end, gp.window + q - 1.0, out=rows[c + 1, :n])
    rows[c + 2, :n] = end
    if nidx:
        np.minimum(end / gp.f_ratio, gp.f_top_k, out=rows[c + 3 : c + 3 + nidx, :n])
    reads = rows[c + 1 : c + 3 + nidx, :n]
    np.multiply(reads, some, out=reads)
    rows[-2, :n] = q
    rows[-1, :n] = some
    if zeros:
        rows[:, zeros] = 0.0
    return np.add.reduceat(rows, starts, axis=1)[gp.f_order] * nonempty  # [F_g + 2, R]


def _general_features_by_row(gp: GroupPlan, q: np.ndarray, end: np.ndarray, starts, nonempty):
    """_general_features row by row, as first written (the reference the tests compare it with)."""
    n = q.size
    nidx = len(gp.indexer_ratios)
    lo = end - q
    lo2 = lo * (lo + 1.0)
    rows = np.zeros((7 + 2 * nidx, n + 1))
    rows[0, :n] = _capped(lo, lo2, end, 1.0, gp.window)
    rows[1, :n] = _linear(lo2, end)
    rows[2, :n] = end * np.ceil(q / 128.0)
    some = q > 0
    r0 = 3 + nidx
    rows[r0, :n] = np.minimum(end, gp.window + q - 1.0) * some if gp.window else 0.0
    rows[r0 + 1, :n] = end * some
    for j, (ratio, top_k) in enumerate(gp.indexer_ratios):
        rows[3 + j, :n] = _capped(lo, lo2, end, ratio, top_k)
        rows[r0 + 2 + j, :n] = np.minimum(end / ratio, top_k) * some
    rows[-2, :n] = q
    rows[-1, :n] = q > 0
    return np.add.reduceat(rows, starts, axis=1) * nonempty  # [F_g + 2, R]


def _kv_times(gp: GroupPlan, feats: np.ndarray, fmap: np.ndarray, seqs: np.ndarray):
    """Per-rank (attention, indexer) times [R, 2], and per-rank compute/memory [R, 2C] each."""
    x = feats.T @ fmap  # [R, 4C]
    half = x.shape[1] // 2
    tc, tm = x[:, :half], x[:, half:]
    t = np.maximum(tc, tm) + gp.omo * np.minimum(tc, tm) + gp.overhead * (tm > 0)
    if gp.has_gather:
        t = t + (seqs > 0)[:, None] * gp.gather
    return t @ gp.weights, tc, tm


def _kv_times_many(gp: GroupPlan, fs: list[np.ndarray]) -> list[tuple]:
    """_kv_times(gp, f[:-2], gp.general_map, f[-1]) of each f of `fs` (the same ranks): the
    matrix products one by one, the element-wise operations on all of them stacked."""
    fmap = gp.general_map
    x = _stacked([f[:-2].T @ fmap for f in fs])  # [B, R, 4C]
    half = x.shape[2] // 2
    tc, tm = x[:, :, :half], x[:, :, half:]
    t = np.maximum(tc, tm) + gp.omo * np.minimum(tc, tm) + gp.overhead * (tm > 0)
    if gp.has_gather:
        seqs = _stacked([f[-1] for f in fs])
        t = t + (seqs > 0)[:, :, None] * gp.gather
    w = gp.weights
    return [(ti @ w, tci, tmi) for ti, tci, tmi in zip(t, tc, tm, strict=True)]


def _stacked(arrays: list[np.ndarray]) -> np.ndarray:
    """np.stack of arrays of one shape (cheaper: one concatenation, reshaped)."""
    return np.concatenate(arrays).reshape(len(arrays), *arrays[0].shape)


class _Group:
    """One layer group's per-call results."""

    __slots__ = ("gp", "kv", "tc", "tm", "tokens", "seqs", "cm")

    def __init__(self, gp, kv, tc, tm, tokens, seqs, cm=None) -> None:
        self.gp, self.kv, self.tc, self.tm, self.tokens, self.seqs = gp, kv, tc, tm, tokens, seqs
        self.cm = cm  # per rank (attention, indexer) compute then memory times [R, 4], when known

    def cm_row(self, ra: int) -> np.ndarray:
        """Rank ra's (attention, indexer) compute, then memory times [4]."""
        if self.cm is not None:
            return self.cm[ra]
        w = self.gp.weights
        return np.concatenate((self.tc[ra] @ w, self.tm[ra] @ w))

    def cm_list(self, ra: int) -> list[float]:
        """cm_row(ra) as floats."""
        if self.cm is not None:
            return self.cm[ra].tolist()
        w = self.gp.weights
        return (self.tc[ra] @ w).tolist() + (self.tm[ra] @ w).tolist()


def fast_step_cost(ctx: CostContext, plan: StepPlan, batch: StepBatch, kv_transfer) -> StepCost:
    lay = plan.layout
    ranks = batch.ranks
    if len(ranks) != lay.dp:
        raise ValueError(f"ranks: layout {lay.key} has {lay.dp} DP ranks, batch has {len(ranks)}")
    if plan.phase == "decode":
        cost = _decode_step(ctx, plan, batch, kv_transfer)
        if cost is not None:
            return cost
    if plan.phase == "prefill":
        return _finish(ctx, plan, batch, _prefill_groups(plan, ranks), kv_transfer)
    # not the single-token decode form: general sums over each sequence's positions, per group
    return general_cost(ctx, plan, batch, Prepared(ranks), kv_transfer)


class Prepared:
    """A step batch's sequences as the general path reads them, and its context feature sums per
    group shape, computed once: a speculative step prices one batch (and its halves) with two
    plans, the verify model's and the draft's, whose feature sums coincide (same window, indexer
    codes and tail), so the second plan reads the first one's."""

    __slots__ = ("ranks", "new", "cached", "counts", "starts", "nonempty", "spread", "ends", "end",
                 "q_full", "feats", "halves", "pooled", "_single")

    def __init__(self, ranks) -> None:
        distinct, spread = _distinct(ranks)
        news = [rb.new_tokens for rb in distinct]
        counts = np.fromiter(map(len, news), np.int64, len(distinct))
        new = np.concatenate(news) if len(news) > 1 else news[0]
        cached = (
            np.concatenate([rb.cached_tokens for rb in distinct])
            if len(news) > 1
            else distinct[0].cached_tokens
        )
        self.ranks, self.new, self.cached, self.counts, self.spread = ranks, new, cached, counts, spread
        self.starts = np.cumsum(counts) - counts
        self.nonempty = counts > 0
        self.ends = cached + new  # each sequence's context after the step (integers)
        self.end = self.ends.astype(np.float64)
        self.q_full = new.astype(np.float64)
        self.feats: dict = {}
        self.halves = None  # (halves, their Prepared) once asked for (TimingModel._step_prepared)
        self.pooled: bool | None = None  # some rank fetches pool tokens (once asked for)
        self._single: bool | None = None

    @property
    def single_token(self) -> bool:
        """Some sequence, each computing one token: _decode_step prices it, not the general path."""
        if self._single is None:
            new = self.new
            self._single = new.shape[0] > 0 and bool((new == 1).all())
        return self._single

    def features(self, gp: GroupPlan) -> np.ndarray:
        """_general_features of group plan `gp`, one column per rank (memoized on what they read)."""
        key = _feature_key(gp)
        f = self.feats.get(key)
        if f is None:
            q = self.q_full if gp.tail == 0 else np.minimum(self.q_full, gp.tail)
            f = _general_features(gp, q, self.end, self.starts, self.nonempty)
            if self.spread is not None:  # back to one column per rank (a rank's sums are its own)
                f = f[:, self.spread]
            self.feats[key] = f
        return f


def _feature_key(gp: GroupPlan) -> tuple:
    """What _general_features reads of a group plan."""
    return (gp.window, gp.tail, gp.indexer_ratios)


def features_together(preps: list[Prepared], groups) -> None:
    """Prepared.features of several batches for each group plan of `groups`, in one
    _general_features call over their sequences laid one after another, each batch's followed by
    the zero column it has alone (so that every rank's sums take the same terms in the same order,
    the zero included): a step's batch and its two halves."""
    for gp in groups:
        key = _feature_key(gp)
        todo = [p for p in preps if key not in p.feats]
        if len(todo) < 2:
            for p in todo:
                p.features(gp)
            continue
        zero = np.zeros(1)
        sizes = [p.q_full.shape[0] for p in todo]
        offsets = list(accumulate((n + 1 for n in sizes[:-1]), initial=0))
        q = np.concatenate([a for p in todo for a in (p.q_full, zero)][:-1])
        if gp.tail:
            q = np.minimum(q, gp.tail)
        end = np.concatenate([a for p in todo for a in (p.end, zero)][:-1])
        starts = np.concatenate([p.starts + off for p, off in zip(todo, offsets, strict=True)])
        nonempty = np.concatenate([p.nonempty for p in todo])
        between = [off + n for off, n in zip(offsets[:-1], sizes[:-1], strict=True)]  # the zero columns
        f = _general_features(gp, q, end, starts, nonempty, between)
        at = 0
        for p in todo:
            d = p.counts.shape[0]
            part = f[:, at : at + d]
            at += d
            p.feats[key] = part[:, p.spread] if p.spread is not None else part.copy()


def general_cost(ctx: CostContext, plan: StepPlan, batch: StepBatch, prep: Prepared, kv_transfer) -> StepCost:
    """The general path of fast_step_cost over `batch`'s Prepared form."""
    groups = []
    for gp in plan.groups:
        f = prep.features(gp)
        kv, tc, tm = _kv_times(gp, f[:-2], gp.general_map, f[-1])
        groups.append(_Group(gp, kv, tc, tm, f[-2], f[-1]))
    return _finish(ctx, plan, batch, groups, kv_transfer, _pooled(prep))


def general_costs(ctx: CostContext, plan: StepPlan, items: list[tuple[StepBatch, Prepared]], kv_transfer) -> list[StepCost]:
    """general_cost of each (batch, its Prepared form) of `items` (a step and its halves: the same
    ranks), _kv_times' element-wise part for all of them at once (_kv_times_many)."""
    groups: list[list[_Group]] = [[] for _ in items]
    for gp in plan.groups:
        fs = [prep.features(gp) for _, prep in items]
        for out, (kv, tc, tm), f in zip(groups, _kv_times_many(gp, fs), fs, strict=True):
            out.append(_Group(gp, kv, tc, tm, f[-2], f[-1]))
    return [
        _finish(ctx, plan, batch, g, kv_transfer, _pooled(prep))
        for (batch, prep), g in zip(items, groups, strict=True)
    ]


def _pooled(prep: Prepared) -> bool:
    if prep.pooled is None:
        prep.pooled = any(map(_HBM, prep.ranks)) or any(map(_DRAM, prep.ranks))
    return prep.pooled


def prepared_cost(ctx: CostContext, plan: StepPlan, batch: StepBatch, prep: Prepared, kv_transfer) -> StepCost:
    """fast_step_cost of a decode `batch` whose Prepared form is `prep` (its feature sums shared)."""
    if prep.single_token:
        cost = _decode_step(ctx, plan, batch, kv_transfer)
        if cost is not None:
            return cost
    return general_cost(ctx, plan, batch, prep, kv_transfer)


def _prefill_groups(plan: StepPlan, ranks) -> list[_Group]:
    """A prefill step's layer groups from its ranks' rows (_rank_row), each rank's memoized on its
    own batch: a prefill rank holds a few sequences and its signatures repeat, while the pair of
    two DEP2 ranks' signatures that keys the step memo mostly does not. The rows not memoized are
    computed together (prefill_rows)."""
    keys = [(rb.new_tokens.tobytes(), rb.cached_tokens.tobytes()) for rb in ranks]
    memo = plan.memo
    fresh = None
    out = []
    for gi, gp in enumerate(plan.groups):
        rows = []
        for k in keys:
            key = (gi, *k)
            row = memo.get(key)
            if row is None:
                row = None if fresh is None else fresh.get(key)
                if row is None:  # (again where the memo was cleared for the fresh rows)
                    fresh = prefill_rows(plan, [ranks])
                    row = fresh[key]
            rows.append(row)
        r = np.concatenate(rows).reshape(len(rows), -1)  # [R, 2 + 4 + 2]: kv times, compute/memory times, tokens, seqs
        out.append(_Group(gp, r[:, :2], None, None, r[:, 6], r[:, 7], r[:, 2:6]))
    return out


def prefill_rows(plan: StepPlan, rank_lists) -> dict:
    """The rows of every (layer group, rank) of `rank_lists` (lists of RankBatch: a prefill step's
    ranks, its halves') that the plan's memo lacks, computed together (_rank_rows) and memoized:
    {memo key: row}."""
    memo = plan.memo
    todo: dict = {}
    for ranks in rank_lists:
        for rb in ranks:
            k = (rb.new_tokens.tobytes(), rb.cached_tokens.tobytes())
            for gi in range(len(plan.groups)):
                key = (gi, *k)
                if key not in memo and key not in todo:
                    todo[key] = (gi, rb)
    if not todo:
        return todo
    fresh = dict(zip(todo, _rank_rows(plan, list(todo.values())), strict=True))
    if len(memo) + len(fresh) > MEMO_LIMIT:
        memo.clear()
    memo.update(fresh)
    return fresh


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


_ZERO = np.zeros(1, dtype=np.int64)


def _rank_rows(plan: StepPlan, items: list) -> np.ndarray:
    """_rank_row of each (group index, rank batch) of `items`, bit for bit, as rows [len(items), 8]:
    the context feature sums of all in one _general_features call (each rank's sequences followed
    by the zero column it has alone, its segment summed alone), the matrix products row by row (a
    stack of [1, F] rows times a stack of matrices: one BLAS vector-matrix product each, as alone;
    a product of more rows may round differently), the element-wise operations on all at once."""
    stack = plan.row_stack
    if stack is None:
        return np.stack([_rank_row(plan.groups[gi], rb) for gi, rb in items])
    gp0 = plan.groups[0]
    news, ends, gis, sizes = [], [], [], []
    for gi, rb in items:
        new = rb.new_tokens
        news += (new, _ZERO)
        ends += (rb.cached_tokens + new, _ZERO)
        sizes.append(new.shape[0])
        gis.append(gi)
    q = np.concatenate(news[:-1]).astype(np.float64)
    end = np.concatenate(ends[:-1]).astype(np.float64)
    sizes_a = np.array(sizes, dtype=np.intp)
    gidx = np.array(gis, dtype=np.intp)
    starts = np.cumsum(sizes_a + 1) - (sizes_a + 1)
    if stack.tails:  # min(q, tail) in tail groups (min(q, inf) == q elsewhere)
        q = np.minimum(q, np.repeat(stack.caps[gidx], sizes_a + 1)[:-1])
    zeros = (starts + sizes_a)[:-1].tolist()  # each rank's zero column but the last (implicit)
    f = _general_features(gp0, q, end, starts, sizes_a > 0, zeros)  # [F_g + 2, M]
    m = len(items)
    x = np.matmul(np.ascontiguousarray(f[:-2].T).reshape(m, 1, -1), stack.maps[gidx])  # [M, 1, 4C]
    half = x.shape[2] // 2
    tc, tm = x[:, :, :half], x[:, :, half:]
    t = np.maximum(tc, tm) + gp0.omo * np.minimum(tc, tm) + gp0.overhead * (tm > 0)
    if gp0.has_gather:
        t = t + (f[-1] > 0)[:, None, None] * gp0.gather
    w = stack.weights[gidx]
    return np.concatenate((np.matmul(t, w), np.matmul(tc, w), np.matmul(tm, w), f[-2:].T[:, None, :]),
                          axis=2).reshape(m, 8)


def _rank_row(gp: GroupPlan, rb) -> np.ndarray:
    """One prefill rank's part of its layer group (the kv times are per rank): (attention, indexer)
    times, their compute and memory times, tokens and sequences, as one row. The readable form of
    _rank_rows (its reference in the tests; its fallback where a plan's groups do not stack)."""
    col = _rank_features(gp, rb)[:, None]
    kv, tc, tm = _kv_times(gp, col[:-2], gp.general_map, col[-1])
    w = gp.weights
    return np.concatenate([kv[0], tc[0] @ w, tm[0] @ w, col[-2:, 0]])


def _rank_features(gp: GroupPlan, rb) -> np.ndarray:
    """_general_features of one rank: its column [F_g + 2]."""
    q = rb.new_tokens.astype(np.float64)
    end = (rb.cached_tokens + rb.new_tokens).astype(np.float64)
    if gp.tail:
        q = np.minimum(q, gp.tail)
    return _general_features(gp, q, end, _START, np.array([q.size > 0]))[:, 0]


_START = np.zeros(1, dtype=np.intp)


def _finish(ctx: CostContext, plan: StepPlan, batch: StepBatch, groups: list, kv_transfer,
            pooled: bool | None = None) -> StepCost:
    """The token-count bundles of a general step's layer groups, its pool transfers, and the cost
    (`pooled`: whether some rank fetches pool tokens, when the caller knows). The bundles are
    token_bundle's, looked up first in the plan's own memo (keyed as token_bundle keys them, less
    the plan's phase and layout)."""
    ranks = batch.ranks
    if batch.expert_tokens is None:
        bundles = []
        memo = plan.bundles
        for g in groups:
            gi = g.gp.gi
            key = (gi, g.tokens.tobytes(), g.seqs.tobytes()) if gi == 0 and plan.phase == "prefill" else \
                (gi, g.tokens.tobytes())
            bundle = memo.get(key)
            if bundle is None:
                bundle = token_bundle(ctx, plan.layout, plan.phase, ctx.groups[plan.phase], gi, g.tokens, g.seqs,
                                      groups[0].tokens, None)
                if len(memo) > MEMO_LIMIT:
                    memo.clear()
                memo[key] = bundle
            bundles.append(bundle)
    else:
        tokens_full = groups[0].tokens
        lg = ctx.groups[plan.phase]
        bundles = [
            token_bundle(ctx, plan.layout, plan.phase, lg, g.gp.gi, g.tokens, g.seqs, tokens_full, batch.expert_tokens)
            for g in groups
        ]
    transfer = None
    if pooled is None:
        pooled = any(map(_HBM, ranks)) or any(map(_DRAM, ranks))
    if pooled:
        transfer = _pool_transfer(ranks, kv_transfer)
    if len(groups) == 1:
        return _assemble_one(groups[0], bundles[0], transfer, plan.layout)
    return _assemble(groups, bundles, transfer, plan.layout)


def _distinct(ranks) -> tuple[list, np.ndarray | None]:
    """The distinct RankBatch objects of a step (a memo's representative shares one batch among
    the ranks of one count) and each rank's index into them; None when every rank is its own."""
    ids = list(map(id, ranks))
    by_id = dict(zip(ids, ranks, strict=True))  # first appearance order, as the ranks list them
    if len(by_id) == len(ranks):
        return list(ranks), None
    index = dict(zip(by_id, range(len(by_id)), strict=True))
    return list(by_id.values()), np.fromiter(map(index.__getitem__, ids), np.intp, len(ids))


def _grow_ones(n: int) -> None:
    """The int64 ones that single-token decode's new_tokens are compared with, byte for byte."""
    global _ONES
    _ONES = np.ones(2 * n, dtype=np.int64).tobytes()


def _pool_transfer(ranks, kv_transfer) -> np.ndarray:
    return np.array(
        [
            kv_transfer(rb.pool_hbm_tokens, "pool_hbm")
            + kv_transfer(rb.pool_dram_tokens, "pool_dram")
            for rb in ranks
        ]
    )


def _decode_step(ctx: CostContext, plan: StepPlan, batch: StepBatch, kv_transfer):
    """Single-token decode (every sequence computes one token; the simulator's hot path): None when
    the batch is not of that form. One concatenation, one capped reduction per rank, one matrix
    product to the per-(kernel, code) compute and memory times, one to the per-rank totals."""
    ranks = batch.ranks
    first = ranks[0].new_tokens
    if first.shape[0] and first[0] != 1:  # a widened MTP verify batch, a prefill-like chunk
        return None
    news = list(map(_NEW, ranks))
    lens = list(map(len, news))
    n = sum(lens)
    if n == 0:
        return None
    if len(ranks) > 1 and not batch.single_token:  # checked once per distinct rank batch
        return None
    if len(ranks) > 1:
        both = np.concatenate(news + list(map(_CACHED, ranks)))
        new, cached = both[:n], both[n:]
    else:
        new, cached = news[0], ranks[0].cached_tokens
    if new.dtype == _INT64 and new.flags.c_contiguous:
        if len(_ONES) < 8 * n:
            _grow_ones(n)
        if new.tobytes() != _ONES[: 8 * n]:
            return None
    elif np.minimum.reduce(new) != 1 or np.maximum.reduce(new) != 1:
        return None
    gp = plan.groups[0]
    entry = plan.memo.get(tuple(lens)) if batch.expert_tokens is None else None
    if entry is None:
        entry = _decode_entry(ctx, plan, lens, batch.expert_tokens)
    bundle, base, starts, active = entry
    if active is not None:  # idle ranks: a zero column keeps every segment start in range
        capped = np.zeros((gp.decode_caps.shape[0], n + 1))
        np.minimum(cached + 1.0, gp.decode_caps, out=capped[:, :n])
        feats = np.add.reduceat(capped, starts, axis=1) * active
    else:
        feats = np.add.reduceat(np.minimum(cached + 1.0, gp.decode_caps), starts, axis=1)
    x = feats.T @ gp.decode_map  # [R, 4C]: compute times, then memory times
    half = x.shape[1] >> 1
    tc, tm = x[:, :half], x[:, half:]
    blocks = (
        (np.maximum(tc, tm), x) if gp.d_omo is None else (np.maximum(tc, tm), np.minimum(tc, tm), x)
    )
    # [R, (attention, indexer, both, attention compute, indexer compute, attention memory,
    # indexer memory)], launch and gather costs apart
    z = np.concatenate(blocks, axis=1) @ gp.d_out
    attn = z[:, 2] + base
    transfer = None
    if any(map(_HBM, ranks)) or any(map(_DRAM, ranks)):
        transfer = _pool_transfer(ranks, kv_transfer)
        attn = attn + transfer
    ra = int(attn.argmax())
    # a rank with sequences always has some attention-part time (its projections stream weights)
    if not lens[ra] and attn[ra] <= 0 and bundle.moe_total.max() <= 0:
        return StepCost(0.0, {}, (0.0,) * len(ranks), {})
    a_t, i_t, _, a_c, i_c, a_m, i_m = z[ra].tolist()
    if lens[ra]:
        a_t, i_t = a_t + gp.d_const_list[0], i_t + gp.d_const_list[1]
    values, labels = bundle.rank_tail(ra)
    a_b = "compute" if a_c > a_m else "memory"
    if gp.has_indexer and transfer is None:  # the common case, as dict displays
        breakdown = {"attention": a_t, "indexer": i_t, **values}
        bound = {"attention": a_b, "indexer": "compute" if i_c > i_m else "memory", **labels}
    else:
        breakdown, bound = {"attention": a_t}, {"attention": a_b}
        if gp.has_indexer:
            breakdown["indexer"] = i_t
            bound["indexer"] = "compute" if i_c > i_m else "memory"
        if transfer is not None:
            breakdown["kv_transfer"] = float(transfer[ra])
            bound["kv_transfer"] = "comm"
        breakdown.update(values)
        bound.update(labels)
    total = sum(breakdown.values())
    busy = np.minimum(attn + bundle.moe_total, total).tolist()
    return StepCost(total, breakdown, tuple(busy), bound)


def _decode_entry(ctx: CostContext, plan: StepPlan, lens: list[int], expert_tokens):
    """What a decode step needs that depends on the sequences per rank alone, memoized on them
    by the caller's lookup (with the expert-load model): the token-count components (bundle), the per-rank attention-part
    base (those + the attention/indexer launch and gather costs of non-idle ranks), the rank
    segment starts and, where some rank is idle, the non-idle mask."""
    key = tuple(lens) if expert_tokens is None else None
    tokens = np.array(lens, dtype=np.float64)
    lg = ctx.groups["decode"]
    bundle = token_bundle(ctx, plan.layout, "decode", lg, 0, tokens, tokens, tokens, expert_tokens)
    gp = plan.groups[0]
    base = bundle.attn_total + (tokens > 0) * (gp.d_const[0] + gp.d_const[1])
    starts = np.array(list(accumulate(lens[:-1], initial=0)), dtype=np.intp)
    entry = (bundle, base, starts, (tokens > 0) if 0 in lens else None)
    if key is not None:
        if len(plan.memo) > MEMO_LIMIT:
            plan.memo.clear()
        plan.memo[key] = entry
    return entry


def decode_passes(ctx: CostContext, plan: StepPlan, lens: list[int], cached: np.ndarray, expert_tokens):
    """_decode_step of k single-token steps of the same sequences per rank (`lens`, every rank,
    n sequences in all, no pool tokens), one step per row of `cached` [k, n] (each
    sequence's cached tokens, ranks in order): a speculative step's one-token draft passes, which
    differ only in their contexts. Each step as (total_s, its dispatch_combine time, rank_busy_s),
    all its speculative step reads. The same operations as _decode_step on each row: element-wise
    ones and reductions over the same sequences for all rows at once, the matrix products row by
    row (a BLAS product of more rows may round differently)."""
    entry = plan.memo.get(tuple(lens)) if expert_tokens is None else None
    if entry is None:
        entry = _decode_entry(ctx, plan, lens, expert_tokens)
    bundle, base, starts, active = entry
    gp = plan.groups[0]
    k, n = cached.shape
    e = (cached + 1.0)[:, None, :]  # [k, 1, n]
    if active is not None:  # idle ranks: a zero column keeps every segment start in range
        capped = np.zeros((k, gp.decode_caps.shape[0], n + 1))
        np.minimum(e, gp.decode_caps, out=capped[:, :, :n])
        feats = np.add.reduceat(capped, starts, axis=2) * active
    else:
        feats = np.add.reduceat(np.minimum(e, gp.decode_caps), starts, axis=2)
    dmap = gp.decode_map
    x = _stacked([f.T @ dmap for f in feats])  # [k, R, 4C]
    half = x.shape[2] >> 1
    tc, tm = x[:, :, :half], x[:, :, half:]
    blocks = (
        (np.maximum(tc, tm), x) if gp.d_omo is None else (np.maximum(tc, tm), np.minimum(tc, tm), x)
    )
    d_out = gp.d_out
    z = _stacked([c @ d_out for c in np.concatenate(blocks, axis=2)])  # [k, R, 7]
    attn = z[:, :, 2] + base
    moe_total = bundle.moe_total
    idle_moe = None
    totals: list[float] = []
    dcs: list[float] = []
    ras = attn.argmax(axis=1)
    rows = np.arange(k)
    at = z[rows, ras, :2].tolist()
    for ra, attn_ra, (a_t, i_t) in zip(ras.tolist(), attn[rows, ras].tolist(), at, strict=True):
        if not lens[ra] and attn_ra <= 0:
            if idle_moe is None:
                idle_moe = bool(moe_total.max() <= 0)
            if idle_moe:
                totals.append(None)  # type: ignore[arg-type]
                dcs.append(0.0)
                continue
        if lens[ra]:
            a_t, i_t = a_t + gp.d_const_list[0], i_t + gp.d_const_list[1]
        values = bundle.rank_tail(ra)[0]
        if gp.has_indexer:
            breakdown = {"attention": a_t, "indexer": i_t, **values}
        else:
            breakdown = {"attention": a_t}
            breakdown.update(values)
        totals.append(sum(breakdown.values()))
        dcs.append(breakdown.get("dispatch_combine", 0.0))
    out = []
    busy = np.minimum(attn + moe_total, np.array([0.0 if t is None else t for t in totals])[:, None])
    zero = (0.0,) * len(lens)
    for total, dc, b in zip(totals, dcs, busy.tolist(), strict=True):
        out.append((0.0, 0.0, zero) if total is None else (total, dc, tuple(b)))
    return out


def _assemble_one(g: _Group, bundle: Bundle, transfer, lay: Layout) -> StepCost:
    """_assemble of a step of one layer group (decode): the same operations, fewer of them."""
    kv = g.kv
    attn = kv[:, 0] + kv[:, 1]
    if transfer is not None:
        attn = attn + transfer
    attn = attn + bundle.attn_total
    moe = bundle.moe_total
    ra = int(attn.argmax())
    if attn[ra] <= 0 and moe.max() <= 0:
        return StepCost(0.0, {}, (0.0,) * lay.dp, {})
    a_t, i_t = kv[ra].tolist()
    a_c, i_c, a_m, i_m = g.cm_list(ra)
    values, labels = bundle.rank_tail(ra)
    if transfer is None:
        if g.gp.has_indexer:
            breakdown = {"attention": a_t, "indexer": i_t, **values}
            bound = {"attention": "compute" if a_c > a_m else "memory", "indexer": "compute" if i_c > i_m else "memory",
                     **labels}
        else:
            breakdown = {"attention": a_t, **values}
            bound = {"attention": "compute" if a_c > a_m else "memory", **labels}
    else:
        breakdown = {"attention": a_t}
        bound = {"attention": "compute" if a_c > a_m else "memory"}
        if g.gp.has_indexer:
            breakdown["indexer"] = i_t
            bound["indexer"] = "compute" if i_c > i_m else "memory"
        breakdown["kv_transfer"] = float(transfer[ra])
        bound["kv_transfer"] = "comm"
        breakdown.update(values)
        bound.update(labels)
    total = sum(breakdown.values())
    return StepCost(total, breakdown, tuple(np.minimum(attn + moe, total).tolist()), bound)


def _assemble(groups, bundles: list[Bundle], transfer, lay: Layout) -> StepCost:
    kv = groups[0].kv
    for g in groups[1:]:
        kv = kv + g.kv
    attn = kv[:, 0] + kv[:, 1]
    if transfer is not None:
        attn = attn + transfer
    moe = bundles[0].moe_total
    for b in bundles:
        attn = attn + b.attn_total
    for b in bundles[1:]:
        moe = moe + b.moe_total
    ra = int(attn.argmax())
    if attn[ra] <= 0 and moe.max() <= 0:
        return StepCost(0.0, {}, (0.0,) * lay.dp, {})
    a_t, i_t = kv[ra].tolist()
    if len(groups) == 1:
        a_c, i_c, a_m, i_m = groups[0].cm_list(ra)
    else:
        cm = groups[0].cm_row(ra)
        for g in groups[1:]:
            cm = cm + g.cm_row(ra)
        a_c, i_c, a_m, i_m = cm.tolist()
    breakdown = {"attention": a_t}
    bound = {"attention": "compute" if a_c > a_m else "memory"}
    if any(g.gp.has_indexer for g in groups):
        breakdown["indexer"] = i_t
        bound["indexer"] = "compute" if i_c > i_m else "memory"
    if transfer is not None:
        breakdown["kv_transfer"] = float(transfer[ra])
        bound["kv_transfer"] = "comm"
    values, labels = bundles[0].rank_tail(ra) if len(bundles) == 1 else _merged_tail(bundles, ra)
    breakdown.update(values)
    bound.update(labels)
    total = sum(breakdown.values())
    busy = np.minimum(attn + moe, total)
    return StepCost(total, breakdown, tuple(busy.tolist()), bound)


def _merged_tail(bundles: list[Bundle], ra: int) -> tuple[dict[str, float], dict[str, str]]:
    """Several layer groups (prefill): their components summed at rank ra, compute/memory from the
    summed times, the MoE components labelled by the all-token group. Cached on the first bundle
    (keyed by the others' ids, which the cached entry holds, so an id is never reused for it)."""
    key = ("merged", ra, *map(id, bundles[1:]))
    hit = bundles[0]._rank_views.get(key)
    if hit is not None:
        return hit[1], hit[2]
    values: dict[str, float] = {}
    tc: dict[str, float] = {}
    tm: dict[str, float] = {}
    for b in bundles:
        for acc, part in zip((values, tc, tm), b.rank_view(ra), strict=True):
            for name, value in part.items():
                acc[name] = acc.get(name, 0.0) + value
    labels = {n: label(n, tc, tm) for n in values}
    for b in bundles:
        for name, value in b.crit_breakdown.items():
            values[name] = values.get(name, 0.0) + value
            labels.setdefault(name, b.crit_bound[name])
    bundles[0]._rank_views[key] = (bundles[1:], values, labels)
    return values, labels
