"""DecisionRecorder: predicted vs delivered cached tokens and hit rates."""

from __future__ import annotations

import pytest

from rackserve.routing import Decision, DecisionRecorder, PrefixHit


def _decision(hbm: int, pool: int) -> Decision:
    return Decision("p0", 0, PrefixHit(hbm, pool, 0), 0.1, "least-uncached-work")


def test_predicted_vs_delivered_stats():
    rec = DecisionRecorder()
    rec.record("a", _decision(64, 32), prompt_tokens=200)
    rec.record("b", _decision(0, 0), prompt_tokens=100)
    rec.record("c", _decision(16, 0), prompt_tokens=50)
    assert rec.deliver("a", 64).delivered_cached_tokens == 64  # pool copy was evicted meanwhile
    rec.deliver("b", 16)
    s = rec.stats()
    assert (s.decisions, s.pending, s.prompt_tokens) == (3, 1, 300)
    assert (s.predicted_tokens, s.delivered_tokens, s.overpredicted_decisions) == (96, 80, 1)
    assert s.predicted_hit_rate == pytest.approx(96 / 300)
    assert s.delivered_hit_rate == pytest.approx(80 / 300)
    assert rec.get("c").delivered_cached_tokens is None and len(rec) == 3


def test_bad_records_raise_naming_the_field():
    rec = DecisionRecorder()
    rec.record("a", _decision(0, 0), prompt_tokens=10)
    rec.record("a", _decision(5, 0), prompt_tokens=10)  # re-routed: the latest decision counts
    assert rec.get("a").decision.predicted.rank_hbm == 5 and len(rec) == 1
    with pytest.raises(ValueError, match="request_id 'zz'"):
        rec.deliver("zz", 1)
    with pytest.raises(ValueError, match="cached_tokens"):
        rec.deliver("a", 11)
    assert DecisionRecorder().stats().delivered_hit_rate == 0.0
