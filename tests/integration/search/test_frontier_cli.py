"""`rackserve sim frontier` end to end: screen, replays as real Ray tasks, frontier.json, plot, resume."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
RACK = """
name: tiny
gpus: 12
timing: {hardware: vr200, model: deepseek-v4.1-flash, optimizations: rubin-optimized}
sim: {kv_block_multiple: 16}
workload: {kind: agentx-trace, seed: 0, concurrency: 1, limit: 12, warmup_first: true}
space:
  prefill: [{layout: dep2, counts: [1, 2]}]
  decode: [{layout: tp8, counts: [1]}]
  decode_max_num_seqs: [64, 1024]
search: {window_s: 30, warmup_s: 5, targets: [387, 100000]}
"""


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rackserve.cli", "sim", "frontier", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_frontier_screens_replays_reports_and_resumes(tmp_path):
    rack = tmp_path / "tiny.yaml"
    rack.write_text(RACK)
    out = tmp_path / "out"
    proc = run(str(rack), "--out", str(out), "--budget-cpu-s", "60", "--num-cpus", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads((out / "frontier.json").read_text())
    assert rep["schema"] == "rackserve.sim.frontier/1"
    assert rep["configs_screened"] == 4 and rep["interactivity"] == "e2e" and rep["percentile"] == "p90"
    replays = [p for p in rep["points"] if p["source"] == "replay"]
    assert replays, "the budget allows at least one replay"
    assert all(p["completed"] > 0 and p["config"]["gpus"] in (10, 12) for p in replays)
    assert rep["envelope_source"] == "replay"
    assert rep["at_target"]["100000"] is None  # unreachable: null, not the peak
    assert rep["peak"]["throughput_per_gpu"] == max(p["throughput_per_gpu"] for p in replays)
    assert rep["screen_error"]["per_point"] and rep["cpu_s"]["replay"] > 0
    assert (out / "frontier.png").stat().st_size > 10_000
    # resume: the replayed points are kept and not run again
    proc = run(str(rack), "--out", str(out), "--budget-cpu-s", "0", "--resume", "--num-cpus", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = json.loads((out / "frontier.json").read_text())
    assert sorted((p["config"]["label"], p["concurrency"]) for p in again["points"] if p["source"] == "replay") == \
        sorted((p["config"]["label"], p["concurrency"]) for p in replays)
    run_before = len(replays) + len(rep.get("invalid_points", []))  # invalid replays are kept too
    assert again["resumed_replays"] == run_before and again["wall_s"] > 0
    # another search's replays of the same rack join the envelope (--resume-from), each point once
    other = tmp_path / "other"
    proc = run(str(rack), "--out", str(other), "--budget-cpu-s", "0", "--num-cpus", "1",
               "--resume-from", str(out / "frontier.json"), "--resume-from", str(out / "frontier.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    merged = json.loads((other / "frontier.json").read_text())
    assert merged["resumed_replays"] == run_before
    assert merged["peak"]["throughput_per_gpu"] == rep["peak"]["throughput_per_gpu"]
    # ... but not another rack's
    foreign = json.loads((out / "frontier.json").read_text()) | {"rack": "another"}
    (tmp_path / "foreign.json").write_text(json.dumps(foreign))
    proc = run(str(rack), "--out", str(other), "--screen-only", "--resume-from", str(tmp_path / "foreign.json"))
    assert proc.returncode != 0 and "another" in proc.stderr + proc.stdout


def test_a_bad_option_is_a_clear_error(tmp_path):
    rack = tmp_path / "tiny.yaml"
    rack.write_text(RACK)
    proc = run(str(rack), "--interactivity", "ttft", "--out", str(tmp_path / "o"))
    assert proc.returncode != 0 and "interactivity" in proc.stderr + proc.stdout


def test_the_search_pins_a_target_down_on_the_replayed_curve(tmp_path):
    """After the screen's candidates, refine() replays until the replayed curve of the target's
    winner brackets it closely (or cannot reach it): the first stage alone leaves it to the screen."""
    import yaml

    from rackserve.search.confirm import InProcess
    from rackserve.search.frontier import search
    from rackserve.search.plan import CLOSE
    from rackserve.search.rack import RackSpec

    data = yaml.safe_load(RACK)
    data["search"]["targets"] = [387]
    rack = RackSpec.model_validate(data)
    rep = search(rack, InProcess, budget_cpu_s=400)
    pins = [p for p in rep["points"] if p["source"] == "replay" and p.get("why", "").startswith("pins 387")]
    assert pins, [p.get("why") for p in rep["points"] if p["source"] == "replay"]
    x = "tps_user_e2e_p90"
    label = pins[-1]["config"]["label"]
    pts = sorted((p for p in rep["points"] if p["source"] == "replay" and p["config"]["label"] == label),
                 key=lambda p: p["concurrency"])
    fast = [p["concurrency"] for p in pts if p[x] >= 387]
    slow = [p["concurrency"] for p in pts if p[x] < 387]
    # bracketed within CLOSE in lanes, or one lane is already too slow
    assert (fast and slow and min(s for s in slow if s > max(fast)) <= max(fast) * (1 + CLOSE) + 1) or \
        (not fast and min(slow) == 1), [(p["concurrency"], round(p[x])) for p in pts]
    assert rep["at_target"]["387"] is None or rep["at_target"]["387"]["source"] == "replay"


def test_a_cut_window_is_judged_valid_as_the_racks_window_would_be():
    import yaml

    from rackserve.search.confirm import replay_point
    from rackserve.search.rack import RackSpec, configurations

    rack = RackSpec.model_validate(yaml.safe_load(RACK))
    cfg = configurations(rack)[0].to_dict()
    full = replay_point(rack.model_dump(), cfg, 8)
    cut = replay_point(rack.model_dump(), cfg, 8, window_s=10.0)
    assert "metric_coverage_measured" not in full and full["window_s"] == 30
    assert cut["window_s"] == 10.0 and cut["metric_coverage"] >= cut["metric_coverage_measured"]
    assert cut["valid"] == (cut["metric_coverage"] >= 0.95 and cut["overflow_share"] <= 0.01)


def test_the_budget_is_spent_on_the_cpu_the_replays_measured():
    """The search stops when its replays' *measured* CPU reaches the budget, not their predicted
    cost: replays that cost a quarter of what the plan predicted leave room for more of them."""
    import yaml

    from rackserve.search.confirm import InProcess
    from rackserve.search.frontier import search
    from rackserve.search.rack import RackSpec

    class QuarterCost(InProcess):  # real replays, each booked at a quarter of its prediction
        def run(self, rack, cands):
            for c, row in zip(cands, super().run(rack, cands), strict=True):
                yield row | {"cpu_s": c.est_cpu_s / 4}

    budget = 20.0
    rep = search(RackSpec.model_validate(yaml.safe_load(RACK)), QuarterCost, budget_cpu_s=budget)
    booked = [p["cpu_s"] for p in rep["points"] + rep.get("invalid_points", []) if p["source"] == "replay"]
    # predicted costs within the budget would stop at a quarter of it
    assert budget / 4 < sum(booked) <= budget, booked


def test_replays_on_one_worker_share_the_step_memo_and_not_their_figures():
    """A worker's later replays find the steps its earlier ones priced (rackserve.sim.run.shared_timing):
    the same figures as with a fresh memo, with fewer timing-model evaluations."""
    import yaml

    from rackserve.search.confirm import replay_point
    from rackserve.search.rack import RackSpec, configurations
    from rackserve.sim import run as sim_run

    rack = RackSpec.model_validate(yaml.safe_load(RACK))
    cfgs = [c.to_dict() for c in configurations(rack)]
    a = cfgs[0]
    b = next(c for c in cfgs if c["decode_max_num_seqs"] != a["decode_max_num_seqs"] and c["prefill_count"] ==
             a["prefill_count"])

    def misses() -> int:
        return sum(t.misses for t in sim_run._TIMINGS.values())

    sim_run._TIMINGS.clear()
    fresh = replay_point(rack.model_dump(), b, 8)
    fresh_misses = misses()
    sim_run._TIMINGS.clear()
    replay_point(rack.model_dump(), a, 8)
    before = misses()
    shared = replay_point(rack.model_dump(), b, 8)
    assert len(sim_run._TIMINGS) == 1  # one timing section, one chunk: one memo for both
    skip = {"cpu_s", "wall_s", "max_rss_gb"}
    assert {k: v for k, v in shared.items() if k not in skip} == {k: v for k, v in fresh.items() if k not in skip}
    assert fresh_misses > 0 and misses() - before < fresh_misses  # b found steps a had priced
