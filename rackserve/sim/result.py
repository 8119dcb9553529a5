"""The run summary of a finished simulation (SimResult) from the simulator's counters."""

from __future__ import annotations

from typing import Any

from rackserve.sim.decode_load import decode_load_report
from rackserve.sim.instances import Instance
from rackserve.sim.metrics import SimResult, pct, slow_tail_speed
from rackserve.sim.validity import run_validity


def _idle(insts: list[Instance]) -> float:
    """Lockstep idle time of the ranks over their stepping time."""
    stepping = sum(i.stepping_s * len(i.ranks) for i in insts)
    return sum(sum(i.rank_idle_s) for i in insts) / stepping if stepping else 0.0


def _idle_by_instance(insts: list[Instance]) -> tuple[dict[str, float], dict[str, float]]:
    """Lockstep idle per instance and per rank, each over the instance's stepping time."""
    by_inst, by_rank = {}, {}
    for inst in insts:
        idle = inst.rank_idle_s
        span = inst.stepping_s
        by_inst[inst.name] = sum(idle) / (span * len(idle)) if span and idle else 0.0
        for r, s in enumerate(idle):
            by_rank[f"{inst.name}/{r}"] = s / span if span else 0.0
    return by_inst, by_rank


def _util(insts: list[Instance], span: float) -> float:
    return sum(i.stepping_s for i in insts) / (span * len(insts)) if insts else 0.0


def _measured_span(m: Any, span: float) -> tuple[float, float]:
    """(start, end) of what the figures measure: the window, or (none) first arrival + span_s."""
    if m.window_end_s is not None:
        return m.window_start_s, m.window_end_s
    start = m.first_arrival if m.arrivals else m.window_start_s
    return start, start + span


def request_figures(m: Any, scenario: str, policy: str, gpus: int, span: float, events: int, wall_s: float,
                    cpu_s: float, validity: Any) -> dict:
    """The SimResult fields every event loop (P/D and aggregated) reads off its requests the same way:
    counts, throughput, TTFT / TPOT, AgentX interactivity, TTFT parts and the run's validity."""
    return dict(
        scenario=scenario, policy=policy, gpus=gpus, arrivals=m.arrivals,
        completed=m.completed, rejected=m.rejected, span_s=span,
        throughput_per_gpu=(m.input_tokens + m.output_tokens) / span / gpus,
        output_tps_per_gpu=m.output_tokens / span / gpus,
        user_tps_p50=pct(m.user_tps, 50), user_tps_p90=pct(m.user_tps, 10),
        ttft_p50_s=pct(m.ttft, 50), ttft_p90_s=pct(m.ttft, 90), ttft_p99_s=pct(m.ttft, 99),
        tpot_p50_s=pct(m.tpot, 50), tpot_p90_s=pct(m.tpot, 90),
        events=events, wall_s=wall_s, cpu_s=cpu_s, ttft_samples=list(m.ttft), warmup_requests=m.warmup_requests,
        tps_user_e2e_p50=slow_tail_speed(m.e2e_s_per_token, 50), tps_user_e2e_p90=slow_tail_speed(m.e2e_s_per_token, 90),
        tps_user_itl_p50=slow_tail_speed(m.tpot, 50), tps_user_itl_p90=slow_tail_speed(m.tpot, 90),
        ttft_breakdown_s={k: v / max(m.completed, 1) for k, v in m.ttft_parts_s.items()},
        valid=validity.valid, invalid_reasons=validity.reasons,
        overflow_share=validity.overflow_share, metric_coverage=validity.metric_coverage,
    )


def build_result(sim: Any, wall_s: float, cpu_s: float) -> SimResult:
    """The measured window's figures of a finished run (`sim`: the Simulator)."""
    m = sim.metrics
    span = m.span_s()
    gpus = sim.scenario.gpus
    prompt = max(m.prompt_tokens_prefilled, 1)
    by_tier = {t: v / prompt for t, v in m.hit_tokens.items()}
    idle_by_inst, idle_by_rank = _idle_by_instance(sim.prefill)
    prefill_share = _util(sim.prefill, span)
    decode_load = decode_load_report(sim.decode_load(), sim.timing, sim.decode, sim.sizing.decode_max_seqs[0],
                                     m.output_tokens, span, prefill_share, sim.sizing.decode_kv_tokens[0])
    validity = run_validity(sim.source, m.completed, m.rejected, sim._sent - sim._done)
    idle = sim.idle_watch.report(m.window_end_s if m.window_end_s is not None else sim.now, span)
    trace = sim.kv.pool_trace()

    return SimResult(
        **request_figures(m, sim.scenario.name, sim.policy, gpus, span, sim._events, wall_s, cpu_s, validity),
        hit_rate=sum(by_tier.values()), hit_rate_by_tier=by_tier,
        predicted_hit_rate=m.predicted_hit_tokens / prompt,
        prefill_idle_frac=_idle(sim.prefill), decode_idle_frac=_idle(sim.decode),
        prefill_util=prefill_share, decode_stepping_share=_util(sim.decode, span),
        pool_occupancy=sim.kv.pool_occupancy(), evictions=sim.kv.evictions(), preemptions=m.preemptions,
        recomputed_tokens=dict(sim.kv.recomputed_tokens), pool_path_util=sim.kv.path_utilization(span),
        sizing=sim.sizing.to_dict(),
        prefill_idle_by_instance=idle_by_inst, prefill_idle_by_rank=idle_by_rank,
        prefill_kv_transfer_frac=sim.prefill_kv_wait_s / max(sum(i.stepping_s for i in sim.prefill), 1e-12),
        regret_mean_s=float(sum(m.regret_s) / len(m.regret_s)) if m.regret_s else 0.0,
        regret_p90_s=pct(m.regret_s, 90) if m.regret_s else 0.0,
        pool_scope=sim.scenario.config.pool.scope,
        decode_load=decode_load,
        prefill_idle_waiting_frac=idle["prefill_idle_waiting_frac"], decode_idle_waiting_frac=idle["decode_idle_waiting_frac"],
        prefill_empty_frac=idle["prefill_empty_frac"], decode_empty_frac=idle["decode_empty_frac"],
        idle_waiting_by_rank=idle["by_rank"], pool_capacity_bytes=trace["capacity_bytes"], pool_trace=trace,
        planner={} if sim.planner is None else sim.planner.report(*_measured_span(m, span)),
    )
