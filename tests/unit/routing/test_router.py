"""Router: healthy ranks only, decode placement by active blocks, errors naming what is missing."""

from __future__ import annotations

import dataclasses

import pytest

from rackserve.config import RoutingSection
from rackserve.routing import (
    ClusterView,
    NoRankAvailable,
    RankState,
    RequestView,
    Router,
    place_decode,
)

REQ = RequestView((1, 2, 3), 50, 16, "r")


def _load(cluster: ClusterView, loads: dict[tuple[str, int], int]) -> ClusterView:
    return ClusterView(
        tuple(
            dataclasses.replace(r, active_decode_blocks=loads[r.key]) if r.key in loads else r
            for r in cluster.ranks
        )
    )


def test_decode_goes_to_least_active_blocks_of_the_requested_layout(idle_cluster):
    cluster = _load(
        idle_cluster, {("d0", 0): 30, ("d0", 1): 10, ("d0", 2): 20, ("d0", 3): 10, ("t0", 0): 0}
    )
    wide = dataclasses.replace(REQ, decode_layout="wide-ep")
    assert place_decode(cluster, "wide-ep").key == ("d0", 1)  # tie with d0/3 -> view order
    d = Router.from_config(RoutingSection(policy="round-robin")).route(wide, cluster)
    assert (d.decode_instance, d.decode_dp_rank) == ("d0", 1)
    assert place_decode(cluster, "tp8").key == ("t0", 0)
    assert place_decode(cluster).key == ("t0", 0)
    sick = ClusterView(
        tuple(dataclasses.replace(r, healthy=r.key != ("d0", 1)) for r in cluster.ranks)
    )
    assert place_decode(sick, "wide-ep").key == ("d0", 3)


def test_no_decode_ranks_means_aggregated(idle_cluster):
    only_prefill = ClusterView(idle_cluster.prefill_ranks())
    d = Router.from_config(RoutingSection(policy="round-robin")).route(REQ, only_prefill)
    assert d.decode_instance is None and d.decode_dp_rank is None


def test_errors_name_what_is_missing(idle_cluster):
    router = Router.from_config(RoutingSection(policy="least-loaded"))
    with pytest.raises(NoRankAvailable, match="decode_layout"):
        router.route(dataclasses.replace(REQ, decode_layout="tp16"), idle_cluster)
    sick = ClusterView(
        tuple(dataclasses.replace(r, healthy=r.role != "prefill") for r in idle_cluster.ranks)
    )
    with pytest.raises(NoRankAvailable, match="prefill") as err:
        router.route(REQ, sick)
    assert err.value.role == "prefill"
    assert isinstance(NoRankAvailable("x", "decode"), ValueError)


def test_from_config_uses_the_seed():
    ranks = ClusterView(tuple(RankState(f"p{i}", 0, "dep2", "prefill") for i in range(8)))
    seq = [
        Router.from_config(RoutingSection(policy="random", seed=5)).route(REQ, ranks).key
        for _ in range(3)
    ]
    assert len(set(seq)) == 1
    a = Router.from_config(RoutingSection(policy="random", seed=5))
    b = Router.from_config(RoutingSection(policy="random", seed=6))
    assert [a.route(REQ, ranks).key for _ in range(20)] != [
        b.route(REQ, ranks).key for _ in range(20)
    ]


def test_decisions_are_recorded_and_delivered(idle_cluster):
    from rackserve.kv.events import EventSequencer, Publisher

    router = Router.from_config(RoutingSection(policy="round-robin"))
    router.index.apply(EventSequencer(Publisher("p0", 0)).make("stored", "rank_hbm", (1, 2)))
    d = router.route(REQ, idle_cluster)  # request_id "r": round-robin starts at p0/0
    assert d.predicted.rank_hbm == 32
    assert router.records.get("r").decision == d
    router.records.deliver("r", 16)
    stats = router.records.stats()
    assert (stats.predicted_tokens, stats.delivered_tokens) == (32, 16)
    router.route(dataclasses.replace(REQ, request_id=""), idle_cluster)  # anonymous: not recorded
    assert len(router.records) == 1
