"""AgentX interactivity in the simulator's metrics: E2E-normalized and ITL-based, read at the slow tail."""

import math

from rackserve.routing.view import PrefixHit
from rackserve.sim.metrics import Flight, MetricsCollector, slow_tail_speed
from rackserve.workload.request import Request


def _finish(m: MetricsCollector, rid: int, arrival: float, first: float, finish: float, out: int) -> None:
    req = Request(rid, arrival, 100, out, ())
    f = Flight(req, (0, 0), (0, 0), PrefixHit())
    f.first_token = first
    m.on_finish(f, finish)


def test_e2e_normalized_counts_ttft_and_itl_does_not():
    m = MetricsCollector()
    # 11 output tokens; TTFT 1 s; 10 tokens after the first in 0.1 s
    _finish(m, 1, 0.0, 1.0, 1.1, 11)
    assert math.isclose(m.e2e_s_per_token[0], 1.1 / 11)
    assert math.isclose(m.tpot[0], 0.01)
    assert math.isclose(slow_tail_speed(m.e2e_s_per_token, 50), 10.0)  # 11 / 1.1 s
    assert math.isclose(slow_tail_speed(m.tpot, 50), 100.0)


def test_p90_is_the_slow_tail():
    # ten requests of 1 output/s ... 10 output/s; the slow tail is near the slowest, not the fastest
    spt = [1.0 / k for k in range(1, 11)]
    p90 = slow_tail_speed(spt, 90)
    p50 = slow_tail_speed(spt, 50)
    assert p90 < p50
    # numpy's linear percentile of [0.1 .. 1.0] at 90 is 0.55 + ... : hand-computed 1 / 0.55
    srt = sorted(spt)
    pos = 0.9 * (len(srt) - 1)
    lo = srt[int(pos)]
    hi = srt[int(pos) + 1]
    expect = lo + (pos - int(pos)) * (hi - lo)
    assert math.isclose(p90, 1.0 / expect)
    assert p90 < 2.0  # the two slowest requests ran at 1 and 2 tok/s
