"""The start-up delay of a new instance: its weights load onto every GPU at once (one GPU's share
over the load bandwidth), then the engine warms up (CUDA-graph capture)."""

from __future__ import annotations

from typing import Any

from rackserve.timing.capacity import weights_bytes_per_gpu


def startup_s(settings: Any, timing: Any, layout: Any) -> float:
    """planner.startup_s when set; else weights per GPU of `layout` (rackserve.timing.capacity) /
    planner.weight_load_bw_bytes_per_s (default: the hardware's host link, host_link_bw_bytes_per_s,
    i.e. weights staged in host DRAM, as a restart from the page cache reads them) + planner.warmup_s."""
    if settings.startup_s is not None:
        return float(settings.startup_s)
    tm = getattr(timing, "timing", timing)  # a CachedTiming wraps the TimingModel
    hw = tm.hardware
    bw = settings.weight_load_bw_bytes_per_s or hw.host_link_bw_bytes_per_s
    return weights_bytes_per_gpu(tm.model, hw, layout) / bw + settings.warmup_s
