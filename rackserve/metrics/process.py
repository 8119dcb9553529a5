"""All metric groups of one process in one registry, and the records that feed several groups."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, generate_latest

from rackserve.metrics.cache import CacheMetrics
from rackserve.metrics.front_door import FrontDoorMetrics
from rackserve.metrics.labels import TTFT_COMPONENTS, RankKey
from rackserve.metrics.planner import PlannerMetrics
from rackserve.metrics.pool import PoolMetrics
from rackserve.metrics.ranks import RankMetrics
from rackserve.metrics.registry import Registry
from rackserve.metrics.request_record import RequestRecord
from rackserve.metrics.router import RouterMetrics
from rackserve.metrics.stages import StageMetrics
from rackserve.metrics.vllm import VllmMetrics


class ProcessMetrics:
    """All metric groups of one process in one registry (a process records only what it does)."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None) -> None:
        self.model_name = model_name
        self.registry = registry if registry is not None else Registry()
        self.front_door = FrontDoorMetrics(self.registry)
        self.cache = CacheMetrics(self.registry)
        self.ranks = RankMetrics(self.registry)
        self.router = RouterMetrics(self.registry)
        self.pool = PoolMetrics(self.registry)
        self.vllm = VllmMetrics(self.registry, model_name)
        self.stages = StageMetrics(self.registry)
        self.planner = PlannerMetrics(self.registry)

    def exposition(self) -> bytes:
        """The Prometheus text format of this process's registry."""
        return generate_latest(self.registry)

    def observe_request(self, rec: RequestRecord) -> None:
        """Record one finished front-door request under both rackserve_ and vllm: names."""
        fd, m = self.front_door, self.model_name
        fd.requests.labels(status=rec.status).inc()
        fd.tokens.labels(kind="cached").inc(rec.prompt_cached_tokens)
        fd.tokens.labels(kind="uncached").inc(rec.prompt_uncached_tokens)
        fd.tokens.labels(kind="output").inc(rec.output_tokens)
        self.vllm.observe_request(rec)
        if rec.ttft_s is not None:
            fd.ttft.labels(model_name=m).observe(rec.ttft_s)
            for component in TTFT_COMPONENTS:
                fd.ttft_component.labels(component=component).observe(
                    getattr(rec, f"{component}_s")
                )
        for gap in rec.inter_token_s:
            fd.inter_token.labels(model_name=m).observe(gap)
        if rec.e2e_s is not None:
            fd.e2e.labels(model_name=m).observe(rec.e2e_s)
        if rec.tpot_s is not None:
            fd.tpot.labels(model_name=m).observe(rec.tpot_s)

    def observe_prefix_lookup(self, rank: RankKey, tokens_by_tier: dict[str, int]) -> None:
        """A prefill rank's lookup of one prompt: rackserve_prefix_tokens + vllm:prefix_cache_*."""
        self.cache.record_lookup(rank, tokens_by_tier)
        vl = {"model_name": self.model_name, "engine": rank.engine}
        self.vllm.prefix_cache_queries.labels(**vl).inc(sum(tokens_by_tier.values()))
        hits = sum(n for tier, n in tokens_by_tier.items() if tier != "miss")
        self.vllm.prefix_cache_hits.labels(**vl).inc(hits)

    def observe_rank_state(
        self,
        rank: RankKey,
        running: int,
        waiting: int,
        queued_uncached_tokens: int,
        kv_blocks_used: int,
        kv_blocks_capacity: int,
    ) -> None:
        """A rank's current load, under both rackserve_ and vllm: names."""
        labels = rank.labels()
        self.ranks.queued_uncached.labels(**labels).set(queued_uncached_tokens)
        self.ranks.kv_blocks_used.labels(**labels).set(kv_blocks_used)
        self.ranks.kv_blocks_capacity.labels(**labels).set(kv_blocks_capacity)
        vl = {"model_name": self.model_name, "engine": rank.engine}
        self.vllm.num_requests_running.labels(**vl).set(running)
        self.vllm.num_requests_waiting.labels(**vl).set(waiting)
        usage = kv_blocks_used / kv_blocks_capacity if kv_blocks_capacity else 0.0
        self.vllm.kv_cache_usage_perc.labels(**vl).set(usage)

    def observe_preemptions(self, rank: RankKey, count: int) -> None:
        """Requests a rank's scheduler preempted (recompute) in one step."""
        vl = {"model_name": self.model_name, "engine": rank.engine}
        self.vllm.num_preemptions.labels(**vl).inc(count)


def metric_names(registry: CollectorRegistry) -> Iterable[str]:
    """Family names registered in `registry` (counters without the `_total` suffix)."""
    for family in registry.collect():
        yield family.name
