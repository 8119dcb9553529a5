"""Prometheus metrics of the KV pool, read from the pool's own counters at scrape time.

Names (all labelled by `tier` = pool_hbm | pool_dram where it applies):
  rackserve_kvpool_keys, _bytes, _target_bytes, _capacity_bytes          gauges per tier
  rackserve_kvpool_redis_bytes, _redis_budget_bytes, _active_leases, _epoch  gauges
  rackserve_kvpool_evictions_total, _hits_total                          counters per tier
  rackserve_kvpool_puts_total, _put_blocks_total, _gets_total, _misses_total, _demotions_total,
  _lease_expiries_total, _alloc_failures_total, _clears_total            counters
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from services.kvpool.server import PoolServicer

P = "rackserve_kvpool_"
TIER_NAMES = {1: "pool_hbm", 2: "pool_dram"}


class PoolCollector:
    """A custom collector: one consistent snapshot of the pool per scrape (no double bookkeeping)."""

    def __init__(self, servicer: PoolServicer) -> None:
        self.servicer = servicer

    def collect(self) -> Iterator[Metric]:
        with self.servicer.lock:
            s = self.servicer.stats()
        per_tier = {
            "keys": ("gauge", "blocks stored in the tier", "keys"),
            "bytes": ("gauge", "actual bytes of the tier's blocks in Redis", "bytes"),
            "target_bytes": ("gauge", "bytes the tier's blocks weigh in the emulated rack", "target_bytes"),
            "capacity_bytes": ("gauge", "tier capacity in target bytes", "capacity_bytes"),
            "evictions": ("counter", "blocks evicted from the tier (demoted or dropped)", "evictions"),
            "hits": ("counter", "BatchGet hits served from the tier", "hits"),
        }
        for name, (kind, doc, attr) in per_tier.items():
            family = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(P + name, doc, labels=["tier"])
            for t in s.tiers:
                family.add_metric([TIER_NAMES[t.tier]], getattr(t, attr))
            yield family
        for name, doc in [("redis_bytes", "actual bytes booked in Redis"),
                          ("redis_budget_bytes", "Redis byte budget"),
                          ("active_leases", "read leases held now"),
                          ("epoch", "pool incarnation; bumps when Redis restarted empty")]:
            yield GaugeMetricFamily(P + name, doc, value=getattr(s, name))
        for name, doc in [("puts", "BatchPutReserve calls"), ("put_blocks", "blocks offered"),
                          ("gets", "BatchGet calls"), ("misses", "BatchGet misses"),
                          ("demotions", "blocks demoted pool_hbm -> pool_dram"),
                          ("lease_expiries", "read leases that expired unreleased"),
                          ("alloc_failures", "blocks refused for lack of space"),
                          ("clears", "times all metadata was cleared")]:
            yield CounterMetricFamily(P + name, doc, value=getattr(s, name))


def serve_metrics(servicer: PoolServicer, port: int, host: str = "127.0.0.1") -> tuple[object, int]:
    """Serve /metrics on host:port (0 = any free port). Returns (server, port)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PoolCollector(servicer))  # type: ignore[arg-type]
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server, server.server_port
