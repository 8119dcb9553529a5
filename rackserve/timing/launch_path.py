"""The low-latency launch path: the fixed cost of one kernel replayed from a CUDA graph, with or
without programmatic dependent launch (PDL).

Without PDL a kernel costs its launch gap plus its fixed work (prologue, tail) plus its roofline
work: microarch.kernel_overhead_s is gap + fixed work, as fitted on the H200 (bench/calibrate/fit.py).
With PDL the launch gap shrinks to launch.pdl_gap_s and up to launch.pdl_prologue_s of the fixed work
(barrier and descriptor setup, the first weight stages, which do not depend on the predecessor's
output) runs under the predecessor's tail: per-kernel cost = gap + max(fixed - prologue, 0) + work.
"""

from __future__ import annotations

from rackserve.timing.spec import HardwareSpec


def kernel_overhead_s(hw: HardwareSpec, pdl: bool) -> float:
    """Fixed time one kernel adds to a step on this launch path."""
    base = hw.microarch.kernel_overhead_s
    if not pdl:
        return base
    fixed = max(base - hw.launch.graph_gap_s, 0.0)
    return hw.launch.pdl_gap_s + max(fixed - hw.launch.pdl_prologue_s, 0.0)


def on_launch_path(hw: HardwareSpec, pdl: bool) -> HardwareSpec:
    """The hardware spec as the step cost sees it: kernel_overhead_s of this launch path."""
    overhead = kernel_overhead_s(hw, pdl)
    if overhead == hw.microarch.kernel_overhead_s:
        return hw
    micro = hw.microarch.model_copy(update={"kernel_overhead_s": overhead})
    return hw.model_copy(update={"microarch": micro})
