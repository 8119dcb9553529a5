import math

import pytest

from rackserve.sim.frontier import (
    first_grid,
    next_concurrencies,
    pareto,
    saturated_at,
    throughput_at,
)
from rackserve.sim.sweep import adaptive, curves, ratios


def _row(scenario, policy, conc, tput, p50):
    return {"scenario": scenario, "policy": policy, "concurrency": conc, "throughput_per_gpu": tput,
            "user_tps_p50": p50, "user_tps_p90": p50 * 0.8}


def test_curves_group_sort_and_mark_the_peak():
    rows = [_row("a", "rr", 400, 900.0, 20.0), _row("a", "rr", 100, 300.0, 60.0), _row("a", "rr", 1600, 700.0, 5.0),
            _row("a", "luw", 100, 350.0, 61.0), _row("b", "rr", 100, 10.0, 1.0)]
    out = curves(rows)
    assert [(c["scenario"], c["policy"]) for c in out] == [("a", "luw"), ("a", "rr"), ("b", "rr")]
    rr = out[1]
    assert [p["concurrency"] for p in rr["points"]] == [100, 400, 1600]
    assert rr["peak"]["concurrency"] == 400 and rr["peak"]["throughput_per_gpu"] == 900.0
    assert rr["points"][0]["user_tps_p90"] == 48.0
    assert [p["concurrency"] for p in rr["frontier_p50"]] == [400, 100]  # 1600 is dominated by 400


# A constructed curve: throughput 100 at 50 tok/s/user, 300 at 30, 400 at 10; (200, 20) is dominated.
CURVE = [{"concurrency": c, "throughput_per_gpu": t, "user_tps_p50": x, "user_tps_p90": x}
         for c, t, x in ((1, 100.0, 50.0), (4, 300.0, 30.0), (16, 400.0, 10.0), (64, 200.0, 20.0))]


def test_pareto_drops_dominated_points_and_interpolates_between_neighbours():
    front = pareto(CURVE)
    assert [p["concurrency"] for p in front] == [16, 4, 1]
    assert throughput_at(front, 40.0) == pytest.approx(200.0)  # halfway between (30, 300) and (50, 100)
    assert throughput_at(front, 20.0) == pytest.approx(350.0)
    assert throughput_at(front, 30.0) == pytest.approx(300.0)  # exactly on a point
    assert throughput_at(front, 60.0) is None  # no point is that interactive
    assert throughput_at(front, 5.0) == pytest.approx(400.0)  # every point is faster: the peak serves it


def test_ratios_between_scenarios_at_a_target():
    rows = [dict(r, scenario="a", policy="p") for r in CURVE] + [
        dict(r, scenario="b", policy="p", throughput_per_gpu=2 * r["throughput_per_gpu"]) for r in CURVE]
    (r,) = ratios(curves(rows, [40.0]), [40.0])
    assert r["base"] == "a" and r["other"] == "b" and r["ratio"] == pytest.approx(2.0)


def test_refinement_climbs_until_saturation_then_bisects_the_bend():
    assert first_grid(1, 20_000) == [1, 4, 16, 64, 256, 1024, 4096, 16384, 20000]

    def model(c):  # throughput saturates at 1,000 lanes; speed falls past it
        return {"concurrency": c, "throughput_per_gpu": 1000.0 * min(c, 1000), "user_tps_p50": 100.0 / max(1, c / 1000),
                "user_tps_p90": 80.0 / max(1, c / 1000), "scenario": "s", "policy": "p", "scenario_path": "s.yaml"}

    calls = []

    def run(points):
        calls.append([p.concurrency for p in points])
        return [model(p.concurrency) for p in points]

    rows = adaptive(["s.yaml"], ["p"], run, 1, 20_000, rounds=3)
    conc = sorted(r["concurrency"] for r in rows)
    assert calls[0] == [1, 4] and 20000 not in conc  # stopped climbing once saturated (4,096)
    assert not any(c < 256 and c not in (1, 4, 16, 64) for c in conc)  # no bisection where it keeps up
    assert saturated_at(rows) is not None
    assert sum(1 for c in conc if 1024 < c < 4096) >= 2  # bisected the bend (two rounds there)
    assert not next_concurrencies([model(1000), model(1001)])
    assert math.isclose(max(r["throughput_per_gpu"] for r in rows), 1e6)


def test_curves_read_agentx_e2e_interactivity_when_the_rows_have_it():
    rows = [dict(_row("a", "rr", 100, 300.0, 60.0), tps_user_e2e_p50=40.0, tps_user_e2e_p90=25.0,
                 tps_user_itl_p50=60.0, tps_user_itl_p90=48.0)]
    (e2e,) = curves(rows, [30.0])
    (itl,) = curves(rows, [30.0], interactivity="itl")
    assert e2e["interactivity"] == "e2e" and e2e["points"][0]["user_tps_p90"] == 25.0
    assert e2e["at_target"]["30"]["p90"] is None  # the slow tail (25) misses 30 tok/s/user
    assert itl["at_target"]["30"]["p90"] == 300.0  # 1 / TPOT at P90 (48) meets it
