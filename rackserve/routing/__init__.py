"""Routing: the prefix index fed by KV events, the policies over a cluster view, decode placement.

Entry point for the simulator and the live router:
    cost = TimingCost.from_config(config)                 # rackserve.routing.timing_cost
    router = Router.from_config(config.routing, cost)
    router.index.apply(event)                             # per KVEvent
    decision = router.route(request_view, cluster_view)
"""

from rackserve.routing import policies  # noqa: F401  (the built-in policies register themselves)
from rackserve.routing.cost import CostModel
from rackserve.routing.decode import place_decode
from rackserve.routing.index import IndexSnapshot, PrefixIndex
from rackserve.routing.match import PrefixMatch
from rackserve.routing.policy import Policy, PolicySettings, make_policy, policy_names, register
from rackserve.routing.records import DecisionRecord, DecisionRecorder, HitRateStats
from rackserve.routing.router import Router
from rackserve.routing.view import (
    ClusterView,
    Decision,
    NoRankAvailable,
    PrefixHit,
    RankId,
    RankState,
    RequestView,
    Scored,
)

__all__ = [
    "ClusterView",
    "CostModel",
    "Decision",
    "DecisionRecord",
    "DecisionRecorder",
    "HitRateStats",
    "IndexSnapshot",
    "NoRankAvailable",
    "Policy",
    "PolicySettings",
    "PrefixHit",
    "PrefixIndex",
    "PrefixMatch",
    "RankId",
    "RankState",
    "RequestView",
    "Router",
    "Scored",
    "make_policy",
    "place_decode",
    "policy_names",
    "register",
]
