"""rackserve/timing/layout.py and the physics that depends on the layout: general dep / tep layouts,
experts split moe_tp ways, EP dispatch across NVLink domains and the barrier wait, precision per tensor
group, prefill attention widths, the P/D hand-off path, the per-step host work."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rackserve.timing import TimingModel
from rackserve.timing.capacity import weights_bytes_per_gpu
from rackserve.timing.layout import make_layout, parse_layout_key
from rackserve.timing.moe_cost import ep_far_share
from rackserve.timing.spec import load_hardware, load_model

from .conftest import bare, decode_step, prefill_step


def test_general_layouts_and_their_keys():
    dep = make_layout("dep", 16)
    assert (dep.dp, dep.tp, dep.ep, dep.expert_tp, dep.dispatches) == (16, 1, 16, 1, True)
    tep = make_layout("tep", 8)
    assert (tep.dp, tep.tp, tep.ep, tep.expert_tp, tep.dispatches) == (1, 8, 8, 1, False)
    split = make_layout("tep", 8, moe_tp=4)
    assert (split.ep, split.expert_tp, split.key) == (2, 4, "tep8-moetp4")
    big = make_layout("dep", 144)  # DeepSeek's EP144 decode unit spans 18 nodes
    assert big.gpus == 144
    for lay in (dep, tep, split, big, make_layout("wide-ep", 16), make_layout("dep2"), make_layout("tp8")):
        assert parse_layout_key(lay.key) == lay
    with pytest.raises(ValueError, match="moe_tp"):
        make_layout("dep", 8, moe_tp=3)
    with pytest.raises(ValueError, match="ranks"):
        make_layout("tep")


def test_dep_inside_one_nvl72_prices_as_wide_ep():
    tm = TimingModel.create("gb200", "deepseek-v3", "baseline,-mtp")
    batch = decode_step(16, 64, 2048)
    assert tm.step_time("decode", tm.layout("dep", 16), batch).total_s == pytest.approx(
        tm.step_time("decode", tm.layout("wide-ep", 16), batch).total_s, rel=1e-12)


def test_attention_tp_with_expert_parallel_moe_has_no_dispatch_and_splits_experts_by_ep():
    tm = TimingModel.create("h200", "deepseek-v3", "baseline,-mtp")
    tep = tm.step_time("decode", tm.layout("tep", 8), decode_step(1, 64, 2048))
    assert "dispatch_combine" not in tep.breakdown and tep.breakdown["all_reduce"] > 0
    model, hw = load_model("deepseek-v3"), load_hardware("h200")
    # experts whole on 8 ranks (EP8) hold the same routed bytes per GPU as each expert split 8 ways (TP8)
    assert weights_bytes_per_gpu(model, hw, make_layout("tep", 8)) == pytest.approx(
        weights_bytes_per_gpu(model, hw, make_layout("tp8")), rel=1e-12)
    # TP4 x EP2: each GPU holds half the experts, each a quarter of its columns: the same bytes again
    assert weights_bytes_per_gpu(model, hw, make_layout("tep", 8, moe_tp=4)) == pytest.approx(
        weights_bytes_per_gpu(model, hw, make_layout("tp8")), rel=1e-12)


def test_ep_beyond_the_nvlink_domain_pays_the_nic():
    h100 = load_hardware("h100")
    assert ep_far_share(h100, 8) == 0.0
    assert ep_far_share(h100, 16) == pytest.approx(8 / 15)
    assert ep_far_share(load_hardware("gb200"), 72) == 0.0
    tm = bare(TimingModel.create("h100", "deepseek-v3", "baseline,-mtp,-two-batch-overlap"))
    one_node = tm.step_time("decode", tm.layout("dep", 8), decode_step(8, 128, 2048)).breakdown["dispatch_combine"]
    two_nodes = tm.step_time("decode", tm.layout("dep", 16), decode_step(16, 128, 2048)).breakdown["dispatch_combine"]
    # the same tokens per rank, but 8/15 of the copies now cross a 50 GB/s NIC instead of 450 GB/s NVLink
    assert two_nodes > 3 * one_node


def test_every_ep_barrier_waits_for_the_slowest_rank():
    base = bare(TimingModel.create("gb200", "deepseek-v3", "baseline,-mtp,-two-batch-overlap"))
    jitter = 20e-6
    tm = base.with_hardware(base.hardware.model_copy(update={"ep_straggler_s": jitter}))
    layers = 61 - 3
    for ep in (8, 32):
        batch = decode_step(ep, 64, 1024)
        lay = tm.layout("dep", ep)
        extra = tm.step_time("decode", lay, batch).breakdown["dispatch_combine"] - base.step_time(
            "decode", lay, batch).breakdown["dispatch_combine"]
        assert extra == pytest.approx(layers * 2 * jitter * math.sqrt(2 * math.log(ep)), rel=1e-9)


def test_expert_precision_rescales_the_experts_and_their_math():
    fp8 = TimingModel.create("gb200", "deepseek-v3", "baseline,-mtp")
    fp4 = TimingModel.create("gb200", "deepseek-v3", "baseline,-mtp", expert_precision="nvfp4")
    assert fp4.model.moe.expert_bytes == pytest.approx(fp8.model.moe.expert_bytes * 0.53125)
    assert (fp4.model.moe.weight_dtype, fp4.model.moe.math_dtype) == ("fp4", "fp4")
    lay = fp8.layout("dep", 8)
    big = prefill_step(8, 8192)  # compute-bound experts: NVFP4 runs at twice FP8's rate
    assert fp4.step_time("prefill", lay, big).breakdown["moe_gemm"] < 0.6 * fp8.step_time("prefill", lay, big).breakdown["moe_gemm"]
    with pytest.raises(ValueError, match="expert_precision"):
        TimingModel.create("gb200", "deepseek-v3", expert_precision="int3")
    fp8_attn = TimingModel.create("gb200", "deepseek-v3", "baseline,-mtp", attention_math="fp8")
    long = decode_step(8, 256, 8192)
    assert fp8_attn.step_time("decode", lay, long).breakdown["attention"] < fp8.step_time("decode", lay, long).breakdown["attention"]


def test_mla_prefill_runs_the_non_absorbed_widths():
    v3 = load_model("deepseek-v3").attention
    assert v3.flops_per_entry("prefill", 1) == 2 * 128 * (192 + 128)
    assert v3.flops_per_entry("decode", 1) == 2 * 128 * (576 + 512)
    v4 = load_model("deepseek-v4.1-flash").attention  # one shared K=V head: no other form
    assert v4.flops_per_entry("prefill", 8) == v4.flops_per_entry("decode", 8)
    tm = TimingModel.create("h200", "deepseek-v3", "baseline,-mtp")
    lay = tm.layout("dep", 8)
    fast, ref = (tm.step_time("prefill", lay, prefill_step(8, 8192)),
                 tm.step_time_reference("prefill", lay, prefill_step(8, 8192)))
    assert fast.breakdown["attention"] == pytest.approx(ref.breakdown["attention"], rel=1e-9)
    # an 8k-token prompt's attention FLOPs at the prefill widths, at the attention roofline's rate
    flops = 61 * v3.flops_per_entry("prefill", 1) * 8192 * 8193 / 2
    rate = tm.hardware.peak("bf16") * tm.hardware.efficiency.attention_compute
    assert fast.breakdown["attention"] == pytest.approx(flops / rate, rel=0.05)


def test_the_pd_hand_off_between_hgx_nodes_goes_over_the_nic():
    h200 = TimingModel.create("h200", "deepseek-v3", "baseline")
    gb200 = TimingModel.create("gb200", "deepseek-v3", "baseline")
    bytes_ = 8192 * 40016
    hw = h200.hardware
    assert h200.pd_transfer_s(8192) == pytest.approx(hw.nic_latency_s + bytes_ / (hw.nic_rdma_bw_bytes_per_s * hw.efficiency.rdma))
    link = gb200.hardware.nvlink_bw_bytes_per_s * gb200.hardware.efficiency.nvlink
    assert gb200.pd_transfer_s(8192) == pytest.approx(gb200.hardware.nvlink_latency_s + bytes_ / link)


def test_host_work_is_charged_once_per_step_and_not_per_draft_pass():
    base = bare(TimingModel.create("gb200", "deepseek-v3", "baseline"))
    host = 1e-3
    tm = base.with_hardware(base.hardware.model_copy(update={"step_overhead_s": host}))
    lay = tm.layout("dep", 8)
    batch = decode_step(8, 32, 1024)
    assert tm.step_time("decode", lay, batch).breakdown["host_overhead"] == pytest.approx(host)
    spec = tm.verify_step_time(lay, batch)  # verify + 3 draft passes
    plain = base.verify_step_time(lay, batch)
    assert spec.total_s - plain.total_s == pytest.approx(host, rel=1e-6)
    assert np.isclose(tm.step_time("prefill", lay, prefill_step(8, 4096)).breakdown["host_overhead"], host)
