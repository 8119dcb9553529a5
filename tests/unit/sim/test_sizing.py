"""The simulator's sizes of a scenario (rackserve/sim/sizing.py)."""

from __future__ import annotations

from rackserve.sim.run import timing_for
from rackserve.sim.scenario import scenario_from_dict
from rackserve.sim.sizing import prefill_chunk_tokens, size_scenario


def _scenario(sim: dict):
    return scenario_from_dict({
        "deployment": {"prefill": [{"layout": "dep2", "count": 1}], "decode": [{"layout": "tp8", "count": 1}]},
        "sim": sim,
        "workload": {"kind": "uniform", "requests": 1, "prompt_tokens": 10, "output_tokens": 1},
    })


def test_the_chunk_is_a_scenario_knob_and_the_router_prices_with_it():
    """Issue 31 item 4: the engine's prefill chunk (max_num_batched_tokens, or the prefill override)
    caps the prefill step and is the router's reference step (it was a fixed 16,384 the cap never
    allowed)."""
    for sim, chunk in (({}, 8192), ({"max_num_batched_tokens": 4096}, 4096),
                       ({"max_num_batched_tokens": 4096, "prefill_chunk_tokens": 2048}, 2048)):
        sc = _scenario(sim)
        assert prefill_chunk_tokens(sc.sim) == chunk
        assert size_scenario(sc).prefill_chunk_tokens == chunk
        assert timing_for(sc).timing.reference_chunk_tokens == chunk


def test_decode_keeps_the_workloads_p99_and_sizing_says_both():
    """Issue 31 item 5: decode ranks keep what the workload holds at its P99 (lanes per decode rank
    x the workload's context, a normal approximation of the sum) and lend the rest to the pool;
    sizing reports the kept, the worst-case slots and the estimate."""
    import math

    from rackserve.sim.sizing import (
        TRACE_CONTEXT_MEAN,
        TRACE_CONTEXT_SD,
        Z_P99,
        decode_held_estimate,
    )
    from rackserve.workload.spec import parse_workload

    uniform = parse_workload({"kind": "uniform", "concurrency": 512, "requests": 1, "prompt_tokens": 1024,
                              "output_tokens": 1024})
    assert decode_held_estimate(uniform, 16, 1024) == (32, 32 * 2048)
    trace = parse_workload({"kind": "agentx-trace", "concurrency": 4096})
    n = math.ceil(4096 / 48)
    assert decode_held_estimate(trace, 48, 1024) == (n, int(n * TRACE_CONTEXT_MEAN + Z_P99 * math.sqrt(n) * TRACE_CONTEXT_SD))
    moon = parse_workload({"kind": "mooncake", "trace": "x.jsonl"})
    assert decode_held_estimate(moon, 48, 1024) is None  # open loop: no lanes, the worst case is kept
    rack = scenario_from_dict({
        "deployment": {"prefill": [{"layout": "dep2", "count": 12}], "decode": [{"layout": "wide-ep", "ranks": 48, "count": 1}]},
        "workload": {"kind": "agentx-trace", "concurrency": 4096}})
    dec = size_scenario(rack).to_dict()["decode"][0]
    assert dec["kept_gb"] < 20 < 180 < dec["worst_case_slots_gb"] and dec["held_p99_estimate_gb"] == dec["kept_gb"]
    assert dec["lent_gb"] > 150  # was ~55 GB per GPU lent to the pool


def test_a_short_hbm_decode_rank_admits_by_kv_not_by_worst_case_slots():
    """Issue 31 item 5, the issue's case: deepseek-v3 on gb200 (wide-ep 8 prefill + wide-ep 16
    decode, uniform 1k/1k at 512 lanes) got max_num_seqs 13 per decode rank from 200k-token slots, so
    the lanes queued for decode (TTFT P50 16.5 s, prefill 6% busy, 544 output tok/s/GPU). Admitted
    by KV tokens, with max_num_seqs a cap: TTFT P50 0.3 s, 1,212 output tok/s/GPU."""
    from rackserve.sim.run import simulate

    sc = scenario_from_dict({
        "timing": {"hardware": "gb200", "model": "deepseek-v3", "optimizations": "baseline"},
        "deployment": {"prefill": [{"layout": "wide-ep", "ranks": 8, "count": 1}],
                       "decode": [{"layout": "wide-ep", "ranks": 16, "count": 1}]},
        "workload": {"kind": "uniform", "concurrency": 512, "requests": 1024, "prompt_tokens": 1024,
                     "output_tokens": 1024}})
    sz = size_scenario(sc)
    assert sz.decode_max_seqs == (1024,) and sz.decode_kv_tokens[0] >= 32 * 2048
    res = simulate(sc)
    assert res.completed == 1024 and res.ttft_p50_s < 1.0
    assert res.decode_load["seqs_per_rank_max"] > 13 and res.decode_load["admission_waits"] == 0


def test_paged_decode_counts_blocks_of_the_derived_budget():
    """sim.decode_paged: decode ranks count KV blocks of the derived budget and preempt when they
    run out (vLLM's paged admission, step by step), instead of the lazy batch's reservation."""
    from rackserve.sim.run import simulate, source_factory, timing_for
    from rackserve.sim.simulator import Simulator

    base = {"timing": {"hardware": "gb200", "model": "deepseek-v3", "optimizations": "baseline"},
            "deployment": {"prefill": [{"layout": "wide-ep", "ranks": 8, "count": 1}],
                           "decode": [{"layout": "wide-ep", "ranks": 16, "count": 1}]},
            "workload": {"kind": "uniform", "concurrency": 64, "requests": 128, "prompt_tokens": 1024,
                         "output_tokens": 256}}
    paged = scenario_from_dict({**base, "sim": {"decode_paged": True}})
    sim = Simulator(paged, timing_for(paged), "least-uncached-work", source_factory(paged)())
    kv = sim.decode[0].ranks[0].kv
    assert kv is not None and kv.num_free_blocks == size_scenario(paged).decode_kv_tokens[0] // 64
    assert simulate(paged).completed == simulate(scenario_from_dict(base)).completed == 128
