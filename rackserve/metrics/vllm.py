"""vLLM's own metric names (labels model_name, engine), so a stock vLLM dashboard reads the twin."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rackserve.metrics.labels import REQUEST_LATENCY_BUCKETS, TOKEN_LATENCY_BUCKETS, VLLM_LABELS


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
