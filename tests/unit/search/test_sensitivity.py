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


def test_confirm_replays_the_top_parameters_at_the_frontiers_point(tmp_path):
    """--confirm K: each of the top K parameters at -25% / +25% is replayed at the point the frontier
    chose, beside the screen's move at the same configuration and lanes; a slower GPU (attention
    efficiency down) lowers the replayed throughput or interactivity, never raises both."""
    from rackserve.search.rack import configurations

    path = tmp_path / "small.yaml"
    path.write_text(SMALL.replace("limit: 24", "limit: 8"))
    rack = load_rack(path)
    cfg = configurations(rack)[0]
    frontier = {"rack": "small", "at_target": {"387": {"point": {"config": cfg.to_dict(), "concurrency": 2}}}}
    fpath = tmp_path / "frontier.json"
    fpath.write_text(json.dumps(frontier))
    res = CliRunner().invoke(app, ["sim", "sensitivity", str(path), "--out", str(tmp_path / "out"),
                                   "--confirm", "1", "--frontier", str(fpath)])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "out" / "sensitivity.json").read_text())
    conf = doc["confirmed"]["racks"]["small"]
    assert conf["config"] == cfg.label and conf["concurrency"] == 2
    rows = conf["rows"]
    assert [r["param"] for r in rows] == [doc["rows"][0]["param"]] * 2 and [r["factor"] for r in rows] == [0.75, 1.25]
    assert conf["base_replayed"]["throughput_per_gpu"] > 0
    for r in rows:
        assert set(r["replayed"]) == set(r["screened"]) == {"throughput_per_gpu", "tps_user_e2e_p90"}
    # the two steps move the replay in opposite directions on at least one figure (a real perturbation)
    a, b = (r["replayed"] for r in rows)
    assert any(a[f] is not None and b[f] is not None and a[f] * b[f] < 0 for f in a)
    assert "Confirmed by replay" in (tmp_path / "out" / "sensitivity.md").read_text()


def test_confirm_needs_a_frontier_with_a_point(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    res = CliRunner().invoke(app, ["sim", "sensitivity", str(path), "--confirm", "1"])
    assert res.exit_code != 0 and "--frontier" in res.output
    fpath = tmp_path / "frontier.json"
    fpath.write_text(json.dumps({"rack": "small", "at_target": {}}))
    res = CliRunner().invoke(app, ["sim", "sensitivity", str(path), "--confirm", "1", "--frontier", str(fpath)])
    assert res.exit_code != 0 and "no replayed point" in res.output
