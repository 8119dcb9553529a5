"""The simulator's sizes of a scenario: per-rank cache and batch limits and the pool's tiers, derived
from the specs by rackserve.timing.capacity; a `sim.*` or `pool.*` capacity field that the scenario
sets explicitly overrides the derived value (and the report says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from rackserve.timing.capacity import (
    DeploymentCapacity,
    Limits,
    PoolPath,
    derive_capacity,
    layouts_of,
)
from rackserve.timing.spec import load_hardware, load_model


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


def size_scenario(scenario) -> Sizing:
    """Derive the scenario's sizes; ValueError when the deployment does not fit its GPUs."""
    cfg, sim = scenario.config, scenario.sim
    given = sim.model_fields_set
    limits = Limits(**{k: getattr(sim, k) for k in ("max_num_seqs", "max_num_batched_tokens",
                                                      "gpu_memory_utilization", "decode_context_tokens")
                       if getattr(sim, k) is not None})
    model, hw = load_model(cfg.timing.model), load_hardware(cfg.timing.hardware)
    cap = derive_capacity(model, hw, layouts_of(cfg.deployment.prefill), layouts_of(cfg.deployment.decode), limits,
                          cfg.timing.engram_placement)
    overrides = [f"sim.{k}" for k in ("rank_cache_tokens", "decode_kv_tokens_per_rank", "prefill_chunk_tokens",
                                       "prefill_max_batch_seqs", "decode_max_batch_seqs") if k in given]
    pool_hbm, pool_dram = cap.pool_hbm, cap.pool_dram
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


def _overrider(sim, given: set[str]):
    def pick(name: str, derived):
        return getattr(sim, name) if name in given and getattr(sim, name) is not None else derived

    return pick
