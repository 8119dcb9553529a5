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


def merge_expositions(texts: Iterable[str]) -> bytes:
    """Prometheus text of all `texts` with each family once and each series once (the first
    text that has a series, by name and labels, gives its value).

    Line by line, not parsed: every text is prometheus_client's own exposition (one family's
    `# HELP`/`# TYPE` then its samples, labels in declaration order), so a series is the same
    text up to its value in every process. Parsing and re-rendering took ~100 ms of the front
    door's event loop per scrape (Prometheus scrapes every second)."""
    families: dict[str, list[str]] = {}  # family name -> its HELP and TYPE lines, its samples
    seen: set[str] = set()  # header lines ("# HELP name", "# TYPE name") and series kept
    for text in texts:
        lines: list[str] = []
        for line in text.splitlines():
            if line.startswith("# "):  # "# HELP name doc" / "# TYPE name type": a family starts
                kind, name = line.split(" ", 3)[1:3]
                lines = families.setdefault(name, [])
                key = f"# {kind} {name}"
            else:
                key = line.rpartition(" ")[0]  # the series: name{labels}, up to its value
            if key and key not in seen:
                seen.add(key)
                lines.append(line)
    return ("\n".join(line for lines in families.values() for line in lines) + "\n").encode()


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
        texts = [own.decode(), *await self.scrape()]
        return await asyncio.to_thread(merge_expositions, texts)

    async def close(self) -> None:
        await self._client.aclose()
