from rackserve.sim.explain import walk

A = {"name": "a", "timing": {"hardware": "gb300", "optimizations": "baseline"},
     "deployment": {"prefill": [{"layout": "dep2", "count": 12}]}, "routing": {"policy": "round-robin"},
     "workload": {"kind": "agentx-trace", "concurrency": 8}, "sim": {"rank_cache_tokens": 5}}
B = {"name": "b", "timing": {"hardware": "vr200", "optimizations": "rubin-optimized"},
     "deployment": {"prefill": [{"layout": "dep2", "count": 3}]}, "routing": {"policy": "least-uncached-work"},
     "pool": {"hbm_capacity_bytes": 7}, "workload": {"kind": "agentx-trace", "concurrency": 8}}


def test_walk_changes_one_factor_per_step_and_ends_at_b():
    steps = walk(A, B)
    assert [s.factor for s in steps] == ["A", "hardware", "optimizations", "layouts", "pool tiers", "routing policy"]
    assert steps[1].scenario["timing"] == {"hardware": "vr200", "optimizations": "baseline"}
    assert steps[1].change == "gb300 -> vr200"
    last = steps[-1].scenario
    for key in ("timing", "deployment", "routing", "pool", "workload"):
        assert last[key] == B[key]
    assert "rank_cache_tokens" not in last["sim"]  # capacity overrides travel with the pool step
    assert A["timing"]["hardware"] == "gb300"  # inputs untouched


def test_engram_placement_is_a_factor_of_its_own_and_a_left_out_default_is_no_step():
    a = {**A, "timing": {**A["timing"], "engram_placement": "host-copy"}, "engram": {"shards": 2}}
    b = {**B, "timing": {**B["timing"], "engram_placement": "hbm-sharded"}}
    steps = walk(a, b)
    assert [s.factor for s in steps] == ["A", "hardware", "optimizations", "layouts", "pool tiers",
                                         "engram placement", "routing policy"]
    eg = steps[5]
    assert eg.change == "host-copy -> hbm-sharded"
    assert steps[4].scenario["timing"]["engram_placement"] == "host-copy"  # unchanged before its step
    assert eg.scenario["timing"] == b["timing"] and "engram" not in eg.scenario  # the small model's section travels
    # B leaving the field out means the default (hbm-sharded): the same step; A stating the default: none
    assert walk(a, B)[5].change == "host-copy -> hbm-sharded"
    explicit = {**A, "timing": {**A["timing"], "engram_placement": "hbm-sharded"}}
    assert "engram placement" not in [s.factor for s in walk(explicit, B)]


def test_the_plain_gb300_scenario_walks_every_mechanism_to_nvl72_vr200():
    from pathlib import Path

    from rackserve.sim.explain import read_scenario_dict
    from rackserve.sim.scenario import load_scenario

    root = Path(__file__).resolve().parents[3] / "scenarios"
    load_scenario(root / "nvl72-gb300-plain.yaml")  # a valid scenario
    steps = walk(read_scenario_dict(root / "nvl72-gb300-plain.yaml"), read_scenario_dict(root / "nvl72-vr200.yaml"))
    assert [s.factor for s in steps] == ["A", "hardware", "optimizations", "pool tiers", "engram placement",
                                         "routing policy"]
    assert steps[-1].scenario["timing"] == read_scenario_dict(root / "nvl72-vr200.yaml")["timing"]


def test_first_moves_factors_to_the_front_and_an_unknown_one_is_named():
    import pytest

    steps = walk(A, B, ["routing policy", "pool tiers"])
    assert [s.factor for s in steps] == ["A", "routing policy", "pool tiers", "hardware", "optimizations", "layouts"]
    assert steps[1].scenario["routing"] == B["routing"] and steps[1].scenario["timing"] == A["timing"]
    assert steps[-1].scenario["timing"] == B["timing"]
    with pytest.raises(ValueError, match="unknown factor 'routing'"):
        walk(A, B, ["routing"])
