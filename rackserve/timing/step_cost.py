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
from rackserve.timing.batch_features import CodeShape, GroupSums, code_shapes, rank_groups
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
        self.t[name] = self.t.get(name, self.zero) + np.asarray(t) * times
        if tc is not None:
            self.tc[name] = self.tc.get(name, self.zero) + np.asarray(tc) * times
        if tm is not None:
            self.tm[name] = self.tm.get(name, self.zero) + np.asarray(tm) * times

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

    @staticmethod
    def build(hw: HardwareSpec, model: ModelSpec, opts: Optimizations) -> CostContext:
        codes = code_shapes(model)
        order = sorted(model.attention.codes)
        groups = {p: _layer_groups(model, order, p) for p in ("prefill", "decode")}
        return CostContext(hw, model, opts, codes, groups)


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
    per_rank = [rank_groups(rb, phase, ctx.model, ctx.codes) for rb in batch.ranks]
    parts = Parts(layout.dp)
    crit = Parts(1)  # MoE components on the busiest EP rank
    moe_tokens_full = np.array([g[0].tokens for g in per_rank])
    for gi in (0, 1):
        if lg.layers[gi] == 0 or per_rank[0][gi] is None:
            continue
        sums = [g[gi] for g in per_rank]
        _attention_part(ctx, layout, phase, lg, gi, sums, parts)
        _moe_part(
            ctx,
            layout,
            phase,
            lg,
            gi,
            np.array([s.tokens for s in sums]),
            moe_tokens_full,
            batch,
            parts,
            crit,
        )
    _lm_head(ctx, layout, phase, batch, per_rank, parts)
    parts.add(
        "kv_transfer",
        [
            kv_transfer(rb.pool_hbm_tokens, "pool_hbm")
            + kv_transfer(rb.pool_dram_tokens, "pool_dram")
            for rb in batch.ranks
        ],
    )
    _engram(ctx, lg, per_rank, parts)
    return _assemble(parts, crit, layout)


def _attention_part(
    ctx: CostContext,
    lay: Layout,
    phase: str,
    lg: LayerGroups,
    gi: int,
    sums: list[GroupSums],
    parts: Parts,
) -> None:
    hw, m, o = ctx.hw, ctx.model, ctx.opts
    att = m.attention
    counts = lg.code_counts[gi]
    tokens = np.array([s.tokens for s in sums])
    win = np.array([s.window_entries for s in sums])[:, None]
    comp = np.array([s.comp_entries for s in sums])
    flops = (win + comp) * 2.0 * (att.heads / lay.tp) * (att.qk_head_dim + att.v_head_dim)
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
        seqs = np.array([s.seqs for s in sums])[:, None]
        t = t + hw.microarch.gather_latency_s * (seqs > 0) * np.array(
            [c.indexer for c in ctx.codes]
        )
    parts.add("attention", t @ counts, tc @ counts, tm @ counts)
    split_k = o.split_k or phase == "prefill"
    for mat in att.matrices:
        _dense(ctx, "attn_proj", tokens, mat, lay.tp, split_k, lg.layers[gi], parts)
    if m.indexer and lg.indexer_layers[gi]:
        ix = m.indexer
        scan = np.array([s.scan_entries for s in sums])
        keys = np.array([s.key_reads for s in sums])
        dt = "fp4" if o.fp4_indexer else "fp8"
        it, itc, itm = attention_time(
            hw,
            scan * 2.0 * (ix.heads / lay.tp) * ix.head_dim,
            keys * ix.key_bytes,
            math_dtype=dt,
            overlap=1.0,
        )
        parts.add("indexer", it @ counts, itc @ counts, itm @ counts)
        for mat in ix.matrices:
            _dense(ctx, "attn_proj", tokens, mat, lay.tp, split_k, lg.indexer_layers[gi], parts)
    layers = lg.layers[gi]
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


def _dense(
    ctx: CostContext,
    name: str,
    tokens: np.ndarray,
    mat,
    tp: int,
    split_k: bool,
    layers: int,
    parts: Parts,
) -> None:
    n, groups = mat.n, mat.groups
    if mat.tp_split and tp > 1:
        if groups >= tp:
            groups //= tp
        else:
            n //= tp
    # dense attention weights are not in REFERENCE's domain-local list: interleaved over both domains
    t, tc, tm = gemm_time(
        ctx.hw,
        tokens,
        n,
        mat.k,
        weight_dtype=ctx.model.dense_dtype,
        groups=groups,
        split_k=split_k,
        domain=domain_bw_factor(ctx.hw, False),
    )
    parts.add(name, t, tc, tm, times=layers)


def _moe_part(
    ctx,
    lay: Layout,
    phase: str,
    lg: LayerGroups,
    gi: int,
    tokens: np.ndarray,
    tokens_full: np.ndarray,
    batch: StepBatch,
    parts: Parts,
    crit: Parts,
) -> None:
    hw, m, o = ctx.hw, ctx.model, ctx.opts
    moe = m.moe
    split_k = o.split_k or phase == "prefill"
    if lg.dense_layers[gi]:
        inter = moe.dense_intermediate // lay.tp
        for p in (parts, crit):
            src = tokens if p is parts else tokens.max(keepdims=True)
            a = gemm_time(
                hw, src, 2 * inter, m.hidden, weight_dtype=moe.shared_dtype, split_k=split_k
            )
            b = gemm_time(hw, src, m.hidden, inter, weight_dtype=moe.shared_dtype, split_k=split_k)
            p.add("dense_mlp", a[0] + b[0], a[1] + b[1], a[2] + b[2], times=lg.dense_layers[gi])
    n_moe = lg.moe_layers[gi]
    if n_moe == 0 or tokens.sum() == 0:
        return
    load = _expert_load(ctx, lay, tokens, tokens_full, batch.expert_tokens)
    ranks = slice(0, lay.dp)
    _moe_rank(
        ctx,
        lay,
        tokens,
        load.recv[ranks],
        load.active[ranks],
        load.padded[ranks],
        n_moe,
        split_k,
        parts,
    )
    b = [load.busiest]
    # the busiest EP rank's MoE work, with the largest own batch for its gate/shared expert/send side
    _moe_rank(
        ctx,
        lay,
        tokens.max(keepdims=True),
        load.recv[b],
        load.active[b],
        load.padded[b],
        n_moe,
        split_k,
        crit,
    )


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
    per_rank_experts = moe.experts // ep
    if expert_tokens is not None:
        counts = np.asarray(expert_tokens, dtype=np.float64)
        if counts.shape != (moe.experts,):
            raise ValueError(f"expert_tokens: expected {moe.experts} entries, got {counts.shape}")
        full = tokens_full.sum()
        counts = counts * (tokens.sum() / full if full else 0.0)
        per = counts.reshape(ep, per_rank_experts)
        recv = per.sum(axis=1)
        active = np.count_nonzero(per > 0, axis=1).astype(float)
        busiest = int(np.argmax(recv))
        tile = _tile(ctx, recv[busiest], active[busiest])
        padded = (np.ceil(per / tile) * tile).sum(axis=1)
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
    g, gc, gm = gemm_time(hw, own, moe.experts, m.hidden, weight_dtype="bf16", split_k=split_k)
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
    a = gemm_time(hw, own, 2 * inter, m.hidden, weight_dtype=moe.shared_dtype, split_k=split_k)
    b = gemm_time(hw, own, m.hidden, inter, weight_dtype=moe.shared_dtype, split_k=split_k)
    t, tc, tm = a[0] + b[0], a[1] + b[1], a[2] + b[2]
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


def _lm_head(ctx, lay: Layout, phase: str, batch: StepBatch, per_rank, parts: Parts) -> None:
    m, o = ctx.model, ctx.opts
    if phase == "decode":
        rows = np.array([rb.total_new for rb in batch.ranks], float)
    else:
        rows = np.array([g[0].seqs for g in per_rank])  # logits of each prompt's last position
    t, tc, tm = gemm_time(
        ctx.hw,
        rows,
        m.vocab // lay.tp,
        m.hidden,
        weight_dtype=m.lm_head_dtype,
        split_k=o.split_k or phase == "prefill",
        domain=domain_bw_factor(ctx.hw, o.domain_local),
    )
    parts.add("lm_head", t, tc, tm)


def _engram(ctx, lg: LayerGroups, per_rank, parts: Parts) -> None:
    """Engram rows are fetched over NVLink from the GPUs holding the table shards, issued at step
    start (addressed by token ids alone), so only what outlasts the layers before it is exposed."""
    m, hw = ctx.model, ctx.hw
    if not m.engram:
        return
    busy = parts.total(ATTN_PART) + parts.total(MOE_PART)
    per_layer = busy / m.layers
    total = parts.zero
    for group, layer in lg.engram:
        tokens = np.array([g[group].tokens if g[group] is not None else 0.0 for g in per_rank])
        fetch = comm.p2p_time(hw, tokens * m.engram.rows_per_token * m.engram.row_bytes)
        exposed = np.maximum(0.0, fetch - layer * per_layer) + hw.microarch.kernel_overhead_s
        total = total + np.where(tokens > 0, exposed, 0.0)
    parts.add("engram", total)


def _assemble(parts: Parts, crit: Parts, lay: Layout) -> StepCost:
    attn = parts.total(ATTN_PART)
    moe = parts.total(MOE_PART)
    busy = attn + moe
    if busy.max() <= 0:
        return StepCost(0.0, {}, tuple(0.0 for _ in range(lay.dp)), {})
    ra = int(np.argmax(attn))
    breakdown: dict[str, float] = {}
    bound: dict[str, str] = {}
    for name in ATTN_PART:
        if name in parts.t:
            breakdown[name] = float(parts.t[name][ra])
            bound[name] = _bound(name, parts, ra)
    for name in MOE_PART:
        if name in crit.t:
            breakdown[name] = float(crit.t[name][0])
            bound[name] = _bound(name, crit, 0)
    total = sum(breakdown.values())
    busy_out = tuple(float(min(b, total)) for b in busy)
    return StepCost(total, breakdown, busy_out, bound)


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
