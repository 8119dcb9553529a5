"""Against the live cluster: every prefill and decode rank exports the idle an operator reads
(rackserve_rank_idle_while_waiting_seconds, issue 50) beside the lockstep idle, and a real
Prometheus scrapes one series per rank of it, none negative."""

from __future__ import annotations

import math

import pytest

from tests.integration.observability.test_live_observability import _poll

pytestmark = pytest.mark.integration


def test_every_rank_exports_idle_while_work_waits_beside_the_lockstep_idle(prometheus, bench_run):
    q_wait, q_lock = "rackserve_rank_idle_while_waiting_seconds_total", "rackserve_rank_idle_seconds_total"
    answers = _poll(prometheus, [q_wait, q_lock], 30.0)
    ranks = lambda series: {(s["metric"]["instance"], s["metric"]["dp_rank"]) for s in series}  # noqa: E731
    waiting = answers[q_wait]
    assert waiting and ranks(waiting) == ranks(answers[q_lock])  # one series per rank, as the lockstep idle
    assert {s["metric"]["role"] for s in waiting} == {"prefill", "decode"}
    assert all(math.isfinite(float(s["value"][1])) and float(s["value"][1]) >= 0 for s in waiting)
