"""The live workers' step pricer: decode steps are charged per output token, MTP-aware."""

from __future__ import annotations

import pytest

from rackserve.timing import RankBatch, StepBatch, TimingModel
from services.topology import InstanceSpec
from services.worker_host import Pricer


def test_decode_pricer_charges_the_speculative_step_per_accepted_token():
    tm = TimingModel.create("vr200", optimizations="rubin-optimized")
    spec = InstanceSpec("d0", "decode", "wide-ep", 8, 8)
    batch = StepBatch(tuple(RankBatch.of([1] * 4, [4000] * 4) for _ in range(8)))
    lay = tm.layout("wide-ep", 8)
    got = Pricer(tm, spec, "decode")(batch)
    assert got == tm.decode_token_time(lay, batch)
    off = tm.with_optimizations("rubin-optimized,-mtp")
    plain = off.step_time("decode", lay, batch).total_s
    assert got.total_s < 0.5 * plain  # ~3.6 tokens per verify step
    prefill = Pricer(tm, InstanceSpec("p0", "prefill", "dep2", 2, 2), "prefill")
    one = StepBatch((RankBatch.of([512]), RankBatch.of([512])))
    assert prefill(one).total_s == pytest.approx(tm.step_time("prefill", tm.layout("dep2"), one).total_s)
