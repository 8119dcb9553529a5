"""rackserve/workload/uniform.py with a lanes_schedule: lanes come and go with the schedule."""

import pytest

from rackserve.workload.spec import parse_workload
from rackserve.workload.uniform import UniformSource, lane_start

SPEC = {"kind": "uniform", "requests": 1000, "prompt_tokens": 100, "output_tokens": 10}


def test_lane_start_follows_the_step_function():
    sched = ((0.0, 2), (10.0, 4), (20.0, 1))
    assert lane_start(sched, 0, 5.0) == 5.0
    assert lane_start(sched, 3, 5.0) == 10.0  # lane 3 runs from the step up
    assert lane_start(sched, 3, 12.0) == 12.0
    assert lane_start(sched, 3, 20.0) is None  # after the step down, never again
    assert lane_start(sched, 1, 25.0) is None


def test_a_source_starts_lanes_at_their_step_and_stops_them_after_the_step_down():
    src = UniformSource(parse_workload({**SPEC, "lanes_schedule": [[0, 2], [10, 4], [20, 1]]}))
    first = src.start()
    assert sorted(r.arrival_s for r in first) == [0.0, 0.0, 10.0, 10.0]
    lane0 = next(r for r in first if r.arrival_s == 0.0)
    again = src.on_done(lane0, 21.0)  # lane 0 keeps running
    assert [r.arrival_s for r in again] == [21.0]
    lane3 = [r for r in first if r.arrival_s == 10.0][-1]
    assert src.on_done(lane3, 21.0) == []  # lane 3 is beyond the single lane left


@pytest.mark.parametrize("sched", [[[5, 2]], [[0, 2], [0, 3]], [[0, -1]], [[0, 0]]])
def test_a_bad_schedule_names_the_field(sched):
    with pytest.raises(ValueError, match="workload.lanes_schedule"):
        parse_workload({**SPEC, "lanes_schedule": sched})
