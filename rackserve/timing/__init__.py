"""Cost model: per-step time of the target model (DeepSeek-V4.1-Flash) on the target GPUs.

from rackserve.timing import TimingModel, StepBatch, RankBatch
tm = TimingModel.create(hardware="vr200", model="deepseek-v4.1-flash", optimizations="rubin-optimized")
cost = tm.step_time("decode", tm.layout("wide-ep", ranks=8), StepBatch(...))
"""

from rackserve.timing.batch import Phase, RankBatch, StepBatch, StepCost
from rackserve.timing.layout import Layout, make_layout
from rackserve.timing.optimizations import PRESETS, SWITCHES, Optimizations, parse_optimizations
from rackserve.timing.timing_model import TimingModel

__all__ = [
    "PRESETS",
    "SWITCHES",
    "Layout",
    "Optimizations",
    "Phase",
    "RankBatch",
    "StepBatch",
    "StepCost",
    "TimingModel",
    "make_layout",
    "parse_optimizations",
]
