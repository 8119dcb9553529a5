"""The live workers' step pricer: decode steps are charged per output token, MTP-aware; through
the simulator's step-cost memo (services/step_memo.py), busy times on the ranks that had the work."""

from __future__ import annotations

import pytest

from rackserve.sim.step_cache import CachedTiming
from rackserve.timing import RankBatch, StepBatch, TimingModel
from rackserve.timing.speculative import verify_batch
from services.step_memo import StepMemo
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
    spec = tm.speculative_step_time(lay, verify_batch(batch, tm.speculation.verify_tokens))
    # one verify step (drafts included) per its expected accepted tokens (2.49 pinned, AgentX)
    assert got.total_s == pytest.approx(spec.total_s / spec.accepted_tokens)
    assert spec.accepted_tokens > 2 and got.total_s < plain / 1.2
    prefill = Pricer(tm, InstanceSpec("p0", "prefill", "dep2", 2, 2), "prefill")
    one = StepBatch((RankBatch.of([512]), RankBatch.of([512])))
    assert prefill(one).total_s == pytest.approx(tm.step_time("prefill", tm.layout("dep2"), one).total_s)


def _wide_ep(tm: TimingModel, memo: StepMemo | None = None) -> Pricer:
    return Pricer(tm, InstanceSpec("d0", "decode", "wide-ep", 4, 4), "decode", memo)


def _one_busy_rank(rank: int, seqs: int, context: int, new: int = 1) -> StepBatch:
    return StepBatch(tuple(
        RankBatch.of([new] * seqs, [context] * seqs) if r == rank else RankBatch.of([])
        for r in range(4)
    ))


def test_the_memo_prices_as_the_simulator_within_its_grid_and_reuses_nearby_steps():
    tm = TimingModel.create("vr200", optimizations="rubin-optimized")
    memo = StepMemo(tm)
    exact, memoized = _wide_ep(tm), _wide_ep(tm, memo)
    sim = CachedTiming(tm)  # what rackserve sim charges the same batches
    lay = tm.layout("wide-ep", 4)
    for context in range(64, 400, 3):  # a stream's context growing token by token
        batch = _one_busy_rank(0, 2, context)
        got = memoized(batch)
        assert got.total_s == pytest.approx(exact(batch).total_s, rel=0.05)
        assert got.total_s == sim.decode_token_time(lay, batch).total_s
    assert memo.misses < memo.calls / 2  # the 5% grid: nearby contexts share a price
    tail = _one_busy_rank(0, 1, 64, new=9)  # a first decode step: the prompt's tail recomputed
    assert memoized(tail).total_s == pytest.approx(exact(tail).total_s, rel=0.05)
    prefill = Pricer(tm, InstanceSpec("p0", "prefill", "dep2", 2, 2), "prefill", memo)
    one = StepBatch((RankBatch.of([]), RankBatch.of([65])))
    want = tm.step_time("prefill", tm.layout("dep2"), one)
    got = prefill(one)
    assert got.total_s == pytest.approx(want.total_s, rel=0.05)
    assert got.rank_busy_s == pytest.approx(want.rank_busy_s, rel=0.05)  # rank by rank, in order


@pytest.mark.parametrize("rank", [0, 2, 3])
def test_the_memo_gives_busy_time_to_the_rank_that_had_the_work(rank):
    """The memo's representative batch lists the busiest rank first; the per-rank busy times
    (the rank idle-time metric) must come back on the rank that held the sequences."""
    tm = TimingModel.create("vr200", optimizations="rubin-optimized")
    batch = _one_busy_rank(rank, 3, 500)
    exact = _wide_ep(tm)(batch).rank_busy_s
    got = _wide_ep(tm, StepMemo(tm))(batch).rank_busy_s
    assert max(range(4), key=exact.__getitem__) == rank
    assert max(range(4), key=got.__getitem__) == rank
    assert got[rank] == pytest.approx(exact[rank], rel=0.05)
