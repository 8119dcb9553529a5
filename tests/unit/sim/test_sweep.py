from rackserve.sim.sweep import curves


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
