"""KV pool metrics: occupancy and traffic per pool tier."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from rackserve.metrics.labels import POOL_TIERS


class PoolMetrics:
    """The KV pool service: occupancy and traffic per tier (pool_hbm, pool_dram)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.blocks = Gauge(
            "rackserve_pool_blocks", "Blocks held per pool tier", ["tier"], registry=r
        )
        self.used_bytes = Gauge(
            "rackserve_pool_used_bytes", "Target bytes held per pool tier", ["tier"], registry=r
        )
        self.capacity_bytes = Gauge(
            "rackserve_pool_capacity_bytes", "Target capacity per pool tier", ["tier"], registry=r
        )
        self.hits = Counter(
            "rackserve_pool_hit_blocks", "Blocks found per pool tier", ["tier"], registry=r
        )
        self.misses = Counter(
            "rackserve_pool_miss_blocks", "Blocks looked up and not found", registry=r
        )
        self.evictions = Counter(
            "rackserve_pool_evictions",
            "Blocks evicted per tier (pool_hbm: demoted)",
            ["tier"],
            registry=r,
        )
        self.leases = Gauge(
            "rackserve_pool_active_leases", "Read leases currently held", registry=r
        )

    def record_tier(self, tier: str, blocks: int, used_bytes: int, capacity_bytes: int) -> None:
        if tier not in POOL_TIERS:
            raise ValueError(f"tier: expected one of {POOL_TIERS}, got {tier!r}")
        self.blocks.labels(tier=tier).set(blocks)
        self.used_bytes.labels(tier=tier).set(used_bytes)
        self.capacity_bytes.labels(tier=tier).set(capacity_bytes)
