"""bench/simulator/planner_vs_dynamo.py: the exported trace carries the scenario's requests, and attainment and
GPU-hours from a Dynamo-style report equal a hand computation (the Dynamo run itself only where .venv-peers is)."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

import pytest

from rackserve.sim.scenario import load_scenario
from rackserve.workload.mooncake import read_trace, trace_requests
from rackserve.workload.request import Request

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("planner_vs_dynamo", ROOT / "bench" / "simulator" / "planner_vs_dynamo.py")
pvd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pvd)


def short_step():
    """planner-step.yaml over 12 s, the step up at 4 s: a few hundred requests."""
    base = load_scenario(ROOT / "scenarios" / "planner-step.yaml")
    wl = base.workload.model_copy(update={"lanes_schedule": ((0.0, 4), (4.0, 12), (8.0, 4))})
    sim = base.sim.model_copy(update={"horizon_s": 12.0, "measure_duration_s": 12.0})
    return dataclasses.replace(base.with_workload(wl), sim=sim)


def test_trace_holds_the_scenarios_requests(tmp_path: Path) -> None:
    base = short_step()
    requests = pvd.load_step_requests(base)
    assert requests and all(r.arrival_s < 12.0 for r in requests)
    assert {(r.prompt_tokens, r.output_tokens) for r in requests} == {(8000, 600)}
    at = sorted(r.arrival_s for r in requests)
    assert sum(t == 0.0 for t in at) == 4 and sum(t == 4.0 for t in at) == 8  # the lanes that open at 0 s, 4 s
    path = tmp_path / "t.jsonl"
    pvd.write_trace(pvd.mooncake_records(requests), path)
    back = trace_requests(read_trace(path), 64, base.config.engine.model_id)
    assert len(back) == len(requests)
    assert [(r.prompt_tokens, r.output_tokens) for r in back] == [(r.prompt_tokens, r.output_tokens) for r in requests]
    assert [r.arrival_s for r in back] == pytest.approx(at, abs=1e-6)
    ids = [h for rec in pvd.mooncake_records(requests) for h in rec["hash_ids"]]
    assert len(ids) == len(set(ids)) == 16 * len(requests)  # no block shared, as the uniform prompts


def test_mooncake_records_of_hand_made_requests() -> None:
    reqs = [Request(0, 0.0, 1000, 5, ()), Request(1, 1.2345678, 512, 2, ())]
    assert pvd.mooncake_records(reqs) == [
        {"timestamp": 0.0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 1234.568, "input_length": 512, "output_length": 2, "hash_ids": [2]}]


def test_attainment_from_a_dynamo_style_report() -> None:
    recs = [
        {"arrival_time_ms": 0, "first_token_ms": 400, "last_token_ms": 400 + 99 * 10, "output_length": 100},  # ok
        {"arrival_time_ms": 0, "first_token_ms": 600, "last_token_ms": 600 + 99 * 10, "output_length": 100},  # TTFT
        {"arrival_time_ms": 0, "first_token_ms": 100, "last_token_ms": 100 + 99 * 30, "output_length": 100},  # ITL
        {"arrival_time_ms": 0, "first_token_ms": 100, "last_token_ms": 100, "output_length": 1},  # ok, no ITL
        {"arrival_time_ms": 0, "first_token_ms": 100, "last_token_ms": 20_000, "output_length": 10},  # after window
        {"arrival_time_ms": 0, "first_token_ms": None, "last_token_ms": None, "output_length": 10},  # unfinished
    ]
    got = pvd.attainment(recs, 0.5, 0.02, 10.0)
    assert got == {"requests": 4, "ttft_attainment": 3 / 4, "itl_attainment": 3 / 4, "sla_attainment": 2 / 4}
    assert math.isnan(pvd.attainment([], 0.5, 0.02, 10.0)["sla_attainment"])


def test_gpu_hours_of_a_worker_timeline() -> None:
    timeline = [(0.0, 1, 1), (60.0, 2, 1), (120.0, 2, 2), (600.0, 1, 1)]  # the last one after the window
    got = pvd.gpu_hours(timeline, (2, 8), (0.0, 480.0))
    seconds = 10 * 60 + 12 * 60 + 20 * 360
    assert got["gpu_hours"] == pytest.approx(seconds / 3600)
    assert got["mean_gpus"] == pytest.approx(seconds / 480)


def test_decisions_are_the_next_ticks_plans() -> None:
    tl = {"t_s": [15, 30, 45], "prefill_planned": [1, 2, 3], "decode_planned": [1, 1, 2]}
    assert pvd.decisions(tl) == [(15, 2, 1), (30, 3, 2)]


@pytest.mark.skipif(not pvd.PEERS_PY.exists(), reason="no .venv-peers (Dynamo's replay)")
def test_dynamo_replay_of_a_tiny_trace(tmp_path: Path) -> None:
    base = short_step()
    trace, profile = tmp_path / "t.jsonl", tmp_path / "p.npz"
    reqs = [Request(i, 0.5 * i, 8000, 20, ()) for i in range(6)]
    pvd.write_trace(pvd.mooncake_records(reqs), trace)
    workers = pvd.mocker_profile(base, profile)
    job = {"trace": str(trace), "profile": str(profile), "workers": workers, "sample_s": 1.0, "window_end_s": 12.0,
           "startup_s": {"prefill": 1.0, "decode": 1.0}, "runs": [{"name": "fixed-1x1", "initial": [1, 1]}]}
    res = pvd.run_dynamo(job)["fixed-1x1"]
    got = pvd.attainment(res["per_request"], 0.5, 0.02, 12.0)
    assert got["requests"] == 6 and got["sla_attainment"] == 1.0
