"""AgentX's validity checks of a run (rackserve/sim/validity.py) and `rackserve sim`'s exit code."""

from __future__ import annotations

import json

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
