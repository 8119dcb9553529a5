"""`rackserve up --time-scale auto`: the probe picks a round scale at which its steps fit."""

from __future__ import annotations

import pytest

from rackserve.config import load_config
from services.time_scale_probe import STEP_OVERHEAD_S, ProbedStep, probe, round_up_125


@pytest.mark.parametrize(("x", "want"), [(0.3, 0.5), (1.0, 1.0), (1.01, 2.0), (7, 10.0), (21, 50.0),
                                         (0.0021, 0.005)])
def test_round_up_125(x: float, want: float) -> None:
    assert round_up_125(x) == pytest.approx(want)


def test_scale_needed_counts_the_step_overhead() -> None:
    step = ProbedStep("decode", "8 seqs", compute_s=0.004, sim_s=0.002)
    assert step.scale_needed == pytest.approx((0.004 + STEP_OVERHEAD_S) / 0.002)


def test_probe_on_the_local_deployment() -> None:
    pick = probe(load_config("scenarios/local.yaml"), decode_seqs=2, headroom=1.0)
    phases = [s.phase for s in pick.steps]
    assert phases == ["prefill", "decode"] and all(s.sim_s > 0 for s in pick.steps)
    # every probed step fits its paced budget at the picked scale
    assert all(s.compute_s + STEP_OVERHEAD_S <= s.sim_s * pick.time_scale for s in pick.steps)
    assert pick.steps[1].shape == "2 seqs"
    assert pick.describe().startswith(f"time_scale auto: {pick.time_scale:g} wall s per simulated s")
