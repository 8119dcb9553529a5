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

from rackserve.metrics.cache import CacheMetrics
from rackserve.metrics.front_door import FrontDoorMetrics
from rackserve.metrics.labels import (
    BATCH_SIZE_BUCKETS,
    POOL_TIERS,
    RANK_LABELS,
    REQUEST_LATENCY_BUCKETS,
    ROLES,
    STATUSES,
    TIERS,
    TOKEN_COUNT_BUCKETS,
    TOKEN_KINDS,
    TOKEN_LATENCY_BUCKETS,
    TTFT_COMPONENTS,
    VLLM_LABELS,
    WALL_FAST_BUCKETS,
    RankKey,
)
from rackserve.metrics.pool import PoolMetrics
from rackserve.metrics.process import ProcessMetrics, metric_names
from rackserve.metrics.ranks import RankMetrics
from rackserve.metrics.registry import Registry
from rackserve.metrics.request_record import RequestRecord
from rackserve.metrics.router import RouterMetrics
from rackserve.metrics.stages import STAGE_WALL_BUCKETS, StageMetrics
from rackserve.metrics.vllm import VllmMetrics

__all__ = [
    "BATCH_SIZE_BUCKETS", "POOL_TIERS", "RANK_LABELS", "REQUEST_LATENCY_BUCKETS", "ROLES",
    "STAGE_WALL_BUCKETS", "STATUSES", "TIERS", "TOKEN_COUNT_BUCKETS", "TOKEN_KINDS",
    "TOKEN_LATENCY_BUCKETS", "TTFT_COMPONENTS", "VLLM_LABELS", "WALL_FAST_BUCKETS",
    "CacheMetrics", "FrontDoorMetrics", "PoolMetrics", "ProcessMetrics", "RankKey", "RankMetrics",
    "Registry", "RequestRecord", "RouterMetrics", "StageMetrics", "VllmMetrics", "metric_names",
]  # fmt: skip
