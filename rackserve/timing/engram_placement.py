"""Where the target's Engram tables live, and what follows from it for memory and for the row fetch.

- `hbm-sharded` (the reference, REFERENCE.md "Engram"): both tables (about 94.4 GiB each) sharded over
  the HBM of every GPU of the deployment; a step's rows come over NVLink from the shards' GPUs.
- `host-copy` (a deployment without the rack-wide sharding; REFERENCE: "so no prefill instance keeps its
  own host-memory copy"; the Engram paper, arXiv:2601.07372, offloads the tables to host memory): no HBM
  is used for them; every host CPU an instance spans keeps a full copy in its DRAM, since a GPU reaches
  host memory over its own CPU-GPU link only (NVLink-C2C on Grace / Vera). Those copies come out of the
  host DRAM the pool's DRAM tier would use. Rows come over the GPU's CPU-GPU link, at most at its share
  of the CPU's DRAM bandwidth (the GPUs of one CPU fetch at once: ranks step in lockstep).

Both are addressed by the token ids alone and issued at step start (prefetch), so only what outlasts
the layers before the Engram layer is exposed (attention_cost.engram).
"""

from __future__ import annotations

import math

from rackserve.timing import comm
from rackserve.timing.spec import HardwareSpec

HBM_SHARDED = "hbm-sharded"
HOST_COPY = "host-copy"
PLACEMENTS = (HBM_SHARDED, HOST_COPY)


def check_placement(placement: str) -> str:
    if placement not in PLACEMENTS:
        raise ValueError(f"engram_placement: unknown placement {placement!r}; known: {', '.join(PLACEMENTS)}")
    return placement


def gpus_per_cpu(hw: HardwareSpec) -> int:
    return max(1, hw.gpus_per_tray // hw.cpus_per_tray)


def host_fetch_bw(hw: HardwareSpec) -> float:
    """Bytes/s of rows into one GPU from its CPU's copy: the CPU-GPU link, or the GPU's share of the
    CPU's DRAM bandwidth if lower; the link efficiency of NVLink (FREE: C2C assumed alike)."""
    share = hw.host_dram_bw_bytes_per_s / gpus_per_cpu(hw)
    return min(hw.host_link_bw_bytes_per_s, share) * hw.efficiency.nvlink


def fetch_time(hw: HardwareSpec, bytes_, placement: str):
    """One GPU's Engram row fetch of `bytes_` (array or scalar) under `placement`."""
    if placement == HOST_COPY:
        return hw.nvlink_latency_s + bytes_ / host_fetch_bw(hw)  # FREE: C2C latency taken as NVLink's
    return comm.p2p_time(hw, bytes_)


def hbm_bytes_per_gpu(table_bytes: float, deployment_gpus: int, placement: str) -> float:
    """HBM one GPU spends on Engram: its shard, or nothing with the tables in host DRAM."""
    return 0.0 if placement == HOST_COPY else table_bytes / max(deployment_gpus, 1)


def host_copies(hw: HardwareSpec, instance_gpus: list[int], placement: str) -> int:
    """Full copies held in host DRAM: one per CPU each instance spans (none when HBM-sharded)."""
    if placement != HOST_COPY:
        return 0
    return sum(math.ceil(g / gpus_per_cpu(hw)) for g in instance_gpus)


def check_copy_fits(hw: HardwareSpec, table_bytes: float, usable_fraction: float) -> None:
    """ValueError when one copy of the tables exceeds one CPU's usable host DRAM."""
    if hw.host_dram_bytes_per_tray is None:
        raise ValueError(f"engram_placement: host-copy needs host_dram_bytes_per_tray on hardware {hw.name}")
    per_cpu = hw.host_dram_bytes_per_tray / hw.cpus_per_tray * usable_fraction
    if table_bytes > per_cpu:
        raise ValueError(f"engram_placement: host-copy on {hw.name}: one copy of the Engram tables "
                         f"({table_bytes / 1e9:.1f} GB) exceeds a CPU's usable host DRAM ({per_cpu / 1e9:.1f} GB)")
