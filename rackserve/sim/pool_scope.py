"""Who shares the KV pool (config pool.scope): one rack-wide pool, one per prefill instance, or none.

- rack: the decode GPUs' spare HBM (over NVLink) and every tray's host DRAM (over the ranks' RDMA
  NICs), one pool for every prefill rank (rackserve.timing.capacity.derive_capacity);
- instance: each prefill instance offloads to its own trays' host DRAM only, as vLLM's CPU offload
  does: its share of the rack's host DRAM (by GPUs), reached over the CPU-GPU link (Vera C2C), no
  spare-HBM tier;
- agentx: "instance" capped as AgentX caps KV offload: CPU DRAM only, 3 TB per 8 GPUs used
  (REFERENCE.md, "How the benchmark measures");
- none: no pool (capacities 0);
- deployment: one store over the trays the deployment occupies (prefill and decode), as a Mooncake
  store over those hosts: each host contributes the segment its operator configures
  (pool.segment_bytes_per_host, Mooncake's global_segment_size) to the DRAM tier and each decode GPU
  the spare HBM it is configured to lend (pool.hbm_lent_bytes_per_gpu); the paths are the rack
  scope's (RDMA NICs of those trays, NVLink to the lenders). When the working set outgrows it the
  pool evicts (LRU at the watermarks, never a block under a read lease: kv/pool_tiers.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rackserve.timing.capacity import PoolPath

AGENTX_DRAM_BYTES_PER_GPU = 3e12 / 8  # REFERENCE.md: AgentX KV offload, 3 TB per 8-GPU server
# vLLM's MooncakeStoreConnector usage guide (docs.vllm.ai/en/latest/features/mooncake_store_connector_usage/):
# mooncake_config.json "global_segment_size": "80GB", embedded mode (each rank contributes its segment
# in-process; vllm.distributed.mooncake_store.MooncakeStoreConfig), one vLLM rank per GPU
RECIPE_SEGMENT_BYTES_PER_GPU = 80e9


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
    if scope in ("rack", "deployment"):  # deployment: sizing gave the tiers their configured capacity
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


def deployment_hosts(prefill_gpus: list[int], decode_gpus: list[int], gpus_per_tray: int) -> list[int]:
    """GPUs the deployment runs on each host it occupies: each role's instances placed in order onto
    its own trays (prefill and decode do not share a tray), an instance on the current tray while it
    fits, else from a fresh one (one larger than a tray takes whole trays)."""
    hosts: list[int] = []
    for role in (prefill_gpus, decode_gpus):
        free = 0
        for gpus in role:
            if gpus > free:
                whole, rest = divmod(gpus, gpus_per_tray)
                hosts += [gpus_per_tray] * whole
                if rest:
                    hosts.append(rest)
                free = gpus_per_tray - rest if rest else 0
                continue
            hosts[-1] += gpus
            free -= gpus
    return hosts


def deployment_store(hosts: list[int], segment_bytes_per_host: int | None, lenders: int, lent_bytes_per_gpu: float,
                     pool_hbm: PoolPath, pool_dram: PoolPath) -> tuple[PoolPath, PoolPath]:
    """The store of pool.scope deployment on `hosts` (GPUs per host): DRAM = each host's segment
    (None: the recipe's per GPU on it), spare HBM = `lenders` decode GPUs x `lent_bytes_per_gpu`;
    the paths are the rack tiers' (`pool_hbm`, `pool_dram`)."""
    if segment_bytes_per_host is None:
        dram = sum(RECIPE_SEGMENT_BYTES_PER_GPU * gpus for gpus in hosts)
    else:
        dram = float(segment_bytes_per_host) * len(hosts)
    return replace(pool_hbm, capacity_bytes=lenders * lent_bytes_per_gpu), replace(pool_dram, capacity_bytes=dram)
