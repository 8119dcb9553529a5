"""The fast step cost (step_plan.py) against the readable reference path (step_cost.py): same
totals, breakdowns, per-rank busy times and bound labels, to rounding, over random batches of every
hardware x preset x layout x phase, including idle ranks, pool transfers, given expert loads and
multi-token decode steps."""

from __future__ import annotations

import numpy as np
import pytest

from rackserve.timing import RankBatch, StepBatch, TimingModel

from .conftest import bare

REL = 1e-9


def _random_batch(rng, dp: int, phase: str, experts: int, kind: int) -> StepBatch:
    ranks = []
    for _ in range(dp):
        n = int(rng.integers(0, 4)) if kind % 4 == 0 else int(rng.integers(1, 48))
        if phase == "prefill":
            n = min(n, 3)
            new = rng.integers(1, 20_000, n)
        elif kind % 5 == 3:
            new = rng.integers(1, 5, n)  # speculative / chunked decode: not the single-token form
        else:
            new = np.ones(n, dtype=np.int64)
        cached = rng.integers(0, 200_000, n)
        hbm = int(rng.integers(0, 3)) * 777 if kind % 3 == 1 else 0
        dram = int(rng.integers(0, 3)) * 555 if kind % 3 == 2 else 0
        ranks.append(RankBatch(new, cached, hbm, dram))
    load = None
    if kind % 6 == 5:
        load = rng.integers(0, 50, experts).astype(float)
        load[rng.random(experts) < 0.3] = 0
    return StepBatch(tuple(ranks), load)


def _assert_same(fast, ref, label) -> None:
    assert fast.total_s == pytest.approx(ref.total_s, rel=REL, abs=0), label
    assert list(fast.breakdown) == list(ref.breakdown), label
    for name, value in ref.breakdown.items():
        assert fast.breakdown[name] == pytest.approx(value, rel=REL, abs=1e-18), (label, name)
    assert fast.rank_busy_s == pytest.approx(ref.rank_busy_s, rel=REL, abs=1e-18), label
    assert fast.bound == ref.bound, label


@pytest.mark.parametrize("hardware", ["vr200", "gb300", "gb200", "h200"])
@pytest.mark.parametrize("model", ["deepseek-v4.1-flash", "deepseek-v3"])
def test_fast_path_matches_reference(hardware, model):
    rng = np.random.default_rng(11)
    for opt in ("baseline", "rubin-optimized", "rubin-optimized,-attn-overlap,-kv-gather-ahead"):
        fast = TimingModel.create(hardware, model, opt)
        ref = TimingModel.create(hardware, model, opt)  # own memo: nothing shared with `fast`
        for name, ranks in (("dep2", None), ("tp8", None), ("wide-ep", 8), ("wide-ep", 72)):
            lay = fast.layout(name, ranks)
            for phase in ("prefill", "decode"):
                for kind in range(8 if ranks != 72 else 3):
                    batch = _random_batch(rng, lay.dp, phase, fast.model.moe.experts, kind)
                    label = (hardware, model, opt, lay.key, phase, kind)
                    a = fast.step_time(phase, lay, batch)
                    _assert_same(a, ref.step_time_reference(phase, lay, batch), label)
                    again = fast.step_time(phase, lay, batch)  # memo hit: same answer
                    assert again == a, label


def test_fast_path_decode_leap_and_estimate_match_reference(vr200):
    ref = bare(TimingModel.create("vr200", "deepseek-v4.1-flash", "rubin-optimized,-mtp"))
    fast = vr200.with_optimizations("rubin-optimized,-mtp")  # the leap of plain one-token steps
    dep2, wide = vr200.layout("dep2"), vr200.layout("wide-ep", 8)
    rng = np.random.default_rng(2)
    batch = StepBatch(
        tuple(RankBatch(np.ones(5, dtype=np.int64), rng.integers(0, 9000, 5)) for _ in range(8))
    )
    fast_leap = fast.decode_leap(wide, batch, 9)
    half = 4
    mid = StepBatch(tuple(RankBatch(r.new_tokens, r.cached_tokens + half) for r in batch.ranks))
    one = ref.step_time_reference("decode", wide, mid)
    assert fast_leap.total_s == pytest.approx(9 * one.total_s, rel=REL)
    # the router's reference step is the engine's chunk (issue 31: 8192, was 16384)
    chunk = vr200.reference_chunk_tokens
    assert chunk == 8192
    base = ref.step_time_reference("prefill", dep2, StepBatch((RankBatch.of([chunk]),) * 2))
    more = ref.step_time_reference(
        "prefill", dep2, StepBatch((RankBatch.of([chunk, 700], [0, 3000]), RankBatch.of([chunk])))
    )
    assert vr200.prefill_estimate_s(dep2, 700, 3000) == pytest.approx(
        max(more.total_s - base.total_s, 0.0), rel=1e-6
    )


def test_layouts_equal_but_distinct_share_a_plan_and_unknown_phase_fails(vr200):
    from rackserve.timing import make_layout

    batch = StepBatch(tuple(RankBatch.of([1, 1], [100, 5000]) for _ in range(8)))
    a = vr200.step_time("decode", vr200.layout("wide-ep", 8), batch)
    b = vr200.step_time("decode", make_layout("wide-ep", 8), batch)
    assert a == b
    with pytest.raises(ValueError, match="phase"):
        vr200.step_time("verify", make_layout("wide-ep", 8), batch)


def test_ranks_sharing_one_batch_cost_what_copies_cost(vr200):
    """A step whose ranks share RankBatch objects (the step memo's representatives) is priced on its
    distinct batches once (features, verify widening, overlap halves) and must equal, bit for bit,
    the same step with a copy per rank; a fresh model prices each so nothing is served from a memo."""
    lay = vr200.layout("wide-ep", ranks=8)
    big = RankBatch(np.full(40, 2, dtype=np.int64), np.arange(1000, 81000, 2000, dtype=np.int64))
    small = RankBatch(np.ones(7, dtype=np.int64), np.full(7, 50_000, dtype=np.int64))
    idle = RankBatch.of([])
    shared = StepBatch((big, small, small, big, idle, small, big, small))

    def copies(b: StepBatch) -> StepBatch:
        return StepBatch(tuple(RankBatch(rb.new_tokens.copy(), rb.cached_tokens.copy()) for rb in b.ranks))

    ones = {id(rb): RankBatch(np.ones_like(rb.new_tokens), rb.cached_tokens) for rb in shared.ranks}
    one = StepBatch(tuple(ones[id(rb)] for rb in shared.ranks))
    for phase, batch, price in (("decode", shared, "step_time"), ("decode", one, "decode_token_time")):
        a = TimingModel.create("vr200", "deepseek-v4.1-flash", "rubin-optimized")
        b = TimingModel.create("vr200", "deepseek-v4.1-flash", "rubin-optimized")
        if price == "step_time":
            x, y = a.step_time(phase, lay, batch), b.step_time(phase, lay, copies(batch))
        else:
            x, y = a.decode_token_time(lay, batch), b.decode_token_time(lay, copies(batch))
        assert x == y, price
        assert len(set(x.rank_busy_s)) == 3  # big, small and idle ranks kept apart
    # the halves and the verify widening keep the sharing (what makes the distinct pricing pay)
    from rackserve.timing.overlap import split_in_two
    from rackserve.timing.speculative import verify_batch
    wide = verify_batch(one, 2)
    assert wide.ranks[1] is wide.ranks[2] and wide.ranks[0] is wide.ranks[3]
    h1, h2 = split_in_two(shared)
    assert h1.ranks[0] is h1.ranks[3] and h2.ranks[1] is h2.ranks[5]


def test_prefill_ranks_memoized_alone_price_pairs_as_fresh(vr200):
    """Prefill ranks' feature sums are memoized rank by rank; a pair whose ranks were each seen in
    other pairs (and in the overlap's halves) costs what a model that never saw them says."""
    dep2 = vr200.layout("dep2")
    a = RankBatch.of([8192], [40_000])
    b = RankBatch.of([4096, 4096], [0, 90_000])
    c = RankBatch.of([1000, 7192], [5_000, 0], pool_hbm_tokens=3_000)
    for x, y in ((a, b), (b, c), (c, a)):
        vr200.step_time("prefill", dep2, StepBatch((x, y)))
    for pair in ((b, a), (a, c), (c, b), (a, a)):
        fresh = bare(TimingModel.create("vr200", "deepseek-v4.1-flash", "rubin-optimized"))
        assert vr200.step_time("prefill", dep2, StepBatch(pair)) == fresh.step_time("prefill", dep2, StepBatch(pair))
        _assert_same(vr200.step_time("prefill", dep2, StepBatch(pair)),
                     fresh.step_time_reference("prefill", dep2, StepBatch(pair)), pair)
