"""A layer group's token bundle in one C call (timing/_pricer.c `bundle`): what step_cost.token_bundle's
components (attention_cost.token_attention, moe_cost.moe_part, lm_head, host_overhead, engram) read of
the specs folded once per (context, layout, phase, layer group) into named constants, then the per-rank
arithmetic over the token counts compiled. step_cost.token_bundle stays the reference (its numpy twin,
and what runs where the extension is not built or a group has an expert load); the two agree to rounding
(tests/unit/timing/test_pricer.py holds them to 1e-12 relative).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rackserve.timing.attention_cost import projections
from rackserve.timing.engram_placement import HOST_COPY, host_fetch_bw
from rackserve.timing.layout import Layout
from rackserve.timing.moe_cost import SMALL_ROWS, ep_far_share
from rackserve.timing.parts import MOE_PART, Bundle, Parts, label
from rackserve.timing.roofline import (
    MAX_MEMORY_EFFICIENCY,
    _gemm_constants,
    domain_bw_factor,
    pipeline_bw_scale,
)
from rackserve.timing.spec import DTYPE_BYTES

try:  # built by `pip install -e .` (setup.py)
    from rackserve.timing import _pricer
except ImportError:  # pragma: no cover - exercised where no C compiler is
    _pricer = None

AVAILABLE = _pricer is not None

# _pricer.c's B_* slots, in its order
SLOTS = ("ko sms persm nproj mhc mhc_f0 mhc_f1 mhc_f2 mhc_f3 mhc_f4 mhc_kk mhc_den mhc_times ar ar_hid ar_alpha "
         "ar_c1 ar_link ar_oneshot ar_oka ar_rm1 ar_olink ar_times dense_times nmoe topk ep disp pre tile mega "
         "gg_n gg_k gg_peak gg_bw gg_eb gg_etp gg_act gate_c gate_vf sh sh_routed sh_packed sh_small dc dc_remote "
         "dc_far dc_row dc_link dc_nic dc_c dc_comb dc_den lm lm_seqs host eng_n eng_layers eng_lat eng_bytes "
         "eng_den").split()
ENGRAM_LAYERS_MAX = 8  # B_ENG_L0's slots
# _pricer.c's components (C_*), in its order, and which of (t, tc, tm) each has
COMPONENTS = ("attn_proj", "mhc", "all_reduce", "dense_mlp", "moe_gemm", "gate", "shared_expert", "dispatch_combine",
              "lm_head", "host_overhead", "engram")
HAS = {"attn_proj": (1, 1, 1), "mhc": (1, 0, 1), "all_reduce": (1, 0, 0), "dispatch_combine": (1, 0, 0),
       "host_overhead": (1, 0, 0), "engram": (1, 0, 0)}
_MOE = frozenset(MOE_PART)


@dataclass(frozen=True)
class BundlePlan:
    """One layer group's packed constants: `scal` (SLOTS, then the engram layers), `gemms` [G, 9]."""

    scal: np.ndarray
    gemms: np.ndarray
    dp: int


def _gemm_row(hw, n, k, weight_dtype, groups=1, split_k=False, domain=1.0):
    """roofline.gemm_time's row-independent constants (_pricer.c's G_* columns, times 1) of each of its
    matrices (n, k: scalars or columns [M, 1], as gemm_time takes them): rows [M, 9]."""
    c = _gemm_constants(hw, n, k, weight_dtype, None, groups, split_k, domain)
    cols = (c.flops_per_row, c.weight_bytes, c.bytes_per_row, c.col_tiles, c.split_ctas, c.bw_cap,
            math.nan if c.bw is None else c.bw, c.peak, 1.0)
    return np.stack([np.ravel(x) for x in np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in cols))],
                    axis=-1).reshape(-1, 9)


def supported(lay: Layout) -> bool:
    """Layouts the compiled bundle prices: every DP rank's MoE load the mean (dp <= ep, or no EP)."""
    return lay.ep == 1 or lay.dp <= lay.ep


def build(ctx, lay: Layout, phase: str, lg, gi: int) -> BundlePlan:
    hw, m, o = ctx.hw, ctx.model, ctx.opts
    s = dict.fromkeys(SLOTS, 0.0)
    ua = hw.microarch
    s.update(ko=ua.kernel_overhead_s, sms=hw.sm_count, persm=ua.per_sm_bw_bytes_per_s)
    layers = lg.layers[gi]
    # attention_cost.token_attention
    n, k, groups, times = projections(ctx, lay.tp, lg, gi)
    proj = _gemm_row(hw, n, k, m.dense_dtype, groups, o.split_k, domain_bw_factor(hw, False))
    proj[:, 8] = np.asarray(times, dtype=np.float64).ravel()
    s["nproj"] = proj.shape[0]
    if m.mhc:
        fused = o.fused_ar_mhc and lay.tp > 1
        passes = max(1, m.mhc.passes_per_sublayer - 2) if fused else m.mhc.passes_per_sublayer
        s.update(mhc=1.0, mhc_f0=m.mhc.streams, mhc_f1=m.hidden, mhc_f2=m.mhc.elem_bytes, mhc_f3=passes, mhc_f4=2,
                 mhc_kk=(0 if fused else 2) * ua.kernel_overhead_s,
                 mhc_den=hw.hbm_bw_bytes_per_s * hw.efficiency.hbm * domain_bw_factor(hw, o.domain_local),
                 mhc_times=layers)
    if lay.tp > 1:
        tp, trays = lay.tp, lay.trays
        s.update(ar=1.0, ar_hid=m.hidden, ar_alpha=hw.allreduce_latency_s + (hw.cross_tray_latency_s if trays > 1 else 0.0),
                 ar_c1=2.0 * (tp - 1) / tp, ar_link=hw.nvlink_bw_bytes_per_s * hw.efficiency.nvlink,
                 ar_oneshot=float(bool(o.oneshot_allreduce)),
                 ar_oka=ua.kernel_overhead_s + (hw.oneshot_allreduce_latency_s
                                                + (hw.cross_tray_latency_s if trays > 1 else 0.0)),
                 ar_rm1=tp - 1, ar_olink=hw.nvlink_bw_bytes_per_s * hw.efficiency.nvlink, ar_times=2 * layers)
    fixed = np.zeros((6, 9))
    moe = m.moe
    if lg.dense_layers[gi]:
        inter = moe.dense_intermediate // lay.tp
        fixed[0:2] = _gemm_row(hw, np.array([[2 * inter], [m.hidden]]), np.array([[m.hidden], [inter]]),
                               moe.shared_dtype, 1, o.split_k)
        s["dense_times"] = lg.dense_layers[gi]
    if lg.moe_layers[gi]:
        _moe_constants(ctx, lay, s, fixed)
        s["nmoe"] = lg.moe_layers[gi]
    if gi == 0:
        fixed[5] = _gemm_row(hw, m.vocab // lay.tp, m.hidden, m.lm_head_dtype, 1, o.split_k,
                             domain_bw_factor(hw, o.domain_local))[0]
        s.update(lm=1.0, lm_seqs=float(phase != "decode"))
        if hw.step_overhead_s > 0.0:
            s["host"] = hw.step_overhead_s
    eng = [layer for group, layer in lg.engram if group == gi]
    if m.engram and eng:
        assert len(eng) <= ENGRAM_LAYERS_MAX
        host = ctx.engram_placement == HOST_COPY
        s.update(eng_n=len(eng), eng_layers=m.layers, eng_lat=hw.nvlink_latency_s,
                 eng_bytes=m.engram.rows_per_token * m.engram.row_bytes,
                 eng_den=host_fetch_bw(hw) if host else hw.nvlink_bw_bytes_per_s * hw.efficiency.nvlink)
    scal = np.array([float(s[name]) for name in SLOTS] + [float(x) for x in eng]
                    + [0.0] * (ENGRAM_LAYERS_MAX - len(eng)))
    return BundlePlan(scal, np.ascontiguousarray(np.concatenate([proj, fixed])), lay.dp)


def _moe_constants(ctx, lay: Layout, s: dict, fixed: np.ndarray) -> None:
    """moe_cost._expert_load (no expert load given) and _moe_rank's constants."""
    hw, m, o = ctx.hw, ctx.model, ctx.opts
    moe = m.moe
    dom = domain_bw_factor(hw, o.domain_local)
    math_dt = "fp4" if o.fp8xfp4_k64 and hw.peak_flops.fp4 else (moe.math_dtype or "fp8")
    stages = 11 if (lay.tp > 1 and o.tp8_packed_fp4) else 7
    bw_scale = pipeline_bw_scale(hw, stages)
    inter = moe.intermediate // lay.expert_tp
    eff_mem = min(MAX_MEMORY_EFFICIENCY, hw.efficiency.grouped_memory * bw_scale)
    s.update(topk=moe.top_k, ep=lay.ep, disp=moe.imbalance_dispersion, pre=moe.experts / lay.ep,
             tile=hw.microarch.tile_m, mega=float(bool(o.megamoe_tiles)),
             gg_n=3 * inter, gg_k=m.hidden, gg_peak=hw.peak(math_dt) * hw.efficiency.grouped_compute,
             gg_bw=hw.hbm_bw_bytes_per_s * eff_mem * dom,
             gg_eb=moe.expert_bytes * hw.stored_bytes(moe.weight_dtype) / DTYPE_BYTES[moe.weight_dtype],
             gg_etp=lay.expert_tp,
             gg_act=m.hidden * 1.0 + m.hidden * 2.0 + (0.0 if o.megamoe_tiles else 2.0 * inter),
             gate_c=moe.experts * (moe.megagate_candidate_fraction if o.megagate else 1.0) * moe.gate_flops_per_expert
             + (moe.experts * 2.0 if o.megagate else 0.0),
             gate_vf=hw.peak_flops.vector_fp32)
    fixed[2] = _gemm_row(hw, moe.experts, m.hidden, "bf16", 1, o.split_k)[0]
    if moe.shared_experts:
        sh = moe.shared_experts * moe.intermediate // lay.tp
        fixed[3:5] = _gemm_row(hw, np.array([[2 * sh], [m.hidden]]), np.array([[m.hidden], [sh]]),
                               moe.shared_dtype, 1, o.split_k)
        s.update(sh=1.0, sh_small=SMALL_ROWS)
        if o.shared_in_routed:
            wbytes = 3 * sh * m.hidden * hw.stored_bytes(moe.shared_dtype)
            bw = max(hw.hbm_bw_bytes_per_s * min(MAX_MEMORY_EFFICIENCY, hw.efficiency.grouped_memory * bw_scale) * dom,
                     hw.hbm_bw_bytes_per_s * hw.efficiency.gemm_memory)
            s.update(sh_routed=1.0, sh_packed=wbytes / bw)
    if lay.dispatches:
        far = ep_far_share(hw, lay.ep)
        latency = hw.nvlink_latency_s
        nic = 1.0
        if far > 0.0:
            nic = (hw.nic_rdma_bw_bytes_per_s or hw.nvlink_bw_bytes_per_s) * hw.efficiency.rdma
            latency = max(latency, hw.nic_latency_s)
        barrier = 0.0 if o.sentinel_combine else latency
        straggle = 2.0 * hw.ep_straggler_s * math.sqrt(2.0 * math.log(lay.ep))
        s.update(dc=1.0, dc_remote=(lay.ep - 1) / lay.ep, dc_far=far,
                 dc_row=(m.hidden * 1.0 + m.hidden / 128 * 4.0) + m.hidden * 2.0,
                 dc_link=hw.nvlink_bw_bytes_per_s * hw.efficiency.nvlink, dc_nic=nic,
                 dc_c=2 * latency + barrier + straggle, dc_comb=m.hidden * 2.0,
                 dc_den=hw.hbm_bw_bytes_per_s * hw.efficiency.hbm * dom)


def plan_of(ctx, lay: Layout, phase: str, lg, gi: int) -> BundlePlan:
    """The group's plan, kept in the context's memo."""
    key = ("bundle-plan", lay.key, phase, gi)
    plan = ctx.memo.get(key)
    if plan is None:
        plan = ctx.memo[key] = build(ctx, lay, phase, lg, gi)
    return plan


def compiled_bundle(plan: BundlePlan, tokens: np.ndarray, seqs: np.ndarray) -> Bundle:
    """step_cost.token_bundle's computation (no expert load) by the compiled kernel, as a Bundle."""
    r = plan.dp
    out = np.empty((len(COMPONENTS), 3, r + 1))
    totals = np.empty((2, r))
    mask = _pricer.bundle(out, totals, np.ascontiguousarray(tokens, dtype=np.float64),
                          np.ascontiguousarray(seqs, dtype=np.float64), plan.scal, plan.gemms)
    parts, crit = Parts(r), Parts(1)
    crit_breakdown, crit_bound = {}, {}
    for i, name in enumerate(COMPONENTS):
        if not mask >> i & 1:
            continue
        has = HAS.get(name, (1, 1, 1))
        for acc, k in ((parts.t, 0), (parts.tc, 1), (parts.tm, 2)):
            if has[k]:
                acc[name] = out[i, k, :r]
        if name in _MOE:
            for acc, k in ((crit.t, 0), (crit.tc, 1), (crit.tm, 2)):
                if has[k]:
                    acc[name] = out[i, k, r:]
    for name in MOE_PART:  # parts.Bundle.of's critical-path entries
        if name in crit.t:
            i = COMPONENTS.index(name)
            t, tc, tm = out[i, :, r].tolist()
            crit_breakdown[name] = t
            has = HAS.get(name, (1, 1, 1))
            crit_bound[name] = label(name, {name: tc} if has[1] else {}, {name: tm} if has[2] else {})
    return Bundle(parts, crit, totals[0], totals[1], crit_breakdown, crit_bound)
