"""Against the live cluster: a real Prometheus scraping it answers every query of vLLM's own Grafana
dashboard (fixtures/vllm_grafana_queries.json, source cited there), and the vLLM counters those
panels read agree exactly with the requests this test sent."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration
FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "vllm_grafana_queries.json").read_text())
# $__rate_interval: wide enough that the requests stay in the window while the tests poll.
RATE_INTERVAL = "5m"
PROMPT_LENGTHS = (40, 57, 90, 123, 200, 33)
MAX_TOKENS = (3, 4, 5, 6, 7, 8)
# The counters the dashboard's panels read, summed over engines: what each request adds.
COUNTERS = {
    "vllm:prompt_tokens_total": lambda u: u["prompt_tokens"],
    "vllm:generation_tokens_total": lambda u: u["completion_tokens"],
    "vllm:request_prompt_tokens_sum": lambda u: u["prompt_tokens"],
    "vllm:request_generation_tokens_sum": lambda u: u["completion_tokens"],
    "vllm:request_prompt_tokens_count": lambda u: 1,
    "vllm:e2e_request_latency_seconds_count": lambda u: 1,
    "vllm:request_queue_time_seconds_count": lambda u: 1,
}
LENGTH = {"finished_reason": "length"}


@dataclass(frozen=True)
class Sent:
    model: str
    usages: list[dict]
    before: dict[str, float]  # the router's own value of each counter before the requests


def _own(base_url: str, name: str, labels: dict[str, str] | None = None) -> float:
    """Sum of a series' samples on the router's /metrics (its own and the workers' merged)."""
    want = (labels or {}).items()
    text = httpx.get(f"{base_url}/metrics", timeout=10.0).text
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name and want <= s.labels.items()
    )


def _scalar(prometheus, expr: str, client: httpx.Client) -> float | None:
    result = prometheus.query(expr, client)
    return float(result[0]["value"][1]) if result else None


def _wait_quiet(base_url: str, deadline_s: float = 60.0) -> None:
    """No request in flight (an earlier test's stream may still be ending)."""
    end = time.monotonic() + deadline_s
    while _own(base_url, "rackserve_requests_in_flight") > 0:
        assert time.monotonic() < end, "requests still in flight"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def sent(obs_cluster, prometheus) -> Sent:
    """Once Prometheus has scraped the engines' series (at zero or more), six completions of known
    prompt length and output budget (ignore_eos: each ends by length)."""
    base = obs_cluster.base_url
    model = httpx.get(f"{base}/v1/models", timeout=10.0).json()["data"][0]["id"]
    seen = f'count(vllm:prompt_tokens_total{{model_name="{model}"}})'
    end = time.monotonic() + 60.0
    with httpx.Client(timeout=5.0) as client:
        while not _scalar(prometheus, seen, client):
            assert time.monotonic() < end, "Prometheus never scraped vllm:prompt_tokens_total"
            time.sleep(0.5)
    _wait_quiet(base)
    before = {name: _own(base, name) for name in COUNTERS}
    before["success"] = _own(base, "vllm:request_success_total", LENGTH)
    usages = []
    for i, (length, max_tokens) in enumerate(zip(PROMPT_LENGTHS, MAX_TOKENS, strict=True)):
        prompt = [(11 * i + 7 * j + 1) % 256 for j in range(length)]
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True}  # fmt: skip
        reply = httpx.post(f"{base}/v1/completions", json=body, timeout=120.0)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["finish_reason"] == "length"
        usages.append(reply.json()["usage"])
    return Sent(model, usages, before)


def test_scraped_vllm_counters_equal_what_the_requests_sent(obs_cluster, prometheus, sent):
    """Prometheus's sum of each counter reaches exactly before + what the six requests carried:
    prompt tokens total = the sum of the prompts' lengths, one success by length per request."""
    assert [u["prompt_tokens"] for u in sent.usages] == list(PROMPT_LENGTHS)
    assert [u["completion_tokens"] for u in sent.usages] == list(MAX_TOKENS)
    expected = {n: sent.before[n] + sum(map(add, sent.usages)) for n, add in COUNTERS.items()}
    queries = {n: f'sum({{__name__="{n}",model_name="{sent.model}"}})' for n in COUNTERS}
    expected["success"] = sent.before["success"] + len(sent.usages)
    queries["success"] = (
        f'sum(vllm:request_success_total{{model_name="{sent.model}",finished_reason="length"}})'
    )
    end = time.monotonic() + 60.0
    with httpx.Client(timeout=5.0) as client:
        while True:
            scraped = {n: _scalar(prometheus, q, client) for n, q in queries.items()}
            if scraped == expected or time.monotonic() > end:
                break
            time.sleep(0.5)
    assert scraped == expected
    models = httpx.get(f"{prometheus.url}/api/v1/label/model_name/values", timeout=5.0).json()
    assert sent.model in models["data"]  # the dashboard's $model_name variable offers it


def _dashboard_exprs(model: str) -> dict[str, str]:
    """expr (as Grafana would send it) -> "panel title #i" for every target of vLLM's dashboard."""
    out = {}
    for title, exprs in FIXTURE["panels"].items():
        for i, expr in enumerate(exprs):
            grafana = expr.replace("$model_name", model)
            out[grafana.replace("$__rate_interval", RATE_INTERVAL)] = f"{title} #{i}"
    return out


def _finite_rows(result: list) -> list[dict]:
    """The series with a number (an engine that served nothing in the window divides 0 by 0)."""
    return [r for r in result if math.isfinite(float(r["value"][1]))]


def test_every_query_of_vllms_dashboard_returns_data(prometheus, sent):
    exprs = _dashboard_exprs(sent.model)
    assert len(exprs) == 32, "the fixture holds every target of vLLM's 13 panels"
    answers: dict[str, list] = {}
    end = time.monotonic() + 60.0
    with httpx.Client(timeout=5.0) as client:
        while True:
            for expr in [e for e in exprs if not _finite_rows(answers.get(e, []))]:
                answers[expr] = prometheus.query(expr, client)
            if all(_finite_rows(a) for a in answers.values()) or time.monotonic() > end:
                break
            time.sleep(0.5)
    empty = sorted(f"{exprs[e]}: {e}" for e, a in answers.items() if not _finite_rows(a))
    assert not empty, "vLLM dashboard queries without data:\n" + "\n".join(empty)
    by_title = {exprs[e]: _finite_rows(a) for e, a in answers.items()}

    def total(title: str, **labels: str) -> float:
        rows = by_title[title]
        return sum(float(r["value"][1]) for r in rows if labels.items() <= r["metric"].items())

    # The six requests fall in the window: throughput, finish reasons and lengths show them.
    assert total("Queue Time #0") >= 0
    assert total("Token Throughput #0") > 0 and total("Token Throughput #1") > 0
    assert total("Finish Reason #0", finished_reason="length") > 0
    assert total("Request Prompt Length #0", le="+Inf") > 0
    assert total("Request Generation Length #0", le="+Inf") > 0
    assert total("Requests Prefill and Decode Time #0") > 0
    assert total("Requests Prefill and Decode Time #1") > 0
    assert total("Max Generation Token in Sequence Group #0") > 0
    for title in ("E2E Request Latency #3", "Time To First Token Latency #3",
                  "Inter Token Latency #3", "Time Per Output Token (TPOT) #3"):  # fmt: skip
        assert total(title) > 0, title  # P50 of seconds
    usage = [float(r["value"][1]) for r in by_title["Cache Utilization #0"]]
    assert all(0 <= u <= 1 for u in usage), usage
