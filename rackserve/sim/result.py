"""The run summary of a finished simulation (SimResult) from the simulator's counters."""

from __future__ import annotations

from typing import Any

from rackserve.sim.instances import Instance
from rackserve.sim.metrics import SimResult, pct, slow_tail_speed


def _idle(insts: list[Instance]) -> float:
    """Lockstep idle time of the ranks over their stepping time."""
    stepping = sum(i.stepping_s * len(i.ranks) for i in insts)
    return sum(sum(i.rank_idle_s) for i in insts) / stepping if stepping else 0.0


def _util(insts: list[Instance], span: float) -> float:
    return sum(i.stepping_s for i in insts) / (span * len(insts)) if insts else 0.0


def build_result(sim: Any, wall_s: float, cpu_s: float) -> SimResult:
    """The measured window's figures of a finished run (`sim`: the Simulator)."""
    m = sim.metrics
    span = m.span_s()
    gpus = sim.scenario.gpus
    prompt = max(m.prompt_tokens_prefilled, 1)
    by_tier = {t: v / prompt for t, v in m.hit_tokens.items()}

    return SimResult(
        scenario=sim.scenario.name, policy=sim.policy, gpus=gpus, arrivals=m.arrivals,
        completed=m.completed, rejected=m.rejected, span_s=span,
        throughput_per_gpu=(m.input_tokens + m.output_tokens) / span / gpus,
        output_tps_per_gpu=m.output_tokens / span / gpus,
        user_tps_p50=pct(m.user_tps, 50), user_tps_p90=pct(m.user_tps, 10),
        ttft_p50_s=pct(m.ttft, 50), ttft_p90_s=pct(m.ttft, 90), ttft_p99_s=pct(m.ttft, 99),
        tpot_p50_s=pct(m.tpot, 50), tpot_p90_s=pct(m.tpot, 90),
        hit_rate=sum(by_tier.values()), hit_rate_by_tier=by_tier,
        predicted_hit_rate=m.predicted_hit_tokens / prompt,
        prefill_idle_frac=_idle(sim.prefill), decode_idle_frac=_idle(sim.decode),
        prefill_util=_util(sim.prefill, span), decode_util=_util(sim.decode, span),
        pool_occupancy=sim.kv.pool_occupancy(), evictions=sim.kv.evictions(), preemptions=m.preemptions,
        events=sim._events, wall_s=wall_s, cpu_s=cpu_s, ttft_samples=list(m.ttft),
        recomputed_tokens=dict(sim.kv.recomputed_tokens), pool_path_util=sim.kv.paths.utilization(span),
        sizing=sim.sizing.to_dict(), warmup_requests=m.warmup_requests,
        tps_user_e2e_p50=slow_tail_speed(m.e2e_s_per_token, 50), tps_user_e2e_p90=slow_tail_speed(m.e2e_s_per_token, 90),
        tps_user_itl_p50=slow_tail_speed(m.tpot, 50), tps_user_itl_p90=slow_tail_speed(m.tpot, 90),
    )
