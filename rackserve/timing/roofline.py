"""Kernel-level roofline: time of one kernel = max(math at achieved peak, bytes at achieved bandwidth)
+ a per-kernel overhead. The H200 calibration (bench/calibrate/fit.py) fits exactly these functions.

All functions accept numpy arrays for the row count (vectorized over ranks) as well as scalars.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rackserve.timing.spec import DTYPE_BYTES, HardwareSpec

CTA_TILE = 128  # output tile edge of a Hopper/Blackwell GEMM CTA (CUTLASS/DeepGEMM default)
# No kernel streams faster than this share of datasheet HBM bandwidth: the best measured on the H200
# was 0.946 (our Triton grouped GEMM streaming 192 experts' weights, 9.1 GB in 2.0 ms;
# bench/results/calibrate/expert_launch.json), and bench/calibrate/fit.py caps memory efficiencies here.
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
    c = _gemm_constants(hw, n, k, weight_dtype, math_dtype, groups, cluster_split_k, domain)
    m = np.asarray(m, dtype=np.float64)
    # flops = 2 m n k groups, bytes = groups (k n w + m k act + m n 2): integers (and multiples of
    # 1/32) far below 2**53, so m times the constants is exact, as the products were
    flops = m * c.flops_per_row
    bytes_ = c.weight_bytes + m * c.bytes_per_row
    if c.bw is not None:  # cluster split-K: every SM streams, whatever the rows
        bw = c.bw
    else:
        ctas = np.maximum(np.ceil(np.maximum(m, 1.0) / CTA_TILE) * c.col_tiles, c.split_ctas)
        stream_bw = np.minimum(ctas, hw.sm_count) * hw.microarch.per_sm_bw_bytes_per_s
        bw = np.minimum(c.bw_cap, stream_bw)
    t_c = flops / c.peak
    t_m = bytes_ / bw
    busy = m > 0  # no rows, no kernel
    return (np.maximum(t_c, t_m) + hw.microarch.kernel_overhead_s) * busy, t_c * busy, t_m * busy


@dataclass(frozen=True)
class _GemmConstants:
    flops_per_row: Any
    weight_bytes: Any
    bytes_per_row: Any
    col_tiles: Any
    split_ctas: Any  # library split-K's CTAs: a floor on the CTAs
    bw_cap: float
    bw: Any  # the bandwidth where it does not depend on the rows (cluster split-K), else None
    peak: float


_GEMM_CONSTANTS: dict[tuple, tuple[HardwareSpec, _GemmConstants]] = {}


def _gemm_constants(hw, n, k, weight_dtype, math_dtype, groups, cluster_split_k, domain) -> _GemmConstants:
    """gemm_time's row-independent terms, memoized per (hardware, shapes, dtypes, switches)."""
    key = (id(hw), _key(n), _key(k), weight_dtype, math_dtype, _key(groups), cluster_split_k, domain)
    hit = _GEMM_CONSTANTS.get(key)
    if hit is not None and hit[0] is hw:  # identity, so a recycled id never matches
        return hit[1]
    math = math_dtype or ("bf16" if weight_dtype == "bf16" else "fp8")
    act = 1.0 if math in ("fp8", "fp4") else 2.0
    col_tiles = np.ceil(np.asarray(n, dtype=np.float64) / CTA_TILE) * groups
    # library split-K (cuBLAS-like, as calibrated on the H200): K in 256-deep slices, at most one CTA
    # per SM; cluster split-K (the Rubin decode GEMM) always spreads the weights over every SM
    split_ctas = np.minimum(hw.sm_count, col_tiles * np.maximum(1, np.asarray(k) // 256))
    bw_cap = hw.hbm_bw_bytes_per_s * hw.efficiency.gemm_memory * domain
    bw = None
    if cluster_split_k:
        ctas = np.maximum(split_ctas, hw.sm_count)
        bw = np.minimum(bw_cap, np.minimum(ctas, hw.sm_count) * hw.microarch.per_sm_bw_bytes_per_s)
    c = _GemmConstants(
        flops_per_row=2.0 * n * k * groups,
        weight_bytes=groups * (k * n * hw.stored_bytes(weight_dtype)),
        bytes_per_row=groups * (k * act + n * 2.0),
        col_tiles=col_tiles,
        split_ctas=split_ctas,
        bw_cap=bw_cap,
        bw=bw,
        peak=hw.peak(math) * hw.gemm_eff(math),
    )
    if len(_GEMM_CONSTANTS) > 4096:
        _GEMM_CONSTANTS.clear()
    _GEMM_CONSTANTS[key] = (hw, c)
    return c


def _key(x) -> object:
    return (x.shape, x.tobytes()) if isinstance(x, np.ndarray) else x


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
