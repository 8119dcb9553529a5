"""Kernel-level roofline: time of one kernel = max(math at achieved peak, bytes at achieved bandwidth)
+ a per-kernel overhead. The H200 calibration (bench/calibrate/fit.py) fits exactly these functions.

All functions accept numpy arrays for the row count (vectorized over ranks) as well as scalars.
"""

from __future__ import annotations

import numpy as np

from rackserve.timing.spec import DTYPE_BYTES, HardwareSpec

CTA_TILE = 128  # output tile edge of a Hopper/Blackwell GEMM CTA (CUTLASS/DeepGEMM default)
# No kernel streams faster than this share of datasheet HBM bandwidth: the best measured on the H200
# was 0.946 (our Triton grouped GEMM streaming 192 experts' weights, 9.1 GB in 2.0 ms;
# bench/results/calib_expert_launch.json), and bench/calibrate/fit.py caps memory efficiencies here.
MAX_MEMORY_EFFICIENCY = 0.95


def domain_bw_factor(hw: HardwareSpec, local: bool) -> float:
    """Bandwidth multiplier for data spread over both memory domains (half the reads remote) vs local."""
    if hw.memory_domains == 1 or local:
        return 1.0
    remote = min(hw.remote_domain_bw_factor, hw.die_to_die_bw_bytes_per_s / hw.hbm_bw_bytes_per_s)
    return 1.0 / (0.5 + 0.5 / remote)


def roofline(flops, bytes_, peak_flops: float, bw: float):
    """(time, compute_time, memory_time) of a kernel without overhead."""
    t_c = flops / peak_flops
    t_m = bytes_ / bw
    return np.maximum(t_c, t_m), t_c, t_m


def gemm_time(
    hw: HardwareSpec,
    m,
    n: int,
    k: int,
    *,
    weight_dtype: str,
    math_dtype: str | None = None,
    groups: int = 1,
    cluster_split_k: bool = False,
    domain: float = 1.0,
):
    """Dense GEMM (m tokens) x (k x n weights), `groups` independent ones: (time, t_compute, t_memory).

    Weight streaming is capped by how many CTAs stream at once: an output of few tiles keeps few SMs
    busy (each pulls at most per_sm_bw) unless split-K spreads K over the idle SMs.
    """
    math = math_dtype or ("bf16" if weight_dtype == "bf16" else "fp8")
    act = 1.0 if math in ("fp8", "fp4") else 2.0
    m = np.asarray(m, dtype=np.float64)
    flops = 2.0 * m * n * k * groups
    bytes_ = groups * (k * n * hw.stored_bytes(weight_dtype) + m * k * act + m * n * 2.0)
    col_tiles = np.ceil(np.asarray(n, dtype=np.float64) / CTA_TILE) * groups
    ctas = np.ceil(np.maximum(m, 1.0) / CTA_TILE) * col_tiles
    # library split-K (cuBLAS-like, as calibrated on the H200): K in 256-deep slices, at most one CTA
    # per SM; cluster split-K (the Rubin decode GEMM) always spreads the weights over every SM
    ctas = np.maximum(
        ctas, np.minimum(hw.sm_count, col_tiles * np.maximum(1, np.asarray(k) // 256))
    )
    if cluster_split_k:
        ctas = np.maximum(ctas, hw.sm_count)
    stream_bw = np.minimum(ctas, hw.sm_count) * hw.microarch.per_sm_bw_bytes_per_s
    bw = np.minimum(hw.hbm_bw_bytes_per_s * hw.efficiency.gemm_memory * domain, stream_bw)
    t, t_c, t_m = roofline(flops, bytes_, hw.peak(math) * hw.gemm_eff(math), bw)
    busy = m > 0  # no rows, no kernel
    return (t + hw.microarch.kernel_overhead_s) * busy, t_c * busy, t_m * busy


def pipeline_bw_scale(hw: HardwareSpec, stages: int, base_stages: int = 7) -> float:
    """Little's law: achieved/peak = X/(X+1), X = bytes in flight / (bandwidth x latency); relative to
    the calibrated kernel's `base_stages` (so the calibrated efficiency holds at base_stages)."""

    def frac(s: int) -> float:
        x = (
            hw.sm_count
            * s
            * hw.microarch.smem_stage_bytes
            / (hw.hbm_bw_bytes_per_s * max(hw.microarch.mem_latency_s, 1e-12))
        )
        return x / (x + 1.0)

    return frac(stages) / frac(base_stages)


def grouped_gemm_time(
    hw: HardwareSpec,
    padded_rows,
    weight_bytes,
    n: int,
    k: int,
    *,
    math_dtype: str,
    bw_scale: float = 1.0,
    domain: float = 1.0,
    act_bytes_per_row: float | None = None,
):
    """Grouped expert GEMM: padded_rows x k x n math, weight_bytes of active experts streamed once,
    act_bytes_per_row of activations in and out per row (default: BF16 in and out)."""
    rows = np.asarray(padded_rows, dtype=np.float64)
    flops = 2.0 * rows * n * k
    per_row = (k + n) * DTYPE_BYTES["bf16"] if act_bytes_per_row is None else act_bytes_per_row
    act_bytes = rows * per_row
    eff_mem = min(MAX_MEMORY_EFFICIENCY, hw.efficiency.grouped_memory * bw_scale)
    bw = hw.hbm_bw_bytes_per_s * eff_mem * domain
    t, t_c, t_m = roofline(
        flops, weight_bytes + act_bytes, hw.peak(math_dtype) * hw.efficiency.grouped_compute, bw
    )
    return t + hw.microarch.kernel_overhead_s * (np.asarray(weight_bytes) > 0), t_c, t_m


def attention_time(
    hw: HardwareSpec, flops, bytes_, *, math_dtype: str, overlap: float, domain: float = 1.0
):
    """Attention kernel: load and math overlap by `overlap` (1 = perfect, time = max)."""
    _, t_c, t_m = roofline(
        flops,
        bytes_,
        hw.peak(math_dtype) * hw.efficiency.attention_compute,
        hw.hbm_bw_bytes_per_s * hw.efficiency.attention_memory * domain,
    )
    t = np.maximum(t_c, t_m) + (1.0 - overlap) * np.minimum(t_c, t_m)
    return t + hw.microarch.kernel_overhead_s * (np.asarray(bytes_) > 0), t_c, t_m


def copy_time(hw: HardwareSpec, bytes_moved, domain: float = 1.0):
    """A streaming pass over `bytes_moved` (read + write counted) at achievable HBM bandwidth."""
    return np.asarray(bytes_moved, dtype=np.float64) / (
        hw.hbm_bw_bytes_per_s * hw.efficiency.hbm * domain
    )
