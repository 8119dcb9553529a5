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
