"""Prefix-reuse metrics: where each prompt token's KV came from, and the router's prediction of it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rackserve.metrics.labels import RANK_LABELS, TIERS, TOKEN_COUNT_BUCKETS, RankKey


class CacheMetrics:
    """Prefix reuse: where each prompt token's KV came from, and the router's prediction of it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        labels = [*RANK_LABELS, "tier"]
        self.prefix_tokens = Counter(
            "rackserve_prefix_tokens",
            "Prompt tokens by where their KV came from (tier=miss: computed)",
            labels,
            registry=r,
        )
        self.predicted_cached = Counter(
            "rackserve_router_predicted_cached_tokens",
            "Cached tokens the router predicted for its decisions",
            list(RANK_LABELS),
            registry=r,
        )
        self.delivered_cached = Counter(
            "rackserve_delivered_cached_tokens",
            "Cached tokens the chosen prefill rank actually reused",
            list(RANK_LABELS),
            registry=r,
        )
        self.prefix_hit_rate = Gauge(
            "rackserve_prefix_cache_hit_rate",
            "Share of this rank's looked-up prompt tokens whose KV was reused (HBM or pool), since start",
            list(RANK_LABELS),
            registry=r,
        )
        self._lookups: dict[RankKey, tuple[int, int]] = {}  # rank -> (queried, reused) tokens
        self.prediction_error = Histogram(
            "rackserve_cached_tokens_prediction_error_tokens",
            "|delivered - predicted| cached tokens per routing decision",
            buckets=TOKEN_COUNT_BUCKETS,
            registry=r,
        )

    def record_lookup(self, rank: RankKey, tokens_by_tier: dict[str, int]) -> None:
        for tier, tokens in tokens_by_tier.items():
            if tier not in TIERS:
                raise ValueError(f"tier: expected one of {TIERS}, got {tier!r}")
            self.prefix_tokens.labels(**rank.labels(), tier=tier).inc(tokens)
        queried, reused = self._lookups.get(rank, (0, 0))
        queried += sum(tokens_by_tier.values())
        reused += sum(n for tier, n in tokens_by_tier.items() if tier != "miss")
        self._lookups[rank] = (queried, reused)
        if queried:
            self.prefix_hit_rate.labels(**rank.labels()).set(reused / queried)

    def record_decision_outcome(self, rank: RankKey, predicted: int, delivered: int) -> None:
        self.predicted_cached.labels(**rank.labels()).inc(predicted)
        self.delivered_cached.labels(**rank.labels()).inc(delivered)
        self.prediction_error.observe(abs(delivered - predicted))
