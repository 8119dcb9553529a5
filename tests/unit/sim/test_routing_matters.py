"""On the real AgentX traces, where a turn is routed changes what it finds cached."""

import pytest

from rackserve.sim.scenario import scenario_from_dict
from rackserve.sim.simulator import Simulator
from rackserve.workload.build import build_source


def _run(timing, policy, pool=None):
    data = {
        "deployment": {"prefill": [{"layout": "dep2", "count": 4}],
                       "decode": [{"layout": "wide-ep", "ranks": 8, "count": 1}]},
        "sim": {"kv_block_multiple": 16},
        "workload": {"kind": "agentx-trace", "limit": 40, "concurrency": 12, "duration_s": 120.0,
                     "measure_start_s": 0.0},
    }
    if pool is not None:
        data["pool"] = {"hbm_capacity_bytes": pool, "dram_capacity_bytes": pool}
    sc = scenario_from_dict(data)
    src = build_source(sc.workload, 64, sc.config.engine.model_id)
    return Simulator(sc, timing, policy, src).run()


@pytest.fixture(scope="module")
def runs():
    from tests.unit.sim.conftest import LinearTiming

    t = LinearTiming()
    return {(p, pool): _run(t, p, pool) for p in ("least-uncached-work", "round-robin") for pool in (None, 0)}


def test_least_uncached_work_keeps_turns_on_the_rank_that_holds_them(runs):
    luw, rr = runs[("least-uncached-work", None)], runs[("round-robin", None)]
    assert luw.completed > 50 and rr.completed > 50
    # (lockstep balance moves some turns to the idle sibling, which reads them from the pool)
    assert luw.hit_rate_by_tier["rank_hbm"] > 0.85 > 0.7 > rr.hit_rate_by_tier["rank_hbm"]
    assert rr.hit_rate_by_tier["pool_hbm"] > luw.hit_rate_by_tier["pool_hbm"]  # the pool catches RR's misses


def test_without_a_pool_round_robin_recomputes_what_it_misses(runs):
    luw, rr = runs[("least-uncached-work", 0)], runs[("round-robin", 0)]
    assert luw.hit_rate > rr.hit_rate + 0.3
    assert luw.completed > rr.completed  # and serves more in the same time
