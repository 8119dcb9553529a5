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
