"""Issue 50 in the simulator: pool.scope deployment (a Mooncake store over the deployment's trays),
the capacity it configures, eviction under it with fetches' read leases, the working set against
the capacity over time, and rank idle as operators read it beside the lockstep share."""

from pathlib import Path

import pytest
import yaml

from rackserve.kv.pool_tiers import PoolLimits
from rackserve.routing.index import PrefixIndex
from rackserve.sim.block_keys import BlockKeys
from rackserve.sim.kv import ClusterKV
from rackserve.sim.pool_paths import PoolPaths
from rackserve.sim.pool_scope import RECIPE_SEGMENT_BYTES_PER_GPU, deployment_hosts, scoped_pools
from rackserve.sim.scenario import scenario_from_dict
from rackserve.sim.simulator import Simulator
from rackserve.sim.sizing import size_scenario
from rackserve.timing.capacity import PoolPath
from rackserve.workload.request import Request
from rackserve.workload.source import ListSource

ROOT = Path(__file__).resolve().parents[3]


def _agentx(pool: dict) -> dict:
    data = yaml.safe_load((ROOT / "scenarios" / "agentx-3dep2-wideep.yaml").read_text())
    return {**data, "pool": pool}


# ---- item 1: the store spans the deployment's trays ------------------------------------------
def test_each_role_is_placed_on_its_own_trays():
    assert deployment_hosts([2, 2, 2], [16], 4) == [4, 2, 4, 4, 4, 4]  # agentx-3dep2-wideep: 6 hosts
    assert deployment_hosts([8], [2, 2], 4) == [4, 4, 4]
    assert deployment_hosts([2, 4], [], 4) == [2, 4]  # a DEP4 does not fit beside a DEP2


def test_the_deployment_store_is_one_pool_for_every_prefill_instance():
    hbm, dram = PoolPath(1.0, 1, 1, 0), PoolPath(2.0, 1, 1, 0)
    (pool,) = scoped_pools("deployment", [("prefill-0", 2), ("prefill-1", 2)], 72, hbm, dram, None)
    assert pool.instances == ("prefill-0", "prefill-1") and pool.pool_dram.capacity_bytes == 2.0


# ---- item 2: configured capacity -------------------------------------------------------------
def test_the_store_has_the_recipes_segment_per_gpu_unless_a_host_segment_is_configured():
    rack = size_scenario(scenario_from_dict(_agentx({"scope": "rack"})))
    recipe = size_scenario(scenario_from_dict(_agentx({"scope": "deployment"})))
    assert recipe.pool_dram.capacity_bytes == pytest.approx(22 * RECIPE_SEGMENT_BYTES_PER_GPU)  # 1.76 TB
    assert recipe.pool_hbm.capacity_bytes == 0  # the recipes lend no HBM
    assert recipe.pool_dram.port_bw_bytes_per_s == rack.pool_dram.port_bw_bytes_per_s  # the same RDMA path
    assert rack.pool_dram.capacity_bytes == pytest.approx(16.2e12)  # rack scope as before
    set_ = size_scenario(scenario_from_dict(_agentx({"scope": "deployment", "segment_bytes_per_host": 10**11,
                                                      "hbm_lent_bytes_per_gpu": 10**10})))
    assert set_.pool_dram.capacity_bytes == pytest.approx(6 * 1e11)  # six hosts
    assert set_.pool_hbm.capacity_bytes == pytest.approx(16 * 1e10)  # the sixteen decode GPUs
    greedy = size_scenario(scenario_from_dict(_agentx({"scope": "deployment", "hbm_lent_bytes_per_gpu": 10**13})))
    assert greedy.pool_hbm.capacity_bytes == pytest.approx(rack.pool_hbm.capacity_bytes)  # at most the spare


def test_a_segment_larger_than_a_hosts_dram_is_refused_by_name():
    with pytest.raises(ValueError, match="pool.segment_bytes_per_host"):
        size_scenario(scenario_from_dict(_agentx({"scope": "deployment", "segment_bytes_per_host": 4 * 10**12})))


def _kv(capacity_blocks: int, block_bytes: int = 100) -> ClusterKV:
    slow = PoolPath(1e18, 1e3, 1e3, 0.0)  # 100-byte blocks: 0.1 s per block on the port
    limits = PoolLimits(0, capacity_blocks * block_bytes, 10**12, 0.95, 0.85, 1e18)
    return ClusterKV({("p", 0): 1, ("p", 1): 1}, limits, 64, block_bytes, PrefixIndex(closed_chains=True),
                     PoolPaths({"pool_hbm": slow, "pool_dram": slow}))


def test_a_block_being_fetched_is_not_evicted_until_its_bytes_have_arrived():
    kv = _kv(capacity_blocks=10)
    a = BlockKeys.of(tuple(range(1, 6)), 1)
    kv.store(("p", 0), a, 0, 0.0)
    kv.advance(1.0)  # its put has committed
    hit, ready = kv.delivered_hit(("p", 1), a, 64 * 6, 1.0)  # rank 1 reads a's 5 blocks: 0.5 s
    assert hit.pool_dram == 64 * 5 and ready > 1.4
    b = BlockKeys.of(tuple(range(100, 106)), 1)
    kv.store(("p", 1), b, 0, 1.1)  # a full pool must make room while a is read
    assert all(kv.pool.tier_of(h) is not None for h in a.keys)  # leased: b's put found no room instead
    kv.advance(ready + 1.0)
    c = BlockKeys.of(tuple(range(200, 206)), 1)
    kv.store(("p", 0), c, 0, ready + 1.0)
    assert any(kv.pool.tier_of(h) is None for h in a.keys)  # the lease is gone: a is the LRU victim
    assert kv.evictions()["pool_dram"] > 0


def _conversations(n: int = 12, turns: int = 4) -> list[Request]:
    """n conversations taking turns (each turn 8 blocks longer), one turn every 0.05 s."""
    out, t = [], 0.0
    for turn in range(turns):
        for c in range(n):
            blocks = tuple(10_000 * (c + 1) + b for b in range(8 * (turn + 1)))
            out.append(Request(len(out), t, 64 * len(blocks), 2, blocks))
            t += 0.05
    return out


def _store_sc(segment: int) -> object:
    return scenario_from_dict({
        "deployment": {"prefill": [{"layout": "dep2", "count": 2}],
                       "decode": [{"layout": "wide-ep", "ranks": 4, "count": 1}]},
        "pool": {"scope": "deployment", "segment_bytes_per_host": segment},
        "sim": {"rank_cache_tokens": 64},  # rank HBM holds nothing: hits come from the store
        "workload": {"kind": "uniform", "requests": 1, "prompt_tokens": 10, "output_tokens": 1},
    })


def test_a_store_smaller_than_the_working_set_evicts_and_its_hits_fall(timing):
    reqs = _conversations()
    big = Simulator(_store_sc(10**12), timing, "round-robin", ListSource(reqs)).run()
    ws = big.pool_trace["working_set_bytes"][-1]
    assert big.evictions["pool_dram"] == 0 and big.pool_trace["held_bytes"][-1] == pytest.approx(ws)
    small = Simulator(_store_sc(int(0.1 * ws / 2)), timing, "round-robin", ListSource(reqs)).run()  # two hosts
    assert small.pool_capacity_bytes == pytest.approx(0.1 * ws, rel=1e-6)
    assert small.evictions["pool_dram"] > 0 and small.recomputed_tokens["pool_dram"] > 0
    assert small.hit_rate_by_tier["pool_dram"] < 0.5 * big.hit_rate_by_tier["pool_dram"]
    trace = small.pool_trace
    assert max(trace["held_bytes"]) <= small.pool_capacity_bytes  # held never above the capacity
    assert trace["working_set_bytes"][-1] > 2 * small.pool_capacity_bytes  # the working set outgrew it
    assert trace["t_s"] == sorted(trace["t_s"]) and trace["evictions_dropped"][-1] == small.evictions["pool_dram"]


# ---- item 3: idle as operators read it -------------------------------------------------------
def test_ranks_left_empty_while_another_rank_queues_count_idle_while_waiting(timing):
    """prefix-hash sends every prompt of one shared prefix to one rank: it queues, the three others
    have nothing to do; least-uncached-work spreads the queue."""
    reqs = [Request(i, 0.001 * i, 64 * 40, 2, tuple(range(8)) + tuple(1000 * (i + 1) + b for b in range(32)))
            for i in range(40)]
    sc = _store_sc(10**12)
    piled = Simulator(sc, timing, "prefix-hash", ListSource(reqs)).run()
    spread = Simulator(sc, timing, "least-uncached-work", ListSource(reqs)).run()
    by_rank = {k: v for k, v in piled.idle_waiting_by_rank.items() if k.startswith("prefill")}
    assert len(by_rank) == 4
    busy = max(by_rank, key=lambda k: -by_rank[k])  # the one rank that took everything idles least
    assert by_rank[busy] == 0.0
    assert all(v > 0.3 for k, v in by_rank.items() if k != busy)
    assert piled.prefill_idle_waiting_frac > 2 * spread.prefill_idle_waiting_frac
    assert 0 <= piled.prefill_idle_waiting_frac <= piled.prefill_empty_frac <= 1


def test_the_report_shows_the_working_set_against_capacity_and_both_idles(timing, tmp_path):
    from rich.console import Console

    from rackserve.sim.report import plot_pool_trace, summary_table

    reqs = _conversations()
    res = Simulator(_store_sc(10**9), timing, "round-robin", ListSource(reqs)).run()
    console = Console(record=True, width=200)
    console.print(summary_table([res]))
    text = console.export_text()
    ws_gb = res.pool_trace["working_set_bytes"][-1] / 1e9
    assert "pool working set | capacity (GB)" in text and f"{ws_gb:,.0f} | 2" in text  # 2 hosts x 1 GB
    assert "rank idle while work waits elsewhere" in text
    plot_pool_trace([res], tmp_path / "pool.png")
    assert (tmp_path / "pool.png").stat().st_size > 1000
