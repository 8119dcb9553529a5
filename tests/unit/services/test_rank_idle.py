"""The live clock's idle as operators read it: two instances' loops of one worker process share
one RankIdleExport; while a rank of one has requests waiting, every empty rank of both accrues
rackserve_rank_idle_while_waiting_seconds on the process's simulated clock (the steps' prices)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rackserve.metrics import ProcessMetrics
from rackserve.timing.batch import RankBatch, StepCost
from services.instance_loop import InstanceLoop
from services.rank_idle import RankIdleExport
from services.rank_worker import RankStep
from services.topology import InstanceSpec
from tests.unit.services.test_instance_loop import HeldRank, finished, settle

STEP_S = 0.01  # simulated seconds of every step


def _idle_series(metrics: ProcessMetrics) -> dict[tuple[str, str], float]:
    text = metrics.exposition().decode()
    return {(s.labels["instance"], s.labels["dp_rank"]): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "rackserve_rank_idle_while_waiting_seconds_total"}


def test_empty_ranks_accrue_while_another_instances_rank_has_waiting_requests() -> None:
    metrics = ProcessMetrics("m")
    specs = [InstanceSpec(f"prefill-dep2-{i}", "prefill", "dep2", 2, 2) for i in range(2)]
    idle = RankIdleExport(metrics, [key for spec in specs for key in spec.ranks()])
    assert set(_idle_series(metrics).values()) == {0.0}  # every rank exported at 0 from the start
    assert len(_idle_series(metrics)) == 4
    ranks = {spec.name: [HeldRank(), HeldRank()] for spec in specs}
    cost = StepCost(STEP_S, {}, (STEP_S, STEP_S))
    loops = [InstanceLoop(spec, ranks[spec.name], lambda _b: cost, 0.0, metrics, lambda _d: None, idle)
             for spec in specs]

    async def scenario() -> None:
        tasks = [asyncio.create_task(loop.run()) for loop in loops]
        try:
            loops[0].wake(0)
            await settle()
            busy = ranks["prefill-dep2-0"][0]
            for _ in range(3):  # three steps with two requests waiting behind the batch
                busy.answer(RankStep(RankBatch.of([1], [10]), (), busy=True, waiting=2))
                await settle()
            busy.answer(finished("r"))  # the queue drained: nothing waits any more
            await settle()
        finally:
            for task in tasks:
                task.cancel()

    asyncio.run(scenario())
    series = _idle_series(metrics)
    assert series[("prefill-dep2-0", "0")] == 0.0  # the rank with the queue never idles
    for key in (("prefill-dep2-0", "1"), ("prefill-dep2-1", "0"), ("prefill-dep2-1", "1")):
        assert series[key] == pytest.approx(3 * STEP_S)  # the three steps its neighbour's queue waited
