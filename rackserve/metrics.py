"""Every Prometheus metric of rackserve, named once, built per process into its own registry.

Latencies are in *simulated* seconds (wall seconds / time_scale) unless the name says `wall`.
Each process (router, prefill, decode, pool, Engram) builds one `ProcessMetrics` and exposes
`ProcessMetrics.registry` on its own /metrics port (the exposition itself is network code and
lives in services/, e.g. `prometheus_client.make_asgi_app(registry)` or
`prometheus_client.start_http_server(port, addr="127.0.0.1", registry=registry)`).

Two families of names:
- vLLM-compatible (`vllm:*`, labels `model_name`, `engine`) so an existing vLLM dashboard works;
- everything else under `rackserve_`, per rank labelled `instance`, `dp_rank`, `role`.
Our `instance` label collides with Prometheus's target label: scrape with `honor_labels: true`
(deploy/prometheus/prometheus.yml does).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Label values used across services: one spelling each.
TIERS = ("rank_hbm", "pool_hbm", "pool_dram", "miss")  # where a prompt token's KV came from
POOL_TIERS = ("pool_hbm", "pool_dram")
ROLES = ("prefill", "decode")
STATUSES = ("finished", "error", "aborted", "rejected")  # how a front-door request ended
TTFT_COMPONENTS = ("queue", "prefill", "kv_transfer", "first_decode")
TOKEN_KINDS = ("cached", "uncached", "output")
RANK_LABELS = ("instance", "dp_rank", "role")
VLLM_LABELS = ("model_name", "engine")

# Buckets in simulated seconds. Rubin decode steps are a few ms, prefill of long prompts seconds.
REQUEST_LATENCY_BUCKETS = (
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04,
    0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip
WALL_FAST_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip
TOKEN_COUNT_BUCKETS = (0, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


@dataclass(frozen=True)
class RankKey:
    """One data-parallel rank of one instance: the label set of every per-rank series."""

    instance: str
    dp_rank: int
    role: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role: expected one of {ROLES}, got {self.role!r}")
        if self.dp_rank < 0:
            raise ValueError(f"dp_rank: must be >= 0, got {self.dp_rank}")

    def labels(self) -> dict[str, str]:
        return {"instance": self.instance, "dp_rank": str(self.dp_rank), "role": self.role}

    @property
    def engine(self) -> str:
        """The vLLM `engine` label of this rank (one vLLM engine core per DP rank)."""
        return f"{self.instance}/{self.dp_rank}"


@dataclass(frozen=True)
class RequestRecord:
    """What the front door knows about one finished request, in simulated seconds."""

    status: str
    prompt_cached_tokens: int
    prompt_uncached_tokens: int
    output_tokens: int
    ttft_s: float | None = None
    queue_s: float = 0.0
    prefill_s: float = 0.0
    kv_transfer_s: float = 0.0
    first_decode_s: float = 0.0
    e2e_s: float | None = None
    inter_token_s: Sequence[float] = field(default_factory=tuple)
    decode_engine: str = ""  # RankKey.engine of the decode rank that streamed it

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status: expected one of {STATUSES}, got {self.status!r}")

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (vLLM's TPOT), None with < 2 tokens."""
        if self.e2e_s is None or self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


class FrontDoorMetrics:
    """The HTTP front door: what a user sees per request."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.ttft = Histogram(
            "rackserve_time_to_first_token_seconds",
            "TTFT at the front door (simulated s)",
            ["model_name"],
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft_component = Histogram(
            "rackserve_ttft_component_seconds",
            "TTFT breakdown: queue, prefill, kv_transfer, first_decode (simulated s)",
            ["component"],
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=r,
        )
        self.inter_token = Histogram(
            "rackserve_inter_token_latency_seconds",
            "Gap between streamed tokens (simulated s)",
            ["model_name"],
            buckets=TOKEN_LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "rackserve_time_per_output_token_seconds",
            "Mean time per output token after the first, per request (simulated s)",
            ["model_name"],
            buckets=TOKEN_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "rackserve_e2e_request_latency_seconds",
            "End-to-end request latency (simulated s)",
            ["model_name"],
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "rackserve_requests", "Front-door requests by how they ended", ["status"], registry=r
        )
        self.tokens = Counter(
            "rackserve_tokens",
            "Tokens by kind: cached/uncached prompt tokens, output tokens",
            ["kind"],
            registry=r,
        )
        self.in_flight = Gauge(
            "rackserve_requests_in_flight", "Requests accepted and not yet finished", registry=r
        )
        self.time_scale = Gauge(
            "rackserve_time_scale", "Wall seconds per simulated second (0 = unpaced)", registry=r
        )


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

    def record_decision_outcome(self, rank: RankKey, predicted: int, delivered: int) -> None:
        self.predicted_cached.labels(**rank.labels()).inc(predicted)
        self.delivered_cached.labels(**rank.labels()).inc(delivered)
        self.prediction_error.observe(abs(delivered - predicted))


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
        self.stale_publishers = Gauge(
            "rackserve_router_stale_publishers",
            "KV event publishers with a gap or silent too long",
            registry=r,
        )


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


class VllmMetrics:
    """vLLM's own names (labels model_name, engine) so a stock vLLM dashboard reads the twin."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        vl = list(VLLM_LABELS)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            vl,
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=r,
        )
        self.inter_token = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            vl,
            buckets=TOKEN_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            vl,
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=r,
        )
        self.prefix_cache_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            vl,
            registry=r,
        )
        self.prefix_cache_hits = Counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            vl,
            registry=r,
        )
        self.num_requests_running = Gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            vl,
            registry=r,
        )
        self.num_requests_waiting = Gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            vl,
            registry=r,
        )
        self.kv_cache_usage_perc = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", vl, registry=r
        )
        self.num_preemptions = Counter(  # exported as vllm:num_preemptions_total
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", vl, registry=r
        )


class ProcessMetrics:
    """All metric groups of one process in one registry (a process records only what it does)."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None) -> None:
        self.model_name = model_name
        self.registry = registry if registry is not None else CollectorRegistry()
        self.front_door = FrontDoorMetrics(self.registry)
        self.cache = CacheMetrics(self.registry)
        self.ranks = RankMetrics(self.registry)
        self.router = RouterMetrics(self.registry)
        self.pool = PoolMetrics(self.registry)
        self.vllm = VllmMetrics(self.registry)

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
        vl = {"model_name": m, "engine": rec.decode_engine}
        if rec.ttft_s is not None:
            fd.ttft.labels(model_name=m).observe(rec.ttft_s)
            self.vllm.ttft.labels(**vl).observe(rec.ttft_s)
            for component in TTFT_COMPONENTS:
                fd.ttft_component.labels(component=component).observe(
                    getattr(rec, f"{component}_s")
                )
        for gap in rec.inter_token_s:
            fd.inter_token.labels(model_name=m).observe(gap)
            self.vllm.inter_token.labels(**vl).observe(gap)
        if rec.e2e_s is not None:
            fd.e2e.labels(model_name=m).observe(rec.e2e_s)
            self.vllm.e2e.labels(**vl).observe(rec.e2e_s)
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
