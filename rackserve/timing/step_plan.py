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


@dataclass(frozen=True)
class StepPlan:
    """Everything per (layout, phase) that does not depend on the batch."""

    layout: Layout
    phase: str
    groups: tuple[GroupPlan, ...]
    # decode: _decode_entry's tuple per tuple of sequences per rank
    memo: dict = field(default_factory=dict, compare=False, repr=False)


def build_plan(ctx: CostContext, lay: Layout, phase: str) -> StepPlan:
    lg = ctx.groups[phase]
    groups = []
    for gi in (0, 1):
        if lg.layers[gi] == 0:
            continue
        if gi == 1 and (phase == "decode" or ctx.model.prefill.full_layers >= ctx.model.layers):
            continue
        groups.append(_group_plan(ctx, lay, phase, gi))
    return StepPlan(lay, phase, tuple(groups))


def _group_plan(ctx: CostContext, lay: Layout, phase: str, gi: int) -> GroupPlan:
    hw, m, o = ctx.hw, ctx.model, ctx.opts
    att, lg = m.attention, ctx.groups[phase]
    codes = ctx.codes
    nc = len(codes)
    idx_codes = [i for i, c in enumerate(codes) if c.ratio and c.indexer]
    fg = 3 + len(idx_codes)
    gmap = np.zeros((fg, 4 * nc))
    fa = 2.0 * (att.heads / lay.tp) * (att.qk_head_dim + att.v_head_dim)
    pa = hw.peak(att.math_dtype) * hw.efficiency.attention_compute
    ba = hw.hbm_bw_bytes_per_s * hw.efficiency.attention_memory * domain_bw_factor(hw, False)
    with_indexer = bool(m.indexer and lg.indexer_layers[gi])
    if m.indexer:
        ix = m.indexer
        fi = 2.0 * (ix.heads / lay.tp) * ix.head_dim
        pi = hw.peak("fp4" if o.fp4_indexer else "fp8") * hw.efficiency.attention_compute
        bi = hw.hbm_bw_bytes_per_s * hw.efficiency.attention_memory
    for i, code in enumerate(codes):
        # window entries: every code attends them
        gmap[0, i] = fa / pa
        gmap[0, 2 * nc + i] = att.window_entry_bytes / ba
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
            gmap[1, 2 * nc + i] = att.compressed_entry_bytes / code.ratio / ba
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
    )


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


def _general_features(gp: GroupPlan, q: np.ndarray, end: np.ndarray, starts, nonempty):
    """Per-rank sums [W, L, Kr, capped per indexer code, W_read, L_read, capped_read per indexer
    code, tokens, seqs] for queries q ending at end; the read rows count each sequence's entries
    once (the union of its queries' windows, everything up to its last position, its last
    position's selection: batch_features.group_sums)."""
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
    if gp.gather.any():
        t = t + (seqs > 0)[:, None] * gp.gather
    return t @ gp.weights, tc, tm


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
        groups = [_prefill_group(plan, gi, gp, ranks) for gi, gp in enumerate(plan.groups)]
        return _finish(ctx, plan, batch, groups, kv_transfer)
    distinct, spread = _distinct(ranks)
    news = [rb.new_tokens for rb in distinct]
    counts = np.fromiter(map(len, news), np.int64, len(distinct))
    new = np.concatenate(news) if len(news) > 1 else news[0]
    cached = (
        np.concatenate([rb.cached_tokens for rb in distinct])
        if len(news) > 1
        else distinct[0].cached_tokens
    )
    starts = np.cumsum(counts) - counts
    nonempty = counts > 0
    # not the single-token decode form: general sums over each sequence's positions, per group
    groups = []
    end = (cached + new).astype(np.float64)
    q_full = new.astype(np.float64)
    for gp in plan.groups:
        q = q_full if gp.tail == 0 else np.minimum(q_full, gp.tail)
        f = _general_features(gp, q, end, starts, nonempty)
        if spread is not None:  # back to one column per rank (a rank's sums are its own)
            f = f[:, spread]
        kv, tc, tm = _kv_times(gp, f[:-2], gp.general_map, f[-1])
        groups.append(_Group(gp, kv, tc, tm, f[-2], f[-1]))
    return _finish(ctx, plan, batch, groups, kv_transfer)


def _prefill_group(plan: StepPlan, gi: int, gp: GroupPlan, ranks) -> _Group:
    """A prefill step's layer group from its ranks' feature sums, each rank's memoized on its own
    batch: a prefill rank holds a few sequences and its signatures repeat, while the pair of two
    DEP2 ranks' signatures that keys the step memo mostly does not."""
    rows = []
    for rb in ranks:
        key = (gi, rb.new_tokens.tobytes(), rb.cached_tokens.tobytes())
        row = plan.memo.get(key)
        if row is None:
            row = _rank_row(gp, rb)
            if len(plan.memo) > MEMO_LIMIT:
                plan.memo.clear()
            plan.memo[key] = row
        rows.append(row)
    r = np.concatenate(rows).reshape(len(rows), -1)  # [R, 2 + 4 + 2]: kv times, compute/memory times, tokens, seqs
    return _Group(gp, r[:, :2], None, None, r[:, 6], r[:, 7], r[:, 2:6])


def _rank_row(gp: GroupPlan, rb) -> np.ndarray:
    """One prefill rank's part of its layer group (the kv times are per rank): (attention, indexer)
    times, their compute and memory times, tokens and sequences, as one row."""
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


def _finish(ctx: CostContext, plan: StepPlan, batch: StepBatch, groups: list, kv_transfer) -> StepCost:
    """The token-count bundles of a general step's layer groups, its pool transfers, and the cost."""
    lay, ranks = plan.layout, batch.ranks
    tokens_full = groups[0].tokens
    lg = ctx.groups[plan.phase]
    bundles = [
        token_bundle(
            ctx, lay, plan.phase, lg, g.gp.gi, g.tokens, g.seqs, tokens_full, batch.expert_tokens
        )
        for g in groups
    ]
    transfer = None
    if any(map(_HBM, ranks)) or any(map(_DRAM, ranks)):
        transfer = _pool_transfer(ranks, kv_transfer)
    return _assemble(groups, bundles, transfer, lay)


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
