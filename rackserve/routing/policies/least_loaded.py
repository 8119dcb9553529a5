"""least-loaded: the rank with the least queued prefill work, ignoring caches (baseline)."""

from __future__ import annotations

from rackserve.routing.match import PrefixMatch
from rackserve.routing.policy import PolicySettings, register
from rackserve.routing.view import ClusterView, RequestView, Scored


@register("least-loaded")
class LeastLoaded:
    name = "least-loaded"

    def __init__(self, settings: PolicySettings) -> None:
        pass

    def choose(self, request: RequestView, cluster: ClusterView, match: PrefixMatch) -> Scored:
        rank = min(cluster.prefill_ranks(), key=lambda r: r.load_order)
        return Scored(rank, rank.queued_work_s)
