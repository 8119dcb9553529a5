"""The live router's routing regret (issue 32 item 6, live clock): each decision, once its prefill
rank says what it delivered, is priced against the cheapest prefill rank the decision saw
(rackserve/routing/regret.py, the simulator's regret_mean_s) and observed as
rackserve_router_regret_seconds{policy}."""

from __future__ import annotations

import pytest

from rackserve.config import RoutingSection
from rackserve.kv.block_hash import block_hashes
from rackserve.metrics import ProcessMetrics
from rackserve.routing.router import Router
from rackserve.routing.timing_cost import TimingCost
from rackserve.timing import TimingModel
from services.router.router_core import RouterCore
from services.topology import InstanceSpec

BLOCK = 16
COST = TimingCost(TimingModel.create())


def make_core(policy: str) -> RouterCore:
    prefill = [InstanceSpec("prefill-dep2-0", "prefill", "dep2", 2, 2)]
    decode = [InstanceSpec("decode-wide-ep-0", "decode", "wide-ep", 4, 4)]
    router = Router.from_config(RoutingSection(policy=policy, lockstep_balance=False), cost=COST)
    return RouterCore(prefill, decode, router, BLOCK, ProcessMetrics("m"), cost=COST)


def prompt(i: int, n: int) -> list[int]:
    return [(i * 7919 + t) % 250 + 1 for t in range(n)]


def route(core: RouterCore, i: int, n: int):
    p = prompt(i, n)
    return core.route(f"r{i}", p, block_hashes(p, BLOCK, "m"), max_tokens=8)


def regret_samples(core: RouterCore, policy: str) -> tuple[float, float]:
    get = core.metrics.registry.get_sample_value
    labels = {"policy": policy}
    return (get("rackserve_router_regret_seconds_count", labels) or 0.0,
            get("rackserve_router_regret_seconds_sum", labels) or 0.0)


def burst(core: RouterCore) -> list:
    """A long prompt, a short one, then a third while both are still queued: round-robin sends
    the third behind the long one, least-uncached-work to the rank with less queued work."""
    return [route(core, 0, 8000), route(core, 1, 100), route(core, 2, 1000)]


def test_round_robin_pays_regret_where_least_uncached_work_pays_none():
    rr = make_core("round-robin")
    routes = burst(rr)
    assert routes[2].prefill_rank == routes[0].prefill_rank  # behind the long prompt
    regret = [rr.regret_s(r, 0) for r in routes]
    assert regret[0] == 0.0 and regret[1] == 0.0
    long_work = routes[0].booking.queued_work_s - routes[1].booking.queued_work_s
    assert regret[2] == pytest.approx(long_work, rel=1e-6) and regret[2] > 0

    luw = make_core("least-uncached-work")
    routes = burst(luw)
    assert routes[2].prefill_rank != routes[0].prefill_rank
    assert [luw.regret_s(r, 0) for r in routes] == [0.0, 0.0, 0.0]


def test_the_delivered_hit_prices_the_chosen_rank():
    rr = make_core("round-robin")
    routes = burst(rr)
    none = rr.regret_s(routes[2], 0)
    found = rr.regret_s(routes[2], 992)  # the rank found most of the prompt after all
    assert 0.0 <= found < none


def test_record_delivery_observes_the_regret_histogram():
    rr = make_core("round-robin")
    routes = burst(rr)
    for r in routes:
        rr.record_delivery(r, 0)
    count, total = regret_samples(rr, "round-robin")
    assert count == 3
    assert total == pytest.approx(rr.regret_s(routes[2], 0), rel=1e-6)
