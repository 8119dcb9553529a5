"""InstanceLoop's bookkeeping of which ranks take part in a step, driven by rank doubles whose
step the test completes by hand, so a wake can land exactly while a step is being gathered."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace

from rackserve.metrics import ProcessMetrics
from rackserve.timing.batch import RankBatch, StepCost
from services import instance_loop
from services.instance_loop import InstanceLoop, StepDone
from services.rank_inbox import AdmitResult, Admitted, Submission
from services.rank_worker import Emitted, RankStep
from services.topology import InstanceSpec


class HeldRank:
    """A rank actor double: each `step.remote()` waits until the test hands it a RankStep."""

    def __init__(self) -> None:
        self.calls: list[asyncio.Future] = []
        self.inboxes: list[tuple] = []  # what each call carried
        self.step = SimpleNamespace(remote=self._remote)
        self.cancelled: list[str] = []  # what cancel.remote() was called with
        self.cancel = SimpleNamespace(remote=self.cancelled.append)

    def _remote(self, inbox: tuple = ()):
        future = asyncio.get_running_loop().create_future()
        self.calls.append(future)
        self.inboxes.append(inbox)
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


@asynccontextmanager
async def running_loop(n_ranks: int = 2) -> AsyncIterator[tuple[InstanceLoop, list[HeldRank], list[StepDone]]]:
    """A running InstanceLoop over `n_ranks` rank doubles: (loop, ranks, the StepDones it
    reported); the loop's task is cancelled on exit."""
    ranks = [HeldRank() for _ in range(n_ranks)]
    done: list[StepDone] = []
    loop = make_loop(ranks, done)
    task = asyncio.create_task(loop.run())
    try:
        yield loop, ranks, done
    finally:
        task.cancel()


def test_a_wake_during_the_gather_keeps_the_rank_in_the_next_step() -> None:
    async def scenario() -> None:
        async with running_loop() as (loop, (rank0, rank1), done):
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

    asyncio.run(scenario())


def test_an_idle_step_without_a_wake_drops_the_rank() -> None:
    async def scenario() -> None:
        async with running_loop() as (loop, (rank0, rank1), done):
            loop.wake(0)
            loop.wake(1)
            await settle()
            rank0.answer(finished("a"))
            rank1.answer(RankStep(RankBatch.of([1], [5]), (), busy=True))
            await settle()
            assert len(rank0.calls) == 1 and len(rank1.calls) == 2  # rank 0 idle, rank 1 still busy

    asyncio.run(scenario())


def admitting(request_id: str, busy: bool) -> RankStep:
    """A step that admitted `request_id` (its answer rides on the step) and computed it."""
    result = AdmitResult(request_id, Admitted(0, 0, 0))
    emitted = (Emitted(request_id, 7, None if busy else "length"),)
    return RankStep(RankBatch.of([4], [0]), emitted, busy=busy, admitted=(result,))


def test_a_submission_rides_on_the_step_call_and_is_answered_with_it() -> None:
    async def scenario() -> None:
        async with running_loop() as (loop, (rank0, rank1), done):
            answer = loop.submit(0, Submission("prefill", "a", (1, 2, 3)))
            await settle()
            assert len(rank0.calls) == 1 and not rank1.calls  # one call: admission and step
            assert [s.request_id for s in rank0.inboxes[0]] == ["a"]
            assert not answer.done()
            rank0.answer(admitting("a", busy=False))
            await settle()
            assert answer.result().admitted == Admitted(0, 0, 0)
            assert [d.emitted[0].request_id for d in done] == ["a"]
            loop.cancel(0, "a")  # sent: a cancel call follows it (the rank runs calls in order)
            assert rank0.cancelled == ["a"]

    asyncio.run(scenario())


def test_a_silent_joining_rank_is_left_behind_and_its_late_answer_counts(monkeypatch) -> None:
    """A rank whose process hangs must not stall its siblings: a request sent to an idle sibling
    still completes; the hung rank's answer, when it comes, is taken by the next step."""
    monkeypatch.setattr(instance_loop, "JOIN_GRACE_S", 0.05)

    async def scenario() -> None:
        async with running_loop() as (loop, (rank0, rank1), done):
            hung = loop.submit(0, Submission("prefill", "a", (1,)))
            await asyncio.sleep(0.2)  # rank 0 does not answer; nobody else needs a step yet
            fine = loop.submit(1, Submission("prefill", "b", (2,)))
            await asyncio.sleep(0.2)  # now rank 1 does: rank 0 is left behind
            await settle()
            assert len(rank1.calls) == 1, "rank 1 was not stepped: the hung rank stalls the instance"
            assert len(rank0.calls) == 1  # not called again while its call is out
            rank1.answer(admitting("b", busy=False))
            await settle()
            assert fine.result().request_id == "b" and not hung.done()
            assert [d.emitted[0].request_id for d in done] == ["b"]
            rank0.answer(admitting("a", busy=False))  # it wakes up: its answer is a step's again
            await settle()
            assert hung.result().request_id == "a"
            assert [d.emitted[0].request_id for d in done] == ["b", "a"]

    asyncio.run(scenario())


def test_a_rank_in_lockstep_is_waited_for_however_long(monkeypatch) -> None:
    monkeypatch.setattr(instance_loop, "JOIN_GRACE_S", 0.01)

    async def scenario() -> None:
        async with running_loop() as (loop, (rank0, _), done):
            loop.submit(0, Submission("prefill", "a", (1,)))
            await settle()
            rank0.answer(admitting("a", busy=True))  # still busy: it is in lockstep now
            await settle()
            assert len(rank0.calls) == 2
            await asyncio.sleep(0.1)  # a slow step of a busy rank is waited for, not left behind
            rank0.answer(finished("a"))
            await settle()
            assert len(done) == 2 and done[1].emitted[0].finish_reason == "length"

    asyncio.run(scenario())


def test_a_failed_step_fails_the_submissions_it_carried_and_those_queued() -> None:
    async def scenario() -> None:
        async with running_loop() as (loop, (rank0, _), done):
            loop.submit(0, Submission("prefill", "a", (1,)))
            await settle()
            rank0.answer(admitting("a", busy=True))  # in lockstep now
            await settle()
            carried = loop.submit(0, Submission("prefill", "b", (1,)))
            await settle()
            queued = loop.submit(0, Submission("prefill", "c", (1,)))
            rank0.calls[-1].set_exception(RuntimeError("actor died"))
            await settle()
            for answer in (carried, queued):
                assert isinstance(answer.exception(), RuntimeError)
            assert done[-1].error and done[-1].rank == -1  # the whole instance fails

    asyncio.run(scenario())


def test_a_joining_rank_that_fails_fails_only_its_own_requests() -> None:
    async def scenario() -> None:
        async with running_loop() as (loop, (rank0, rank1), done):
            doomed = loop.submit(0, Submission("prefill", "a", (1,)))
            fine = loop.submit(1, Submission("prefill", "b", (1,)))
            await settle()
            rank0.calls[-1].set_exception(RuntimeError("actor restarting"))  # idle before: joined
            rank1.answer(admitting("b", busy=False))
            await settle()
            assert isinstance(doomed.exception(), RuntimeError)
            assert fine.result().request_id == "b"
            assert [(d.rank, d.error != "") for d in done] == [(0, True), (1, False)]
            await settle()
            assert len(rank0.calls) == 1  # a failed idle rank is not called again without work

    asyncio.run(scenario())


def test_a_rank_left_behind_that_fails_fails_only_its_own_requests(monkeypatch) -> None:
    monkeypatch.setattr(instance_loop, "JOIN_GRACE_S", 0.05)

    async def scenario() -> None:
        async with running_loop() as (loop, (rank0, rank1), done):
            doomed = loop.submit(0, Submission("prefill", "a", (1,)))
            await asyncio.sleep(0.1)
            loop.submit(1, Submission("prefill", "b", (2,)))
            await asyncio.sleep(0.2)  # rank 0 left behind, rank 1 called
            rank0.calls[0].set_exception(RuntimeError("actor died"))  # killed while left behind
            rank1.answer(admitting("b", busy=False))
            await settle()
            assert isinstance(doomed.exception(), RuntimeError)
            failed = [d for d in done if d.error]
            assert [(d.rank, d.fails("prefill-dep2-0", 1)) for d in failed] == [(0, False)]
            assert [d.emitted[0].request_id for d in done if not d.error] == ["b"]  # untouched

    asyncio.run(scenario())


def test_a_cancel_of_a_queued_submission_drops_it_and_never_calls_a_rank() -> None:
    async def scenario() -> None:
        async with running_loop() as (loop, (rank0, rank1), done):
            loop.submit(0, Submission("prefill", "a", (1,)))
            await settle()  # rank 0's step call carries "a" and is still out
            queued = loop.submit(0, Submission("prefill", "b", (1,)))
            loop.cancel(0, "b")
            assert queued.cancelled() and not rank0.cancelled  # dropped here, no call for it
            rank0.answer(admitting("a", busy=False))
            await settle()
            assert all(not inbox for inbox in rank0.inboxes[1:])  # "b" never reaches the rank

    asyncio.run(scenario())


def test_a_stream_woken_by_a_steps_tokens_runs_before_the_next_step_call() -> None:
    """Unpaced, nothing in a step awaits after its answer: the stream that the step's token woke
    must still get the loop before the (busy) rank's next step call is made, or the first token
    waits for that call's Ray submission (the old loop: it saw 2 calls)."""

    async def scenario() -> None:
        ranks = [HeldRank()]
        seen: list[int] = []
        woken = asyncio.Event()

        async def stream() -> None:
            await woken.wait()
            seen.append(len(ranks[0].calls))

        loop = make_loop(ranks, [])
        loop.on_step = lambda _done: woken.set()
        consumer = asyncio.create_task(stream())
        task = asyncio.create_task(loop.run())
        try:
            loop.wake(0)
            await settle()
            ranks[0].answer(RankStep(RankBatch.of([1], [5]), (Emitted("a", 7, None),), busy=True))
            await settle()
            assert seen == [1] and len(ranks[0].calls) == 2
        finally:
            task.cancel()
            consumer.cancel()

    asyncio.run(scenario())


def test_a_call_that_admitted_records_the_admissions_share_of_the_ranks_time() -> None:
    async def scenario() -> None:
        async with running_loop(1) as (loop, (rank0,), done):
            loop.submit(0, Submission("prefill", "a", (1, 2, 3)))
            await settle()
            step = admitting("a", busy=True)
            rank0.answer(RankStep(step.batch, step.emitted, True, admitted=step.admitted,
                                  wall_s=0.01, admit_s=0.004))
            await settle()
            rank0.answer(RankStep(RankBatch.of([1], [5]), (), busy=False, wall_s=0.01))
            await settle()
            registry = loop.metrics.registry
            count = registry.get_sample_value(
                "rackserve_frontdoor_stage_wall_seconds_count", {"stage": "prefill_rank_admit"})
            total = registry.get_sample_value(
                "rackserve_frontdoor_stage_wall_seconds_sum", {"stage": "prefill_rank_admit"})
            steps = registry.get_sample_value(
                "rackserve_frontdoor_stage_wall_seconds_count", {"stage": "prefill_rank_step"})
            assert (count, total, steps) == (1, 0.004, 2)  # only the call that carried one

    asyncio.run(scenario())
