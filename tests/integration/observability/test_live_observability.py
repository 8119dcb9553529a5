"""Against the live cluster: `rackserve bench` completes with no failures and a complete vLLM-named
JSON, and a real Prometheus scraping the cluster answers every dashboard panel's PromQL."""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.observability.conftest import BENCH_REQUESTS, ROOT, small_trace
from tests.integration.observability.test_bench_summary import VLLM_FIELDS
from tests.integration.observability.test_dashboards import all_exprs

pytestmark = pytest.mark.integration
VLLM_SERIES = {
    "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
    "vllm:request_queue_time_seconds_bucket", "vllm:request_prefill_time_seconds_bucket",
    "vllm:request_decode_time_seconds_bucket", "vllm:request_prompt_tokens_bucket",
    "vllm:request_generation_tokens_bucket", "vllm:iteration_tokens_total_bucket",
    "vllm:request_time_per_output_token_seconds_bucket", "vllm:cache_config_info",
}  # fmt: skip


def test_bench_completes_every_request_and_writes_vllm_json(bench_run, prometheus):
    proc = bench_run["proc"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((bench_run["dir"] / "result.json").read_text())
    assert VLLM_FIELDS <= set(result)
    assert result["completed"] == BENCH_REQUESTS and result["failed"] == 0, result["errors"]
    out_tokens = 32  # 128 trace output tokens x length scale 0.25
    assert result["total_output_tokens"] == out_tokens * BENCH_REQUESTS
    assert len(result["ttfts"]) == BENCH_REQUESTS and all(t > 0 for t in result["ttfts"])
    scale_q = "max(rackserve_time_scale)"
    scale = float(_poll(prometheus, [scale_q], 30.0)[scale_q][0]["value"][1])
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


def test_rackserve_up_started_the_prometheus_we_query(obs_cluster, prometheus):
    assert obs_cluster.prometheus_url == prometheus.url
    jobs = {
        t["labels"]["job"]
        for t in httpx.get(f"{prometheus.url}/api/v1/targets").json()["data"]["activeTargets"]
    }
    assert jobs == {"router", "kvpool"}


def test_every_dashboard_panel_returns_data(prometheus, bench_run):
    exprs = {expr: f"{name} / {title}" for name, title, expr in all_exprs()}
    answers = _poll(prometheus, list(exprs), deadline_s=60.0)
    missing = sorted(f"{exprs[e]}: {e}" for e, res in answers.items() if not _finite(res))
    scrapes = {
        r["metric"]["job"]: r["value"][1] for r in prometheus.query("scrape_duration_seconds")
    }
    ups = {r["metric"]["job"]: r["value"][1] for r in prometheus.query("up")}
    assert not missing, f"panels without data (scrape s {scrapes}, up {ups}):\n" + "\n".join(
        missing
    )


def test_vllm_named_series_exist_with_model_and_engine_labels(prometheus, bench_run):
    answers = _poll(
        prometheus, [f'count by (__name__) ({{__name__="{n}"}})' for n in VLLM_SERIES], 30.0
    )
    assert all(answers.values()), {k: v for k, v in answers.items() if not v}
    series = prometheus.query('{__name__=~"vllm:.*"}')
    assert {s["metric"]["__name__"] for s in series} >= VLLM_SERIES
    assert all("engine" in s["metric"] for s in series)
    # vLLM's info gauge has its config's fields and engine as labels, no model_name.
    per_model = [s for s in series if s["metric"]["__name__"] != "vllm:cache_config_info"]
    assert all("model_name" in s["metric"] for s in per_model)


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


def test_idle_time_is_zero_for_one_rank_and_positive_for_lockstep_ranks(prometheus, bench_run):
    """TP8 decode is one DP rank (nobody to wait for); Wide-EP's 4 ranks wait for the busiest one."""
    q = "rackserve_rank_idle_seconds_total"
    series = _poll(prometheus, [q], 30.0)[q]
    idle = {(s["metric"]["instance"], s["metric"]["dp_rank"]): float(s["value"][1]) for s in series}
    single = {k: v for k, v in idle.items() if k[0].startswith("decode-tp8")}
    lockstep = {k: v for k, v in idle.items() if k[0].startswith("decode-wide-ep")}
    assert single, f"the TP8 instance took no step: {sorted(idle)}"
    assert all(v == pytest.approx(0.0, abs=1e-9) for v in single.values()), (
        single
    )  # float rounding only
    assert len(lockstep) == 4 and sum(lockstep.values()) > 0, lockstep


def _counter_sum(base_url: str, name: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=10.0).text
    return sum(
        s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name
    )


def _complete(base_url: str, prompt: list[int]) -> dict:
    model = httpx.get(f"{base_url}/v1/models", timeout=10.0).json()["data"][0]["id"]
    body = {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0, "ignore_eos": True}
    resp = httpx.post(f"{base_url}/v1/completions", json=body, timeout=120.0)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_predicted_and_delivered_cached_tokens_agree_on_a_clean_run(bench_run):
    """One request stores its prefix; once the router has applied those KV events, a second request
    sharing the prefix is predicted exactly the cached tokens the prefill rank then reuses."""
    base = bench_run["url"]
    prefix = [(7 * i + 3) % 256 for i in range(96)]
    _complete(base, [*prefix, 1, 2, 3])
    index = "rackserve_router_index_blocks"
    end, before = time.monotonic() + 30.0, _counter_sum(base, index)
    while _counter_sum(base, index) <= before and time.monotonic() < end:
        time.sleep(0.2)
    pred0 = _counter_sum(base, "rackserve_router_predicted_cached_tokens_total")
    deliv0 = _counter_sum(base, "rackserve_delivered_cached_tokens_total")
    reply = _complete(base, [*prefix, 4, 5, 6])
    pred = _counter_sum(base, "rackserve_router_predicted_cached_tokens_total") - pred0
    deliv = _counter_sum(base, "rackserve_delivered_cached_tokens_total") - deliv0
    assert deliv == reply["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert pred == deliv


def test_ctrl_c_prints_the_partial_summary(bench_run, tmp_path):
    """SIGINT once some requests have finished: the bench prints the summary of those and exits."""
    trace = small_trace(tmp_path / "long.jsonl", 400)
    base = bench_run["url"]
    cmd = [sys.executable, "-m", "services.bench", "--url", base, "--trace", str(trace),
           "--length-scale", "0.25", "--concurrency", "2", "--no-progress"]  # fmt: skip
    finished = "rackserve_requests_total"
    before = _counter_sum(base, finished)
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        end = time.monotonic() + 120.0
        while _counter_sum(base, finished) < before + 2 and time.monotonic() < end:
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "interrupted" in err, err[-2000:]
    completed = int(re.search(r"Successful requests:\s+(\d+)", out).group(1))
    assert 1 <= completed < 400


def test_info_endpoint_gives_the_clock_bench_converts_with(bench_run, prometheus):
    info = httpx.get(f"{bench_run['url']}/v1/rackserve/info", timeout=10.0).json()
    q = "max(rackserve_time_scale)"
    assert info["time_scale"] == pytest.approx(
        float(_poll(prometheus, [q], 30.0)[q][0]["value"][1])
    )
    result = json.loads((bench_run["dir"] / "result.json").read_text())
    assert result["time_scale"] == pytest.approx(info["time_scale"]) and info["time_scale"] > 0


def test_scraped_values_equal_the_services_own_counts(prometheus, bench_run):
    """Not just "some finite value": Prometheus's answer for a panel's series converges to exactly
    what the router's /metrics says (nothing is sent meanwhile), and that count covers the bench's
    requests and the prefix hits the bench measured."""
    base = bench_run["url"]
    result = json.loads((bench_run["dir"] / "result.json").read_text())
    for name in ("rackserve_requests_total", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total"):  # fmt: skip
        own = _counter_sum(base, name)
        expr = f'sum({{__name__="{name}"}})'
        end = time.monotonic() + 30.0
        while (scraped := _scalar(prometheus.query(expr))) != own:
            assert time.monotonic() < end, (name, scraped, own)
            time.sleep(0.5)
    assert _counter_sum(base, "rackserve_requests_total") >= BENCH_REQUESTS
    assert result["cached_token_share"] > 0
    assert _counter_sum(base, "vllm:prefix_cache_hits_total") > 0


def _scalar(result: list) -> float | None:
    return float(result[0]["value"][1]) if result else None
