"""Communication cost: alpha + bytes / bandwidth for collectives and point-to-point copies over
NVLink, and KV movement between the pool tiers and a rank."""

from __future__ import annotations

from rackserve.timing.spec import HardwareSpec


def allreduce_time(hw: HardwareSpec, bytes_: float, ranks: int, trays: int = 1) -> float:
    """Ring all-reduce: latency (+ cross-tray hop) + 2 (n-1)/n x bytes over one GPU's link."""
    if ranks <= 1 or bytes_ <= 0:
        return 0.0
    alpha = hw.allreduce_latency_s + (hw.cross_tray_latency_s if trays > 1 else 0.0)
    return alpha + 2.0 * (ranks - 1) / ranks * bytes_ / (
        hw.nvlink_bw_bytes_per_s * hw.efficiency.nvlink
    )


def p2p_time(hw: HardwareSpec, bytes_, latency_s: float | None = None):
    """One NVLink transfer of `bytes_` out of (or into) one GPU."""
    lat = hw.nvlink_latency_s if latency_s is None else latency_s
    return lat + bytes_ / (hw.nvlink_bw_bytes_per_s * hw.efficiency.nvlink)


def pool_dram_bw(hw: HardwareSpec) -> float:
    """Host DRAM tier -> GPU: limited by the DRAM itself, the CPU-GPU link and the NVLink hop."""
    return (
        min(hw.host_dram_bw_bytes_per_s, hw.host_link_bw_bytes_per_s, hw.nvlink_bw_bytes_per_s)
        * hw.efficiency.nvlink
    )
