"""Front-door stage metrics: wall time of each hop of a request on its way to the first token."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

# Wall seconds of one hop (services/stage_timer.py names the stages): 0.1 ms to 1 s.
STAGE_WALL_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03,
    0.05, 0.075, 0.1, 0.25, 1.0,
)  # fmt: skip


class StageMetrics:
    """Where a request's wall time to its first token goes, hop by hop (real time, not paced)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.wall = Histogram(
            "rackserve_frontdoor_stage_wall_seconds",
            "Wall time of each hop to the first token, by stage (services/stage_timer.py)",
            ["stage"],
            buckets=STAGE_WALL_BUCKETS,
            registry=registry,
        )
