import pytest

from rackserve.sim.step_cache import CachedTiming, GeometricGrid
from rackserve.timing.batch import RankBatch, StepBatch


def test_grid_keeps_small_values_exact_and_bounds_relative_error():
    g = GeometricGrid(0.05)
    assert [g(x) for x in (0, 1, 7, 16)] == [0, 1, 7, 16]
    for x in (17, 100, 4097, 123_456):
        assert abs(g(x) - x) / x <= 0.026


def test_memo_matches_exact_on_linear_model_and_hits(timing):
    memo = CachedTiming(timing, rel=0.05)
    batch = StepBatch((RankBatch.of([4000, 1000], [1000, 0]), RankBatch.of([2000], [3000])))
    exact = timing.step_time("prefill", "dep2", batch)
    got = memo.step_time("prefill", "dep2", batch)
    assert got.total_s == pytest.approx(exact.total_s, rel=0.06)
    memo.step_time("prefill", "dep2", batch)
    assert (memo.calls, memo.misses) == (2, 1)
    dec = StepBatch(tuple(RankBatch.of([1] * n, [5000] * n) for n in (3, 5, 0, 4)))
    d_exact = timing.step_time("decode", "wide-ep", dec).total_s
    assert memo.step_time("decode", "wide-ep", dec).total_s == pytest.approx(d_exact, rel=0.03)
    assert memo.prefill_estimate_s("dep2", 1234, 0) == pytest.approx(timing.prefill_estimate_s("dep2", 1234, 0))


def test_a_decode_batch_with_a_recompute_chunk_is_priced_by_its_tokens():
    """The decode memo keys single-token ranks by sequences and context only; a batch with a longer
    chunk (a newcomer's partial last block, a resumed request) must not hit that key, as the real
    timing model prices it as the step it is."""
    from rackserve.timing import TimingModel

    tm = TimingModel.create("vr200", optimizations="rubin-optimized")
    memo = CachedTiming(tm, rel=0.05)
    lay = tm.layout("wide-ep", ranks=2)
    pure = StepBatch((RankBatch.of([1, 1], [4000, 4000]), RankBatch.of([1], [4000])))
    chunk = StepBatch((RankBatch.of([1, 64], [4000, 3937]), RankBatch.of([1], [4000])))
    assert memo.decode_token_time(lay, pure).total_s == pytest.approx(tm.decode_token_time(lay, pure).total_s, rel=0.03)
    exact = tm.decode_token_time(lay, chunk).total_s
    assert exact > tm.decode_token_time(lay, pure).total_s * 1.2  # MTP's per-token division is off
    assert memo.decode_token_time(lay, chunk).total_s == pytest.approx(exact, rel=0.03)
    assert memo.step_time("decode", lay, chunk).total_s == pytest.approx(exact, rel=0.03)


def test_the_fast_tail_and_sparse_paths_price_like_the_batch(timing):
    """decode_tail_step_time and sparse_step_time_of give the cost (and per-rank busy times) that
    step_time gives the batch decode_side._decode_rank_batch builds, idle ranks included."""
    import random

    from rackserve.sim.decode_side import _decode_rank_batch
    from rackserve.sim.step_cache import CachedTiming, _totals
    from rackserve.timing.batch import StepBatch

    rng = random.Random(3)
    memo = CachedTiming(timing)
    for _ in range(200):
        ranks = rng.choice((2, 8, 24))
        loads = []
        for r in range(ranks):
            n = rng.choice((0, 0, 1, 3, 20, 200))
            if n:
                tail = rng.choice((0, 0, 17, 63))
                loads.append((r, n, n * rng.randrange(100, 100_000) + tail, tail))
        if not loads:
            continue
        by_rank = {r: (n, ctx, tail) for r, n, ctx, tail in loads}
        batch = StepBatch(tuple(_decode_rank_batch(*by_rank[r][:2], 0, by_rank[r][2]) if r in by_rank
                                else _decode_rank_batch(0, 0, 0) for r in range(ranks)))
        want = CachedTiming(timing).step_time("decode", "wide-ep", batch) if any(t for *_, t in loads) else None
        got = memo.decode_tail_step_time("wide-ep", ranks, loads)
        sparse = memo.sparse_step_time_of("decode", "wide-ep", ranks,
                                          {r: _totals(batch.ranks[r]) for r in by_rank})
        assert (got.total_s, got.rank_busy_s) == (sparse.total_s, sparse.rank_busy_s)
        if want is not None:
            assert (got.total_s, got.rank_busy_s) == (want.total_s, want.rank_busy_s)
