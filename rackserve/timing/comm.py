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


# An NVLink domain this large holds a whole P/D deployment (NVL72); smaller ones (an HGX node of 8)
# hold one instance at most, so prefill and decode sit on different nodes.
RACK_DOMAIN_GPUS = 36


def pd_path_time(hw: HardwareSpec, bytes_):
    """A prompt's KV from its prefill rank to its decode rank: one NVLink copy inside a rack-sized
    NVLink domain; between HGX nodes an RDMA write over the NIC (Mooncake / NIXL move KV this way),
    one NIC per GPU at hw.efficiency.rdma of its rate."""
    if hw.nvlink_domain_gpus >= RACK_DOMAIN_GPUS or not hw.nic_rdma_bw_bytes_per_s:
        return p2p_time(hw, bytes_)
    return hw.nic_latency_s + bytes_ / (hw.nic_rdma_bw_bytes_per_s * hw.efficiency.rdma)


def pool_dram_bw(hw: HardwareSpec) -> float:
    """Host DRAM tier -> GPU: limited by the DRAM itself, the CPU-GPU link and the NVLink hop."""
    return (
        min(hw.host_dram_bw_bytes_per_s, hw.host_link_bw_bytes_per_s, hw.nvlink_bw_bytes_per_s)
        * hw.efficiency.nvlink
    )
