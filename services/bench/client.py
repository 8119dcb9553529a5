"""The HTTP side of the benchmark: one shared httpx.AsyncClient, streamed completions, cluster info.

`stream_completion` posts a token-id prompt to /v1/completions with `stream: true` and records the
wall time of every SSE chunk carrying text, the usage chunk (cached tokens) and the router's own
`rackserve` timings. `cluster_info` reads the cluster's time_scale from an endpoint, never a flag.
"""

from __future__ import annotations

import json
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from services.bench.outcome import Outcome


async def stream_completion(client: httpx.AsyncClient, base_url: str, model: str, out: Outcome,
                            prompt: list[int]) -> Outcome:  # fmt: skip
    body = {"model": model, "prompt": prompt, "max_tokens": out.max_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0.0, "stream_options": {"include_usage": True}}  # fmt: skip
    out.start = time.monotonic()
    try:
        async with client.stream("POST", f"{base_url}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                out.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:300]}"
                return out
            async for line in resp.aiter_lines():
                _on_line(out, line)
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.end = time.monotonic()
    out.success = not out.error and out.output_tokens > 0
    if not out.success and not out.error:
        out.error = "stream ended without tokens or usage"
    return out


def _on_line(out: Outcome, line: str) -> None:
    if not line.startswith("data:"):
        return
    data = line[5:].strip()
    if data == "[DONE]":
        return
    chunk = json.loads(data)
    if "error" in chunk:
        out.error = str(chunk["error"].get("message", chunk["error"]))
        return
    if any(c.get("text") for c in chunk.get("choices", [])):
        out.chunk_times.append(time.monotonic())
    if "rackserve" in chunk:
        out.server = chunk["rackserve"]
    usage = chunk.get("usage")
    if usage:
        out.output_tokens = usage["completion_tokens"]
        out.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


async def cluster_info(client: httpx.AsyncClient, base_url: str) -> dict:
    """{"time_scale": float, "model": str}: /v1/rackserve/info, else the router's metrics + models."""
    resp = await client.get(f"{base_url}/v1/rackserve/info")
    info = resp.json() if resp.status_code == 200 else {}
    if "model" not in info:
        models = (await client.get(f"{base_url}/v1/models")).json()
        info["model"] = models["data"][0]["id"]
    if "time_scale" not in info:
        values = scrape(await metrics_text(client, base_url)).get("rackserve_time_scale")
        if not values:
            raise RuntimeError(
                f"{base_url} exposes neither /v1/rackserve/info nor rackserve_time_scale"
            )
        info["time_scale"] = max(values.values())
    return info


async def model_context(client: httpx.AsyncClient, base_url: str) -> int | None:
    """The served model's context length: `max_model_len` of /v1/models (vLLM's field), or None."""
    resp = await client.get(f"{base_url}/v1/models")
    if resp.status_code != 200:
        return None
    cards = resp.json().get("data") or [{}]
    value = cards[0].get("max_model_len")
    return int(value) if isinstance(value, int) and value > 0 else None


async def metrics_text(client: httpx.AsyncClient, base_url: str) -> str:
    resp = await client.get(f"{base_url}/metrics")
    resp.raise_for_status()
    return resp.text


def scrape(text: str) -> dict[str, dict[frozenset, float]]:
    """Sample name -> {label set: value} of a Prometheus text exposition."""
    out: dict[str, dict[frozenset, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return out


def rank_idle_pct(before: str, after: str) -> float | None:
    """Idle share (%) of all ranks' simulated step time between two scrapes; None without steps."""
    b, a = scrape(before), scrape(after)

    def delta(name: str) -> float:
        old, new = b.get(name, {}), a.get(name, {})
        return sum(v - old.get(k, 0.0) for k, v in new.items())

    idle, busy = (
        delta("rackserve_rank_idle_seconds_total"),
        delta("rackserve_rank_busy_seconds_total"),
    )
    return 100.0 * idle / (idle + busy) if idle + busy > 0 else None
