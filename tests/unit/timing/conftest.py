"""Timing-model fixtures: a few representative steps of every layout."""

from __future__ import annotations

import numpy as np
import pytest

from rackserve.timing import RankBatch, StepBatch, TimingModel


def decode_step(dp: int, batch: int, context: int) -> StepBatch:
    rb = RankBatch(np.ones(batch, dtype=np.int64), np.full(batch, context - 1, dtype=np.int64))
    return StepBatch(tuple(rb for _ in range(dp)))


def prefill_step(dp: int, tokens: int, cached: int = 0) -> StepBatch:
    return StepBatch(tuple(RankBatch.of([tokens], [cached]) for _ in range(dp)))


def scenarios(tm: TimingModel) -> list[tuple[str, str, object, StepBatch]]:
    """(label, phase, layout, batch): small and large decode on wide-ep and tp8, prefill on dep2."""
    wide, tp8, dep2 = tm.layout("wide-ep", ranks=8), tm.layout("tp8"), tm.layout("dep2")
    return [
        ("wide-ep8 decode b4", "decode", wide, decode_step(8, 4, 8192)),
        ("wide-ep8 decode b64", "decode", wide, decode_step(8, 64, 32768)),
        ("tp8 decode b1", "decode", tp8, decode_step(1, 1, 32768)),
        ("tp8 decode b8", "decode", tp8, decode_step(1, 8, 65536)),
        ("dep2 prefill 2k", "prefill", dep2, prefill_step(2, 2048, 6144)),
        ("dep2 prefill 32k", "prefill", dep2, prefill_step(2, 32768)),
    ]


# The system terms fitted on public deployments (per-step host work, EP barrier waits; issue 48) off:
# the tests here check kernel-level mechanisms; tests/unit/timing/test_layout.py checks those terms.
BARE = {"ep_straggler_s": 0.0, "step_overhead_s": 0.0}


def bare(tm: TimingModel) -> TimingModel:
    return tm.with_hardware(tm.hardware.model_copy(update=BARE))


@pytest.fixture(scope="module")
def vr200() -> TimingModel:
    return bare(TimingModel.create("vr200", "deepseek-v4.1-flash", "rubin-optimized"))
