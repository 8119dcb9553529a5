"""rackserve/sim/aggregated.py: aggregated instances prefill and decode in the same lockstep steps,
priced by the real cost model, with TensorRT-LLM's attention-DP balance."""

from __future__ import annotations

import pytest

from rackserve.sched.output import ScheduledSeq, SchedulerOutput
from rackserve.sim.aggregated import AggregatedSimulator, mixed_cost
from rackserve.sim.run import simulate, simulator_for, timing_for
from rackserve.sim.scenario import scenario_from_dict
from rackserve.timing.batch import RankBatch, StepBatch
from rackserve.timing.spec import load_model
from rackserve.timing.speculative import with_drafts
from rackserve.timing.timing_model import TimingModel

TIMING = {"hardware": "b200", "model": "deepseek-v3", "optimizations": "baseline,-mtp", "expert_precision": "nvfp4"}


def agg(ranks=8, sim=None, timing=None, **workload):
    wl = {"kind": "uniform", "seed": 0, "concurrency": 64, "requests": 256, "prompt_tokens": 4096,
          "output_tokens": 256, "length_spread": 0.2, **workload}
    return scenario_from_dict({"timing": {**TIMING, **(timing or {})},
                               "deployment": {"aggregated": [{"layout": "dep", "ranks": ranks}]},
                               "sim": sim or {}, "workload": wl})


def test_an_aggregated_deployment_is_one_or_the_other():
    sc = agg()
    assert sc.config.deployment.prefill == [] and sc.config.deployment.decode == []
    assert sc.gpus == 8 and simulator_for(sc) is AggregatedSimulator
    with pytest.raises(ValueError, match="aggregated: serves alone; drop prefill"):
        scenario_from_dict({"deployment": {"aggregated": [{"layout": "dep", "ranks": 8}],
                                           "prefill": [{"layout": "dep2"}]},
                            "workload": {"kind": "uniform", "requests": 1, "prompt_tokens": 8, "output_tokens": 2}})
    with pytest.raises(ValueError, match="sim.adp_balance_timeout_iters"):
        agg(sim={"adp_balance_timeout_iters": -1})


def test_every_request_finishes_with_its_tokens_counted():
    res = simulate(agg())
    assert res.completed == 256 and res.rejected == 0 and res.valid
    # closed loop of 80-100% lengths: every prompt and output token is counted once
    assert res.throughput_per_gpu * res.span_s * 8 == pytest.approx(256 * (0.9 * 4096 + 0.9 * 256), rel=0.02)
    assert res.ttft_p50_s > 0 and res.tpot_p50_s > 0


def test_one_stream_is_its_prefill_step_then_its_decode_steps():
    """Concurrency 1 on one rank: TTFT is the prompt's prefill step; every later token a decode step of
    one sequence at its context (the leap prices at the leap's middle context: within 0.1%)."""
    sc = agg(ranks=8, concurrency=1, requests=1, prompt_tokens=3000, output_tokens=200, length_spread=0.0)
    tm = TimingModel.from_section(sc.config.timing)
    lay = tm.layout("dep", 8)
    res = simulate(sc, timing=timing_for(sc))
    idle = (RankBatch.of([]),) * 7
    prefill = tm.step_time("prefill", lay, StepBatch((RankBatch.of([3000], [0]), *idle))).total_s
    decode = sum(tm.decode_token_time(lay, StepBatch((RankBatch.of([1], [3000 + k]), *idle))).total_s
                 for k in range(199))
    assert res.ttft_p50_s == pytest.approx(prefill, rel=0.05)  # the step memo's 5% grid
    assert res.tpot_p50_s * 199 == pytest.approx(decode, rel=0.05)


def test_a_mixed_step_is_the_decode_step_plus_what_the_chunk_adds():
    sc = agg()
    timing = timing_for(sc)
    lay = timing.layout("dep", 8)
    dec = [ScheduledSeq(i, 1, 5000) for i in range(16)]
    only = [SchedulerOutput(1, tuple(dec))] * 8
    mixed = [SchedulerOutput(1, (*dec, ScheduledSeq(99, 4000, 0)))] + only[1:]
    base = mixed_cost(timing, lay, only)
    step = mixed_cost(timing, lay, mixed)
    assert base.total_s == pytest.approx(timing.decode_token_time(lay, StepBatch((RankBatch.of([1] * 16, [5000] * 16),) * 8)).total_s)
    extra = step.total_s - base.total_s
    chunk_alone = timing.step_time("prefill", lay, StepBatch((RankBatch.of([4000], [0]),) + (RankBatch.of([]),) * 7)).total_s
    assert 0.3 * chunk_alone < extra < chunk_alone  # the chunk's work beside the decodes, not a second weight read
    assert step.breakdown["prefill_chunks"] == pytest.approx(extra)
    assert max(step.rank_busy_s) <= step.total_s + 1e-12
    assert step.rank_busy_s[0] > step.rank_busy_s[1]  # the rank with the prompt is the slow one


def test_adp_balance_trades_ttft_for_throughput():
    """Prompts held until every rank has one stall the lockstep decodes once, not once per rank
    (TensorRT-LLM tech blog 10): more throughput per GPU and faster decode, longer TTFT."""
    off = simulate(agg(concurrency=128, requests=512, prompt_tokens=8192, output_tokens=512))
    on = simulate(agg(sim={"adp_balance_timeout_iters": 60}, concurrency=128, requests=512, prompt_tokens=8192,
                      output_tokens=512))
    assert on.throughput_per_gpu > 1.05 * off.throughput_per_gpu
    assert on.tpot_p50_s < off.tpot_p50_s
    assert on.ttft_p50_s > off.ttft_p50_s
    assert on.prefill_idle_frac < off.prefill_idle_frac  # ranks wait less for one rank's prompt


def test_the_token_budget_and_batch_limit_bind():
    small = simulate(agg(sim={"max_num_batched_tokens": 2048}, concurrency=32, requests=64))
    big = simulate(agg(sim={"max_num_batched_tokens": 16384}, concurrency=32, requests=64))
    assert small.ttft_p50_s > big.ttft_p50_s  # a 4k prompt takes two chunks of 2048
    capped = simulate(agg(sim={"decode_max_batch_seqs": 2}, concurrency=64, requests=128))
    free = simulate(agg(concurrency=64, requests=128))
    assert capped.ttft_p90_s > free.ttft_p90_s  # lanes wait for a slot
    assert capped.completed == free.completed == 128


def test_drafts_cut_the_models_mtp_positions_keeping_the_pinned_discount():
    v3 = load_model("deepseek-v3")
    one = with_drafts(v3, 1)
    assert one.mtp.block_tokens == 2 and len(one.mtp.acceptance) == 1 and one.mtp.acceptance_length is None
    full = TimingModel.create("h200", "deepseek-v3", "baseline")
    cut = TimingModel.create("h200", "deepseek-v3", "baseline", drafts=1)
    assert full.speculation.verify_tokens == 4 and cut.speculation.verify_tokens == 2
    assert cut.expected_accepted_tokens() == pytest.approx(1.0 + full.speculation.acceptance[0])
    assert with_drafts(v3, 3) is v3
    with pytest.raises(ValueError, match="speculative.drafts"):
        with_drafts(v3, 4)
    sc = agg(timing={"optimizations": "baseline", "speculative": {"drafts": 1}})
    assert timing_for(sc).speculation.verify_tokens == 2


def test_rackserve_sim_runs_an_aggregated_scenario(tmp_path):
    import json

    import yaml
    from typer.testing import CliRunner

    from rackserve.cli import app

    path = tmp_path / "agg.yaml"
    path.write_text(yaml.safe_dump({"name": "agg", "timing": TIMING,
                                    "deployment": {"aggregated": [{"layout": "dep", "ranks": 8}]},
                                    "sim": {"adp_balance_timeout_iters": 60},
                                    "workload": {"kind": "uniform", "concurrency": 32, "requests": 64,
                                                 "prompt_tokens": 2048, "output_tokens": 64}}))
    res = CliRunner().invoke(app, ["sim", str(path), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "out" / "agg.json").read_text())
    run = doc["results"][0] if "results" in doc else doc["runs"][0]
    assert run["completed"] == 64 and run["sizing"]["aggregated"] is True
    assert 0 < run["decode_load"]["seqs_per_rank_mean"] <= 4  # 32 lanes over 8 ranks
