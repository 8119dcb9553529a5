"""rackserve/search/sensitivity.py: the FREE parameters are read from the files with their paths, a
perturbed one really reaches the cost model, and the table ranks what moves the answer."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rackserve.cli import app
from rackserve.search import sensitivity as sens
from rackserve.search.rack import load_rack
from rackserve.timing.spec import load_hardware, load_model

from .test_rack_and_screen import SMALL as RACK

# the screen tests' small rack, MTP on only (half the configurations)
SMALL = RACK.replace("mtp: [true, false]", "mtp: [true]").replace("targets: [387, 1000]", "targets: [387]")


def test_free_parameters_carry_their_nested_path_value_and_comment():
    hw = {p.path: p for p in sens.free_parameters("hardware", "vr200")}
    assert ("efficiency", "attention_compute") in hw and ("microarch", "tile_m") in hw
    assert hw[("efficiency", "attention_compute")].value == load_hardware("vr200").efficiency.attention_compute
    assert all("FREE" in p.comment for p in hw.values())
    model = {p.path: p for p in sens.free_parameters("model", "deepseek-v4.1-flash")}
    assert model[("moe", "imbalance_dispersion")].value == load_model("deepseek-v4.1-flash").moe.imbalance_dispersion


def test_a_perturbed_parameter_reaches_the_cost_model(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    rack = load_rack(path)
    from rackserve.search.rack import configurations, scenario_of

    sc = scenario_of(rack, configurations(rack)[0])
    p = next(q for q in sens.free_parameters("hardware", "vr200") if q.path == ("efficiency", "attention_compute"))
    tm = sens.PerturbedCache(p, 1.25).get(sc)
    assert tm.hardware.efficiency.attention_compute == pytest.approx(p.value * 1.25)
    assert sens.PerturbedCache(None, 1.0).get(sc).hardware == load_hardware("vr200")


def test_sensitivity_ranks_the_parameters_by_how_far_they_move_the_answer(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    res = CliRunner().invoke(app, ["sim", "sensitivity", str(path), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "out" / "sensitivity.json").read_text())
    rows = doc["rows"]
    assert len(rows) == len(sens.free_parameters("hardware", "vr200")) + len(sens.free_parameters("model", "deepseek-v4.1-flash"))
    moves = [r["max_abs_move"] for r in rows]
    assert moves == sorted(moves, reverse=True) and moves[0] > 0.0
    assert set(doc["base"]["small"]) == {"at 387", "peak"} and doc["base"]["small"]["peak"] > 0
    assert "| small |" in (tmp_path / "out" / "sensitivity.md").read_text()
