import json

from typer.testing import CliRunner

from rackserve.cli import app


def test_sim_runs_policies_side_by_side_and_writes_json_and_plots(tmp_path, tiny_yaml):
    path = tmp_path / "tiny.yaml"
    path.write_text(tiny_yaml)
    res = CliRunner().invoke(app, ["sim", str(path), "--policy", "least-uncached-work,round-robin",
                                   "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "least-uncached-work" in res.output and "round-robin" in res.output and "TTFT" in res.output
    data = json.loads((tmp_path / "out" / "tiny.json").read_text())
    assert [r["policy"] for r in data["results"]] == ["least-uncached-work", "round-robin"]
    assert all(r["completed"] == 6 and r["rejected"] == 0 for r in data["results"])
    assert (tmp_path / "out" / "tiny-ttft-cdf.png").stat().st_size > 1000
    assert (tmp_path / "out" / "tiny-throughput-vs-speed.png").stat().st_size > 1000


def test_sim_without_policy_runs_the_scenarios_routing_policy(tmp_path, tiny_yaml):
    path = tmp_path / "tiny.yaml"
    path.write_text(tiny_yaml + "routing: {policy: round-robin}\n")
    res = CliRunner().invoke(app, ["sim", str(path), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "out" / "tiny.json").read_text())
    assert data["policies"] == ["round-robin"]
    assert [r["policy"] for r in data["results"]] == ["round-robin"]


def test_sim_bad_scenario_names_the_field(tmp_path, tiny_yaml):
    path = tmp_path / "bad.yaml"
    path.write_text(tiny_yaml.replace("requests: 6", "requests: zero"))
    res = CliRunner().invoke(app, ["sim", str(path)])
    assert res.exit_code != 0 and "workload.requests" in res.output
