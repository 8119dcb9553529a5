"""dynamo-kv: NVIDIA Dynamo's published KV-router cost, for comparison.

cost = overlap_score_weight * prefill_blocks + decode_blocks, where prefill_blocks = blocks queued
for prefill + the request's blocks not in that worker's cache (device tier only, as Dynamo's
indexer sees it) and decode_blocks = active decode blocks + the request's blocks. Temperature 0
picks the cheapest (ties at random); above 0, softmax sampling over min-max normalised costs.
"""

from __future__ import annotations

import math
import random

from rackserve.routing.match import PrefixMatch
from rackserve.routing.policy import PolicySettings, register
from rackserve.routing.view import ClusterView, RankState, RequestView, Scored


@register("dynamo-kv")
class DynamoKV:
    name = "dynamo-kv"

    def __init__(self, settings: PolicySettings) -> None:
        if settings.temperature < 0:
            raise ValueError(f"routing.temperature must be >= 0, got {settings.temperature}")
        self._weight = settings.overlap_score_weight
        self._temperature = settings.temperature
        self._rng = random.Random(settings.seed)

    def costs(
        self, request: RequestView, ranks: tuple[RankState, ...], match: PrefixMatch
    ) -> list[float]:
        bs = request.block_size
        request_blocks = math.ceil(request.prompt_tokens / bs)
        hbm = match.rank_blocks
        out = []
        for rank in ranks:
            overlap = min(hbm.get(rank.key, 0), request_blocks)
            prefill = math.ceil(rank.queued_tokens / bs) + request_blocks - overlap
            decode = rank.active_decode_blocks + request_blocks
            out.append(self._weight * prefill + decode)
        return out

    def choose(self, request: RequestView, cluster: ClusterView, match: PrefixMatch) -> Scored:
        ranks = cluster.prefill_ranks()
        costs = self.costs(request, ranks, match)
        i = self._argmin(costs) if self._temperature == 0 else self._softmax_sample(costs)
        return Scored(ranks[i], costs[i])

    def _argmin(self, costs: list[float]) -> int:
        low = min(costs)
        return self._rng.choice([i for i, c in enumerate(costs) if c == low])

    def _softmax_sample(self, costs: list[float]) -> int:
        low, high = min(costs), max(costs)
        span = (high - low) or 1.0
        weights = [math.exp(-((c - low) / span) / self._temperature) for c in costs]
        return self._rng.choices(range(len(costs)), weights=weights)[0]
