"""Router metrics: decision latency and placement, freshness of the KV prefix index."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rackserve.metrics.labels import RANK_LABELS, WALL_FAST_BUCKETS


class RouterMetrics:
    """The router: how fast and where it decides, and how fresh its KV index is."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.decision_latency = Histogram(
            "rackserve_router_decision_wall_seconds",
            "Wall time of one routing decision (real CPU, not paced)",
            ["policy"],
            buckets=WALL_FAST_BUCKETS,
            registry=r,
        )
        self.decisions = Counter(
            "rackserve_router_decisions",
            "Routing decisions by policy and chosen rank",
            ["policy", *RANK_LABELS],
            registry=r,
        )
        self.regret = Histogram(
            "rackserve_router_regret_seconds",
            "Routing regret per decision, simulated seconds: the chosen prefill rank's cost (queued "
            "work + uncached compute + pool transfers) with the hit it delivered, less the cheapest "
            "rank's at the decision (rackserve/routing/regret.py; the simulator's regret_mean_s)",
            ["policy"],
            buckets=(0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, float("inf")),
            registry=r,
        )
        self.index_blocks = Gauge(
            "rackserve_router_index_blocks",
            "Block entries in the router's KV prefix index",
            registry=r,
        )
        self.event_lag = Histogram(
            "rackserve_router_event_lag_wall_seconds",
            "Wall time from KV event publish to router apply",
            buckets=WALL_FAST_BUCKETS,
            registry=r,
        )
        self.events = Counter(
            "rackserve_router_kv_events",
            "KV events applied by kind (stored/removed/cleared)",
            ["kind"],
            registry=r,
        )
        self.event_gaps = Counter(
            "rackserve_router_kv_event_gaps",
            "Sequence gaps detected in a publisher's KV events",
            registry=r,
        )
        self.migrations = Counter(
            "rackserve_migrations",
            "Requests moved off a failed rank (decode: continued on another decode rank; "
            "prefill: routed again before the first token)",
            ["from_role", "to_role"],
            registry=r,
        )
        for role in ("decode", "prefill"):  # exported at 0 from the start (Prometheus practice:
            self.migrations.labels(role, role)  # a series that appears only on a fault has no rate)
        self.stale_publishers = Gauge(
            "rackserve_router_stale_publishers",
            "KV event publishers with a gap or silent too long",
            registry=r,
        )
