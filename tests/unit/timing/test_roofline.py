"""gemm_time with its row-independent terms memoized equals the roofline written out, bit for bit."""

import numpy as np
import pytest

from rackserve.timing.roofline import CTA_TILE, gemm_time
from rackserve.timing.spec import load_hardware


def _written_out(hw, m, n, k, weight_dtype, math_dtype, groups, split_k, domain):
    math = math_dtype or ("bf16" if weight_dtype == "bf16" else "fp8")
    act = 1.0 if math in ("fp8", "fp4") else 2.0
    m = np.asarray(m, dtype=np.float64)
    flops = 2.0 * m * n * k * groups
    bytes_ = groups * (k * n * hw.stored_bytes(weight_dtype) + m * k * act + m * n * 2.0)
    col_tiles = np.ceil(np.asarray(n, dtype=np.float64) / CTA_TILE) * groups
    ctas = np.ceil(np.maximum(m, 1.0) / CTA_TILE) * col_tiles
    ctas = np.maximum(ctas, np.minimum(hw.sm_count, col_tiles * np.maximum(1, np.asarray(k) // 256)))
    if split_k:
        ctas = np.maximum(ctas, hw.sm_count)
    bw = np.minimum(hw.hbm_bw_bytes_per_s * hw.efficiency.gemm_memory * domain,
                    np.minimum(ctas, hw.sm_count) * hw.microarch.per_sm_bw_bytes_per_s)
    t_c, t_m = flops / (hw.peak(math) * hw.gemm_eff(math)), bytes_ / bw
    busy = m > 0
    return (np.maximum(t_c, t_m) + hw.microarch.kernel_overhead_s) * busy, t_c * busy, t_m * busy


@pytest.mark.parametrize("hardware", ["vr200", "h200"])
@pytest.mark.parametrize("split_k", [False, True])
@pytest.mark.parametrize("dtype", [("fp4", None), ("fp8", None), ("bf16", None), ("fp4", "fp4")])
def test_gemm_time_equals_the_roofline_written_out(hardware, split_k, dtype):
    hw = load_hardware(hardware)
    rng = np.random.default_rng(5)
    rows = np.concatenate([[0, 1, 16, 127, 128, 129], rng.integers(0, 40_000, 40)]).astype(np.float64)
    shapes = [(7168, 129_280, 1), (2048, 512, 8), (np.array([[1536], [24576]]), np.array([[7168], [1536]]),
                                                   np.array([[1], [4]]))]
    for k, n, groups in shapes:
        m = rows if np.ndim(n) == 0 else rows[None, :]
        for domain in (1.0, 0.8):
            for _ in range(2):  # the second call reads the memoized terms
                got = gemm_time(hw, m, n, k, weight_dtype=dtype[0], math_dtype=dtype[1], groups=groups,
                                cluster_split_k=split_k, domain=domain)
                want = _written_out(hw, m, n, k, dtype[0], dtype[1], groups, split_k, domain)
                for g, w in zip(got, want, strict=True):
                    assert g.shape == w.shape and np.array_equal(g, w)
