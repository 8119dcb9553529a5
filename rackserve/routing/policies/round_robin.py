"""round-robin: each request to the next healthy prefill rank in view order (baseline)."""

from __future__ import annotations

from rackserve.routing.match import PrefixMatch
from rackserve.routing.policy import PolicySettings, register
from rackserve.routing.view import ClusterView, RequestView, Scored


@register("round-robin")
class RoundRobin:
    name = "round-robin"

    def __init__(self, settings: PolicySettings) -> None:
        self._next = 0

    def choose(self, request: RequestView, cluster: ClusterView, match: PrefixMatch) -> Scored:
        ranks = cluster.prefill_ranks()
        rank = ranks[self._next % len(ranks)]
        self._next += 1
        return Scored(rank, 0.0)
