"""Issue 32 item 4: the KV-aware policies balance the ranks of a lockstep instance within its steps."""

import pytest

from rackserve.sim.scenario import scenario_from_dict
from rackserve.sim.simulator import Simulator
from rackserve.workload.build import build_source
from rackserve.workload.request import Request
from rackserve.workload.source import ListSource


def _run(timing, policy, requests, balance=True):
    sc = scenario_from_dict({
        "deployment": {"prefill": [{"layout": "dep2", "count": 1}],
                       "decode": [{"layout": "wide-ep", "ranks": 4, "count": 1}]},
        "pool": {"scope": "none"},
        "routing": {"lockstep_balance": balance},
        "workload": {"kind": "uniform", "requests": 1, "prompt_tokens": 10, "output_tokens": 1},
    })
    return Simulator(sc, timing, policy, ListSource(requests)).run()


def _alternating(n=300, spacing_s=0.01):
    """Prompts of 8,000 and 500 tokens in turn, faster than one DEP2 instance prefills them: the
    order round-robin is worst at (every long prompt on one rank)."""
    return [Request(i, i * spacing_s, 8000 if i % 2 == 0 else 500, 2, tuple(range(i * 1000, i * 1000 + 7)))
            for i in range(n)]


@pytest.mark.parametrize("policy", ["least-uncached-work", "dynamo-kv"])
def test_a_saturated_dep2_pair_idles_less_under_the_kv_policies_than_round_robin_can(timing, policy):
    reqs = _alternating()
    rr = _run(timing, "round-robin", reqs)
    fed = _run(timing, policy, reqs)
    assert fed.prefill_util > 0.95 and rr.prefill_util > 0.95  # saturated
    assert rr.prefill_idle_frac > 0.3
    assert fed.prefill_idle_frac < 0.1
    assert set(fed.prefill_idle_by_instance) == {"prefill-0"}
    assert set(fed.prefill_idle_by_rank) == {"prefill-0/0", "prefill-0/1"}


def _agentx(timing, balance):
    sc = scenario_from_dict({
        "deployment": {"prefill": [{"layout": "dep2", "count": 4}],
                       "decode": [{"layout": "wide-ep", "ranks": 8, "count": 1}]},
        "routing": {"lockstep_balance": balance},
        "sim": {"kv_block_multiple": 16},
        "workload": {"kind": "agentx-trace", "limit": 40, "concurrency": 12, "duration_s": 120.0,
                     "measure_start_s": 0.0},
    })
    return Simulator(sc, timing, "least-uncached-work", build_source(sc.workload, 64, "m")).run()


def test_lockstep_balance_trades_rank_hits_for_less_sibling_idle_on_agentx_turns(timing):
    # turns stick to the rank that holds their conversation; charging the idle a pick forces on the
    # sibling sends some to it instead (they read their prefix from the pool there)
    sticky, balanced = _agentx(timing, False), _agentx(timing, True)
    assert balanced.prefill_idle_frac < sticky.prefill_idle_frac - 0.08
    assert balanced.hit_rate_by_tier["pool_hbm"] > sticky.hit_rate_by_tier["pool_hbm"]
    assert balanced.hit_rate == pytest.approx(sticky.hit_rate, abs=0.01)
    assert balanced.completed >= sticky.completed - 2
