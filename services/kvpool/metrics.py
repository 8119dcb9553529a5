"""Prometheus metrics of the KV pool service, refreshed from the pool's own counters at each scrape.

The names of `rackserve.metrics.PoolMetrics` (what the dashboards read):
  rackserve_pool_blocks{tier}, rackserve_pool_used_bytes{tier} (target bytes),
  rackserve_pool_capacity_bytes{tier}, rackserve_pool_hit_blocks_total{tier},
  rackserve_pool_miss_blocks_total, rackserve_pool_evictions_total{tier}, rackserve_pool_active_leases
and the service's own extras, same prefix:
  rackserve_pool_redis_bytes{tier} (actual bytes), rackserve_pool_redis_budget_bytes, rackserve_pool_epoch,
  rackserve_pool_{puts,put_blocks,gets,demotions,lease_expiries,alloc_failures,clears}_total
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rackserve.metrics import PoolMetrics, Registry
from services.kvpool.server import PoolServicer

P = "rackserve_pool_"
TIER_NAMES = {1: "pool_hbm", 2: "pool_dram"}
EXTRA_COUNTERS = {
    "puts": "BatchPutReserve calls", "put_blocks": "blocks offered to the pool",
    "gets": "BatchGet calls", "demotions": "blocks demoted pool_hbm -> pool_dram",
    "lease_expiries": "read leases that expired unreleased",
    "alloc_failures": "blocks refused for lack of space (the caller recomputes)",
    "clears": "times all metadata was cleared (start, Redis restarted empty)",
}


class PoolCollector:
    """Registered first in the registry: on each scrape it takes one snapshot of the pool, pushes
    it into `PoolMetrics` (collected right after, registries collect in registration order) and
    yields the extras."""

    def __init__(self, servicer: PoolServicer) -> None:
        self.servicer = servicer
        self.shared: PoolMetrics | None = None
        self._seen: dict[tuple[str, str], float] = {}

    def collect(self) -> Iterator[Metric]:
        with self.servicer.lock:
            s = self.servicer.stats()
        if self.shared is not None:
            self._refresh(s)
        redis_bytes = GaugeMetricFamily(P + "redis_bytes", "actual bytes of the tier's blocks in Redis", labels=["tier"])
        for t in s.tiers:
            redis_bytes.add_metric([TIER_NAMES[t.tier]], t.bytes)
        yield redis_bytes
        yield GaugeMetricFamily(P + "redis_budget_bytes", "Redis byte budget", value=s.redis_budget_bytes)
        yield GaugeMetricFamily(P + "epoch", "pool incarnation: bumps when Redis restarted empty", value=s.epoch)
        for name, doc in EXTRA_COUNTERS.items():
            yield CounterMetricFamily(P + name, doc, value=getattr(s, name))

    def _refresh(self, s: object) -> None:
        m = self.shared
        assert m is not None
        for t in s.tiers:  # type: ignore[attr-defined]
            tier = TIER_NAMES[t.tier]
            m.record_tier(tier, t.keys, t.target_bytes, t.capacity_bytes)
            self._advance(m.hits.labels(tier=tier), ("hits", tier), t.hits)
            self._advance(m.evictions.labels(tier=tier), ("evictions", tier), t.evictions)
        self._advance(m.misses, ("misses", ""), s.misses)  # type: ignore[attr-defined]
        m.leases.set(s.active_leases)  # type: ignore[attr-defined]

    def _advance(self, counter: object, key: tuple[str, str], total: float) -> None:
        """Counters only go up: add what the pool counted since the last scrape."""
        delta = total - self._seen.get(key, 0)
        if delta > 0:
            counter.inc(delta)  # type: ignore[attr-defined]
            self._seen[key] = total


def pool_registry(servicer: PoolServicer) -> CollectorRegistry:
    registry = Registry(auto_describe=False)  # no *_created families
    collector = PoolCollector(servicer)
    registry.register(collector)  # type: ignore[arg-type]
    collector.shared = PoolMetrics(registry)
    return registry


def serve_metrics(servicer: PoolServicer, port: int, host: str = "127.0.0.1") -> tuple[object, int]:
    """Serve /metrics on host:port (0 = any free port). Returns (server, port)."""
    server, _thread = start_http_server(port, addr=host, registry=pool_registry(servicer))
    return server, server.server_port
