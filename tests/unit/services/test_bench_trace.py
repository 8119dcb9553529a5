"""The bench client's trace-replay parts without a cluster: fitting the model's context, the
measured window and warm-up exclusion in the summary, overflow validity, and prompts whose token
prefixes follow the trace's hash ids."""

from __future__ import annotations

import numpy as np
import pytest

from rackserve.workload.spec import DEFAULT_AGENTX_TRACE, AgentXWorkload, parse_workload
from services.bench.__main__ import parse_args
from services.bench.context_fit import (
    ContextFitError,
    check_agentx_fits,
    fit_length_scale,
    overflow_share,
)
from services.bench.outcome import Outcome
from services.bench.summary import format_summary, summarize
from services.bench.workload import BenchWorkload


def test_fit_picks_the_largest_scale_with_at_most_one_percent_overflow():
    prompts = np.arange(1, 1001) * 100  # 100 .. 100,000 tokens
    outputs = np.full(1000, 50)
    scale = fit_length_scale(prompts, outputs, 4096)
    assert overflow_share(prompts, outputs, scale, 4096) <= 0.01
    assert overflow_share(prompts, outputs, scale * 1.02, 4096) > 0.01
    assert fit_length_scale(prompts, outputs, 10**7) == 1.0  # fits unscaled: no scaling up


def test_a_requested_scale_that_overflows_is_refused_with_what_to_pass():
    prompts, outputs = np.full(100, 10_800), np.full(100, 400)
    with pytest.raises(ContextFitError, match=r"--length-scale 0.5: 100.0% .* 4,096-token context .* use --length-scale 0.3"):
        fit_length_scale(prompts, outputs, 4096, requested=0.5)
    assert fit_length_scale(prompts, outputs, 4096, requested=0.2) == 0.2


def test_agentx_sessions_that_cannot_fit_are_refused_up_front():
    spec = AgentXWorkload(kind="agentx", concurrency=8, sessions=16)  # 10,800-token first prompts
    with pytest.raises(ContextFitError, match="first prompt is 10,800 tokens .* over the model's 4,096-token context"):
        check_agentx_fits(spec, 4096)
    check_agentx_fits(spec.model_copy(update={"system_prompt_tokens": 1000, "tool_defs_tokens": 500}), 4096)


def _done(i, arrival, start, out=3, warmup=False, error=""):
    chunks = [start + 0.1 * (k + 1) for k in range(out)]
    return Outcome(i, 100, out, warmup=warmup, arrival_s=arrival, start=start, chunk_times=chunks,
                   end=chunks[-1], output_tokens=out, success=not error, error=error)  # fmt: skip


def test_summary_counts_the_measured_window_only_and_never_warmups():
    outs = [_done(0, 0.0, 0.0, warmup=True), _done(1, 5.0, 5.0), _done(2, 12.0, 12.0), _done(3, 25.0, 25.0)]
    r = summarize(outs, wall_duration_s=30.0, time_scale=1.0, model_id="m", measure_start_s=10.0, measure_s=10.0)
    assert r["completed"] == 1 and r["total_input_tokens"] == 100  # only request 2 (arrived at 12 s)
    assert r["duration"] == pytest.approx(10.0) and r["warmup_requests"] == 1
    assert r["measure_window_s"] == [10.0, 20.0]
    everything = summarize(outs, wall_duration_s=30.0, time_scale=1.0, model_id="m")
    assert everything["completed"] == 3  # the warm-up still left out


def test_overflows_over_one_percent_make_the_run_invalid():
    overflowed = [Outcome(i, 5000, 10, error='HTTP 400: {"code": "context_length_exceeded"}') for i in range(2)]
    ok = [_done(i, 1.0, 1.0) for i in range(2, 100)]
    r = summarize(ok + overflowed, wall_duration_s=10.0, time_scale=1.0, model_id="m")
    assert r["context_overflows"] == 2 and not r["valid"]
    assert "INVALID RUN: 2.0% of requests overflowed" in format_summary(r)
    more = [_done(i, 1.0, 1.0) for i in range(100, 300)]
    assert summarize(ok + more + overflowed, wall_duration_s=10.0, time_scale=1.0, model_id="m")["valid"]  # 2 in 300
    r = summarize(ok, wall_duration_s=10.0, time_scale=1.0, model_id="m", unsent_overflows=5)
    assert r["context_overflows"] == 5 and not r["valid"]  # never sent by the replay: counted too


def test_replayed_prompts_share_token_prefixes_like_the_trace_and_nothing_across_lanes():
    spec = parse_workload({"kind": "agentx-trace", "concurrency": 2, "length_scale": 0.05, "limit": 1,
                           "start_ratio_min": 0, "start_ratio_max": 0, "max_context": 10**6})  # fmt: skip
    wl = BenchWorkload.from_conversations(spec)
    a, b = wl.source.start()  # two lanes, the same conversation, turn 0
    pa, pb = wl.prompt_of(a), wl.prompt_of(b)
    assert len(pa) == a.prompt_tokens and max(pa) < 256
    assert np.mean(np.array(pa) == np.array(pb)) < 0.05  # cache bust: lanes share nothing
    (a2,) = wl.source.on_done(a, 1.0)
    pa2 = wl.prompt_of(a2)
    n = min(len(pa), len(pa2))
    common = next((i for i in range(n) if pa[i] != pa2[i]), n)
    assert common >= 0.9 * len(pa)  # the next turn resends (most of) its predecessor


def test_cli_refuses_a_bad_length_scale():
    with pytest.raises(SystemExit):
        parse_args(["--trace", DEFAULT_AGENTX_TRACE, "--length-scale", "2"])


def test_bench_reports_agentx_interactivity_both_ways():
    # 3 tokens 0.1 s apart from start: E2E 0.3 s -> 10 tok/s/user; TPOT 0.1 s -> 10 tok/s/user.
    # A request whose first token waits 1 s: E2E 1.2 s for 3 tokens (2.5/s) but TPOT still 0.1 s.
    slow = Outcome(9, 100, 3, arrival_s=1.0, start=1.0, chunk_times=[2.0, 2.1, 2.2], end=2.2, output_tokens=3,
                   success=True)
    r = summarize([_done(1, 1.0, 1.0), slow], wall_duration_s=10.0, time_scale=1.0, model_id="m")
    assert r["tps_user_itl_p50"] == pytest.approx(10.0) and r["tps_user_itl_p90"] == pytest.approx(10.0)
    assert r["tps_user_e2e_p50"] == pytest.approx(1 / ((0.1 + 0.4) / 2))
    assert r["tps_user_e2e_p90"] == pytest.approx(1 / (0.1 + 0.9 * 0.3))  # near the slow one's 2.5
    assert "tok/s/user E2E-normalized P50 | P90:" in format_summary(r)
