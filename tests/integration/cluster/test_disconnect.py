"""A client that hangs up mid-stream: the front door records an aborted request, frees its slot,
and the cluster keeps serving."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration

MODEL = "rackserve-moe-small"


def sample(base: str, name: str, labels: dict[str, str]) -> float:
    """Sum of the series `name` whose labels include `labels` (on the merged /metrics)."""
    text = httpx.get(f"{base}/metrics", timeout=30).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_hang_up_mid_stream_is_aborted_and_freed(live_cluster) -> None:
    base = live_cluster.base_url
    aborted_before = sample(base, "rackserve_requests_total", {"status": "aborted"})
    body = {
        "model": MODEL,
        "prompt": "a long story",
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0,
    }
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as reply:
        events = 0
        for line in reply.iter_lines():
            events += line.startswith("data: {")
            if events == 3:
                break  # hang up after three chunks
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        aborted = sample(base, "rackserve_requests_total", {"status": "aborted"})
        in_flight = sample(base, "rackserve_requests_in_flight", {})
        if aborted == aborted_before + 1 and in_flight == 0:
            break
        time.sleep(0.2)
    assert aborted == aborted_before + 1 and in_flight == 0
    # The decode rank dropped the request: no more output tokens (400 would take seconds).
    produced = sample(base, "rackserve_instance_tokens_total", {"role": "decode", "kind": "output"})
    time.sleep(1.5)
    assert sample(base, "rackserve_instance_tokens_total", {"role": "decode", "kind": "output"}) == produced
    after = httpx.post(
        f"{base}/v1/completions",
        timeout=60,
        json={"model": MODEL, "prompt": "still here", "max_tokens": 3, "ignore_eos": True},
    ).json()
    assert after["usage"]["completion_tokens"] == 3
