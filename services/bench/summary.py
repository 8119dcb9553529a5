"""Benchmark summary: vLLM `bench serve` field names, latencies converted to simulated seconds.

A wall-clock interval becomes simulated seconds by dividing by the cluster's time_scale (wall
seconds per simulated second). An unpaced cluster (time_scale 0) has no simulated clock: then the
numbers stay wall seconds and `clock` says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np

from rackserve.sim.metrics import slow_tail_speed
from rackserve.workload.trace_replay import MAX_OVERFLOW_SHARE
from services.bench.outcome import Outcome

PERCENTILES = (90, 99)
LATENCIES = (("ttft", "TTFT", "Time to First Token"), ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
             ("itl", "ITL", "Inter-token Latency"), ("e2el", "E2EL", "End-to-end Latency"))  # fmt: skip


def to_sim(wall_s: float, time_scale: float) -> float:
    return wall_s / time_scale if time_scale > 0 else wall_s


def _stats(name: str, values_s: Sequence[float]) -> dict[str, float]:
    ms = np.asarray(values_s, dtype=float) * 1000.0
    if ms.size == 0:
        ms = np.zeros(1)
    out = {f"mean_{name}_ms": float(ms.mean()), f"median_{name}_ms": float(np.median(ms)),
           f"std_{name}_ms": float(ms.std())}  # fmt: skip
    for p in PERCENTILES:
        out[f"p{p}_{name}_ms"] = float(np.percentile(ms, p))
    return out


def summarize(
    outcomes: Sequence[Outcome],
    wall_duration_s: float,
    time_scale: float,
    *,
    model_id: str,
    request_rate: float | None = None,
    max_concurrency: int | None = None,
    rank_idle_pct: float | None = None,
    measure_start_s: float = 0.0,
    measure_s: float | None = None,
    unsent_overflows: int = 0,
) -> dict:
    """The result JSON (vLLM names + rackserve extras) of a finished or interrupted run.

    Figures count the measured requests only: not warm-ups, and scheduled (simulated s from the
    start) within [measure_start_s, measure_start_s + measure_s); the duration is that window's
    part of the run. Context overflows (refused by the server, or never sent by the replay because
    they cannot fit) are counted over every request; more than 1 % makes the run invalid (AgentX).
    """
    all_outcomes = outcomes
    sim = lambda s: to_sim(s, time_scale)  # noqa: E731
    run_s = sim(wall_duration_s) if wall_duration_s > 0 else 0.0
    end_s = run_s if measure_s is None else min(run_s, measure_start_s + measure_s)
    duration = max(0.0, end_s - measure_start_s)
    measured = [o for o in outcomes if not o.warmup and measure_start_s <= o.arrival_s < end_s + 1e-9]
    overflows = sum(o.overflowed for o in outcomes) + unsent_overflows
    overflow_share = overflows / (len(outcomes) + unsent_overflows) if outcomes or unsent_overflows else 0.0
    outcomes = measured
    ok = [o for o in outcomes if o.success]
    per_s = (lambda n: n / duration) if duration > 0 else (lambda n: 0.0)
    total_in = sum(o.prompt_tokens for o in ok)
    total_out = sum(o.output_tokens for o in ok)
    cached = sum(o.cached_tokens for o in ok)
    ttfts = [sim(o.ttft_wall) for o in ok if o.ttft_wall is not None]
    tpots = [sim(o.tpot_wall) for o in ok if o.tpot_wall is not None]
    itls = [sim(x) for o in ok for x in o.itls_wall]
    e2els = [sim(o.e2e_wall) for o in ok]
    result = {
        "date": datetime.now(UTC).strftime("%Y%m%d-%H%M%S"),
        "backend": "openai",
        "model_id": model_id,
        "tokenizer_id": model_id,
        "num_prompts": len(outcomes),
        "request_rate": request_rate if request_rate is not None else "inf",
        "burstiness": 1.0,  # Poisson arrivals (vLLM's gamma shape 1) when a rate is given
        "max_concurrency": max_concurrency,
        "duration": duration,
        "completed": len(ok),
        "failed": len(outcomes) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": per_s(len(ok)),
        "output_throughput": per_s(total_out),
        "total_token_throughput": per_s(total_in + total_out),
        "input_lens": [o.prompt_tokens for o in ok],
        "output_lens": [o.output_tokens for o in ok],
        "ttfts": ttfts,
        "itls": [[sim(x) for x in o.itls_wall] for o in ok],
        "errors": [o.error for o in outcomes if not o.success],
    }
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        result |= _stats(name, values)
    result |= {
        "clock": "simulated" if time_scale > 0 else "wall (unpaced cluster)",
        "time_scale": time_scale,
        "wall_duration": wall_duration_s,
        "total_cached_input_tokens": cached,
        "cached_token_share": cached / total_in if total_in else 0.0,
        "rank_idle_pct": rank_idle_pct,
        "output_tok_per_s_per_user": per_user_speeds(ok, time_scale),
        **interactivity(ok, time_scale),
        "warmup_requests": sum(o.warmup for o in all_outcomes),
        "measure_window_s": [measure_start_s, end_s],
        "context_overflows": overflows,
        "context_overflow_share": overflow_share,
        "valid": overflow_share <= MAX_OVERFLOW_SHARE,
    }
    result |= server_stats(ok)
    return result


def server_stats(ok: Sequence[Outcome]) -> dict[str, float]:
    """The cluster's own simulated latencies (the router's `rackserve` field: cost model time, no
    pacing lag), as server_<stat>_<ttft|tpot|e2el>_ms; empty when the cluster did not report them."""
    out: dict[str, float] = {}
    for key, name in (("ttft_s", "ttft"), ("tpot_s", "tpot"), ("e2e_s", "e2el")):
        values = [o.server[key] for o in ok if key in o.server]
        if values:
            out |= {f"server_{k}": v for k, v in _stats(name, values).items()}
    return out


def per_user_speeds(outcomes: Sequence[Outcome], time_scale: float) -> list[float]:
    """Each stream's output tokens/s after its first token (= 1 / TPOT), simulated."""
    return [1.0 / to_sim(o.tpot_wall, time_scale) for o in outcomes if o.tpot_wall]


def interactivity(ok: Sequence[Outcome], time_scale: float) -> dict[str, float]:
    """AgentX interactivity (rackserve.sim.metrics): E2E-normalized = output tokens / E2E latency
    (TTFT counts; the headline) and ITL-based = 1 / TPOT, each as 1 / p50 and 1 / p90 (the slow
    tail) of seconds per output token over the successful requests, simulated."""
    e2e = [to_sim(o.e2e_wall, time_scale) / o.output_tokens for o in ok if o.output_tokens > 0]
    itl = [to_sim(o.tpot_wall, time_scale) for o in ok if o.tpot_wall]
    return {f"tps_user_{kind}_{pc}": slow_tail_speed(values, q) for kind, values in (("e2e", e2e), ("itl", itl))
            for pc, q in (("p50", 50), ("p90", 90))}


def format_summary(r: dict) -> str:
    """The familiar `vllm bench serve` table, plus the twin's cached share and rank idle time."""
    unit = "" if r["clock"] == "simulated" else " [wall]"
    rows = [
        ("Successful requests:", r["completed"]),
        ("Failed requests:", r["failed"]),
        (f"Benchmark duration (s){unit}:", f"{r['duration']:.2f}"),
        ("Total input tokens:", r["total_input_tokens"]),
        ("Total generated tokens:", r["total_output_tokens"]),
        ("Request throughput (req/s):", f"{r['request_throughput']:.2f}"),
        ("Output token throughput (tok/s):", f"{r['output_throughput']:.2f}"),
        ("Total Token throughput (tok/s):", f"{r['total_token_throughput']:.2f}"),
        ("Cached input token share (%):", f"{100 * r['cached_token_share']:.1f}"),
        (
            "Rank idle time (%):",
            "n/a" if r["rank_idle_pct"] is None else f"{r['rank_idle_pct']:.1f}",
        ),
        ("Warm-up requests (not counted):", r["warmup_requests"]),
        ("Context overflows (%):", f"{r['context_overflows']} ({100 * r['context_overflow_share']:.1f})"),
        ("tok/s/user E2E-normalized P50 | P90:", f"{r['tps_user_e2e_p50']:.1f} | {r['tps_user_e2e_p90']:.1f}"),
        ("tok/s/user ITL-based P50 | P90:", f"{r['tps_user_itl_p50']:.1f} | {r['tps_user_itl_p90']:.1f}"),
    ]
    lines = ["{s:{c}^50}".format(s=" Serving Benchmark Result ", c="=")]
    lines += [f"{k:<40}{v:<10}" for k, v in rows]
    for key, short, title in LATENCIES:
        lines.append("{s:{c}^50}".format(s=title, c="-"))
        lines.append(f"{f'Mean {short} (ms):':<40}{r[f'mean_{key}_ms']:<10.2f}")
        lines.append(f"{f'Median {short} (ms):':<40}{r[f'median_{key}_ms']:<10.2f}")
        for p in PERCENTILES:
            lines.append(f"{f'P{p} {short} (ms):':<40}{r[f'p{p}_{key}_ms']:<10.2f}")
    if "server_mean_ttft_ms" in r:
        lines.append("{s:{c}^50}".format(s="Cluster-reported (cost model, no pacing lag)", c="-"))
        for key, short, _ in LATENCIES:
            if f"server_mean_{key}_ms" in r:
                lines.append(f"{f'Mean {short} (ms):':<40}{r[f'server_mean_{key}_ms']:<10.2f}")
                lines.append(f"{f'P90 {short} (ms):':<40}{r[f'server_p90_{key}_ms']:<10.2f}")
    lines.append("=" * 50)
    if not r["valid"]:
        lines.append(f"INVALID RUN: {100 * r['context_overflow_share']:.1f}% of requests overflowed the "
                     f"model's context (AgentX allows {MAX_OVERFLOW_SHARE:.0%})")  # fmt: skip
    return "\n".join(lines)
