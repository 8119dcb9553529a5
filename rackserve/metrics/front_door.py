"""Front-door metrics: what a user sees per request (simulated seconds)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rackserve.metrics.labels import REQUEST_LATENCY_BUCKETS, TOKEN_LATENCY_BUCKETS


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
