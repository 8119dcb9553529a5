"""Capacity from the specs, checked against a hand computation from REFERENCE.md's numbers."""

import pytest

from rackserve.sim.scenario import scenario_from_dict
from rackserve.sim.sizing import size_scenario
from rackserve.timing.capacity import derive_capacity
from rackserve.timing.layout import make_layout
from rackserve.timing.spec import load_hardware, load_model

MODEL = load_model("deepseek-v4.1-flash")
VR200 = load_hardware("vr200")

# Hand computation for one DEP2 GPU of DeepSeek-V4.1-Flash (REFERENCE "config"):
PROJ_PER_LAYER = (5120 * 1280 + 1280 * 32768 + 5120 * 512 + 8 * 4096 * 1024 + 8192 * 5120  # attention
                  + 1280 * 4096 + 5120 * 128 + 5120 * 32)  # indexer (q, k, head weights), FP8
ROUTED = 40 * 384 * 18_800_640  # FP4 routed experts, all layers
SHARED = 40 * 3 * 5120 * 2304  # the shared expert, FP8
VOCAB = 2 * 129_280 * 5120 * 2  # embedding + LM head, BF16
DEP2_WEIGHTS = 40 * PROJ_PER_LAYER + ROUTED / 2 + SHARED + VOCAB
ENGRAM = (384_006_168 + 384_016_682) * 264
WORKSPACE = 0.1 * 288e9 + 8192 * (2 * 4 * 5120 * 2 + 6 * 2 * 2304)  # vLLM 0.9 utilization + one step
RACK = [(make_layout("dep2"), 12)], [(make_layout("wide-ep", 48), 1)]


def test_dep2_rank_matches_the_hand_computation():
    cap = derive_capacity(MODEL, VR200, *RACK)
    pre = cap.prefill[0]
    assert pre.memory.weights_bytes == pytest.approx(DEP2_WEIGHTS, rel=1e-9)
    assert pre.memory.engram_bytes == pytest.approx(ENGRAM / 72, rel=1e-9)
    kv = 288e9 - DEP2_WEIGHTS - ENGRAM / 72 - WORKSPACE
    assert pre.memory.kv_bytes == pytest.approx(kv, rel=1e-9)
    assert pre.kv_tokens == int((kv - 1024 * 2.7e6) // MODEL.kv_bytes_per_token)
    assert 100e6 < pre.kv_tokens < 120e6  # ~111M tokens of prefix cache per DEP2 rank


def test_decode_ranks_lend_what_their_batch_budget_leaves_and_dram_is_per_tray():
    cap = derive_capacity(MODEL, VR200, *RACK)
    dec = cap.decode[0]
    weights = 40 * PROJ_PER_LAYER + ROUTED / 48 + SHARED + VOCAB
    kv = 288e9 - weights - ENGRAM / 72 - WORKSPACE
    slot = 2.7e6 + 200_000 * MODEL.kv_bytes_per_token
    assert dec.max_num_seqs == 1024  # vLLM default binds before memory does
    assert dec.lent_bytes == pytest.approx(kv - 1024 * slot, rel=1e-9)
    assert cap.pool_hbm.capacity_bytes == pytest.approx(48 * (kv - 1024 * slot), rel=1e-9)
    assert cap.pool_dram.capacity_bytes == pytest.approx(18 * 3.0e12 * 0.9)  # 18 trays x 2 Vera CPUs x 1.5 TB
    assert cap.pool_dram.port_bw_bytes_per_s == 2.0e11  # ConnectX-9 1.6 Tb/s


def test_a_deployment_that_does_not_fit_says_what_and_by_how_much():
    with pytest.raises(ValueError, match=r"deployment.prefill\[0\]: does not fit on h200: dep2 .* short by 158\.\d GB"):
        derive_capacity(MODEL, load_hardware("h200"), *RACK)


def test_short_hbm_limits_the_decode_batch_by_memory():
    """186 GB: memory binds before 1024 worst-case slots. Since issue 31 it binds through the KV
    budget the scheduler admits against (tokens, as vLLM's free blocks), not by cutting max_num_seqs,
    which stays a cap (it was 13 x 200k-token slots for deepseek-v3 on gb200)."""
    cap = derive_capacity(MODEL, load_hardware("gb200"), *RACK)
    dec = cap.decode[0]
    assert dec.max_num_seqs == 1024
    assert dec.kv_tokens * MODEL.kv_bytes_per_token <= dec.memory.kv_bytes < dec.worst_case_slots_bytes
    assert dec.lent_bytes == 0.0 and dec.held_estimate_bytes is None


def test_decode_ranks_keep_what_the_workload_holds_and_lend_the_rest():
    """Issue 31 item 5: with the workload's P99 holding known, a decode rank keeps that (at least one
    slot) and lends the rest; the worst case of max_num_seqs slots is reported, not reserved."""
    from dataclasses import replace

    from rackserve.timing.capacity import Limits

    held = replace(Limits(), decode_held_seqs=100, decode_held_tokens=12_000_000)
    worst = derive_capacity(MODEL, VR200, *RACK).decode[0]
    dec = derive_capacity(MODEL, VR200, *RACK, held).decode[0]
    kept = 12_000_000 * MODEL.kv_bytes_per_token + 100 * MODEL.window_buffer_bytes
    assert dec.held_estimate_bytes == pytest.approx(kept)
    assert dec.lent_bytes == pytest.approx(dec.memory.kv_bytes - kept)
    assert dec.lent_bytes > worst.lent_bytes + 100e9  # was ~55 GB of ~240 GB
    assert dec.kv_tokens == int((kept - 100 * MODEL.window_buffer_bytes) // MODEL.kv_bytes_per_token)
    assert dec.worst_case_slots_bytes == worst.worst_case_slots_bytes and dec.max_num_seqs == 1024
    d = dec.to_dict()
    assert d["kept_gb"] == pytest.approx(kept / 1e9) and d["worst_case_slots_gb"] > 180


BASE = {"deployment": {"prefill": [{"layout": "dep2", "count": 12}],
                       "decode": [{"layout": "wide-ep", "ranks": 48, "count": 1}]},
        "workload": {"kind": "uniform", "requests": 1, "prompt_tokens": 10, "output_tokens": 1}}


def test_scenario_sizes_are_derived_unless_overridden():
    derived = size_scenario(scenario_from_dict(BASE))
    assert derived.overrides == ()
    assert derived.prefill_chunk_tokens == 8192 and derived.decode_max_seqs == (1024,)
    assert derived.prefill_cache_tokens[0] == derive_capacity(MODEL, VR200, *RACK).prefill[0].kv_tokens
    over = size_scenario(scenario_from_dict({**BASE, "sim": {"rank_cache_tokens": 5000},
                                             "pool": {"hbm_capacity_bytes": 7}}))
    assert over.prefill_cache_tokens == (5000,) and over.pool_hbm.capacity_bytes == 7
    assert set(over.overrides) == {"sim.rank_cache_tokens", "pool.hbm_capacity_bytes"}
