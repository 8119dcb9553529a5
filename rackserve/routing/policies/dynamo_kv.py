"""dynamo-kv: NVIDIA Dynamo's KV-router cost, term by term as its docs state it, for comparison.

Per (worker, dp_rank) target (ai-dynamo/dynamo docs/components/router/router-concepts.md and
router-configuration.md):
    raw_prefill      = active prefill blocks + prompt blocks
    adjusted_prefill = max(raw_prefill - overlap credit, 0)
    decode           = active decode blocks + new blocks
    cost             = prefill_load_scale x adjusted_prefill + decode
Active prefill blocks: the target's queued uncached prompt tokens in blocks. Overlap credit is
weighted by tier: overlap_score_credit per block in the target's own HBM (device), and per pooled
block pool_hbm_hit_weight (spare HBM, a shared cache) or host_cache_hit_weight (host DRAM, 0.75).
New blocks: the prompt's blocks the target does not hold yet (Dynamo assumes KV reuse: a held
block is not allocated again). Temperature 0 picks the cheapest (ties at random); above 0,
softmax sampling over min-max normalised costs.
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
        self._scale, self._device_credit = settings.dynamo_scale_and_credit()
        self._pool_hbm_weight = settings.pool_hbm_hit_weight
        self._host_weight = settings.host_cache_hit_weight
        self._temperature = settings.temperature
        self._rng = random.Random(settings.seed)

    def overlap_credit(self, match: PrefixMatch, rank: RankState) -> float:
        """Tier-weighted overlap credit of `rank`, in blocks."""
        device, pool_hbm, pool_dram = match.block_tiers(rank.key)
        return (self._device_credit * device + self._pool_hbm_weight * pool_hbm
                + self._host_weight * pool_dram)

    def cost(self, request: RequestView, rank: RankState, match: PrefixMatch) -> float:
        bs = request.block_size
        prompt_blocks = math.ceil(request.prompt_tokens / bs)
        active_prefill = math.ceil(rank.queued_tokens / bs)
        adjusted = max(active_prefill + prompt_blocks - self.overlap_credit(match, rank), 0.0)
        new_blocks = prompt_blocks - min(match.hbm_blocks(rank.key), prompt_blocks)
        return self._scale * adjusted + rank.active_decode_blocks + new_blocks

    def costs(
        self, request: RequestView, ranks: tuple[RankState, ...], match: PrefixMatch
    ) -> list[float]:
        return [self.cost(request, rank, match) for rank in ranks]

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
