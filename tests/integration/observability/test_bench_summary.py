"""The bench client's pure parts: summary numbers vs a hand computation, prompt prefix sharing,
rank idle share from two scrapes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rackserve.metrics import ProcessMetrics, RankKey
from rackserve.workload.mooncake import TraceRecord
from rackserve.workload.request import Request
from services.bench.client import rank_idle_pct
from services.bench.outcome import Outcome
from services.bench.summary import format_summary, summarize
from services.bench.workload import SessionPrompts, TracePrompts

VLLM_FIELDS = {
    "duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
    "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls", "errors",
    "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
    "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms",
}  # fmt: skip


def _outcome(
    i: int, start: float, chunks: list[float], out_tokens: int, cached: int = 0
) -> Outcome:
    return Outcome(i, prompt_tokens=100, max_tokens=out_tokens, start=start, chunk_times=chunks,
                   end=chunks[-1], output_tokens=out_tokens, cached_tokens=cached, success=True)  # fmt: skip


def test_summary_converts_wall_to_simulated_with_time_scale():
    # time_scale 2: two wall seconds per simulated second, so every interval halves.
    a = _outcome(0, 0.0, [0.4, 0.6, 0.8], 3, cached=50)
    b = _outcome(1, 1.0, [2.0, 2.2, 2.4, 2.6], 4, cached=0)
    failed = Outcome(2, 100, 4, error="HTTP 500: boom")
    r = summarize([a, b, failed], wall_duration_s=4.0, time_scale=2.0, model_id="m")
    assert VLLM_FIELDS <= set(r)
    assert r["completed"] == 2 and r["failed"] == 1 and r["errors"] == ["HTTP 500: boom"]
    assert r["duration"] == pytest.approx(2.0)
    assert r["request_throughput"] == pytest.approx(1.0)
    assert r["total_output_tokens"] == 7 and r["output_throughput"] == pytest.approx(3.5)
    assert r["ttfts"] == pytest.approx([0.2, 0.5])
    assert r["mean_ttft_ms"] == pytest.approx(350.0)
    # TPOT: a (0.8-0.4)/2 wall = 0.2 -> 0.1 sim; b (2.6-2.0)/3 wall = 0.2 -> 0.1 sim
    assert r["mean_tpot_ms"] == pytest.approx(100.0)
    itls = [0.1, 0.1, 0.1, 0.1, 0.1]
    assert r["mean_itl_ms"] == pytest.approx(1000 * np.mean(itls))
    assert r["p99_e2el_ms"] == pytest.approx(1000 * np.percentile([0.4, 0.8], 99))
    assert r["cached_token_share"] == pytest.approx(50 / 200)
    assert r["output_tok_per_s_per_user"] == pytest.approx([10.0, 10.0])
    json.dumps(r)  # the result must be JSON-serializable as is
    table = format_summary(r)
    assert (
        "Successful requests:" in table
        and "P90 TTFT (ms):" in table
        and "Cached input token share" in table
    )


def test_unpaced_cluster_reports_wall_seconds():
    r = summarize(
        [_outcome(0, 0.0, [0.5, 1.0], 2)], wall_duration_s=1.0, time_scale=0.0, model_id="m"
    )
    assert r["clock"].startswith("wall") and r["mean_ttft_ms"] == pytest.approx(500.0)


def test_trace_prompts_share_prefixes_by_hash_id_and_scale_lengths():
    recs = [TraceRecord(0.0, 1100, 20, (1, 2, 3)), TraceRecord(500.0, 700, 10, (1, 9))]
    tp = TracePrompts(recs, length_scale=0.25)  # 512-token blocks become 128
    p0, p1 = tp.prompt(0), tp.prompt(1)
    assert len(p0) == 275 and len(p1) == 175
    assert p0[:128] == p1[:128] and p0[128:256] != p1[128:256]
    assert max(p0 + p1) < 256
    reqs = tp.requests()
    assert [r.arrival_s for r in reqs] == [0.0, 0.5] and [r.output_tokens for r in reqs] == [5, 2]
    rated = tp.requests(request_rate=4.0, seed=1)
    assert rated[0].arrival_s == 0.0 and rated[1].arrival_s > 0


def test_session_prompts_resend_the_conversation_and_fork_subagents():
    sp = SessionPrompts(seed=3)
    t0 = sp.prompt(Request(0, 0.0, 50, 4, (), session=7, turn=0))
    t1 = sp.prompt(Request(1, 1.0, 80, 4, (), session=7, turn=1))
    sub = sp.prompt(Request(2, 2.0, 95, 4, (), session=7, turn=1000))
    other = sp.prompt(Request(3, 0.0, 50, 4, (), session=8, turn=0))
    assert t1[:50] == t0 and sub[:80] == t1 and len(sub) == 95
    assert other != t0


def test_rank_idle_share_between_two_scrapes():
    m = ProcessMetrics("m")
    r0, r1 = RankKey("decode-wide-ep-0", 0, "decode"), RankKey("decode-wide-ep-0", 1, "decode")
    m.ranks.record_step(r0, 1.0, 0.0, 4)
    before = m.exposition().decode()
    m.ranks.record_step(r0, 0.3, 0.0, 4)
    m.ranks.record_step(r1, 0.1, 0.2, 1)
    after = m.exposition().decode()
    assert rank_idle_pct(before, after) == pytest.approx(100 * 0.2 / 0.6)
    assert rank_idle_pct(after, after) is None


def test_cluster_reported_latencies_are_summarized_separately():
    a = _outcome(0, 0.0, [0.4, 0.6], 2)
    a.server = {"ttft_s": 0.1, "tpot_s": 0.01, "e2e_s": 0.11}
    b = _outcome(1, 0.0, [0.4, 0.6], 2)
    b.server = {"ttft_s": 0.3, "tpot_s": 0.03, "e2e_s": 0.33}
    r = summarize([a, b], wall_duration_s=1.0, time_scale=1.0, model_id="m")
    assert r["server_mean_ttft_ms"] == pytest.approx(200.0)
    assert r["server_median_tpot_ms"] == pytest.approx(20.0)
    assert r["server_p90_e2el_ms"] == pytest.approx(1000 * np.percentile([0.11, 0.33], 90))
    assert "Cluster-reported" in format_summary(r)
