"""InstanceLoop's bookkeeping of which ranks take part in a step, driven by rank doubles whose
step the test completes by hand, so a wake can land exactly while a step is being gathered."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from rackserve.metrics import ProcessMetrics
from rackserve.timing.batch import RankBatch, StepCost
from services.instance_loop import InstanceLoop, StepDone
from services.rank_worker import Emitted, RankStep
from services.topology import InstanceSpec


class HeldRank:
    """A rank actor double: each `step.remote()` waits until the test hands it a RankStep."""

    def __init__(self) -> None:
        self.calls: list[asyncio.Future] = []
        self.step = SimpleNamespace(remote=self._remote)

    def _remote(self):
        future = asyncio.get_running_loop().create_future()
        self.calls.append(future)
        return future

    def answer(self, step: RankStep) -> None:
        self.calls[-1].set_result(step)


def finished(request_id: str) -> RankStep:
    """A step that finishes the rank's last request: it reports itself idle."""
    emitted = (Emitted(request_id, 7, "length"),)
    return RankStep(RankBatch.of([1], [10]), emitted, busy=False)


async def settle(rounds: int = 50) -> None:
    """Let the loop run every callback that is ready (no wall-clock wait)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


def make_loop(ranks: list[HeldRank], done: list[StepDone]) -> InstanceLoop:
    spec = InstanceSpec("prefill-dep2-0", "prefill", "dep2", 2, len(ranks))
    cost = StepCost(0.01, {}, tuple(0.01 for _ in ranks))
    return InstanceLoop(
        spec, ranks, lambda _batch: cost, 0.0, ProcessMetrics("m"), done.append
    )


def test_a_wake_during_the_gather_keeps_the_rank_in_the_next_step() -> None:
    async def scenario() -> None:
        rank0, rank1 = HeldRank(), HeldRank()
        done: list[StepDone] = []
        loop = make_loop([rank0, rank1], done)
        task = asyncio.create_task(loop.run())
        loop.wake(0)
        await settle()
        assert len(rank0.calls) == 1 and not rank1.calls  # only the rank with work is called
        loop.wake(0)  # a new request reaches rank 0 while its step is in flight...
        rank0.answer(finished("a"))  # ...and that step reports the rank idle (it saw no new work)
        await settle()
        assert [d.emitted[0].request_id for d in done] == ["a"]
        assert len(rank0.calls) == 2, "rank 0 was dropped: its new request is stranded"
        rank0.answer(finished("b"))
        await settle()
        assert [d.emitted[0].request_id for d in done] == ["a", "b"]
        assert len(rank0.calls) == 2  # idle now, with no wake since: not called again
        task.cancel()

    asyncio.run(scenario())


def test_an_idle_step_without_a_wake_drops_the_rank() -> None:
    async def scenario() -> None:
        rank0, rank1 = HeldRank(), HeldRank()
        loop = make_loop([rank0, rank1], [])
        task = asyncio.create_task(loop.run())
        loop.wake(0)
        loop.wake(1)
        await settle()
        rank0.answer(finished("a"))
        rank1.answer(RankStep(RankBatch.of([1], [5]), (), busy=True))
        await settle()
        assert len(rank0.calls) == 1 and len(rank1.calls) == 2  # rank 0 idle, rank 1 still busy
        task.cancel()

    asyncio.run(scenario())
