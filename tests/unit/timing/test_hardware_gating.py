"""Switches declare the hardware they need: where it is missing the switch changes nothing."""

from __future__ import annotations

import pytest

from rackserve.timing import TimingModel
from rackserve.timing.optimizations import FEATURES, PRESETS, REQUIRES, Optimizations
from rackserve.timing.spec import load_hardware

from .conftest import scenarios

LACKING = [
    (hw, switch)
    for hw in ("gb300", "gb200", "h200")
    for switch, need in REQUIRES.items()
    if not FEATURES[need](load_hardware(hw))
]


def test_blackwell_lacks_sm107_and_hopper_lacks_more():
    assert ("gb300", "fp8xfp4-k64") in LACKING and ("gb300", "fp4-indexer") in LACKING
    assert ("h200", "domain-local") in LACKING and ("h200", "tp8-packed-fp4") in LACKING
    assert ("gb300", "domain-local") not in LACKING  # two dies on Blackwell too
    assert not PRESETS["rubin-optimized"].applicable(load_hardware("vr200"))[1]


@pytest.mark.parametrize(("hw", "switch"), LACKING)
def test_a_switch_the_hardware_lacks_changes_nothing_there(hw, switch):
    off = TimingModel.create(hw, optimizations=Optimizations())
    on = TimingModel.create(hw, optimizations=Optimizations().with_switch(switch))
    assert switch in on.skipped_switches and hw in on.skipped_switches[switch]
    assert on.optimizations == off.optimizations
    for label, phase, lay, batch in scenarios(off):
        assert on.step_time(phase, lay, batch) == off.step_time(phase, lay, batch), label


def test_preset_on_gb300_is_the_preset_without_sm107_switches():
    gb = TimingModel.create("gb300", optimizations="rubin-optimized")
    assert set(gb.skipped_switches) == {"fp8xfp4-k64", "fp4-indexer"}
    same = TimingModel.create("gb300", optimizations="rubin-optimized,-fp8xfp4-k64,-fp4-indexer")
    for label, phase, lay, batch in scenarios(gb):
        assert gb.step_time(phase, lay, batch) == same.step_time(phase, lay, batch), label
    # moving the same request to Rubin applies them again
    vr = gb.with_hardware(load_hardware("vr200"))
    assert vr.optimizations.fp8xfp4_k64 and not vr.skipped_switches


def test_best_is_every_switch_the_hardware_runs():
    """`best` compares a rack at the best software its hardware supports: GB300 (SM100, two dies) runs
    all but the SM107 MMA switches, the H200 (one die, no FP4) fewer, Rubin all."""
    from rackserve.timing import TimingModel
    from rackserve.timing.optimizations import SWITCHES

    gb = TimingModel.create("gb300", optimizations="best")
    assert set(gb.skipped_switches) == {"fp8xfp4-k64", "fp4-indexer"}
    assert set(gb.optimizations.enabled()) == set(SWITCHES) - {"fp8xfp4-k64", "fp4-indexer"}
    h200 = TimingModel.create("h200", optimizations="best")
    assert {"domain-local", "tp8-packed-fp4", "fp8xfp4-k64"} <= set(h200.skipped_switches)
    vr = TimingModel.create("vr200", optimizations="best")
    assert vr.skipped_switches == {} and vr.optimizations.enabled() == list(SWITCHES)
