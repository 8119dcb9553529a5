"""Issue 32 items 1-3 and 6 in the simulator: pool reads cost their links, events take time, the
pool's scope is a deployment choice, and routing regret is reported."""

import pytest

from rackserve.sim.pool_paths import PoolPaths
from rackserve.sim.pool_scope import AGENTX_DRAM_BYTES_PER_GPU, scoped_pools
from rackserve.sim.scenario import scenario_from_dict
from rackserve.sim.simulator import Simulator
from rackserve.timing.capacity import PoolPath
from rackserve.workload.build import build_source
from rackserve.workload.request import Request
from rackserve.workload.source import ListSource

HUGE = 10**15


def _sc(prefill=2, pool=None, routing=None, sim=None):
    return scenario_from_dict({
        "deployment": {"prefill": [{"layout": "dep2", "count": prefill}],
                       "decode": [{"layout": "wide-ep", "ranks": 4, "count": 1}]},
        "pool": {"hbm_capacity_bytes": HUGE, "dram_capacity_bytes": HUGE, **(pool or {})},
        "routing": routing or {},
        "sim": sim or {},
        "workload": {"kind": "uniform", "requests": 1, "prompt_tokens": 10, "output_tokens": 1},
    })


def _run(sc, timing, reqs, policy="least-uncached-work"):
    return Simulator(sc, timing, policy, ListSource(reqs)).run()


# ---- item 1: pool reads cost what the links cost ----------------------------------------------
def test_a_pool_transfer_pays_bytes_over_its_links_plus_latency_and_setup():
    path = PoolPath(1e12, port_bw_bytes_per_s=1e9, aggregate_bw_bytes_per_s=4e9, latency_s=2e-6)
    paths = PoolPaths({"pool_hbm": path, "pool_dram": path}, {"pool_hbm": 6.6e-6, "pool_dram": 77e-6})
    assert paths.transfer(1.0, ("p", 0), "pool_dram", "read", 0) == 1.0
    assert paths.transfer(1.0, ("p", 0), "pool_dram", "read", 1e6) == pytest.approx(1.0 + 1e-3 + 2e-6 + 77e-6)
    # the same port again queues behind the first transfer
    assert paths.transfer(1.0, ("p", 0), "pool_dram", "read", 1e6) == pytest.approx(1.0 + 2e-3 + 2e-6 + 77e-6)


def _pool_turns(n=40):
    """Prompt i shares its first 40 blocks with prompt i - 1 (of another conversation on a
    rank it did not run on: routed round-robin, the shared part comes from the pool)."""
    return [Request(i, 0.5 * i, 64 * 48, 2, tuple(range(0, 40)) + tuple(range(1000 * (i + 1), 1000 * (i + 1) + 8)))
            for i in range(n)]


def test_a_pool_hit_waits_for_its_bytes_unless_prefetched_while_queued(timing):
    # a slow DRAM tier (1 MB/s port): the fetch outlasts the compute
    pool = {"hbm_capacity_bytes": 0, "dram_transfer_setup_s": 0.05}
    slow = {"sim": {"rank_cache_tokens": 64 * 8}}
    cold = _run(_sc(pool={**pool, "prefetch_while_queued": False}, **slow), timing, _pool_turns(), "round-robin")
    assert cold.hit_rate_by_tier["pool_dram"] > 0.5
    assert cold.ttft_breakdown_s["kv_transfer"] >= 0.04  # the setup alone, (nearly) every pooled read
    assert cold.prefill_kv_transfer_frac > 0.3
    assert sum(cold.ttft_breakdown_s.values()) == pytest.approx(cold.ttft_p50_s, rel=0.2)
    # arriving together, they queue: fetched while queued, they wait for (almost) nothing
    burst = [r.__class__(r.req_id, 1.0 + 0.001 * r.req_id if r.req_id else 0.0, r.prompt_tokens, r.output_tokens,
                         r.block_hashes) for r in _pool_turns()]  # the shared prefix is pooled by then
    late = _run(_sc(pool={**pool, "prefetch_while_queued": False}, **slow), timing, burst, "round-robin")
    early = _run(_sc(pool=pool, **slow), timing, burst, "round-robin")
    assert early.ttft_breakdown_s["kv_transfer"] < 0.5 * late.ttft_breakdown_s["kv_transfer"]
    assert early.ttft_p50_s < late.ttft_p50_s


# ---- item 2: puts and events take time --------------------------------------------------------
def test_a_block_is_a_hit_for_routing_only_after_its_event_reaches_the_router(timing):
    # the second prompt arrives 5 ms after the first was stored: with a 50 ms event lag the router
    # does not know it yet (predicts nothing), but the rank finds it
    first = Request(0, 0.0, 64 * 20, 2, tuple(range(20)))
    second = Request(1, 0.0, 64 * 24, 2, tuple(range(24)))
    base = _run(_sc(prefill=1), timing, [first])
    t_stored = base.ttft_samples[0]  # ~ when its prefill ended
    second = Request(1, t_stored + 0.005, 64 * 24, 2, tuple(range(24)))
    fresh = _run(_sc(prefill=1, routing={"event_lag_s": 0.0}), timing, [first, second])
    lagged = _run(_sc(prefill=1, routing={"event_lag_s": 0.05}), timing, [first, second])
    assert fresh.predicted_hit_rate == pytest.approx(fresh.hit_rate)
    assert lagged.predicted_hit_rate < lagged.hit_rate
    assert lagged.hit_rate == pytest.approx(fresh.hit_rate)


# ---- item 3: pool scope -----------------------------------------------------------------------
def test_scoped_pools_split_the_host_dram_by_instance_and_agentx_caps_it():
    hbm = PoolPath(1e12, 1e11, 1e12, 2e-6)
    dram = PoolPath(24e12, 2e11, 3.2e12, 2e-6)
    insts = [("prefill-0", 2), ("prefill-1", 2)]
    (rack,) = scoped_pools("rack", insts, 8, hbm, dram, 9e11)
    assert rack.instances == ("prefill-0", "prefill-1") and rack.pool_dram is dram
    (none,) = scoped_pools("none", insts, 8, hbm, dram, 9e11)
    assert none.pool_hbm.capacity_bytes == none.pool_dram.capacity_bytes == 0
    own = scoped_pools("instance", insts, 8, hbm, dram, 9e11)
    assert [p.instances for p in own] == [("prefill-0",), ("prefill-1",)]
    assert own[0].pool_hbm.capacity_bytes == 0 and own[0].pool_dram.capacity_bytes == 24e12 * 2 / 8
    assert own[0].pool_dram.port_bw_bytes_per_s == 9e11  # the CPU-GPU link, not the NIC
    agentx = scoped_pools("agentx", insts, 8, hbm, dram, 9e11)
    assert agentx[0].pool_dram.capacity_bytes == 2 * AGENTX_DRAM_BYTES_PER_GPU


def test_an_instance_pool_serves_only_its_own_instance(timing):
    # the same prompt twice, routed round-robin to the two instances in turn... (ranks 0/0, 0/1,
    # 1/0): with one rack pool the third finds it pooled; with pools per instance the prompt that
    # lands on instance 1 finds nothing
    reqs = [Request(i, 1.0 * i, 64 * 30, 2, tuple(range(30))) for i in range(3)]
    rack = _run(_sc(sim={"rank_cache_tokens": 64}), timing, reqs, "round-robin")
    own = _run(_sc(pool={"scope": "instance"}, sim={"rank_cache_tokens": 64}), timing, reqs, "round-robin")
    none = _run(_sc(pool={"scope": "none"}, sim={"rank_cache_tokens": 64}), timing, reqs, "round-robin")
    assert rack.hit_rate > own.hit_rate > none.hit_rate == 0.0
    assert own.pool_scope == "instance"


def test_the_agentx_preset_runs_on_a_real_trace(timing):
    sc = scenario_from_dict({
        "deployment": {"prefill": [{"layout": "dep2", "count": 2}],
                       "decode": [{"layout": "wide-ep", "ranks": 8, "count": 1}]},
        "pool": {"scope": "agentx"},
        "sim": {"kv_block_multiple": 16},
        "workload": {"kind": "agentx-trace", "limit": 10, "concurrency": 6, "duration_s": 60.0,
                     "measure_start_s": 0.0},
    })
    res = Simulator(sc, timing, "least-uncached-work", build_source(sc.workload, 64, "m")).run()
    assert res.completed > 10 and res.hit_rate_by_tier["pool_hbm"] == 0.0


# ---- item 6: routing regret -------------------------------------------------------------------
def test_regret_is_zero_for_least_uncached_work_with_a_fresh_index_and_positive_for_round_robin(timing):
    reqs = [Request(i, 0.05 * i, 64 * 40, 2, tuple(range(1000 * (i % 3), 1000 * (i % 3) + 40))) for i in range(30)]
    luw = _run(_sc(routing={"lockstep_balance": False, "event_lag_s": 0.0}, sim={"rank_cache_tokens": 64 * 40},
                   pool={"scope": "none"}), timing, reqs)
    rr = _run(_sc(routing={"event_lag_s": 0.0}, sim={"rank_cache_tokens": 64 * 40}, pool={"scope": "none"}),
              timing, reqs, "round-robin")
    assert luw.regret_mean_s == pytest.approx(0.0, abs=1e-12)
    assert rr.regret_mean_s > 0 and rr.regret_p90_s > 0


def test_regret_reuses_the_routers_match_only_where_the_lag_hid_nothing(timing, monkeypatch):
    """Regret prices the hindsight match; where the event lag cut no lookup short the router's own
    match is that match, and reusing it changes no regret (against always matching again)."""
    reqs = [Request(i, 0.005 * i, 64 * 40, 2, tuple(range(1000 * (i % 3), 1000 * (i % 3) + 40))) for i in range(60)]
    sc = _sc(routing={"event_lag_s": 0.05}, sim={"rank_cache_tokens": 64 * 400})
    reused = _run(sc, timing, reqs)
    sim_seen: list[Simulator] = []
    original = Simulator._regret

    def always_again(self, view, chosen, routed=None):
        sim_seen.append(self)
        return original(self, view, chosen, None)

    monkeypatch.setattr(Simulator, "_regret", always_again)
    again = _run(sc, timing, reqs)
    assert sim_seen[0].kv.lag_cuts > 0  # the lag did hide blocks from some lookups here
    assert (reused.regret_mean_s, reused.regret_p90_s) == (again.regret_mean_s, again.regret_p90_s)
    assert reused.regret_mean_s > 0  # a stale view costs something: the comparison is not of zeros
