"""The fast path of the step cost: what depends only on (hardware, model, optimizations, layout,
phase) is folded once into a plan; a call is then a few numpy reductions over the batch's sequences.

step_cost.step_cost stays the readable reference (TimingModel.step_time_reference); the two agree
to rounding (tests/unit/timing/test_step_plan.py). Same contract: total_s == sum(breakdown), the
critical path is the slowest rank's attention part + the busiest EP rank's MoE part.

Attention and indexer times are linear in four per-rank sums (window entries W, sum of positions L,
indexer key reads Kr, selected entries per indexer code) until the roofline max, so one matrix maps
the sums to (compute, memory) times of every (kernel, attention code) at once. The token-count-only
components (projections, mHC, all-reduce, LM head, engram, MoE) come from step_cost's memoized
bundles. The plan itself is built in plan.py, the per-rank features and their times are
plan_features.py's, the critical path step_assemble.py's; this file prices batches with them.
"""

from __future__ import annotations

from itertools import accumulate
from operator import attrgetter

import numpy as np

from rackserve.timing import pricer
from rackserve.timing.batch import StepBatch, StepCost
from rackserve.timing.cost_context import MEMO_LIMIT, CostContext
from rackserve.timing.plan import GroupPlan, RowStack, StepPlan, build_plan  # noqa: F401  (re-exported)
from rackserve.timing.plan_features import (
    Group,
    _general_features,
    _general_features_by_row,  # noqa: F401  (re-exported: tests compare the two feature paths)
    _kv_times,
    _kv_times_many,
    _stacked,
)
from rackserve.timing.step_assemble import _assemble, _assemble_one
from rackserve.timing.step_cost import token_bundle

_NEW = attrgetter("new_tokens")
_CACHED = attrgetter("cached_tokens")
_HBM = attrgetter("pool_hbm_tokens")
_DRAM = attrgetter("pool_dram_tokens")
_ONES = b""  # int64 ones, grown on demand (see _grow_ones)
_INT64 = np.dtype(np.int64)


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
            f = group_features(gp, q, self.end, self.starts, self.nonempty)
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
        f = group_features(gp, q, end, starts, nonempty, between)
        at = 0
        for p in todo:
            d = p.counts.shape[0]
            part = f[:, at : at + d]
            at += d
            p.feats[key] = part[:, p.spread] if p.spread is not None else part.copy()


def general_cost(ctx: CostContext, plan: StepPlan, batch: StepBatch, prep: Prepared, kv_transfer) -> StepCost:
    """The general path of fast_step_cost over `batch`'s Prepared form."""
    groups = [group_result(gp, prep.features(gp)) for gp in plan.groups]
    return _finish(ctx, plan, batch, groups, kv_transfer, _pooled(prep))


def general_costs(ctx: CostContext, plan: StepPlan, items: list[tuple[StepBatch, Prepared]], kv_transfer) -> list[StepCost]:
    """general_cost of each (batch, its Prepared form) of `items` (a step and its halves: the same
    ranks), _kv_times' element-wise part for all of them at once (_kv_times_many)."""
    groups: list[list[Group]] = [[] for _ in items]
    for gp in plan.groups:
        for out, g in zip(groups, group_results(gp, [prep.features(gp) for _, prep in items]), strict=True):
            out.append(g)
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


def _prefill_groups(plan: StepPlan, ranks) -> list[Group]:
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
        out.append(Group(gp, r[:, :2], None, None, r[:, 6], r[:, 7], r[:, 2:6]))
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
    fresh = dict(zip(todo, rank_rows(plan, list(todo.values())), strict=True))
    if len(memo) + len(fresh) > MEMO_LIMIT:
        memo.clear()
    memo.update(fresh)
    return fresh


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
    z = decode_totals(gp, cached, starts, active)
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
    k = cached.shape[0]
    z = decode_pass_totals(gp, cached, starts, active)  # [k, R, 7]
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



# The arithmetic kernels' numpy twins: the reference, and what runs where timing/_pricer.c is not built.


def _group_result(gp, f: np.ndarray) -> Group:
    """One layer group's results from its features f [F_g + 2, R] (general path)."""
    kv, tc, tm = _kv_times(gp, f[:-2], gp.general_map, f[-1])
    return Group(gp, kv, tc, tm, f[-2], f[-1])


def _group_results(gp, fs: list[np.ndarray]) -> list[Group]:
    """_group_result of each f of `fs` (the same ranks), _kv_times' element-wise part for all at once."""
    return [Group(gp, kv, tc, tm, f[-2], f[-1]) for (kv, tc, tm), f in zip(_kv_times_many(gp, fs), fs, strict=True)]


def _decode_totals(gp, cached: np.ndarray, starts: np.ndarray, active) -> np.ndarray:
    """A single-token decode step's per rank [attention, indexer, both, attention compute, indexer
    compute, attention memory, indexer memory] from its sequences' cached tokens, launch and gather
    costs apart: one capped reduction per rank, one matrix product to the per-(kernel, code) compute
    and memory times, one to the per-rank totals."""
    n = cached.shape[0]
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
    return np.concatenate(blocks, axis=1) @ gp.d_out


def _decode_pass_totals(gp, cached: np.ndarray, starts: np.ndarray, active) -> np.ndarray:
    """_decode_totals of each row of cached [k, n], as [k, R, 7]: element-wise ones and reductions for
    all rows at once, the matrix products row by row (a BLAS product of more rows may round differently)."""
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
    return _stacked([c @ d_out for c in np.concatenate(blocks, axis=2)])


# name -> (numpy twin, compiled kernel) of the kernels this module prices with; the compiled ones where
# timing/_pricer.c is built (tests swap in the twins: tests/unit/timing/test_pricer.py)
KERNELS = {
    "group_features": (_general_features, pricer.general_features),
    "group_result": (_group_result, pricer.group_result),
    "group_results": (_group_results, pricer.group_results),
    "decode_totals": (_decode_totals, pricer.decode_totals),
    "decode_pass_totals": (_decode_pass_totals, pricer.decode_pass_totals),
    "rank_rows": (_rank_rows, pricer.rank_rows),
}
_CHOSEN = 1 if pricer.AVAILABLE else 0
group_features = KERNELS["group_features"][_CHOSEN]
group_result = KERNELS["group_result"][_CHOSEN]
group_results = KERNELS["group_results"][_CHOSEN]
decode_totals = KERNELS["decode_totals"][_CHOSEN]
decode_pass_totals = KERNELS["decode_pass_totals"][_CHOSEN]
rank_rows = KERNELS["rank_rows"][_CHOSEN]
