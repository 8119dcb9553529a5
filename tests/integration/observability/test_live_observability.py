"""Against the live cluster: `rackserve bench` completes with no failures and a complete vLLM-named
JSON, and a real Prometheus scraping the cluster answers every dashboard panel's PromQL."""

from __future__ import annotations

import json
import math
import time

import httpx
import pytest

from tests.integration.observability.conftest import BENCH_REQUESTS
from tests.integration.observability.test_bench_summary import VLLM_FIELDS
from tests.integration.observability.test_dashboards import all_exprs

pytestmark = pytest.mark.integration
VLLM_SERIES = {
    "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
}  # fmt: skip


def test_bench_completes_every_request_and_writes_vllm_json(bench_run, prometheus):
    proc = bench_run["proc"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((bench_run["dir"] / "result.json").read_text())
    assert VLLM_FIELDS <= set(result)
    assert result["completed"] == BENCH_REQUESTS and result["failed"] == 0, result["errors"]
    assert (
        result["total_output_tokens"] == 8 * BENCH_REQUESTS
    )  # 32 trace tokens x length scale 0.25
    assert len(result["ttfts"]) == BENCH_REQUESTS and all(t > 0 for t in result["ttfts"])
    scale = float(
        _poll(prometheus, ["max(rackserve_time_scale)"], 30.0)["max(rackserve_time_scale)"][0][
            "value"
        ][1]
    )
    assert result["clock"] == "simulated" and result["time_scale"] == pytest.approx(scale)
    # Simulated duration = wall / time_scale: the run cannot have taken more wall time than it did.
    assert 0 < result["duration"] * scale <= bench_run["wall_s"]
    assert (
        result["server_mean_ttft_ms"] > 0
        and result["server_mean_e2el_ms"] >= result["server_mean_ttft_ms"]
    )
    assert result["cached_token_share"] > 0, (
        "groups share a 2-block prefix: some prompt tokens must hit"
    )
    assert result["rank_idle_pct"] is not None and 0 <= result["rank_idle_pct"] < 100
    assert "Serving Benchmark Result" in proc.stdout and "Mean TTFT (ms):" in proc.stdout
    for png in ("ttft_cdf.png", "tok_per_s_per_user.png"):
        assert (bench_run["dir"] / "plots" / png).read_bytes()[:4] == b"\x89PNG"


def _poll(prometheus, exprs: list[str], deadline_s: float) -> dict[str, list]:
    """Query until every expression has a finite value or the deadline passes; last answers."""
    answers: dict[str, list] = {}
    end = time.monotonic() + deadline_s
    with httpx.Client(timeout=5.0) as client:
        while True:
            pending = [e for e in exprs if not _finite(answers.get(e))]
            for expr in pending:
                answers[expr] = prometheus.query(expr, client)
            if all(_finite(answers[e]) for e in exprs) or time.monotonic() > end:
                return answers
            time.sleep(0.5)


def _finite(result: list | None) -> bool:
    return bool(result) and any(math.isfinite(float(r["value"][1])) for r in result)


def test_every_dashboard_panel_returns_data(prometheus, bench_run):
    exprs = {expr: f"{name} / {title}" for name, title, expr in all_exprs()}
    answers = _poll(prometheus, list(exprs), deadline_s=60.0)
    missing = sorted(f"{exprs[e]}: {e}" for e, res in answers.items() if not _finite(res))
    assert not missing, "panels without data:\n" + "\n".join(missing)


def test_vllm_named_series_exist_with_model_and_engine_labels(prometheus, bench_run):
    answers = _poll(
        prometheus, [f'count by (__name__) ({{__name__="{n}"}})' for n in VLLM_SERIES], 30.0
    )
    assert all(answers.values()), {k: v for k, v in answers.items() if not v}
    series = prometheus.query('{__name__=~"vllm:.*"}')
    assert {s["metric"]["__name__"] for s in series} >= VLLM_SERIES
    assert all("model_name" in s["metric"] and "engine" in s["metric"] for s in series)


def test_rank_series_carry_instance_dp_rank_role(prometheus, bench_run):
    answers = _poll(prometheus, ["rackserve_rank_busy_seconds_total"], 30.0)
    series = answers["rackserve_rank_busy_seconds_total"]
    assert series
    for s in series:
        labels = s["metric"]
        assert labels["role"] in ("prefill", "decode") and labels["dp_rank"].isdigit()
        assert labels["instance"].startswith(labels["role"]), (
            "our `instance` label survived the scrape"
        )
