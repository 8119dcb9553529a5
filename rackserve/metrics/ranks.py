"""Per-rank metrics: lockstep busy/idle time, batch, queue, KV blocks, pacing lag; per-instance tokens."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rackserve.metrics.labels import BATCH_SIZE_BUCKETS, RANK_LABELS, ROLES, TOKEN_KINDS, RankKey


class RankMetrics:
    """Per (instance, dp_rank, role): lockstep busy/idle time, batch, queue, KV, pacing."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        rl = list(RANK_LABELS)
        self.busy = Counter(
            "rackserve_rank_busy_seconds", "Simulated seconds this rank computed", rl, registry=r
        )
        self.idle = Counter(
            "rackserve_rank_idle_seconds",
            "Simulated seconds this rank waited at the lockstep barrier",
            rl,
            registry=r,
        )
        # rackserve/metrics/idle_waiting.py: the idle an operator reads (not the lockstep share above)
        self.idle_while_waiting = Counter(
            "rackserve_rank_idle_while_waiting_seconds",
            "Simulated seconds this rank had nothing to compute while requests waited at another rank of its role",
            rl,
            registry=r,
        )
        self.steps = Counter("rackserve_rank_steps", "Steps this rank took part in", rl, registry=r)
        self.batch_size = Gauge(
            "rackserve_rank_batch_size", "Sequences in this rank's current step", rl, registry=r
        )
        self.batch_size_hist = Histogram(
            "rackserve_rank_batch_size_sequences",
            "Sequences per step",
            ["role"],
            buckets=BATCH_SIZE_BUCKETS,
            registry=r,
        )
        self.queued_uncached = Gauge(
            "rackserve_rank_queued_uncached_tokens",
            "Prompt tokens queued here that must still be computed",
            rl,
            registry=r,
        )
        self.kv_blocks_used = Gauge(
            "rackserve_rank_kv_blocks_used",
            "KV blocks held in this rank's HBM cache",
            rl,
            registry=r,
        )
        self.kv_blocks_capacity = Gauge(
            "rackserve_rank_kv_blocks_capacity",
            "KV blocks this rank's HBM cache holds at most",
            rl,
            registry=r,
        )
        self.pacing_lag = Counter(
            "rackserve_rank_pacing_lag_seconds",
            "Wall seconds real compute overran the paced step budget",
            rl,
            registry=r,
        )
        self.lagging_steps = Counter(
            "rackserve_rank_lagging_steps",
            "Steps whose real compute overran the paced budget",
            rl,
            registry=r,
        )
        il = ["instance", "role"]
        self.instance_tokens = Counter(
            "rackserve_instance_tokens",
            "Tokens processed by an instance (cached, uncached, output)",
            [*il, "kind"],
            registry=r,
        )
        self.instance_gpus = Gauge(
            "rackserve_instance_gpus", "GPUs of the emulated instance", il, registry=r
        )
        # Simulated tokens/s per GPU is derived in PromQL (see deploy/grafana):
        #   rate(rackserve_instance_tokens_total[1m]) * rackserve_time_scale / rackserve_instance_gpus

    def record_step(self, rank: RankKey, busy_s: float, idle_s: float, batch_size: int) -> None:
        """One lockstep step of one rank: it computed busy_s and waited idle_s (simulated)."""
        labels = rank.labels()
        self.busy.labels(**labels).inc(busy_s)
        self.idle.labels(**labels).inc(idle_s)
        self.steps.labels(**labels).inc()
        self.batch_size.labels(**labels).set(batch_size)
        self.batch_size_hist.labels(role=rank.role).observe(batch_size)

    def declare_instance(self, instance: str, role: str, gpus: int) -> None:
        """Once at start: how many GPUs an instance emulates (the per-GPU throughput divisor)."""
        if role not in ROLES:
            raise ValueError(f"role: expected one of {ROLES}, got {role!r}")
        self.instance_gpus.labels(instance=instance, role=role).set(gpus)

    def record_instance_tokens(
        self, instance: str, role: str, tokens_by_kind: dict[str, int]
    ) -> None:
        """Tokens an instance processed in one step, by kind (cached, uncached, output)."""
        for kind, n in tokens_by_kind.items():
            if kind not in TOKEN_KINDS:
                raise ValueError(f"kind: expected one of {TOKEN_KINDS}, got {kind!r}")
            self.instance_tokens.labels(instance=instance, role=role, kind=kind).inc(n)

    def record_pacing(self, rank: RankKey, lag_wall_s: float) -> None:
        if lag_wall_s <= 0:
            return
        self.pacing_lag.labels(**rank.labels()).inc(lag_wall_s)
        self.lagging_steps.labels(**rank.labels()).inc()
