"""One /metrics for the whole cluster: the router's own series merged with the workers' scrapes.

Each worker process (prefill, decode) keeps its own registry and serves it on its own port, so a
Prometheus can scrape them one by one; the front door's /metrics also merges them (family by
family) so one URL shows pacing lag and rank idle time too. Every process registers every family,
so a series the router also has (same name and labels: rackserve_requests_in_flight, the index
gauges, ...) is the router's own: the workers' copies (their untouched defaults) are dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families


class _Merged:
    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


def merge_expositions(texts: Iterable[str]) -> bytes:
    """Prometheus text of all `texts` with each family once and each series once (the first
    text that has a series, by name and labels, gives its value)."""
    merged: dict[str, Metric] = {}
    seen: set[tuple[str, frozenset]] = set()
    for text in texts:
        for family in text_string_to_metric_families(text):
            kept = merged.setdefault(
                family.name, Metric(family.name, family.documentation, family.type)
            )
            for sample in family.samples:
                key = (sample.name, frozenset(sample.labels.items()))
                if key not in seen:
                    seen.add(key)
                    kept.samples.append(sample)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(merged.values()))
    return generate_latest(registry)


class WorkerMetrics:
    """Scrapes the workers' /metrics URLs (concurrently, short timeout; a dead worker is skipped)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self._client = httpx.AsyncClient(timeout=2.0)

    async def scrape(self) -> list[str]:
        replies = await asyncio.gather(
            *(self._client.get(u) for u in self.urls), return_exceptions=True
        )
        return [r.text for r in replies if isinstance(r, httpx.Response) and r.status_code == 200]

    async def merged_with(self, own: bytes) -> bytes:
        return merge_expositions([own.decode(), *await self.scrape()])

    async def close(self) -> None:
        await self._client.aclose()
