"""rackserve/planner/fleet.py: starting, active, draining, off; GPUs held over time."""

from rackserve.planner.fleet import (
    ACTIVE,
    DRAINING,
    OFF,
    STARTING,
    Fleet,
    InstanceSlot,
    gpu_seconds,
)
from rackserve.planner.observation import Targets


def _fleet():
    slots = [InstanceSlot(f"prefill-{i}", "prefill", i, 2) for i in range(3)]
    slots += [InstanceSlot(f"decode-{i}", "decode", i, 8) for i in range(2)]
    fleet = Fleet(slots)
    fleet.activate_now(slots[0], 0.0)
    fleet.activate_now(slots[3], 0.0)
    return fleet, slots


def test_scaling_up_starts_instances_that_serve_only_after_the_delay():
    fleet, slots = _fleet()
    changes = fleet.apply(Targets(2, 1), 10.0, lambda s: 45.0, lambda s: 0.0)
    assert [(c.slot.name, c.to) for c in changes] == [("prefill-1", STARTING)]
    assert slots[1].ready_at == 55.0
    assert not fleet.ready(slots[1], 54.9)
    assert fleet.ready(slots[1], 55.0) and slots[1].state == ACTIVE
    assert fleet.held == [(0.0, 10), (10.0, 12)]  # GPUs are held from the start of the load


def test_scaling_down_drains_the_least_loaded_and_frees_gpus_when_drained():
    fleet, slots = _fleet()
    fleet.activate_now(slots[1], 0.0)
    load = {"prefill-0": 5.0, "prefill-1": 1.0}
    changes = fleet.apply(Targets(1, 1), 20.0, lambda s: 45.0, lambda s: load[s.name])
    assert [(c.slot.name, c.to) for c in changes] == [("prefill-1", DRAINING)]
    assert fleet.held_gpus() == 12  # draining still holds its GPUs
    fleet.drained(slots[1], 30.0)
    assert slots[1].state == OFF and fleet.held[-1] == (30.0, 10)


def test_a_draining_instance_asked_back_is_active_at_once():
    fleet, slots = _fleet()
    fleet.activate_now(slots[1], 0.0)
    fleet.apply(Targets(1, 1), 20.0, lambda s: 45.0, lambda s: s.index)
    assert slots[0].state == DRAINING
    changes = fleet.apply(Targets(2, 1), 25.0, lambda s: 45.0, lambda s: 0.0)
    assert [(c.slot.name, c.to) for c in changes] == [("prefill-0", ACTIVE)]


def test_a_starting_instance_no_longer_wanted_stops_loading():
    fleet, slots = _fleet()
    fleet.apply(Targets(2, 1), 10.0, lambda s: 45.0, lambda s: 0.0)
    fleet.apply(Targets(1, 1), 20.0, lambda s: 45.0, lambda s: 0.0)
    assert slots[1].state == OFF and slots[0].state == ACTIVE
    assert not fleet.ready(slots[1], 55.0)


def test_gpu_seconds_integrates_the_held_step_function_over_the_window():
    held = [(0.0, 10), (10.0, 12), (30.0, 10)]
    assert gpu_seconds(held, 0.0, 40.0) == 10 * 10 + 12 * 20 + 10 * 10
    assert gpu_seconds(held, 20.0, 35.0) == 12 * 10 + 10 * 5
