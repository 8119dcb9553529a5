"""The simulator's sizes of a scenario: per-rank cache and batch limits and the pool's tiers, derived
from the specs by rackserve.timing.capacity; a `sim.*` or `pool.*` capacity field that the scenario
sets explicitly overrides the derived value (and the report says so).

Decode ranks keep the KV their workload holds at its P99 and lend the rest to the pool
(decode_held_estimate): lanes per decode rank x the workload's context per request, summed as
independent requests (normal approximation of the sum: mean n m + 2.33 sqrt(n) s).
With pool.scope deployment the pool's tiers are the store the deployment configures (sim/pool_scope.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from rackserve.sim.pool_scope import deployment_hosts, deployment_store
from rackserve.timing.capacity import (
    DeploymentCapacity,
    Limits,
    PoolPath,
    derive_capacity,
    layouts_of,
)
from rackserve.timing.precision import with_precision
from rackserve.timing.spec import load_hardware, load_model
from rackserve.workload.spec import AgentXTraceWorkload, AgentXWorkload, UniformWorkload

Z_P99 = 2.326  # standard normal 99th percentile
# The shipped AgentX capture (data/agentx/README.md "Figures"): input tokens per request mean 117.2k,
# p10 41.5k, p90 200.1k (sd ~ (p90 - p10) / 2.563 for a normal: 61.9k); output mean 443. Used for
# any conversation trace (an approximation for other captures).
TRACE_CONTEXT_MEAN = 117_200 + 443
TRACE_CONTEXT_SD = (200_100 - 41_500) / 2.563


@dataclass(frozen=True)
class Sizing:
    capacity: DeploymentCapacity
    prefill_cache_tokens: tuple[int, ...]  # per prefill instance group
    prefill_chunk_tokens: int
    prefill_max_seqs: int
    decode_max_seqs: tuple[int, ...]  # per decode instance group
    decode_kv_tokens: tuple[int | None, ...]
    pool_hbm: PoolPath
    pool_dram: PoolPath
    kv_bytes_per_token: float
    overrides: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return {**self.capacity.to_dict(), "prefill_cache_tokens": list(self.prefill_cache_tokens),
                "prefill_chunk_tokens": self.prefill_chunk_tokens, "prefill_max_seqs": self.prefill_max_seqs,
                "decode_max_seqs": list(self.decode_max_seqs), "decode_kv_tokens": list(self.decode_kv_tokens),
                "pool_hbm_bytes": self.pool_hbm.capacity_bytes, "pool_dram_bytes": self.pool_dram.capacity_bytes,
                "overrides": list(self.overrides)}


def prefill_chunk_tokens(sim) -> int:
    """The engine's prefill chunk of a scenario's `sim` section (the step cap of its prefill ranks,
    and the router's reference step): prefill_chunk_tokens, else max_num_batched_tokens, else vLLM's."""
    for name in ("prefill_chunk_tokens", "max_num_batched_tokens"):
        value = getattr(sim, name, None)
        if value is not None:
            return int(value)
    return Limits().max_num_batched_tokens


def workload_context(workload) -> tuple[float, float, float] | None:
    """(mean, sd, max) of one request's decode context (prompt + output) by the workload's kind, or
    None when it is not a closed loop of lanes (an open-loop trace: the worst case is kept)."""
    if isinstance(workload, UniformWorkload):
        n = workload.prompt_tokens + workload.output_tokens
        return float(n), 0.0, float(n)
    if isinstance(workload, AgentXTraceWorkload):
        scale = workload.length_scale
        return TRACE_CONTEXT_MEAN * scale, TRACE_CONTEXT_SD * scale, float(workload.max_context)
    if isinstance(workload, AgentXWorkload):  # a session's context grows turn by turn: its middle turn
        w = workload
        fixed = w.system_prompt_tokens + w.tool_defs_tokens + w.first_user_tokens
        per_turn = (w.tool_output_tokens_min + w.tool_output_tokens_max) / 2 + w.output_tokens
        top = fixed + w.turns_max * per_turn
        mean = fixed + (w.turns_min + w.turns_max) / 4 * per_turn
        return mean, (top - fixed) / 4, top
    return None


def decode_held_estimate(workload, decode_ranks: int, max_num_seqs: int) -> tuple[int, int] | None:
    """(sequences, KV tokens) a decode rank holds at the P99 of the workload: every lane's request in
    decode at once, lanes spread evenly over the decode ranks (an upper bound on the batch), their
    contexts independent draws from the workload's; None when the workload has no lanes."""
    stats = workload_context(workload)
    lanes = getattr(workload, "concurrency", None)
    if stats is None or not lanes:
        return None
    mean, sd, top = stats
    n = min(max_num_seqs, math.ceil(lanes / decode_ranks))
    return n, int(min(n * mean + Z_P99 * math.sqrt(n) * sd, n * top))


def size_scenario(scenario) -> Sizing:
    """Derive the scenario's sizes; ValueError when the deployment does not fit its GPUs."""
    cfg, sim = scenario.config, scenario.sim
    given = sim.model_fields_set
    limits = Limits(**{k: getattr(sim, k) for k in ("max_num_seqs", "max_num_batched_tokens",
                                                      "gpu_memory_utilization", "decode_context_tokens")
                       if getattr(sim, k) is not None})
    model = with_precision(load_model(cfg.timing.model), cfg.timing.expert_precision, cfg.timing.attention_math)
    hw = load_hardware(cfg.timing.hardware)
    decode_ranks = sum(g.count * g.dp_ranks for g in cfg.deployment.decode)
    held = decode_held_estimate(scenario.workload, max(decode_ranks, 1), limits.max_num_seqs)
    if held is not None:
        limits = replace(limits, decode_held_seqs=held[0], decode_held_tokens=held[1])
    cap = derive_capacity(model, hw, layouts_of(cfg.deployment.prefill), layouts_of(cfg.deployment.decode), limits,
                          cfg.timing.engram_placement)
    overrides = [f"sim.{k}" for k in ("rank_cache_tokens", "decode_kv_tokens_per_rank", "prefill_chunk_tokens",
                                       "prefill_max_batch_seqs", "decode_max_batch_seqs") if k in given]
    pool_hbm, pool_dram = cap.pool_hbm, cap.pool_dram
    if cfg.pool.scope == "deployment":
        pool_hbm, pool_dram = _deployment_store(cfg, hw, cap)
    if "hbm_capacity_bytes" in cfg.pool.model_fields_set:
        pool_hbm = replace(pool_hbm, capacity_bytes=float(cfg.pool.hbm_capacity_bytes))
        overrides.append("pool.hbm_capacity_bytes")
    if "dram_capacity_bytes" in cfg.pool.model_fields_set:
        pool_dram = replace(pool_dram, capacity_bytes=float(cfg.pool.dram_capacity_bytes))
        overrides.append("pool.dram_capacity_bytes")
    pick = _overrider(sim, given)
    return Sizing(
        capacity=cap,
        prefill_cache_tokens=tuple(pick("rank_cache_tokens", r.kv_tokens) for r in cap.prefill),
        prefill_chunk_tokens=pick("prefill_chunk_tokens", limits.max_num_batched_tokens),
        prefill_max_seqs=pick("prefill_max_batch_seqs", limits.max_num_seqs),
        decode_max_seqs=tuple(pick("decode_max_batch_seqs", r.max_num_seqs) for r in cap.decode),
        decode_kv_tokens=tuple(pick("decode_kv_tokens_per_rank", r.kv_tokens) for r in cap.decode),
        pool_hbm=pool_hbm, pool_dram=pool_dram, kv_bytes_per_token=model.kv_bytes_per_token,
        overrides=tuple(overrides),
    )


def store_capacity(config) -> tuple[int, int]:
    """(spare HBM, DRAM) target bytes of the pool a deployment config sizes, as the simulator does
    (the live pool service's tiers under pool.scope deployment; explicit pool.*_capacity_bytes win)."""
    from rackserve.sim.scenario import Scenario, SimSettings

    sz = size_scenario(Scenario("live", config, None, SimSettings()))  # type: ignore[arg-type]  # no workload: worst-case decode KV
    return int(sz.pool_hbm.capacity_bytes), int(sz.pool_dram.capacity_bytes)


def _deployment_store(cfg, hw, cap: DeploymentCapacity) -> tuple[PoolPath, PoolPath]:
    """pool.scope deployment: the store over the deployment's hosts (sim/pool_scope.py), its HBM
    tier what each decode GPU is configured to lend, at most its spare (the least of the groups')."""
    dep, pool = cfg.deployment, cfg.pool
    host_dram = hw.host_dram_bytes_per_tray
    if pool.segment_bytes_per_host is not None and host_dram is not None and pool.segment_bytes_per_host > host_dram:
        raise ValueError(f"pool.segment_bytes_per_host: {pool.segment_bytes_per_host / 1e9:,.0f} GB is more than a "
                         f"{hw.name} host's DRAM ({host_dram / 1e9:,.0f} GB)")
    per_gpu = lambda groups: [g.gpus for g in groups for _ in range(g.count)]  # noqa: E731
    hosts = deployment_hosts(per_gpu(dep.prefill), per_gpu(dep.decode), hw.gpus_per_tray)
    lenders = sum(g.count * g.gpus for g in dep.decode)
    spare = min((r.lent_bytes for r in cap.decode), default=0.0)
    return deployment_store(hosts, pool.segment_bytes_per_host, lenders, min(float(pool.hbm_lent_bytes_per_gpu), spare),
                            cap.pool_hbm, cap.pool_dram)


def _overrider(sim, given: set[str]):
    def pick(name: str, derived):
        return getattr(sim, name) if name in given and getattr(sim, name) is not None else derived

    return pick
