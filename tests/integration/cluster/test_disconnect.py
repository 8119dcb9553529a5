"""A client that hangs up mid-stream: the front door records an aborted request, frees its slot,
and the cluster keeps serving."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration

MODEL = "rackserve-moe-small"


def families(base: str):
    return text_string_to_metric_families(httpx.get(f"{base}/metrics", timeout=30).text)


def sample(base: str, name: str, labels: dict[str, str]) -> float:
    """Sum of the series `name` whose labels include `labels` (on the merged /metrics)."""
    return sum(
        s.value
        for family in families(base)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def decode_running(base: str) -> float:
    """Requests running or waiting on the decode ranks (each rank's gauges, refreshed every 1 s)."""
    return sum(
        s.value
        for family in families(base)
        for s in family.samples
        if s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting")
        and s.labels.get("engine", "").startswith("decode")
    )


def wait_for(predicate, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling interval of a condition, not a timed wait


MAX_TOKENS = 1500  # far more than the decode rank produces before the hang-up is seen


def test_hang_up_mid_stream_is_aborted_and_freed(live_cluster) -> None:
    """No timed waits: the decode rank's own gauges prove the request was dropped. Streaming goes
    on until a gauge refresh shows the request running there; after the hang-up the same gauges
    must read 0 (a fresh refresh, since they read 1 after the request started) while its output
    is still short of MAX_TOKENS: a decode rank that kept the request would reach 0 only after
    producing all of them."""
    base = live_cluster.base_url
    aborted_before = sample(base, "rackserve_requests_total", {"status": "aborted"})
    output = {"role": "decode", "kind": "output"}
    produced_before = sample(base, "rackserve_instance_tokens_total", output)
    body = {
        "model": MODEL,
        "prompt": "a long story",
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0,
    }
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {") and decode_running(base) >= 1:
                break  # hang up once the decode rank is seen running it
        else:
            raise AssertionError("the stream ended before the decode rank was seen running it")
    wait_for(lambda: sample(base, "rackserve_requests_total", {"status": "aborted"}) == aborted_before + 1
             and sample(base, "rackserve_requests_in_flight", {}) == 0, "the abort to be counted")
    wait_for(lambda: decode_running(base) == 0, "the decode rank to drop the request")
    produced = sample(base, "rackserve_instance_tokens_total", output) - produced_before
    assert 0 < produced < MAX_TOKENS - 1, produced  # dropped, not finished
    after = httpx.post(
        f"{base}/v1/completions",
        timeout=60,
        json={"model": MODEL, "prompt": "still here", "max_tokens": 3, "ignore_eos": True},
    ).json()
    assert after["usage"]["completion_tokens"] == 3
