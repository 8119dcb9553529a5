"""Idle as operators read it: a rank with nothing to compute counts only while another rank of its
role has a request waiting; the window clips both clocks."""

import pytest

from rackserve.metrics.idle_waiting import IdleWhileWaiting


def test_an_empty_rank_counts_only_while_another_rank_has_waiting_requests():
    w = IdleWhileWaiting(["a", "b"])
    w.update(1.0, "a", has_work=True, waiting=True)  # a queues from 1 s; b has nothing
    w.update(3.0, "a", has_work=True, waiting=False)  # a's queue drained into its batch at 3 s
    w.update(4.0, "a", has_work=False, waiting=False)  # a done at 4 s
    secs = w.seconds(6.0)
    assert secs["b"] == pytest.approx((2.0, 6.0))  # waited-for 1..3 only; empty 0..6
    assert secs["a"] == pytest.approx((0.0, 3.0))  # empty 0..1 and 4..6, while nothing waited anywhere


def test_a_rank_with_work_never_counts_and_the_window_clips():
    w = IdleWhileWaiting(["a", "b"], window=lambda: (2.0, 5.0))
    w.update(0.0, "a", has_work=True, waiting=True)
    w.update(0.0, "b", has_work=True, waiting=False)
    w.update(4.0, "b", has_work=False, waiting=False)  # b empties at 4 s while a still queues
    secs = w.seconds(10.0)
    assert secs["a"] == (0.0, 0.0)
    assert secs["b"] == pytest.approx((1.0, 1.0))  # 4..5: the window ends at 5 s
