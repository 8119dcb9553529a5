"""random: a uniformly random healthy prefill rank from a seeded generator (baseline)."""

from __future__ import annotations

import random

from rackserve.routing.match import PrefixMatch
from rackserve.routing.policy import PolicySettings, register
from rackserve.routing.view import ClusterView, RequestView, Scored


@register("random")
class RandomChoice:
    name = "random"

    def __init__(self, settings: PolicySettings) -> None:
        self._rng = random.Random(settings.seed)

    def choose(self, request: RequestView, cluster: ClusterView, match: PrefixMatch) -> Scored:
        ranks = cluster.prefill_ranks()
        return Scored(ranks[self._rng.randrange(len(ranks))], 0.0)
