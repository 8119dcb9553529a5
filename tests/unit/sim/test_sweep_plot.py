from matplotlib.image import imread

from rackserve.sim.sweep_plot import plot_by_lanes


def _row(scenario, policy, lanes, tps):
    return {"scenario": scenario, "policy": policy, "concurrency": lanes, "throughput_per_gpu": tps}


def test_plot_by_lanes_draws_one_panel_per_scenario_with_points_past_the_peak(tmp_path):
    runs = [_row(s, p, c, t) for s in ("a", "b") for p in ("luw", "rr")
            for c, t in ((1, 1e3), (64, 5e4), (4096, 9e5), (20000, 3e5))]
    one, two = tmp_path / "one.png", tmp_path / "two.png"
    plot_by_lanes(runs[:8], one)
    plot_by_lanes(runs, two, [_row("a", "luw", 4096, 8e5)], "hollow: 900 s")
    assert imread(two).shape[1] > imread(one).shape[1]  # two scenarios side by side, one alone
    assert two.stat().st_size > 5000
