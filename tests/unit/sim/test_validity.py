"""AgentX's validity checks of a run (rackserve/sim/validity.py) and `rackserve sim`'s exit code."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rackserve.cli import app
from rackserve.sim.validity import Validity, run_validity
from rackserve.workload.trace_replay import ReplayStats

SHORT = """
name: short
deployment:
  prefill: [{layout: dep2, count: 1}]
  decode: [{layout: wide-ep, ranks: 4, count: 1}]
sim: {measure_duration_s: 0.5}
workload: {kind: uniform, concurrency: 8, requests: 64, prompt_tokens: 2000, output_tokens: 4000}
"""


def test_overflow_and_coverage_make_a_run_invalid():
    assert Validity(0.0, 1.0).valid and Validity(0.01, 0.95).valid
    assert "overflow" in Validity(0.02, 1.0).reasons[0]
    assert "coverage" in Validity(0.0, 0.5).reasons[0] and not Validity(0.0, 0.5).valid

    class Replay:
        def stats(self) -> ReplayStats:
            return ReplayStats(requests=980, warmups=0, overflows=20)

    v = run_validity(Replay(), completed=900, rejected=0, in_flight=10)
    assert v.overflow_share == 0.02 and v.metric_coverage == 900 / 910 and not v.valid
    # the case: nothing completed and 4,737 in flight at the window's end
    assert run_validity(object(), completed=0, rejected=0, in_flight=4737).metric_coverage == 0.0


def test_sim_exits_nonzero_on_an_invalid_run_unless_allowed(tmp_path):
    """Issue 31 item 8: a 0.5 s window of 4,000-token outputs ends with every request in flight
    (coverage 0%): reported invalid, `rackserve sim` exits 3; --allow-invalid exits 0."""
    path = tmp_path / "short.yaml"
    path.write_text(SHORT)
    res = CliRunner().invoke(app, ["sim", str(path), "--out", str(tmp_path / "out")])
    assert res.exit_code == 3, res.output
    assert "invalid run" in res.output and "coverage" in res.output
    data = json.loads((tmp_path / "out" / "short.json").read_text())["results"][0]
    assert data["valid"] is False and data["metric_coverage"] < 0.95 and data["invalid_reasons"]
    ok = CliRunner().invoke(app, ["sim", str(path), "--out", str(tmp_path / "out"), "--allow-invalid"])
    assert ok.exit_code == 0, ok.output


def test_coverage_at_the_racks_window_scales_finished_and_rejected_not_in_flight():
    from rackserve.sim.validity import coverage_at_window

    # 120 s: 9,000 finished, 0 rejected, 1,000 in flight -> 90%; over 900 s (x7.5): 67,500 finished,
    # the same 1,000 in flight -> 98.5%
    assert coverage_at_window(9_000, 0, 0.9, 120.0, 900.0) == pytest.approx(67_500 / 68_500)
    # rejections grow with the window: 8,000 finished, 1,000 rejected, 1,000 in flight (80%)
    assert coverage_at_window(8_000, 1_000, 0.8, 120.0, 900.0) == pytest.approx(60_000 / (67_500 + 1_000))
    assert coverage_at_window(9_000, 0, 0.9, 900.0, 900.0) == 0.9  # the full window: as measured
