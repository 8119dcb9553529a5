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


def oneshot_allreduce_time(hw: HardwareSpec, bytes_: float, ranks: int, trays: int = 1) -> float:
    """One-shot all-reduce: every rank stores its partial into each of the n-1 peers over NVLink and
    sums what it receives: one NVLink round (+ cross-tray hop) + (n-1) x bytes out of one GPU's link,
    plus the kernel's own launch cost (the ring's measured alpha includes it)."""
    if ranks <= 1 or bytes_ <= 0:
        return 0.0
    alpha = hw.oneshot_allreduce_latency_s + (hw.cross_tray_latency_s if trays > 1 else 0.0)
    link = hw.nvlink_bw_bytes_per_s * hw.efficiency.nvlink
    return hw.microarch.kernel_overhead_s + alpha + (ranks - 1) * bytes_ / link


def tp_allreduce_time(
    hw: HardwareSpec, bytes_: float, ranks: int, trays: int, oneshot: bool
) -> float:
    """The TP all-reduce a tuned stack picks: the faster of one-shot and ring where one-shot is on."""
    ring = allreduce_time(hw, bytes_, ranks, trays)
    return min(ring, oneshot_allreduce_time(hw, bytes_, ranks, trays)) if oneshot else ring


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
