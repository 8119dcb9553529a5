"""The launch path: CUDA-graph replay with and without PDL."""

from __future__ import annotations

import pytest

from rackserve.timing import TimingModel
from rackserve.timing.launch_path import kernel_overhead_s, on_launch_path
from rackserve.timing.spec import load_hardware

from .conftest import scenarios


def test_pdl_overhead_by_hand():
    vr = load_hardware("vr200")
    assert kernel_overhead_s(vr, False) == vr.microarch.kernel_overhead_s == 3.0e-6
    # 0.64 us PDL gap + (3.0 - 1.19 graph gap - 1.0 prologue under the predecessor) = 1.45 us
    assert kernel_overhead_s(vr, True) == pytest.approx(1.45e-6)
    h200 = load_hardware("h200")
    assert kernel_overhead_s(h200, True) < kernel_overhead_s(h200, False)
    assert on_launch_path(vr, False) is vr
    assert on_launch_path(vr, True).microarch.kernel_overhead_s == pytest.approx(1.45e-6)


def test_pdl_helps_most_where_the_step_is_many_small_kernels():
    base = TimingModel.create("vr200", optimizations="rubin-optimized,-pdl")
    pdl = base.with_optimizations("rubin-optimized")
    gains = {}
    for label, phase, lay, batch in scenarios(base):
        a, b = base.step_time(phase, lay, batch).total_s, pdl.step_time(phase, lay, batch).total_s
        assert b < a, label
        gains[label] = a / b
    assert gains["tp8 decode b1"] > gains["dep2 prefill 32k"]
