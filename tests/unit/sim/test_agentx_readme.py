"""bench/agentx_readme.py: a curve is drawn from its 900 s points where it has enough of them (else
its 60 s ones), and every generated row and ratio says which window it used."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rackserve.sim.cli_sweep import sweep_payload

_PATH = Path(__file__).resolve().parents[3] / "bench" / "agentx_readme.py"
_SPEC = importlib.util.spec_from_file_location("agentx_readme", _PATH)
readme = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(readme)


def _run(scenario, policy, lanes, tps, user, window_s):
    return {"scenario": scenario, "policy": policy, "concurrency": lanes, "throughput_per_gpu": tps,
            "user_tps_p50": user, "user_tps_p90": user * 0.9, "window_s": window_s, "measure_start_s": 30.0,
            "code": "abc", "gpus": 72, "span_s": window_s, "completed": 100, "output_tps_per_gpu": tps / 100,
            "hit_rate_by_tier": {"rank_hbm": 0.5, "pool_hbm": 0.4, "pool_dram": 0.0},
            "ttft_p50_s": 0.1, "ttft_p90_s": 0.5, "prefill_idle_frac": 0.1, "decode_idle_frac": 0.05,
            "prefill_util": 0.9, "decode_util": 1.0, "pool_occupancy": {"pool_hbm": 0.5, "pool_dram": 0.0},
            "pool_path_util": {"pool_hbm_read_aggregate": 0.001}, "cpu_s": 1.0}


# (lanes, tok/s/GPU, tok/s/user): both cross 1,000 tok/s/user between 64 and 256 lanes
SHORT = [_run(s, "luw", c, t * k, u, 60.0) for s, k in (("base", 1.0), ("fast", 2.0))
         for c, t, u in ((1, 1e3, 1500), (64, 5e4, 1200), (256, 2e5, 900), (1024, 6e5, 700))]
LONG = ([_run("fast", "luw", c, t, u, 900.0) for c, t, u in ((1, 1.8e3, 1400), (64, 9e4, 1100), (256, 3e5, 800))]
        + [_run("base", "luw", 1024, 5e5, 650, 900.0)])  # one 900 s point: not a curve


def _payload():
    rows, windows = readme.choose_curves(SHORT, LONG)
    ops, past = readme.split_at_peak(rows)
    payload = sweep_payload(ops, [1000.0], "base")
    readme.label_windows(payload, windows, {readme.curve_key(r) for r in past})
    payload.update(runs=SHORT, window_runs=LONG, past_peak=past)
    return payload


def test_a_curve_with_enough_900s_points_is_drawn_from_them_and_the_others_from_60s():
    rows, windows = readme.choose_curves(SHORT, LONG)
    assert windows == {("fast", "luw"): 900.0, ("base", "luw"): 60.0}
    assert sorted(r["concurrency"] for r in rows if r["scenario"] == "fast") == [1, 64, 256]
    assert {r["window_s"] for r in rows if r["scenario"] == "base"} == {60.0}


def test_target_column_and_ratio_come_from_the_900s_points_and_name_both_windows():
    payload = _payload()
    fast = next(c for c in payload["curves"] if c["scenario"] == "fast")
    # interpolated on the 900 s frontier between 64 lanes (1,100) and 256 (800): 160,000
    expected = 9e4 + (1100 - 1000) / (1100 - 800) * (3e5 - 9e4)
    assert fast["at_target"]["1000"]["p50"] == pytest.approx(expected)
    assert fast["window_s"] == 900.0 and fast["peak_at_last_lane_run"]
    assert next(c for c in payload["curves"] if c["scenario"] == "base")["window_s"] == 60.0
    (ratio,) = payload["ratios"]
    assert (ratio["other_window_s"], ratio["base_window_s"]) == (900.0, 60.0)
    base_at = 2e5 + (1000 - 900) / (1200 - 900) * (5e4 - 2e5)  # the 60 s curve: 150,000
    assert ratio["ratio"] == pytest.approx(expected / base_at)
    assert "(900 s / 60 s (mixed windows))" in readme.ratio_lines(payload["ratios"])[0]


def test_section_rows_say_their_window_and_the_window_table_pairs_the_points():
    text = readme.section(_payload(), ["`cmd`"])
    fast_row = next(ln for ln in text.splitlines() if ln.startswith("| fast | luw | 900 s"))
    assert "300,000 (256, 800)" in fast_row
    assert any(ln.startswith("| base | luw | 60 s") for ln in text.splitlines())
    # 60 s -> 900 s at 64 lanes of "fast": 100,000 -> 90,000 (x0.900)
    assert "| fast | luw | 64 | 100,000 -> 90,000 (0.900) | 1200 -> 1100 |" in text
