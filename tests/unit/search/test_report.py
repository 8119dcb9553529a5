"""frontier.json: envelopes from replays, both interactivity definitions, winners, screen error."""

import numpy as np
import pytest

from rackserve.search.frontier import report, screen_error, speed_key
from rackserve.search.mix import Mix
from rackserve.search.rack import RackSpec, Space

RACK = RackSpec(name="r", gpus=8, timing={"hardware": "vr200"}, workload={"kind": "agentx-trace"},
                space=Space(prefill=[{"layout": "dep2", "counts": [1]}], decode=[{"layout": "tp8", "counts": [1]}]))
MIX = Mix(np.array([100.0]), np.array([10.0]), np.array([10.0]), np.array([1.0]), 1.0, 0.0)


def replay(label: str, lanes: int, tput: float, e2e90: float, itl90: float) -> dict:
    return {"config": {"label": label}, "concurrency": lanes, "source": "replay", "completed": 10,
            "throughput_per_gpu": tput, "tps_user_e2e_p50": e2e90 * 1.2, "tps_user_e2e_p90": e2e90,
            "tps_user_itl_p50": itl90 * 1.2, "tps_user_itl_p90": itl90, "ttft_p90_s": 0.1}


REPLAYS = [replay("fast", 10, 100, 900, 1000), replay("busy", 100, 1000, 300, 1100)]
CURVES = {"fast": ({"label": "fast"}, [{"concurrency": 1, "throughput_per_gpu": 10, "tps_user_e2e_p90": 950},
                                       {"concurrency": 20, "throughput_per_gpu": 200, "tps_user_e2e_p90": 850}]),
          "busy": ({"label": "busy"}, [{"concurrency": 50, "throughput_per_gpu": 500, "tps_user_e2e_p90": 400},
                                       {"concurrency": 150, "throughput_per_gpu": 1500, "tps_user_e2e_p90": 200}])}


def test_e2e_and_itl_give_different_envelopes_and_winners():
    e2e = report(RACK, {}, [], REPLAYS, MIX, "e2e", "p90", [387, 1000], {}, {})
    itl = report(RACK, {}, [], REPLAYS, MIX, "itl", "p90", [387, 1000], {}, {})
    # E2E: busy (300) misses 387, fast (900) meets it; nobody reaches 1000
    assert e2e["at_target"]["387"]["config"]["label"] == "fast"
    assert e2e["at_target"]["1000"] is None
    # ITL: busy is both faster and heavier, so it dominates and wins both targets
    assert [p["config"]["label"] for p in itl["envelope"]["p90"]] == ["busy"]
    assert itl["at_target"]["1000"]["config"]["label"] == "busy"
    assert e2e["envelope_source"] == "replay"
    assert e2e["peak"]["config"]["label"] == "busy"


def test_screen_error_interpolates_the_screen_curve_at_the_replayed_lanes():
    err = screen_error(CURVES, REPLAYS, "tps_user_e2e_p90")
    fast = next(r for r in err["per_point"] if r["config"] == "fast")
    # screen at 10 lanes: 10 + (200-10)*9/19 = 100 -> exact; speed 950 - 100*9/19 = 902.6 vs 900
    assert fast["throughput_per_gpu"]["rel_err"] == pytest.approx(0.0, abs=1e-9)
    assert fast["tps_user_e2e_p90"]["screen"] == pytest.approx(950 - 100 * 9 / 19)
    busy = next(r for r in err["per_point"] if r["config"] == "busy")
    assert busy["throughput_per_gpu"]["rel_err"] == pytest.approx((1000 - 1000) / 1000)
    assert err["median_throughput"] == pytest.approx(0.0)


def test_bad_interactivity_or_percentile_is_a_clear_error():
    with pytest.raises(ValueError, match="interactivity"):
        speed_key("ttft", "p90")
    with pytest.raises(ValueError, match="percentile"):
        speed_key("e2e", "p99")


def test_a_target_below_the_replayed_range_takes_the_screens_answer_and_says_so():
    # replays reach down to 300 tok/s/user only; the screen puts 1,500 tok/s/GPU at 200
    rep = report(RACK, CURVES, [], REPLAYS, MIX, "e2e", "p90", [250, 950, 2000], {}, {})
    at = rep["at_target"]
    assert at["250"]["source"] == "screen"
    assert at["250"]["config"]["label"] == "busy"
    assert at["250"]["throughput_per_gpu"] > 1000  # between the screen's (400, 500) and (200, 1500)
    assert at["950"]["source"] == "screen"  # no replay reaches 950 but the screen's fast curve does
    assert at["2000"] is None  # nothing reaches it: null, never the peak


def test_an_invalid_run_stays_off_the_envelope_and_is_listed():
    """AgentX: a run with >1% context overflow or <95% metric coverage is invalid, not a point."""
    bad = {**replay("huge", 1000, 5000, 900, 1000), "valid": False, "invalid_reasons": ["overflow 3%"]}
    rep = report(RACK, {}, [], [*REPLAYS, bad], MIX, "e2e", "p90", [387], {}, {})
    assert "huge" not in {p["config"]["label"] for p in rep["envelope"]["p90"]}
    assert rep["peak"]["config"]["label"] == "busy"
    assert [p["config"]["label"] for p in rep["invalid_points"]] == ["huge"]


def test_screened_points_are_kept_only_for_configurations_that_matter_and_each_is_summarised():
    curves = {**CURVES, "slow": ({"label": "slow"}, [{"concurrency": 5, "throughput_per_gpu": 1, "tps_user_e2e_p90": 10,
                                                       "tps_user_e2e_p50": 10}])}
    for _, pts in curves.values():
        for p in pts:
            p.setdefault("tps_user_e2e_p50", p["tps_user_e2e_p90"])
    rep = report(RACK, curves, [], [], MIX, "e2e", "p90", [387], {}, {"planned": []})
    kept = {p["config"]["label"] for p in rep["points"]}
    assert "slow" not in kept and {"fast", "busy"} <= kept  # slow is dominated everywhere
    summary = {c["label"]: c for c in rep["configs"]}
    assert set(summary) == {"fast", "busy", "slow"}
    assert summary["busy"]["peak_throughput_per_gpu"] == 1500


def test_resume_reads_back_invalid_replays_so_they_are_not_run_again(tmp_path):
    import json

    from rackserve.search.frontier import read_previous

    ok = {"config": {"label": "a"}, "concurrency": 8, "source": "replay", "valid": True}
    bad = {"config": {"label": "a"}, "concurrency": 64, "source": "replay", "valid": False}
    screen = {"config": {"label": "a"}, "concurrency": 8, "source": "screen"}
    path = tmp_path / "frontier.json"
    path.write_text(json.dumps({"points": [ok, screen], "invalid_points": [bad]}))
    assert read_previous(path) == [ok, bad]
