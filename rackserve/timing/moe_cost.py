"""The MoE part of a layer's cost: gate, grouped expert GEMM over the expert-load model's rows,
shared expert, dense MLP and the EP dispatch/combine, for every rank and the busiest EP rank."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rackserve.timing.cost_context import CostContext, LayerGroups
from rackserve.timing.layout import Layout
from rackserve.timing.parts import Parts
from rackserve.timing.roofline import (
    MAX_MEMORY_EFFICIENCY,
    copy_time,
    domain_bw_factor,
    gemm_time,
    grouped_gemm_time,
    pipeline_bw_scale,
)
from rackserve.timing.spec import DTYPE_BYTES, HardwareSpec

SMALL_ROWS = 16  # REFERENCE: shared experts packed into the routed GEMM below 16 rows


def moe_part(
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
    math_dt = "fp4" if o.fp8xfp4_k64 and hw.peak_flops.fp4 else (moe.math_dtype or "fp8")
    expert_bytes = (
        moe.expert_bytes * hw.stored_bytes(moe.weight_dtype) / DTYPE_BYTES[moe.weight_dtype]
    )
    stages = 11 if (lay.tp > 1 and o.tp8_packed_fp4) else 7
    bw_scale = pipeline_bw_scale(hw, stages)
    # activations per row: FP8 token in, BF16 expert output; unfused (two GEMMs) the FP8 SwiGLU
    # intermediate also goes out to HBM and back, MegaMoE keeps it on chip
    inter = moe.intermediate // lay.expert_tp
    act_row = m.hidden * 1.0 + m.hidden * 2.0 + (0.0 if o.megamoe_tiles else 2.0 * inter)
    t, tc, tm = grouped_gemm_time(
        hw,
        padded,
        active * expert_bytes / lay.expert_tp,
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
    if lay.dispatches:
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
            hw.hbm_bw_bytes_per_s
            * min(MAX_MEMORY_EFFICIENCY, hw.efficiency.grouped_memory * bw_scale)
            * dom,
            hw.hbm_bw_bytes_per_s * hw.efficiency.gemm_memory,
        )
        packed = wbytes / bw
        small = (own < SMALL_ROWS) & (own > 0)
        t = np.where(small, np.minimum(t, packed), t)
        tm = np.where(small, np.minimum(tm, packed), tm)
    p.add("shared_expert", t, tc, tm, times=n_moe)


def _dispatch_combine(ctx, lay: Layout, own, recv, n_moe: int, dom: float, p: Parts) -> None:
    """EP dispatch + combine of one layer as DeepEP-style all-to-alls run: each a fixed latency, the
    wait for the slowest of the ep ranks at its barrier (hw.ep_straggler_s x sqrt(2 ln ep): the
    expected maximum of ep ranks' independent arrival jitter, the Gumbel/extreme-value limit of a
    normal sample's maximum), and the bytes over the path they take: peers inside the NVLink domain
    over NVLink, the others over the scale-out NIC, in parallel (the slower sets the time)."""
    hw, m, o = ctx.hw, ctx.model, ctx.opts
    remote = (lay.ep - 1) / lay.ep
    send = own * m.moe.top_k * remote
    moved = np.maximum(send, recv * remote)
    dispatch_bytes = m.hidden * 1.0 + m.hidden / 128 * 4.0  # FP8 token + per-128 FP32 scales
    combine_bytes = m.hidden * 2.0  # BF16 expert output
    row_bytes = dispatch_bytes + combine_bytes
    far = ep_far_share(hw, lay.ep)
    link = hw.nvlink_bw_bytes_per_s * hw.efficiency.nvlink
    t_bytes = moved * (1.0 - far) * row_bytes / link
    latency = hw.nvlink_latency_s
    if far > 0.0:
        nic = (hw.nic_rdma_bw_bytes_per_s or hw.nvlink_bw_bytes_per_s) * hw.efficiency.rdma
        t_bytes = np.maximum(t_bytes, moved * far * row_bytes / nic)
        latency = max(latency, hw.nic_latency_s)
    barrier = 0.0 if o.sentinel_combine else latency
    straggle = 2.0 * hw.ep_straggler_s * math.sqrt(2.0 * math.log(lay.ep))  # dispatch's and combine's barrier
    t = 2 * latency + barrier + straggle + t_bytes
    reduce = copy_time(hw, own * m.moe.top_k * combine_bytes, dom)  # combine buffer read back
    t = np.where(moved > 0, t + reduce, 0.0)
    p.add("dispatch_combine", t, None, None, times=n_moe)


def ep_far_share(hw: HardwareSpec, ep: int) -> float:
    """Share of a rank's remote copies that leave its NVLink domain (uniform over the other ranks):
    0 inside one domain (NVL72, or EP <= 8 on an HGX node)."""
    near = min(ep, hw.nvlink_domain_gpus)
    return (ep - near) / (ep - 1) if ep > 1 else 0.0
