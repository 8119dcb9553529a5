"""An instance's per-rank busy and idle seconds: a wide instance charges its ranks lazily, the
pending step costs as arrays; every figure must equal charging each step's cost to each rank at
once (StepCost.rank_idle_s), bit for bit."""

import random

import pytest

from rackserve.sched.scheduler import RankScheduler, SchedulerLimits
from rackserve.sim.instances import MAX_PENDING, WIDE, Instance
from rackserve.timing.batch import StepCost


def _instance(ranks: int) -> Instance:
    return Instance("d0", "wide-ep", None, ranks, [RankScheduler(SchedulerLimits(1024, 8)) for _ in range(ranks)])


def _cost(rng: random.Random, ranks: int, short: float = 0.1) -> StepCost:
    total = rng.uniform(1e-4, 5e-2)
    listed = ranks if rng.random() >= short else rng.randrange(ranks)  # a cost that lists fewer ranks
    busy = tuple(rng.choice([total, 0.0, rng.uniform(0.0, total * 1.2)]) for _ in range(listed))
    return StepCost(total, {"x": total}, busy)


def _eager(charges: list[tuple[StepCost, int]], ranks: int) -> tuple[list[float], list[float]]:
    busy, idle = [0.0] * ranks, [0.0] * ranks
    for cost, steps in charges:
        for r in range(ranks):
            b = cost.rank_busy_s[r] if r < len(cost.rank_busy_s) else 0.0
            busy[r] += b * steps
            idle[r] += max(0.0, cost.total_s - b) * steps
    return busy, idle


def test_a_wide_instance_charges_its_ranks_as_each_step_would_bit_for_bit():
    rng = random.Random(7)
    for ranks in (WIDE, 16, 48):
        inst = _instance(ranks)
        pool = [_cost(rng, ranks) for _ in range(40)]
        charged: list[tuple[StepCost, int]] = []
        for _ in range(3 * MAX_PENDING // 2):  # past MAX_PENDING distinct costs once: a flush midway
            cost = rng.choice(pool) if rng.random() < 0.7 else _cost(rng, ranks)
            steps = rng.randint(1, 300)
            inst.account(cost, steps)
            charged.append((cost, steps))
            if rng.random() < 0.01:  # read midway: flushes, then goes on
                assert len(inst.rank_busy_s) == ranks
        busy_eager, idle_eager = _eager(charged, ranks)
        busy, idle = inst.rank_busy_s, inst.rank_idle_s
        assert len(busy) == ranks and len(idle) == ranks
        for r in range(ranks):  # regrouped sums: within 1e-12 of charging step by step
            assert abs(busy[r] - busy_eager[r]) <= 1e-12 * max(1.0, abs(busy_eager[r]))
            assert abs(idle[r] - idle_eager[r]) <= 1e-12 * max(1.0, abs(idle_eager[r]))


@pytest.mark.parametrize("short", [0.0, 0.02])
def test_the_array_flush_equals_charging_each_pending_cost_in_turn(short):
    """_flush as arrays against _charge called for each pending cost in the same order: equal bits
    (short > 0: some costs list fewer ranks, and a flush holding one charges cost by cost)."""
    rng = random.Random(3)
    for ranks in (WIDE, 48):
        a, b = _instance(ranks), _instance(ranks)
        for _ in range(500):
            cost, steps = _cost(rng, ranks, short), rng.randint(1, 50)
            a.account(cost, steps)
            b._charge(cost, steps)
            if rng.random() < 0.05:
                a._flush()
        assert a.rank_busy_s == b.rank_busy_s
        assert a.rank_idle_s == b.rank_idle_s
        assert sum(a.rank_idle_s) > 0 and sum(a.rank_busy_s) > 0
