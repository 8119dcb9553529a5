"""The per-step cost of one instance: roofline per operation, summed over layers, lockstep over ranks.

Per layer, every DP rank runs its attention part (projections, indexer, attention, mHC, TP
all-reduce) on its own sequences; then the MoE part (gate, dispatch, grouped expert GEMM, combine)
waits on the dispatch barrier, so the MoE time is the busiest EP rank's. total_s = slowest attention
part + busiest MoE part + the rest; the breakdown lists the critical rank's components.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from rackserve.timing import comm
from rackserve.timing.batch import StepBatch, StepCost
from rackserve.timing.batch_features import CodeShape, GroupArrays, code_shapes, step_arrays
from rackserve.timing.layout import Layout
from rackserve.timing.optimizations import Optimizations
from rackserve.timing.roofline import (
    attention_time,
    copy_time,
    domain_bw_factor,
    gemm_time,
    grouped_gemm_time,
    pipeline_bw_scale,
)
from rackserve.timing.spec import DTYPE_BYTES, HardwareSpec, ModelSpec

ATTN_PART = (
    "attn_proj",
    "indexer",
    "attention",
    "mhc",
    "all_reduce",
    "engram",
    "lm_head",
    "kv_transfer",
)
MOE_PART = ("gate", "dispatch_combine", "moe_gemm", "shared_expert", "dense_mlp")
COMM = {"all_reduce", "dispatch_combine", "engram", "kv_transfer"}
SMALL_ROWS = 16  # REFERENCE: shared experts packed into the routed GEMM below 16 rows


class Parts:
    """Per-component time, compute time and memory time, each an array over ranks."""

    def __init__(self, ranks: int) -> None:
        self.t: dict[str, np.ndarray] = {}
        self.tc: dict[str, np.ndarray] = {}
        self.tm: dict[str, np.ndarray] = {}
        self.zero = np.zeros(ranks)

    def add(self, name: str, t, tc=None, tm=None, times: float = 1.0) -> None:
        for acc, value in ((self.t, t), (self.tc, tc), (self.tm, tm)):
            if value is None:
                continue
            value = np.asarray(value, dtype=np.float64)
            if times != 1.0:
                value = value * times
            prev = acc.get(name)
            if prev is not None:
                acc[name] = prev + value
            elif value.shape == self.zero.shape:  # a first add is the value itself (0 + x == x)
                acc[name] = value
            else:
                acc[name] = value + self.zero

    def merge(self, other: Parts) -> None:
        for name, t in other.t.items():
            self.add(name, t, other.tc.get(name), other.tm.get(name))

    def total(self, names: tuple[str, ...]) -> np.ndarray:
        out = self.zero
        for n in names:
            if n in self.t:
                out = out + self.t[n]
        return out


@dataclass(frozen=True)
class LayerGroups:
    """Layer counts of one phase's two layer groups (all tokens / prefill tail), per attention code."""

    code_counts: tuple[np.ndarray, np.ndarray]
    indexer_layers: tuple[int, int]
    moe_layers: tuple[int, int]
    dense_layers: tuple[int, int]
    layers: tuple[int, int]
    engram: tuple[tuple[int, int], ...] = field(default=())  # (group, layer index)


@dataclass(frozen=True)
class CostContext:
    """Everything that does not change between steps: specs, switches, derived constants."""

    hw: HardwareSpec
    model: ModelSpec
    opts: Optimizations
    codes: tuple[CodeShape, ...]
    groups: dict[str, LayerGroups]
    indexer_codes: np.ndarray  # 1.0 for attention codes that use the indexer
    memo: dict = field(default_factory=dict, compare=False, repr=False)  # see _token_bundle

    @staticmethod
    def build(hw: HardwareSpec, model: ModelSpec, opts: Optimizations) -> CostContext:
        codes = code_shapes(model)
        order = sorted(model.attention.codes)
        groups = {p: _layer_groups(model, order, p) for p in ("prefill", "decode")}
        indexer = np.array([float(c.indexer) for c in codes])
        return CostContext(hw, model, opts, codes, groups, indexer)


def _layer_groups(model: ModelSpec, order: list[int], phase: str) -> LayerGroups:
    split = model.layers if phase == "decode" else model.prefill.full_layers
    spans = (range(0, split), range(split, model.layers))
    counts = tuple(
        np.array([sum(model.attention.layer_codes[i] == c for i in s) for c in order], float)
        for s in spans
    )
    idx = tuple(
        sum(model.attention.codes[model.attention.layer_codes[i]].indexer for i in s) for s in spans
    )
    moe = tuple(sum(i >= model.moe.first_dense_layers for i in s) for s in spans)
    dense = tuple(len(s) - m for s, m in zip(spans, moe, strict=False))
    engram = tuple(
        (0 if i < split else 1, i) for i in (model.engram.layers if model.engram else [])
    )
    return LayerGroups(counts, idx, moe, dense, (len(spans[0]), len(spans[1])), engram)  # type: ignore[arg-type]


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
        _kv_attention(ctx, layout, phase, lg, gi, ga, kv)
        bundles.append(
            _token_bundle(
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


MEMO_LIMIT = 50_000


@dataclass(frozen=True)
class Bundle:
    """The token-count-only components of one layer group, with their per-rank totals."""

    parts: Parts
    crit: Parts
    attn_total: np.ndarray
    moe_total: np.ndarray
    crit_breakdown: dict[str, float]
    crit_bound: dict[str, str]
    _rank_views: dict = field(default_factory=dict, compare=False, repr=False)

    def rank_view(self, r: int) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        """(time, compute time, memory time) per attention-part component of rank r (cached)."""
        view = self._rank_views.get(r)
        if view is None:
            p = self.parts
            names = [n for n in p.t if n not in MOE_PART]
            view = (
                {n: float(p.t[n][r]) for n in names},
                {n: float(p.tc[n][r]) for n in names if n in p.tc},
                {n: float(p.tm[n][r]) for n in names if n in p.tm},
            )
            self._rank_views[r] = view
        return view

    def rank_tail(self, r: int) -> tuple[dict[str, float], dict[str, str]]:
        """(time, bound) per component of this bundle alone on the critical path through rank r:
        rank r's attention-part components, then the busiest EP rank's MoE components (cached)."""
        tail = self._rank_views.get(("tail", r))
        if tail is None:
            t, tc, tm = self.rank_view(r)
            bound = {
                n: "comm"
                if n in COMM
                else ("compute" if tc.get(n, 0.0) > tm.get(n, 0.0) else "memory")
                for n in t
            }
            values = dict(t)
            for name, value in self.crit_breakdown.items():
                values[name] = values.get(name, 0.0) + value
                bound[name] = self.crit_bound[name]
            tail = self._rank_views[("tail", r)] = (values, bound)
        return tail

    @staticmethod
    def of(parts: Parts, crit: Parts) -> Bundle:
        names = [n for n in MOE_PART if n in crit.t]
        return Bundle(
            parts,
            crit,
            parts.total(ATTN_PART),
            parts.total(MOE_PART),
            {n: float(crit.t[n][0]) for n in names},
            {n: _bound(n, crit, 0) for n in names},
        )


def _token_bundle(
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
    if expert_tokens is None:
        extra = seqs.tobytes() if (phase == "prefill" and gi == 0) else b""
        full = tokens_full.tobytes() if gi == 1 else b""
        key = (phase, lay.key, gi, tokens.tobytes(), extra, full)
        hit = ctx.memo.get(key)
        if hit is not None:
            return hit
    b_parts, b_crit = Parts(lay.dp), Parts(1)
    _token_attention(ctx, lay, phase, lg, gi, tokens, b_parts)
    _moe_part(ctx, lay, phase, lg, gi, tokens, tokens_full, expert_tokens, b_parts, b_crit)
    if gi == 0:
        _lm_head(ctx, lay, phase, tokens, seqs, b_parts)
    _engram(ctx, lg, gi, tokens, b_parts)
    bundle = Bundle.of(b_parts, b_crit)
    if key is not None:
        if len(ctx.memo) > MEMO_LIMIT:
            ctx.memo.clear()
        ctx.memo[key] = bundle
    return bundle


def _kv_attention(
    ctx: CostContext,
    lay: Layout,
    phase: str,
    lg: LayerGroups,
    gi: int,
    ga: GroupArrays,
    parts: Parts,
) -> None:
    """Attention over each sequence's window and selected/compressed KV, and the indexer scan."""
    hw, m, o = ctx.hw, ctx.model, ctx.opts
    att = m.attention
    counts = lg.code_counts[gi]
    win = ga.window_entries[:, None]
    comp = ga.comp_entries
    flops = (win + comp) * (2.0 * (att.heads / lay.tp) * (att.qk_head_dim + att.v_head_dim))
    bytes_ = win * att.window_entry_bytes + comp * att.compressed_entry_bytes
    overlap = 1.0 if o.attn_overlap else hw.efficiency.attention_overlap
    t, tc, tm = attention_time(
        hw,
        flops,
        bytes_,
        math_dtype=att.math_dtype,
        overlap=overlap,
        domain=domain_bw_factor(hw, False),
    )
    if phase == "decode" and not o.kv_gather_ahead:
        t = t + hw.microarch.gather_latency_s * (ga.seqs > 0)[:, None] * ctx.indexer_codes
    parts.add("attention", t @ counts, tc @ counts, tm @ counts)
    if m.indexer and lg.indexer_layers[gi]:
        ix = m.indexer
        dt = "fp4" if o.fp4_indexer else "fp8"
        it, itc, itm = attention_time(
            hw,
            ga.scan_entries * (2.0 * (ix.heads / lay.tp) * ix.head_dim),
            ga.key_reads * ix.key_bytes,
            math_dtype=dt,
            overlap=1.0,
        )
        parts.add("indexer", it @ counts, itc @ counts, itm @ counts)


def _token_attention(
    ctx: CostContext,
    lay: Layout,
    phase: str,
    lg: LayerGroups,
    gi: int,
    tokens: np.ndarray,
    parts: Parts,
) -> None:
    """Projections (attention + indexer), mHC residual traffic and the TP all-reduces."""
    hw, m, o = ctx.hw, ctx.model, ctx.opts
    split_k = o.split_k
    layers = lg.layers[gi]
    n, k, groups, times = _projections(ctx, lay.tp, lg, gi)
    # dense attention weights are not in REFERENCE's domain-local list: interleaved over both domains
    t, tc, tm = gemm_time(  # every projection at once: [matrices, ranks]
        hw,
        tokens[None, :],
        n,
        k,
        weight_dtype=m.dense_dtype,
        groups=groups,
        cluster_split_k=split_k,
        domain=domain_bw_factor(hw, False),
    )
    parts.add("attn_proj", (t * times).sum(0), (tc * times).sum(0), (tm * times).sum(0))
    if m.mhc:
        fused = o.fused_ar_mhc and lay.tp > 1
        passes = max(1, m.mhc.passes_per_sublayer - 2) if fused else m.mhc.passes_per_sublayer
        mbytes = tokens * m.mhc.streams * m.hidden * m.mhc.elem_bytes * passes * 2
        kernels = 0 if fused else 2
        mt = copy_time(
            hw, mbytes, domain_bw_factor(hw, o.domain_local)
        ) + kernels * hw.microarch.kernel_overhead_s * (tokens > 0)
        parts.add("mhc", mt, None, mt, times=layers)
    if lay.tp > 1:
        ar = np.array(
            [comm.allreduce_time(hw, x * m.hidden * 2.0, lay.tp, lay.trays) for x in tokens]
        )
        parts.add("all_reduce", ar, times=2 * layers)


def _projections(ctx: CostContext, tp: int, lg: LayerGroups, gi: int):
    """(n, k, groups, layers) columns [matrices, 1] of the attention (and, where the group has
    indexer layers, indexer) projections, each matrix's share of one rank under TP (cached)."""
    key = ("projections", tp, lg.layers, gi, lg.indexer_layers)
    hit = ctx.memo.get(key)
    if hit is not None:
        return hit
    m = ctx.model
    mats = [(mat, lg.layers[gi]) for mat in m.attention.matrices]
    if m.indexer and lg.indexer_layers[gi]:
        mats += [(mat, lg.indexer_layers[gi]) for mat in m.indexer.matrices]
    rows = []
    for mat, layers in mats:
        n, groups = mat.n, mat.groups
        if mat.tp_split and tp > 1:
            if groups >= tp:
                groups //= tp
            else:
                n //= tp
        rows.append((n, mat.k, groups, layers))
    cols = np.array(rows, dtype=np.int64).T[:, :, None]
    hit = ctx.memo[key] = (cols[0], cols[1], cols[2], cols[3].astype(np.float64))
    return hit


def _moe_part(
    ctx,
    lay: Layout,
    phase: str,
    lg: LayerGroups,
    gi: int,
    tokens: np.ndarray,
    tokens_full: np.ndarray,
    expert_tokens,
    parts: Parts,
    crit: Parts,
) -> None:
    hw, m, o = ctx.hw, ctx.model, ctx.opts
    moe = m.moe
    split_k = o.split_k
    # every rank, then the critical (busiest) one as one more column, split apart at the end
    both = Parts(lay.dp + 1)
    own = np.append(tokens, tokens.max())
    if lg.dense_layers[gi]:
        inter = moe.dense_intermediate // lay.tp
        t, tc, tm = _up_down(hw, own, inter, m.hidden, moe.shared_dtype, split_k)
        both.add("dense_mlp", t, tc, tm, times=lg.dense_layers[gi])
    n_moe = lg.moe_layers[gi]
    if n_moe and tokens.sum() != 0:
        load = _expert_load(ctx, lay, tokens, tokens_full, expert_tokens)
        # the busiest EP rank's MoE work, with the largest own batch for its gate/shared expert/send side
        pick = [*range(lay.dp), load.busiest]
        recv, active, padded = load.recv[pick], load.active[pick], load.padded[pick]
        _moe_rank(ctx, lay, own, recv, active, padded, n_moe, split_k, both)
    for name, t in both.t.items():
        tc, tm = both.tc.get(name), both.tm.get(name)
        parts.add(name, t[:-1], None if tc is None else tc[:-1], None if tm is None else tm[:-1])
        crit.add(name, t[-1:], None if tc is None else tc[-1:], None if tm is None else tm[-1:])


def _up_down(hw: HardwareSpec, rows, inter: int, hidden: int, dtype: str, split_k: bool):
    """A gated MLP's two GEMMs (gate+up: hidden -> 2 x inter, down: inter -> hidden), summed."""
    t, tc, tm = gemm_time(
        hw,
        np.asarray(rows, dtype=np.float64)[None, :],
        np.array([[2 * inter], [hidden]]),
        np.array([[hidden], [inter]]),
        weight_dtype=dtype,
        cluster_split_k=split_k,
    )
    return t.sum(0), tc.sum(0), tm.sum(0)


@dataclass(frozen=True)
class ExpertLoad:
    recv: np.ndarray  # routed token-copies each EP rank computes
    active: np.ndarray  # experts with at least one token, per rank
    padded: np.ndarray  # GEMM rows after tile padding, per rank
    busiest: int


def _next_pow2(x: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(x, 1.0))))


def _expert_load(
    ctx: CostContext, lay: Layout, tokens: np.ndarray, tokens_full: np.ndarray, expert_tokens
) -> ExpertLoad:
    moe, _hw = ctx.model.moe, ctx.hw
    ep = lay.ep
    per_rank_experts = (
        moe.experts / ep
    )  # experts are split contiguously; uneven when ep does not divide them
    if expert_tokens is not None:
        counts = np.asarray(expert_tokens, dtype=np.float64)
        if counts.shape != (moe.experts,):
            raise ValueError(f"expert_tokens: expected {moe.experts} entries, got {counts.shape}")
        full = tokens_full.sum()
        counts = counts * (tokens.sum() / full if full else 0.0)
        starts = np.arange(ep) * moe.experts // ep
        recv = np.add.reduceat(counts, starts)
        active = np.add.reduceat((counts > 0).astype(np.float64), starts)
        busiest = int(np.argmax(recv))
        tile = _tile(ctx, recv[busiest], active[busiest])
        padded = np.add.reduceat(np.ceil(counts / tile) * tile, starts)
        return ExpertLoad(recv, active, padded, busiest)
    assignments = tokens.sum() * moe.top_k
    if ep > 1:
        mean = assignments / ep
        spread = (
            moe.imbalance_dispersion * math.sqrt(2.0 * mean * math.log(ep)) if mean > 0 else 0.0
        )
        recv = np.append(np.full(ep, mean), mean + spread)
    else:
        recv = np.array([assignments, assignments])
    active = per_rank_experts * (1.0 - np.exp(-recv / per_rank_experts))
    tile = _tile(ctx, recv[-1], active[-1])
    per_expert = np.divide(recv, active, out=np.zeros_like(recv), where=active > 0)
    padded = active * np.ceil(per_expert / tile) * tile
    return ExpertLoad(recv, active, padded, len(recv) - 1)


def _tile(ctx: CostContext, busiest_recv: float, busiest_active: float) -> int:
    """Baseline: fixed tile rows. MegaMoE: tile sized by the busiest rank's rows per expert."""
    base = ctx.hw.microarch.tile_m
    if not ctx.opts.megamoe_tiles or busiest_active <= 0:
        return base
    return int(min(base, max(8, _next_pow2(busiest_recv / busiest_active))))


def _moe_rank(
    ctx, lay: Layout, own, recv, active, padded, n_moe: int, split_k: bool, p: Parts
) -> None:
    hw, m, o = ctx.hw, ctx.model, ctx.opts
    moe = m.moe
    dom = domain_bw_factor(hw, o.domain_local)
    math_dt = "fp4" if o.fp8xfp4_k64 and hw.peak_flops.fp4 else "fp8"
    expert_bytes = (
        moe.expert_bytes * hw.stored_bytes(moe.weight_dtype) / DTYPE_BYTES[moe.weight_dtype]
    )
    stages = 11 if (lay.tp > 1 and o.tp8_packed_fp4) else 7
    bw_scale = pipeline_bw_scale(hw, stages)
    # activations per row: FP8 token in, BF16 expert output; unfused (two GEMMs) the FP8 SwiGLU
    # intermediate also goes out to HBM and back, MegaMoE keeps it on chip
    inter = moe.intermediate // lay.tp
    act_row = m.hidden * 1.0 + m.hidden * 2.0 + (0.0 if o.megamoe_tiles else 2.0 * inter)
    t, tc, tm = grouped_gemm_time(
        hw,
        padded,
        active * expert_bytes / lay.tp,
        3 * inter,
        m.hidden,
        math_dtype=math_dt,
        bw_scale=bw_scale,
        domain=dom,
        act_bytes_per_row=act_row,
    )
    p.add("moe_gemm", t, tc, tm, times=n_moe)
    # gate: router GEMM + sqrt-softplus scoring (MegaGate scores only candidate experts after a bound)
    g, gc, gm = gemm_time(
        hw, own, moe.experts, m.hidden, weight_dtype="bf16", cluster_split_k=split_k
    )
    evaluated = moe.experts * (moe.megagate_candidate_fraction if o.megagate else 1.0)
    bound = moe.experts * 2.0 if o.megagate else 0.0
    elem = own * (evaluated * moe.gate_flops_per_expert + bound) / hw.peak_flops.vector_fp32
    p.add("gate", g + elem, gc + elem, gm, times=n_moe)
    _shared_expert(ctx, lay, own, split_k, n_moe, dom, bw_scale, p)
    if lay.ep > 1:
        _dispatch_combine(ctx, lay, own, recv, n_moe, dom, p)


def _shared_expert(
    ctx, lay: Layout, own, split_k: bool, n_moe: int, dom: float, bw_scale: float, p: Parts
) -> None:
    hw, m, o = ctx.hw, ctx.model, ctx.opts
    moe = m.moe
    if moe.shared_experts == 0:
        return
    inter = moe.shared_experts * moe.intermediate // lay.tp
    t, tc, tm = _up_down(hw, own, inter, m.hidden, moe.shared_dtype, split_k)
    if o.shared_in_routed:
        # packed into the routed GEMM: no own kernels, its tiles streamed by SMs the routed GEMM leaves idle
        wbytes = 3 * inter * m.hidden * hw.stored_bytes(moe.shared_dtype)
        bw = max(
            hw.hbm_bw_bytes_per_s * min(0.95, hw.efficiency.grouped_memory * bw_scale) * dom,
            hw.hbm_bw_bytes_per_s * hw.efficiency.gemm_memory,
        )
        packed = wbytes / bw
        small = (own < SMALL_ROWS) & (own > 0)
        t = np.where(small, np.minimum(t, packed), t)
        tm = np.where(small, np.minimum(tm, packed), tm)
    p.add("shared_expert", t, tc, tm, times=n_moe)


def _dispatch_combine(ctx, lay: Layout, own, recv, n_moe: int, dom: float, p: Parts) -> None:
    hw, m, o = ctx.hw, ctx.model, ctx.opts
    remote = (lay.ep - 1) / lay.ep
    send = own * m.moe.top_k * remote
    moved = np.maximum(send, recv * remote)
    dispatch_bytes = m.hidden * 1.0 + m.hidden / 128 * 4.0  # FP8 token + per-128 FP32 scales
    combine_bytes = m.hidden * 2.0  # BF16 expert output
    link = hw.nvlink_bw_bytes_per_s * hw.efficiency.nvlink
    barrier = 0.0 if o.sentinel_combine else hw.nvlink_latency_s
    t = 2 * hw.nvlink_latency_s + barrier + moved * (dispatch_bytes + combine_bytes) / link
    reduce = copy_time(hw, own * m.moe.top_k * combine_bytes, dom)  # combine buffer read back
    t = np.where(moved > 0, t + reduce, 0.0)
    p.add("dispatch_combine", t, None, None, times=n_moe)


def _lm_head(ctx, lay: Layout, phase: str, tokens, seqs, parts: Parts) -> None:
    """Logits of every decoded token, or of each prompt's last position in prefill."""
    m, o = ctx.model, ctx.opts
    rows = tokens if phase == "decode" else seqs
    t, tc, tm = gemm_time(
        ctx.hw,
        rows,
        m.vocab // lay.tp,
        m.hidden,
        weight_dtype=m.lm_head_dtype,
        cluster_split_k=o.split_k,
        domain=domain_bw_factor(ctx.hw, o.domain_local),
    )
    parts.add("lm_head", t, tc, tm)


def _engram(ctx, lg: LayerGroups, gi: int, tokens: np.ndarray, parts: Parts) -> None:
    """Engram rows are fetched over NVLink from the GPUs holding the table shards, issued at step
    start (addressed by token ids alone), so only what outlasts the layers before it is exposed.
    The layers before it are timed by their token-count components (attention over the context is
    left out, so the exposure is, if anything, over-estimated), which keeps this memoizable."""
    m, hw = ctx.model, ctx.hw
    layers = [layer for group, layer in lg.engram if group == gi]
    if not m.engram or not layers:
        return
    per_layer = (parts.total(ATTN_PART) + parts.total(MOE_PART)) / m.layers
    fetch = comm.p2p_time(hw, tokens * (m.engram.rows_per_token * m.engram.row_bytes))
    total = parts.zero
    for layer in layers:
        exposed = np.maximum(0.0, fetch - layer * per_layer) + hw.microarch.kernel_overhead_s
        total = total + exposed * (tokens > 0)
    parts.add("engram", total)


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
    bound = {
        n: "comm" if n in COMM else ("compute" if tc.get(n, 0.0) > tm.get(n, 0.0) else "memory")
        for n in breakdown
    }
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


def _bound(name: str, parts: Parts, r: int) -> str:
    if name in COMM:
        return "comm"
    tc = parts.tc.get(name)
    tm = parts.tm.get(name)
    if tc is None and tm is None:
        return "memory"
    c = float(tc[r]) if tc is not None else 0.0
    mm = float(tm[r]) if tm is not None else 0.0
    return "compute" if c > mm else "memory"
