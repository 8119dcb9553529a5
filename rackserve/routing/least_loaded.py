"""least-loaded: the rank with the least queued prefill work, ignoring caches (baseline)."""

from __future__ import annotations

from rackserve.routing.index import PrefixMatch
from rackserve.routing.policy import PolicySettings, register
from rackserve.routing.view import RankState, RequestView, Scored


@register("least-loaded")
class LeastLoaded:
    name = "least-loaded"

    def __init__(self, settings: PolicySettings) -> None:
        pass

    def choose(
        self, request: RequestView, ranks: tuple[RankState, ...], match: PrefixMatch
    ) -> Scored:
        rank = min(ranks, key=lambda r: (r.queued_work_s, r.queued_tokens, r.running_seqs))
        return Scored(rank, rank.queued_work_s)
