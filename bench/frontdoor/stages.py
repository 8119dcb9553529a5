"""Where bench/frontdoor/overhead.py's TTFT overhead goes: the per-stage wall-time histogram
(`rackserve_frontdoor_stage_wall_seconds{stage}`, services/stage_timer.py) scraped from the front
door's merged /metrics before and after the latency phase, as count, mean and p50 per stage (p50
interpolated inside the histogram's bucket, as PromQL's histogram_quantile does).
"""

from __future__ import annotations

import math

import httpx
from prometheus_client.parser import text_string_to_metric_families

from services.stage_timer import STAGES

FAMILY = "rackserve_frontdoor_stage_wall_seconds"


def scrape(base: str) -> dict[str, dict]:
    """{stage: {"buckets": [(le, cumulative count)], "sum": s, "count": n}} from /metrics."""
    text = httpx.get(f"{base}/metrics", timeout=30).text
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        if family.name != FAMILY:
            continue
        for sample in family.samples:
            entry = out.setdefault(sample.labels["stage"], {"buckets": [], "sum": 0.0, "count": 0})
            if sample.name.endswith("_bucket"):
                entry["buckets"].append((float(sample.labels["le"]), sample.value))
            elif sample.name.endswith("_sum"):
                entry["sum"] += sample.value
            elif sample.name.endswith("_count"):
                entry["count"] += sample.value
    return out


def delta(before: dict[str, dict], after: dict[str, dict]) -> dict[str, dict]:
    """What was observed between two scrapes, stage by stage."""
    out = {}
    for stage, now in after.items():
        then = before.get(stage, {"buckets": [], "sum": 0.0, "count": 0})
        old = dict(then["buckets"])
        buckets = sorted((le, n - old.get(le, 0.0)) for le, n in now["buckets"])
        out[stage] = {
            "buckets": buckets,
            "sum": now["sum"] - then["sum"],
            "count": now["count"] - then["count"],
        }
    return out


def quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """histogram_quantile over cumulative (le, count) pairs, linear inside the bucket."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return math.nan
    rank, low, below = q * total, 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return low
            return low + (le - low) * (rank - below) / max(count - below, 1e-12)
        low, below = le, count
    return low


def summary(observed: dict[str, dict]) -> dict[str, dict]:
    """{stage: {"count", "mean_ms", "p50_ms"}} in request order."""
    out = {}
    for stage in STAGES:
        entry = observed.get(stage)
        if not entry or entry["count"] <= 0:
            continue
        out[stage] = {
            "count": int(entry["count"]),
            "mean_ms": 1000 * entry["sum"] / entry["count"],
            "p50_ms": 1000 * quantile(0.5, entry["buckets"]),
        }
    return out


def table(stages: dict[str, dict], before: dict[str, dict] | None = None) -> None:
    """Print the stages (and a 'before' column when given)."""
    head = f"{'stage (wall)':24s}{'n':>6s}{'mean ms':>10s}{'p50 ms':>10s}"
    print(head + (f"{'before p50':>12s}" if before else ""))
    for stage, row in stages.items():
        line = f"{stage:24s}{row['count']:6d}{row['mean_ms']:10.2f}{row['p50_ms']:10.2f}"
        if before and stage in before:
            line += f"{before[stage]['p50_ms']:12.2f}"
        print(line)
