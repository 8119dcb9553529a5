"""Who shares the KV pool (config pool.scope): one rack-wide pool, one per prefill instance, or none.

- rack: the decode GPUs' spare HBM (over NVLink) and every tray's host DRAM (over the ranks' RDMA
  NICs), one pool for every prefill rank (rackserve.timing.capacity.derive_capacity);
- instance: each prefill instance offloads to its own trays' host DRAM only, as vLLM's CPU offload
  does: its share of the rack's host DRAM (by GPUs), reached over the CPU-GPU link (Vera C2C), no
  spare-HBM tier;
- agentx: "instance" capped as AgentX caps KV offload: CPU DRAM only, 3 TB per 8 GPUs used
  (REFERENCE.md, "How the benchmark measures");
- none: no pool (capacities 0).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rackserve.timing.capacity import PoolPath

AGENTX_DRAM_BYTES_PER_GPU = 3e12 / 8  # REFERENCE.md: AgentX KV offload, 3 TB per 8-GPU server


@dataclass(frozen=True)
class ScopedPool:
    """One pool: the prefill instances it serves and its two tiers' capacities and paths."""

    instances: tuple[str, ...]
    pool_hbm: PoolPath
    pool_dram: PoolPath


def scoped_pools(scope: str, instances: list[tuple[str, int]], rack_gpus: int, pool_hbm: PoolPath,
                 pool_dram: PoolPath, host_link_bw_bytes_per_s: float | None) -> list[ScopedPool]:
    """The pools of a deployment. `instances`: (name, GPUs) of each prefill instance; `pool_hbm` /
    `pool_dram`: the rack's tiers (rack scope as they are); `host_link_bw_bytes_per_s`: one
    GPU's link to its host's DRAM (per direction; None: the rack DRAM path's port)."""
    names = tuple(n for n, _ in instances)
    if scope == "rack":
        return [ScopedPool(names, pool_hbm, pool_dram)]
    if scope == "none":
        return [ScopedPool(names, replace(pool_hbm, capacity_bytes=0.0), replace(pool_dram, capacity_bytes=0.0))]
    assert scope in ("instance", "agentx"), scope
    link = host_link_bw_bytes_per_s or pool_dram.port_bw_bytes_per_s
    out = []
    for name, gpus in instances:
        dram = pool_dram.capacity_bytes * gpus / max(rack_gpus, 1)
        if scope == "agentx":
            dram = min(dram, AGENTX_DRAM_BYTES_PER_GPU * gpus)
        path = PoolPath(dram, link, min(link * gpus, pool_dram.aggregate_bw_bytes_per_s), pool_dram.latency_s)
        out.append(ScopedPool((name,), replace(pool_hbm, capacity_bytes=0.0), path))
    return out
